package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// startHost runs the local sandbox host on loopback (API key "k") until
// the test ends.
func startHost(t *testing.T) *sandboxhost.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: "k", RootDir: t.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	t.Cleanup(func() { cancel(); _ = srv.Close() })
	return srv
}

// postSandbox POSTs the JSON body to u with X-API-Key key, decodes the
// reply into out (failing the test when it is not JSON) and returns the
// HTTP status.
func postSandbox(t *testing.T, u, key, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("create sandbox: HTTP %d %+v %v", resp.StatusCode, out, err)
	}
	return resp.StatusCode
}

// realSandbox starts the local sandbox host and creates one sandbox in it.
func realSandbox(t *testing.T) (string, client.Connection) {
	t.Helper()
	srv := startHost(t)
	var out struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if status := postSandbox(t, srv.APIURL+"/sandboxes", "k", `{"templateID":"base","timeout":120}`, &out); out.SandboxID == "" {
		t.Fatalf("create sandbox: HTTP %d %+v", status, out)
	}
	return out.SandboxID, client.Connection{EnvdURL: srv.EnvdURL, EnvdAccessToken: out.EnvdAccessToken}
}

func TestPutExecGetInARealSandbox(t *testing.T) {
	id, conn := realSandbox(t)
	h := newHarness(t, nil)
	if err := (connStore{filepath.Join(h.dir, ".run", "sbx")}).Save(StoredConnection{SandboxID: id, Connection: conn}); err != nil {
		t.Fatal(err)
	}
	csv := "region,amount\nnorth,10\nsouth,32\n"
	if err := os.WriteFile(filepath.Join(h.dir, "sales.csv"), []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := h.run(nil, "put", id, "sales.csv", "uploads/sales.csv")
	if code != 0 || !strings.Contains(out, "uploaded 32 bytes to "+id+":/home/user/uploads/sales.csv") {
		t.Fatalf("put: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// Words are quoted: the space and the quote survive; -e values reach the env.
	code, out, errOut = h.run(nil, "exec", id, "-e", "TOTAL_LABEL=sum is", "--",
		"awk", "-F,", `NR>1{s+=$2} END{print ENVIRON["TOTAL_LABEL"]": "s > "uploads/it's total.txt"; print "done"}`, "uploads/sales.csv")
	if code != 0 || out != "done\n" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	code, out, errOut = h.run(nil, "get", id, "uploads/it's total.txt", "-")
	if code != 0 || out != "sum is: 42\n" {
		t.Fatalf("get -: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = h.run(nil, "get", id, "uploads/it's total.txt")
	if code != 0 {
		t.Fatalf("get: exit %d, stderr %q", code, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(h.dir, "it's total.txt")); err != nil || string(b) != "sum is: 42\n" {
		t.Errorf("downloaded file = %q, %v; want %q", b, err, "sum is: 42\n")
	}

	// The command's exit code becomes sbx's; stderr is passed through.
	code, _, errOut = h.run(nil, "exec", id, "-c", "echo oops >&2; exit 5")
	if code != 5 || errOut != "oops\n" {
		t.Errorf("exec exit 5: got exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = h.run(nil, "get", id, "outputs/missing.txt", "-")
	if code != ExitError || !strings.Contains(errOut, "file not found") {
		t.Errorf("get missing: exit %d, stderr %q; want 1 and file not found", code, errOut)
	}
}

func TestExecReacquiresWithUserAndThread(t *testing.T) {
	id, conn := realSandbox(t)
	body, _ := json.Marshal(client.Sandbox{SandboxID: id, State: "active", Source: "reused", Backend: "local", Connection: conn, ExpiresAt: time.Now()})
	h := newHarness(t, map[string]route{"POST /v1/sandboxes/acquire": {status: 200, body: string(body)}})

	code, out, errOut := h.run(nil, "exec", id, "-u", "u1", "-t", "t1", "--", "echo", "hi")
	if code != 0 || out != "hi\n" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, err := (connStore{filepath.Join(h.dir, ".run", "sbx")}).Load(id); err != nil {
		t.Errorf("connection not stored after re-acquire: %v", err)
	}
	// A thread bound to another sandbox is refused, not silently used.
	code, _, errOut = h.run(nil, "exec", "otherid", "-u", "u1", "-t", "t1", "--", "true")
	if code != ExitError || !strings.Contains(errOut, "has sandbox "+id+", not otherid") {
		t.Errorf("exec other id: exit %d, stderr %q", code, errOut)
	}
}

func TestPutFromStdin(t *testing.T) {
	id, conn := realSandbox(t)
	h := newHarness(t, nil)
	if err := (connStore{filepath.Join(h.dir, ".run", "sbx")}).Save(StoredConnection{SandboxID: id, Connection: conn}); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	a := &App{Stdin: strings.NewReader("from stdin"), Stdout: &out, Stderr: &errb, Getenv: envOf(nil), Dir: h.dir}
	if code := a.Run(context.Background(), []string{"--json", "put", id, "-", "/tmp/in.txt"}); code != 0 {
		t.Fatalf("put -: exit %d, stderr %q", code, errb.String())
	}
	var got struct {
		Path  string `json:"path"`
		Bytes int64  `json:"bytes"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got.Path != "/tmp/in.txt" || got.Bytes != 10 {
		t.Errorf("put JSON = %s (%v), want path /tmp/in.txt bytes 10", out.String(), err)
	}
	code, o, e := h.run(nil, "exec", id, "--", "cat", "/tmp/in.txt")
	if code != 0 || o != "from stdin" {
		t.Errorf("cat: exit %d, stdout %q, stderr %q", code, o, e)
	}
}

// realAIOSandbox starts the local sandbox host's provisioner face and
// creates one sandbox through it, returning the connection the broker
// hands out for the provisioner backend.
func realAIOSandbox(t *testing.T) (string, client.Connection) {
	t.Helper()
	srv := startHost(t)
	base, err := srv.StartProvisioner("127.0.0.1:0", sandboxhost.ProvisionerOptions{APIKey: "pk"})
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		SandboxID   string `json:"sandbox_id"`
		SandboxURL  string `json:"sandbox_url"`
		AccessToken string `json:"access_token"`
	}
	if status := postSandbox(t, base+"/api/sandboxes", "pk", `{"sandbox_id":"aio-cli-1","user_id":"u1","thread_id":"t1"}`, &out); out.SandboxURL == "" {
		t.Fatalf("create sandbox: HTTP %d %+v", status, out)
	}
	return out.SandboxID, client.Connection{SandboxURL: out.SandboxURL, AccessToken: out.AccessToken}
}

func TestPutExecGetInAProvisionerSandbox(t *testing.T) {
	id, conn := realAIOSandbox(t)
	body, _ := json.Marshal(map[string]any{"sandbox_id": id, "state": "active", "source": "created", "backend": "provisioner",
		"connection": map[string]string{"sandbox_url": conn.SandboxURL, "access_token": conn.AccessToken}})
	h := newHarness(t, map[string]route{"POST /v1/sandboxes/acquire": {status: 200, body: string(body)}})
	if code, out, errOut := h.run(nil, "acquire", "-u", "u1", "-t", "t1"); code != 0 || out != id+"\n" {
		t.Fatalf("acquire: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if err := os.WriteFile(filepath.Join(h.dir, "in.txt"), []byte("a\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{args: []string{"put", id, "in.txt", "uploads/in.txt"}, wantOut: "uploaded 4 bytes to " + id + ":/home/user/uploads/in.txt\n"},
		{args: []string{"exec", id, "-e", "X=it's", "--", "sh", "-c", `wc -l < uploads/in.txt; echo "$X" >&2`}, wantOut: "2\n", wantErr: "it's\n"},
		{args: []string{"exec", id, "-c", "exit 4"}, wantCode: 4},
		{args: []string{"get", id, "uploads/in.txt", "-"}, wantOut: "a\nb\n"},
		{args: []string{"get", id, "uploads/missing", "-"}, wantCode: ExitError, wantErr: "file not found"},
	}
	for _, s := range steps {
		code, out, errOut := h.run(nil, s.args...)
		if code != s.wantCode || out != s.wantOut || !strings.Contains(errOut, s.wantErr) {
			t.Errorf("sbx %v: exit %d, stdout %q, stderr %q; want %d, %q, stderr containing %q", s.args, code, out, errOut, s.wantCode, s.wantOut, s.wantErr)
		}
	}
}

func TestExecWithAnUnknownConnectionFailsClearly(t *testing.T) {
	h := newHarness(t, nil)
	if err := (connStore{filepath.Join(h.dir, ".run", "sbx")}).Save(StoredConnection{SandboxID: "sb9", Backend: "modal"}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"exec", "sb9", "--", "true"}, {"get", "sb9", "x", "-"}, {"put", "sb9", "-", "x"}} {
		code, _, errOut := h.run(nil, args...)
		if code != ExitError || !strings.Contains(errOut, "sandbox sb9 (backend modal): no connection sbx can use") {
			t.Errorf("sbx %v: exit %d, stderr %q; want 1 and a message naming the backend", args, code, errOut)
		}
	}
}
