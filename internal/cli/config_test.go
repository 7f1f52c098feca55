package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeStack writes dir/.run/stack.json with body and returns its path.
func writeStack(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, ".run", "stack.json")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// The stack lists "zeta" before "alpha": "the first token" is file order, not sorted.
const stackBody = `{"api_url":"http://127.0.0.1:8787","tokens":{"zeta":"z-token","alpha":"a-token"},
 "s3":{"endpoint":"http://127.0.0.1:9000","region":"us-east-1","access_key":"ak","secret_key":"sk","bucket":"b","prefix":"outputs"}}`

func TestResolvePrecedence(t *testing.T) {
	dir := t.TempDir()
	writeStack(t, dir, stackBody)
	sub := filepath.Join(dir, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                     string
		flags                    Settings
		env                      map[string]string
		cwd                      string
		wantURL, wantTok, wantTn string
		wantSrc                  map[string]string
	}{
		{
			name: "stack only: first token in file order",
			cwd:  dir, wantURL: "http://127.0.0.1:8787", wantTok: "z-token", wantTn: "zeta",
			wantSrc: map[string]string{"api_url": "stack", "token": "stack", "tenant": "stack", "stack": "found"},
		},
		{
			name: "stack named by SBX_STACK",
			cwd:  t.TempDir(), env: map[string]string{EnvStack: filepath.Join(dir, ".run", "stack.json")},
			wantURL: "http://127.0.0.1:8787", wantTok: "z-token", wantTn: "zeta",
			wantSrc: map[string]string{"api_url": "stack", "stack": "env"},
		},
		{
			name: "stack named by --stack over SBX_STACK",
			cwd:  t.TempDir(), flags: Settings{Stack: filepath.Join(dir, ".run", "stack.json")},
			env:     map[string]string{EnvStack: filepath.Join(t.TempDir(), "missing.json")},
			wantURL: "http://127.0.0.1:8787", wantTok: "z-token", wantTn: "zeta",
			wantSrc: map[string]string{"api_url": "stack", "stack": "flag"},
		},
		{
			name: "stack found from a subdirectory",
			cwd:  sub, wantURL: "http://127.0.0.1:8787", wantTok: "z-token", wantTn: "zeta",
			wantSrc: map[string]string{"api_url": "stack", "token": "stack", "tenant": "stack"},
		},
		{
			name: "tenant flag picks its stack token",
			cwd:  dir, flags: Settings{Tenant: "alpha"},
			wantURL: "http://127.0.0.1:8787", wantTok: "a-token", wantTn: "alpha",
			wantSrc: map[string]string{"api_url": "stack", "token": "stack", "tenant": "flag"},
		},
		{
			name: "tenant from env picks its stack token",
			cwd:  dir, env: map[string]string{EnvTenant: "alpha"},
			wantURL: "http://127.0.0.1:8787", wantTok: "a-token", wantTn: "alpha",
			wantSrc: map[string]string{"api_url": "stack", "token": "stack", "tenant": "env"},
		},
		{
			name: "env beats stack",
			cwd:  dir, env: map[string]string{EnvAPIURL: "http://env:1", EnvToken: "a-token"},
			wantURL: "http://env:1", wantTok: "a-token", wantTn: "alpha", // tenant looked up by token
			wantSrc: map[string]string{"api_url": "env", "token": "env", "tenant": "stack"},
		},
		{
			name: "flags beat env and stack",
			cwd:  dir, flags: Settings{APIURL: "http://flag:2", Token: "flag-token", Tenant: "t9"},
			env:     map[string]string{EnvAPIURL: "http://env:1", EnvToken: "env-token", EnvTenant: "alpha"},
			wantURL: "http://flag:2", wantTok: "flag-token", wantTn: "t9",
			wantSrc: map[string]string{"api_url": "flag", "token": "flag", "tenant": "flag"},
		},
		{
			name: "no stack: env only",
			cwd:  t.TempDir(), env: map[string]string{EnvAPIURL: "http://env:1", EnvToken: "env-token"},
			wantURL: "http://env:1", wantTok: "env-token", wantTn: "",
			wantSrc: map[string]string{"api_url": "env", "token": "env", "stack": ""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Resolve(tt.flags, envOf(tt.env), tt.cwd, true)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if cfg.APIURL != tt.wantURL || cfg.Token != tt.wantTok || cfg.Tenant != tt.wantTn {
				t.Errorf("got url=%q token=%q tenant=%q, want url=%q token=%q tenant=%q",
					cfg.APIURL, cfg.Token, cfg.Tenant, tt.wantURL, tt.wantTok, tt.wantTn)
			}
			for k, want := range tt.wantSrc {
				if cfg.Sources[k] != want {
					t.Errorf("source of %s = %q, want %q", k, cfg.Sources[k], want)
				}
			}
		})
	}
}

