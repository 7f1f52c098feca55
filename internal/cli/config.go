package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Environment variables the CLI reads (flags win over them, and they win
// over .run/stack.json).
const (
	EnvAPIURL = "SBX_API_URL"
	EnvToken  = "SBX_TOKEN"
	EnvTenant = "SBX_TENANT"
	EnvStack  = "SBX_STACK"
)

// StackFile is where `make run` writes the endpoints and credentials of the
// local stack, relative to the repository root.
const StackFile = ".run/stack.json"

// TenantToken is one entry of stack.json's "tokens" map.
type TenantToken struct {
	Tenant string
	Token  string
}

// S3Info is stack.json's "s3" section.
type S3Info struct {
	Endpoint  string `json:"endpoint"`
	Region    string `json:"region"`
	AccessKey string `json:"access_key"`
	SecretKey string `json:"secret_key"`
	Bucket    string `json:"bucket"`
	Prefix    string `json:"prefix"`
}

// Stack is the part of .run/stack.json the CLI uses.
type Stack struct {
	// Path is the file it was read from.
	Path   string
	APIURL string
	// Tokens in file order: "the first" token is Tokens[0].
	Tokens []TenantToken
	// DefaultTenant is the stack's "default_tenant" ("" when absent): the
	// tenant whose token sbx uses when none is named. make run sets it to
	// the first tenant of BROKER_DEV_TOKENS.
	DefaultTenant string
	S3            *S3Info
}

// Root is the directory holding the stack's .run directory.
func (s *Stack) Root() string { return filepath.Dir(filepath.Dir(s.Path)) }

// TokenFor returns the token of tenant, if the stack has one.
func (s *Stack) TokenFor(tenant string) (string, bool) {
	for _, t := range s.Tokens {
		if t.Tenant == tenant {
			return t.Token, true
		}
	}
	return "", false
}

// TenantOf returns the tenant whose token is token, if the stack has it.
func (s *Stack) TenantOf(token string) (string, bool) {
	for _, t := range s.Tokens {
		if t.Token == token {
			return t.Tenant, true
		}
	}
	return "", false
}

// Default returns the tenant and token sbx uses when none is named: the
// DefaultTenant's, when it has a token, else the first listed.
func (s *Stack) Default() TenantToken {
	if tok, ok := s.TokenFor(s.DefaultTenant); ok && s.DefaultTenant != "" {
		return TenantToken{Tenant: s.DefaultTenant, Token: tok}
	}
	return s.Tokens[0]
}

// LoadStack reads a stack.json file. Errors wrap fs.ErrNotExist when it is missing.
func LoadStack(path string) (*Stack, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read stack file: %w", err)
	}
	var w struct {
		APIURL        string          `json:"api_url"`
		Tokens        json.RawMessage `json:"tokens"`
		DefaultTenant string          `json:"default_tenant"`
		S3            *S3Info         `json:"s3"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, fmt.Errorf("parse stack file %s: %w", path, err)
	}
	tokens, err := orderedTokens(w.Tokens)
	if err != nil {
		return nil, fmt.Errorf("parse stack file %s: tokens: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	return &Stack{Path: abs, APIURL: w.APIURL, Tokens: tokens, DefaultTenant: w.DefaultTenant, S3: w.S3}, nil
}

// orderedTokens decodes a JSON object of string values keeping its key order.
func orderedTokens(raw json.RawMessage) ([]TenantToken, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("want an object of tenant to token")
	}
	var out []TenantToken
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v string
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("tenant %v: %w", k, err)
		}
		out = append(out, TenantToken{Tenant: k.(string), Token: v})
	}
	return out, nil
}

// FindStack looks for .run/stack.json in dir and its parents and returns its
// path, or "" when there is none.
func FindStack(dir string) string {
	for {
		p := filepath.Join(dir, StackFile)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// Settings are the global flags as given on the command line ("" = not given).
type Settings struct {
	APIURL string
	Token  string
	Tenant string
	Stack  string
}

// Config is the resolved configuration of one CLI run.
type Config struct {
	APIURL string
	Token  string
	// Tenant is the tenant named by --tenant/SBX_TENANT, or the one whose
	// stack token was picked or matches the token ("" if unknown).
	Tenant string
	// Stack is the loaded stack file, nil when there is none.
	Stack *Stack
	// StateDir holds per-sandbox connection files (<root>/.run/sbx).
	StateDir string
	// Sources says where APIURL, Token and Tenant came from ("flag", "env",
	// "stack", or "" for unset), and the stack file ("flag", "env", or
	// "found" by searching), for `sbx config` and error messages.
	Sources map[string]string
}

// ErrNoAPIURL and ErrNoToken mean the configuration could not be completed.
var (
	ErrNoAPIURL = errors.New("no API URL: pass --api-url, set " + EnvAPIURL + ", or start the local stack with `make run` (it writes " + StackFile + ")")
	ErrNoToken  = errors.New("no token: pass --token, set " + EnvToken + ", or start the local stack with `make run` (it writes " + StackFile + ")")
)

// Resolve applies the precedence flags > environment > stack file to each
// setting independently. The stack file is --stack, else $SBX_STACK, else
// .run/stack.json in cwd or a parent; a missing file is fine unless it was
// named explicitly. Token: --token > $SBX_TOKEN > the stack's token of the
// tenant (--tenant/$SBX_TENANT) > the stack's default (Stack.Default). A tenant named
// but absent from the stack is an error only when the token must come from
// the stack. needAPI=false skips the API URL and token checks (for commands
// that only read the stack, such as ls-outputs).
func Resolve(s Settings, getenv func(string) string, cwd string, needAPI bool) (Config, error) {
	cfg := Config{Sources: map[string]string{}}
	st, src, err := resolveStack(s, getenv, cwd)
	if err != nil {
		return cfg, err
	}
	cfg.Stack = st
	if st != nil {
		cfg.Sources["stack"] = src
	}

	pick := func(name, flag, env string, stack string) string {
		switch {
		case flag != "":
			cfg.Sources[name] = "flag"
			return flag
		case env != "" && getenv(env) != "":
			cfg.Sources[name] = "env"
			return getenv(env)
		case stack != "":
			cfg.Sources[name] = "stack"
			return stack
		}
		return ""
	}
	var stackURL string
	if cfg.Stack != nil {
		stackURL = cfg.Stack.APIURL
	}
	cfg.APIURL = pick("api_url", s.APIURL, EnvAPIURL, stackURL)
	cfg.Tenant = pick("tenant", s.Tenant, EnvTenant, "")
	cfg.Token = pick("token", s.Token, EnvToken, "")

	if err := cfg.credentialsFromStack(); err != nil {
		return cfg, err
	}

	if cfg.Stack != nil {
		cfg.StateDir = filepath.Join(cfg.Stack.Root(), ".run", "sbx")
	} else {
		cfg.StateDir = filepath.Join(cwd, ".run", "sbx")
	}

	if needAPI {
		if cfg.APIURL == "" {
			return cfg, ErrNoAPIURL
		}
		if cfg.Token == "" {
			return cfg, ErrNoToken
		}
	}
	return cfg, nil
}

// resolveStack loads the stack file: --stack, else SBX_STACK (relative to
// cwd), else the one FindStack finds, and says which ("flag", "env" or
// "found"). A stack file named explicitly must load; one found by
// searching may be absent (nil, no error).
func resolveStack(s Settings, getenv func(string) string, cwd string) (*Stack, string, error) {
	stackPath, src := s.Stack, "flag"
	if stackPath == "" {
		stackPath, src = getenv(EnvStack), "env"
	}
	explicit := stackPath != ""
	if explicit && !filepath.IsAbs(stackPath) {
		stackPath = filepath.Join(cwd, stackPath)
	}
	if !explicit {
		stackPath, src = FindStack(cwd), "found"
	}
	if stackPath == "" {
		return nil, "", nil
	}
	st, err := LoadStack(stackPath)
	if err != nil && (explicit || !errors.Is(err, fs.ErrNotExist)) {
		return nil, "", err
	}
	return st, src, nil
}

// credentialsFromStack completes the token and tenant from the stack file:
// without a token, the tenant's token (or the stack's default tenant and
// its token); without a tenant, the tenant the token names.
func (cfg *Config) credentialsFromStack() error {
	if cfg.Token == "" && cfg.Stack != nil && len(cfg.Stack.Tokens) > 0 {
		if cfg.Tenant != "" {
			tok, ok := cfg.Stack.TokenFor(cfg.Tenant)
			if !ok {
				return fmt.Errorf("tenant %q has no token in %s (tenants there: %s)", cfg.Tenant, cfg.Stack.Path, tenantList(cfg.Stack))
			}
			cfg.Token = tok
		} else {
			d := cfg.Stack.Default()
			cfg.Token, cfg.Tenant = d.Token, d.Tenant
			cfg.Sources["tenant"] = "stack"
		}
		cfg.Sources["token"] = "stack"
	}
	if cfg.Tenant == "" && cfg.Token != "" && cfg.Stack != nil {
		if t, ok := cfg.Stack.TenantOf(cfg.Token); ok {
			cfg.Tenant = t
			cfg.Sources["tenant"] = "stack"
		}
	}
	return nil
}

func tenantList(s *Stack) string {
	var b bytes.Buffer
	for i, t := range s.Tokens {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(t.Tenant)
	}
	return b.String()
}