func TestResolveStateDirIsAtTheStackRoot(t *testing.T) {
	dir := t.TempDir()
	writeStack(t, dir, stackBody)
	sub := filepath.Join(dir, "x")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := Resolve(Settings{}, envOf(nil), sub, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, ".run", "sbx"); cfg.StateDir != want {
		t.Errorf("StateDir = %q, want %q", cfg.StateDir, want)
	}
	if cfg.Stack.S3 == nil || cfg.Stack.S3.Bucket != "b" || cfg.Stack.S3.Prefix != "outputs" {
		t.Errorf("S3 = %+v, want bucket b prefix outputs", cfg.Stack.S3)
	}
}

func TestResolveErrors(t *testing.T) {
	dir := t.TempDir()
	writeStack(t, dir, stackBody)
	bad := t.TempDir()
	writeStack(t, bad, `{"tokens":["not","a","map"]}`)
	tests := []struct {
		name    string
		flags   Settings
		env     map[string]string
		cwd     string
		wantErr error  // errors.Is target, or nil
		wantMsg string // substring
	}{
		{name: "nothing configured", cwd: t.TempDir(), wantErr: ErrNoAPIURL},
		{name: "url but no token", cwd: t.TempDir(), env: map[string]string{EnvAPIURL: "http://x:1"}, wantErr: ErrNoToken},
		{name: "unknown tenant", cwd: dir, flags: Settings{Tenant: "nobody"}, wantMsg: `tenant "nobody" has no token`},
		{name: "explicit stack missing", cwd: dir, flags: Settings{Stack: "nope.json"}, wantMsg: "no such file"},
		{name: "stack from env missing", cwd: dir, env: map[string]string{EnvStack: "/nonexistent/stack.json"}, wantMsg: "no such file"},
		{name: "malformed tokens", cwd: bad, wantMsg: "tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Resolve(tt.flags, envOf(tt.env), tt.cwd, true)
			if err == nil {
				t.Fatal("Resolve: nil error, want one")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error = %v, want %v", err, tt.wantErr)
			}
			if tt.wantMsg != "" && !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error = %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

func TestShellJoinKeepsWords(t *testing.T) {
	tests := []struct {
		in   []string
		want string
	}{
		{[]string{"python3", "report.py", "uploads/sales.csv"}, "python3 report.py uploads/sales.csv"},
		{[]string{"echo", "a b", "it's", "$HOME", ""}, `echo 'a b' 'it'\''s' '$HOME' ''`},
		{[]string{"ls", "-l", "--color=never"}, "ls -l --color=never"},
	}
	for _, tt := range tests {
		if got := shellJoin(tt.in); got != tt.want {
			t.Errorf("shellJoin(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestThreadPrefix(t *testing.T) {
	tests := []struct{ prefix, want string }{
		{"outputs", "outputs/dev/u/t/"},
		{"/outputs/", "outputs/dev/u/t/"},
		{"", "dev/u/t/"},
		{"a/b", "a/b/dev/u/t/"},
	}
	for _, tt := range tests {
		if got := threadPrefix(tt.prefix, "dev", "u", "t"); got != tt.want {
			t.Errorf("threadPrefix(%q) = %q, want %q", tt.prefix, got, tt.want)
		}
	}
}

func TestResolvePrefersTheStacksDefaultTenant(t *testing.T) {
	tests := []struct {
		name            string
		body            string
		flags           Settings
		wantTok, wantTn string
	}{
		{name: "default_tenant wins over file order",
			body:    `{"api_url":"http://127.0.0.1:8787","default_tenant":"alpha","tokens":{"zeta":"z-token","alpha":"a-token"}}`,
			wantTok: "a-token", wantTn: "alpha"},
		{name: "tenant flag beats default_tenant",
			body:    `{"api_url":"http://127.0.0.1:8787","default_tenant":"alpha","tokens":{"zeta":"z-token","alpha":"a-token"}}`,
			flags:   Settings{Tenant: "zeta"},
			wantTok: "z-token", wantTn: "zeta"},
		{name: "default_tenant without a token falls back to the first",
			body:    `{"api_url":"http://127.0.0.1:8787","default_tenant":"gone","tokens":{"zeta":"z-token","alpha":"a-token"}}`,
			wantTok: "z-token", wantTn: "zeta"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeStack(t, dir, tt.body)
			cfg, err := Resolve(tt.flags, envOf(nil), dir, true)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if cfg.Token != tt.wantTok || cfg.Tenant != tt.wantTn {
				t.Errorf("got token=%q tenant=%q, want token=%q tenant=%q", cfg.Token, cfg.Tenant, tt.wantTok, tt.wantTn)
			}
		})
	}
}
