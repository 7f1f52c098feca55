// Package e2e tests the broker end to end over HTTP against the real local
// stack (devstack): DynamoDB Local, versitygw, the sandbox host, and the four
// bootstrap binaries, freshly built by the test, under the Lambda Runtime
// Interface Emulator.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/sandbox-broker/sandbox-broker/internal/devstack"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

const (
	tokenA  = "token-acme"
	tokenB  = "token-globex"
	tenantA = "acme"
	tenantB = "globex"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// goBuild builds pkg from the source at root into out as make build does:
// static and -trimpath, so that it reuses make build's compile.
func goBuild(root, out, pkg string, flags ...string) error {
	args := append(append([]string{"build", "-trimpath"}, flags...), "-o", out, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// buildFunctions builds every function's bootstrap from the current source
// into out (never a possibly stale .build).
func buildFunctions(root, out string) error {
	fns := []string{"acquire", "status", "release", "sync", "reconcile"}
	var wg sync.WaitGroup
	errs := make([]error, len(fns))
	for i, fn := range fns {
		wg.Go(func() {
			errs[i] = goBuild(root, filepath.Join(out, fn, "bootstrap"), "./functions/"+fn, "-tags", "lambda.norpc")
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// buildSbx builds the command-line client from this source into out.
func buildSbx(t *testing.T, root, out string) {
	t.Helper()
	if err := goBuild(root, out, "./cmd/sbx"); err != nil {
		t.Fatal(err)
	}
}

// startStack starts the local stack with the functions on SANDBOX_PROVIDER
// provider ("e2b" or "provisioner"), one slot, policy reject.
func startStack(t *testing.T, provider string) *devstack.Stack {
	t.Helper()
	return startStackWith(t, stackOptions{provider: provider, env: []string{
		"SANDBOX_REPLICAS=1",
		"SANDBOX_OVERFLOW_POLICY=reject",
		"LOG_LEVEL=DEBUG",
	}})
}

// stackOptions vary the stacks of this package's tests.
type stackOptions struct {
	provider  string
	env       []string          // Options.FunctionEnv
	instances int               // per HTTP function (default 2)
	tokens    map[string]string // default tokenA -> tenantA, tokenB -> tenantB
	// schedule, when > 0, is every scheduled function's rate
	// (Options.ScheduleOverride).
	schedule time.Duration
	// ownDynamoDB starts the stack's own DynamoDB Local; otherwise the
	// stack makes its table on the test process's one (testenv.DynamoDB).
	ownDynamoDB bool
}

// startStackWith starts the local stack with o, on the functions built
// once per test process (sharedBuild), and closes it at the end of t.
func startStackWith(t *testing.T, o stackOptions) *devstack.Stack {
	t.Helper()
	root := repoRoot(t)
	buildDir := sharedBuild(t, root)
	runDir := t.TempDir()
	if o.instances == 0 {
		o.instances = 2
	}
	if o.tokens == nil {
		o.tokens = map[string]string{tokenA: tenantA, tokenB: tenantB}
	}
	var dynamoEndpoint string
	if !o.ownDynamoDB {
		dynamoEndpoint = testenv.DynamoDB(t).Endpoint
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := devstack.Start(ctx, devstack.Options{
		DynamoDBEndpoint: dynamoEndpoint,
		Root:             root,
		BuildDir:         buildDir,
		RunDir:           runDir,
		Addr:             "127.0.0.1:0",
		Tokens:           o.tokens,
		FunctionEnv:      o.env,
		Instances:        o.instances,
		Provider:         o.provider,
		ScheduleOverride: o.schedule,
	})
	if err != nil {
		t.Fatalf("devstack.Start: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, s.Info.LogDir)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func dumpLogs(t *testing.T, dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || len(b) == 0 {
			continue
		}
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		t.Logf("---- %s (tail) ----\n%s", e.Name(), b)
	}
}

// api is a tiny client of the broker's HTTP API.
type api struct {
	t    *testing.T
	base string
	http *http.Client
}

type reply struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (a api) do(method, path, token, body string) reply {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.http.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		a.t.Fatalf("%s %s: status %d, body %q is not a JSON object: %v", method, path, resp.StatusCode, raw, err)
	}
	return r
}

// acquire asks for the thread's sandbox as the clients do: a 202 (waiting
// for a slot) is asked again with its ticket after its Retry-After, until
// another answer comes (at most maxAsks asks).
func (a api) acquire(token, user, thread string) reply {
	a.t.Helper()
	body := acquireBody(user, thread, "")
	for range maxAsks {
		r := a.do("POST", "/v1/sandboxes/acquire", token, body)
		if r.status != http.StatusAccepted {
			return r
		}
		time.Sleep(askAgainAfter(r))
		body = acquireBody(user, thread, str(r.body, "ticket"))
	}
	a.t.Fatalf("acquire %s/%s: still waiting after %d asks", user, thread, maxAsks)
	return reply{}
}

// maxAsks bounds the asks of one waiting acquire in these tests.
const maxAsks = 300

// acquireBody is an acquire's body, with the ticket of a wait it
// continues when not empty.
func acquireBody(user, thread, ticket string) string {
	if ticket == "" {
		return fmt.Sprintf(`{"user_id":%q,"thread_id":%q}`, user, thread)
	}
	return fmt.Sprintf(`{"user_id":%q,"thread_id":%q,"ticket":%q}`, user, thread, ticket)
}

// askAgainAfter is a 202's retry_after_seconds (at least a second).
func askAgainAfter(r reply) time.Duration {
	secs, _ := r.body["retry_after_seconds"].(float64)
	return time.Duration(max(secs, 1)) * time.Second
}

func str(m map[string]any, keys ...string) string {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = mm[k]
	}
	s, _ := v.(string)
	return s
}

func errCode(r reply) string { return str(r.body, "error", "code") }

func want(t *testing.T, step string, r reply, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("%s: status %d, want %d; body %s", step, r.status, status, r.raw)
	}
}

// conn is the connection object an acquire returns.
type conn struct {
	id, envdURL, token string
}

func connOf(r reply) conn {
	return conn{id: str(r.body, "sandbox_id"), envdURL: str(r.body, "connection", "envd_url"), token: str(r.body, "connection", "envd_access_token")}
}

// face is how the scenario reaches sandboxes of one provider, as an agent
// holding only the acquire response would, and how it kills one behind
// the broker's back.
type face struct {
	name     string
	connOf   func(r reply) conn
	run      func(t *testing.T, c conn, script string) (string, int)
	readFile func(t *testing.T, c conn, path string) (int, []byte)
	kill     func(t *testing.T, s *devstack.Stack, id string)
}

// e2bFace talks envd (Connect RPC and /files) and kills through the E2B
// control plane of the sandbox host.
var e2bFace = face{name: "e2b", connOf: connOf, run: run, readFile: readFile,
	kill: func(t *testing.T, s *devstack.Stack, id string) {
		t.Helper()
		killVia(t, s.Info.SandboxHost.APIURL+"/sandboxes/"+id, s.Info.SandboxHost.APIKey)
	}}

// provisionerFace talks the AIO sandbox API at connection.sandbox_url and
// kills through the provisioner API.
var provisionerFace = face{name: "provisioner",
	connOf: func(r reply) conn {
		c := conn{id: str(r.body, "sandbox_id"), envdURL: str(r.body, "connection", "sandbox_url"), token: str(r.body, "connection", "access_token")}
		if conn, _ := r.body["connection"].(map[string]any); conn["envd_url"] != nil || conn["envd_access_token"] != nil {
			c.envdURL = "" // the provisioner backend must not carry envd fields
		}
		return c
	},
	run: runAIO, readFile: readFileAIO,
	kill: func(t *testing.T, s *devstack.Stack, id string) {
		t.Helper()
		killVia(t, s.Info.Provisioner.APIURL+"/api/sandboxes/"+id, s.Info.Provisioner.APIKey)
	}}

// killVia sends DELETE url with X-API-Key and wants a 2xx.
func killVia(t *testing.T, url, key string) {
	t.Helper()
	req, _ := http.NewRequest("DELETE", url, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("kill via sandbox host: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("kill via sandbox host: HTTP %d", resp.StatusCode)
	}
}

// runAIO runs script with POST {sandbox_url}/v1/bash/exec (AIO sandbox
// API, sync mode) in /home/user and returns stdout and the exit code.
func runAIO(t *testing.T, c conn, script string) (string, int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"command": script, "exec_dir": "/home/user", "hard_timeout": 50, "max_output_length": 0})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", c.envdURL+"/v1/bash/exec", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("AIO exec: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("AIO exec: HTTP %d: %s", resp.StatusCode, raw)
	}
	var out struct {
		Success bool `json:"success"`
		Data    struct {
			Status   string `json:"status"`
			Stdout   string `json:"stdout"`
			ExitCode *int   `json:"exit_code"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || !out.Success || out.Data.Status != "completed" || out.Data.ExitCode == nil {
		t.Fatalf("AIO exec: reply %s (%v), want a completed command", raw, err)
	}
	return out.Data.Stdout, *out.Data.ExitCode
}

// readFileAIO reads a sandbox file with GET {sandbox_url}/v1/file/download.
func readFileAIO(t *testing.T, c conn, path string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", c.envdURL+"/v1/file/download?path="+path, nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("AIO download: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// startProcess sends envd's process.Process/Start for /bin/bash with args
// (JSON codec) and returns the reply, its stream unread.
func startProcess(ctx context.Context, t *testing.T, c conn, args ...string) *http.Response {
	t.Helper()
	msg, _ := json.Marshal(map[string]any{
		"process": map[string]any{"cmd": "/bin/bash", "args": args, "cwd": "/home/user"},
		"stdin":   false,
	})
	var env bytes.Buffer
	env.WriteByte(0)
	_ = binary.Write(&env, binary.BigEndian, uint32(len(msg)))
	env.Write(msg)
	req, _ := http.NewRequestWithContext(ctx, "POST", c.envdURL+"/process.Process/Start", &env)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("E2b-Sandbox-Id", c.id)
	req.Header.Set("X-Access-Token", c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("envd Start: %v", err)
	}
	return resp
}

// run starts `bash -c script` in the sandbox through envd's Connect RPC
// (process.Process/Start, JSON codec, server stream) and returns its stdout
// and exit code, as an agent holding only the acquire response would.
func run(t *testing.T, c conn, script string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp := startProcess(ctx, t, c, "-l", "-c", script)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("envd Start: HTTP %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	var stdout bytes.Buffer
	exit := -1
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			t.Fatalf("envd Start: stream ended without end-stream envelope: %v", err)
		}
		payload := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(br, payload); err != nil {
			t.Fatalf("envd Start: short envelope: %v", err)
		}
		if hdr[0]&0x02 != 0 { // end of stream
			var end struct {
				Error *struct{ Code, Message string } `json:"error"`
			}
			_ = json.Unmarshal(payload, &end)
			if end.Error != nil {
				t.Fatalf("envd Start: stream error %s: %s", end.Error.Code, end.Error.Message)
			}
			break
		}
		var ev struct {
			Event struct {
				Data *struct {
					Stdout []byte `json:"stdout"`
				} `json:"data"`
				End *struct {
					ExitCode int    `json:"exitCode"`
					Error    string `json:"error"`
				} `json:"end"`
			} `json:"event"`
		}
		if err := json.Unmarshal(payload, &ev); err != nil {
			t.Fatalf("envd Start: bad event %q: %v", payload, err)
		}
		if ev.Event.Data != nil {
			stdout.Write(ev.Event.Data.Stdout)
		}
		if ev.Event.End != nil {
			exit = ev.Event.End.ExitCode
		}
	}
	return stdout.String(), exit
}

// readFile reads a sandbox file through envd's GET /files.
func readFile(t *testing.T, c conn, path string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", c.envdURL+"/files?path="+path, nil)
	req.Header.Set("E2b-Sandbox-Id", c.id)
	req.Header.Set("X-Access-Token", c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("envd GET /files: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestBrokerEndToEnd runs the scenario once per provider, each on a
// fresh stack whose functions use that provider.
func TestBrokerEndToEnd(t *testing.T) {
	t.Parallel()
	for _, f := range []face{e2bFace, provisionerFace} {
		t.Run(f.name, func(t *testing.T) {
			s := startStack(t, f.name)
			scenario(t, s, f)
			checkRequestIDs(t, s.Info.LogDir)
		})
	}
}

// scenario is acquire -> work -> release -> S3 -> reclaim -> capacity ->
// kill and replace -> tenant isolation -> sync -> validation -> reconcile,
// reaching sandboxes through f.
func scenario(t *testing.T, s *devstack.Stack, f face) {
	connOf, run, readFile := f.connOf, f.run, f.readFile
	a := newAPI(t, s)
	const user, thread, otherThread = "u-1", "thread-1", "thread-2"

	// No token: the local authorizer refuses.
	if r := a.do("GET", "/v1/capacity", "", ""); r.status != 401 {
		t.Fatalf("no token: status %d, want 401", r.status)
	}
	// The API's contract, served to a tenant (checked against itself by
	// the contract transport like every reply).
	if r := a.do("GET", "/v1/openapi.json", tokenA, ""); r.status != 200 || str(r.body, "openapi") != "3.1.0" {
		t.Fatalf("GET /v1/openapi.json: status %d, openapi %q", r.status, str(r.body, "openapi"))
	}

	// 1. acquire -> created.
	r := a.acquire(tokenA, user, thread)
	want(t, "first acquire", r, 200)
	first := connOf(r)
	if str(r.body, "source") != "created" || str(r.body, "state") != "active" || first.id == "" || first.envdURL == "" || first.token == "" || str(r.body, "backend") != f.name {
		t.Fatalf("first acquire: body %s, want source created, state active, id, backend and connection", r.raw)
	}
	exp, err := time.Parse(time.RFC3339, str(r.body, "expires_at"))
	if err != nil || !exp.After(time.Now()) {
		t.Errorf("expires_at %q: want a future RFC 3339 time (%v)", str(r.body, "expires_at"), err)
	}

	// 2. a command writes outputs/a.txt through the envd connection.
	content := "hello from the e2e test " + strconv.FormatInt(time.Now().UnixNano(), 10) + "\n"
	out, code := run(t, first, "mkdir -p outputs && cat > outputs/a.txt <<'EOF'\n"+strings.TrimSuffix(content, "\n")+"\nEOF\necho ok")
	if code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("write outputs/a.txt: exit %d stdout %q", code, out)
	}
	if st, b := readFile(t, first, "/home/user/outputs/a.txt"); st != 200 || string(b) != content {
		t.Fatalf("envd read back outputs/a.txt: HTTP %d %q, want %q", st, b, content)
	}

	// 3. release -> warm, outputs synced.
	r = a.do("POST", "/v1/sandboxes/"+first.id+"/release", tokenA, "")
	want(t, "release", r, 200)
	if str(r.body, "state") != "warm" || str(r.body, "sandbox_id") != first.id {
		t.Fatalf("release: body %s, want state warm for %s", r.raw, first.id)
	}
	if sync, ok := r.body["sync"].(map[string]any); !ok || sync["complete"] != true {
		t.Errorf("release: sync %v, want a complete sync result", r.body["sync"])
	}

	// 4. the S3 object has the bytes.
	key := s.Info.S3.Prefix + "/" + tenantA + "/" + user + "/" + thread + "/outputs/a.txt"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obj, err := devstack.S3Client(s.Info.S3).GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.Info.S3.Bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("S3 GetObject %s: %v", key, err)
	}
	got, err := io.ReadAll(obj.Body)
	obj.Body.Close()
	if err != nil || string(got) != content {
		t.Fatalf("S3 object %s = %q (%v), want %q", key, got, err, content)
	}

	// 5. acquire again, same thread -> the same sandbox, reclaimed.
	r = a.acquire(tokenA, user, thread)
	want(t, "second acquire", r, 200)
	if str(r.body, "source") != "reclaimed" || str(r.body, "sandbox_id") != first.id {
		t.Fatalf("second acquire: body %s, want source reclaimed and sandbox %s", r.raw, first.id)
	}
	reclaimed := connOf(r)
	if _, code := run(t, reclaimed, "test -f outputs/a.txt"); code != 0 {
		t.Errorf("reclaimed sandbox lost outputs/a.txt (exit %d)", code)
	}

	// 6. another thread: capacity 1 under reject -> 429.
	r = a.acquire(tokenA, user, otherThread)
	want(t, "other thread acquire", r, 429)
	if errCode(r) != "SANDBOX_CAPACITY_EXCEEDED" || str(r.body, "error", "reason") != "capacity" {
		t.Errorf("429 body %s, want code SANDBOX_CAPACITY_EXCEEDED reason capacity", r.raw)
	}
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want a positive integer", r.header.Get("Retry-After"))
	}
	if e, _ := r.body["error"].(map[string]any); e["retryable"] != true {
		t.Errorf("429 retryable = %v, want true", e["retryable"])
	}

	// 7. kill the sandbox behind the broker's back; the next acquire notices and replaces it.
	f.kill(t, s, first.id)
	r = a.acquire(tokenA, user, thread)
	want(t, "acquire after kill", r, 200)
	replaced := connOf(r)
	if replaced.id == first.id || replaced.id == "" || str(r.body, "source") != "created" {
		t.Fatalf("acquire after kill: body %s, want a new sandbox (not %s) with source created", r.raw, first.id)
	}
	if out, code := run(t, replaced, "echo alive"); code != 0 || strings.TrimSpace(out) != "alive" {
		t.Fatalf("replacement sandbox: exit %d stdout %q", code, out)
	}
	if r := a.do("GET", "/v1/sandboxes/"+first.id, tokenA, ""); r.status == 200 && (str(r.body, "state") == "active" || str(r.body, "state") == "warm") {
		t.Errorf("killed sandbox still recorded as %s: %s", str(r.body, "state"), r.raw)
	}
	capBefore := a.do("GET", "/v1/capacity", tokenA, "")
	want(t, "capacity", capBefore, 200)
	if capBefore.body["used"] != float64(1) || capBefore.body["limit"] != float64(1) {
		t.Errorf("capacity after replacement %s, want used 1 of limit 1", capBefore.raw)
	}

	// 8. another tenant's token: 404 for the first tenant's sandbox.
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/" + replaced.id},
		{"POST", "/v1/sandboxes/" + replaced.id + "/release"},
		{"POST", "/v1/sandboxes/" + replaced.id + "/sync"},
	} {
		r := a.do(c.method, c.path, tokenB, "")
		if r.status != 404 || errCode(r) != "SANDBOX_NOT_FOUND" {
			t.Errorf("tenant %s %s %s: status %d body %s, want 404 SANDBOX_NOT_FOUND", tenantB, c.method, c.path, r.status, r.raw)
		}
	}
	// The owner may sync its sandbox on demand (the sync function).
	if _, code := run(t, replaced, "mkdir -p workspace && echo data > workspace/b.txt"); code != 0 {
		t.Fatalf("write workspace/b.txt: exit %d", code)
	}
	r = a.do("POST", "/v1/sandboxes/"+replaced.id+"/sync", tokenA, "")
	want(t, "owner sync", r, 200)
	for _, k := range []string{"uploaded", "skipped", "deferred", "bytes", "complete"} {
		if _, ok := r.body[k]; !ok {
			t.Errorf("sync reply %s lacks %q", r.raw, k)
		}
	}
	if r.body["complete"] != true || r.body["uploaded"].(float64) < 1 {
		t.Errorf("sync reply %s, want complete with at least one upload", r.raw)
	}
	r = a.do("GET", "/v1/sandboxes/"+replaced.id, tokenA, "")
	want(t, "owner get", r, 200)
	if str(r.body, "state") != "active" {
		t.Errorf("owner get: %s, want state active", r.raw)
	}

	// 9. malformed ids and bodies: 400, nothing changes.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/bad.id", ""},
		{"GET", "/v1/sandboxes/%2e%2e", ""},
		{"POST", "/v1/sandboxes/a%2Fb/release", ""},
		{"POST", "/v1/sandboxes/" + strings.Repeat("x", 200) + "/release", ""},
		{"POST", "/v1/sandboxes/x;y/sync", ""},
		{"POST", "/v1/sandboxes/acquire", `{"user_id":"u/1","thread_id":"t"}`},
		{"POST", "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t","extra":1}`},
		{"POST", "/v1/sandboxes/acquire", `not json`},
	} {
		r := a.do(c.method, c.path, tokenA, c.body)
		if r.status != 400 || errCode(r) != "VALIDATION_ERROR" {
			t.Errorf("%s %s %s: status %d body %s, want 400 VALIDATION_ERROR", c.method, c.path, c.body, r.status, r.raw)
		}
	}
	capAfter := a.do("GET", "/v1/capacity", tokenA, "")
	// The ledger's figures, read at once (a scheduled reconcile pass may
	// recount the states meanwhile).
	ledger := func(body map[string]any) []any {
		return []any{body["limit"], body["used"], body["granted"], body["paused"], body["draining"]}
	}
	if !reflect.DeepEqual(ledger(capAfter.body), ledger(capBefore.body)) {
		t.Errorf("capacity changed by rejected requests: %s -> %s", capBefore.raw, capAfter.raw)
	}
	if r := a.do("GET", "/v1/sandboxes/"+replaced.id, tokenA, ""); r.status != 200 || str(r.body, "state") != "active" {
		t.Errorf("sandbox after rejected requests: %d %s, want 200 active", r.status, r.raw)
	}

	// 10. a reconcile pass (as the schedule runs it) leaves the live, active sandbox alone.
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	stats, err := s.InvokeScheduled(rctx, "reconcile")
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	var st map[string]any
	if err := json.Unmarshal(stats, &st); err != nil || st["errors"] != float64(0) {
		t.Errorf("reconcile stats %s (%v), want JSON with errors 0", stats, err)
	}
	if r := a.do("GET", "/v1/sandboxes/"+replaced.id, tokenA, ""); r.status != 200 || str(r.body, "state") != "active" {
		t.Errorf("sandbox after reconcile: %d %s, want 200 active", r.status, r.raw)
	}
}

// TestStackFileAndShutdown checks .run/stack.json's shape
// and that Close leaves nothing listening, on a stack that starts every
// stand-in itself, as make run's does.
func TestStackFileAndShutdown(t *testing.T) {
	s := startStackWith(t, stackOptions{provider: "e2b", ownDynamoDB: true})
	b, err := os.ReadFile(s.StackFile)
	if err != nil {
		t.Fatalf("read stack file: %v", err)
	}
	var info map[string]any
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatalf("stack file: %v", err)
	}
	shape := map[string][]string{
		"s3":           {"endpoint", "region", "access_key", "secret_key", "bucket", "prefix"},
		"dynamodb":     {"endpoint", "region", "table"},
		"sandbox_host": {"api_url", "envd_url", "api_key"},
		"provisioner":  {"api_url", "api_key"},
		"events":       {"endpoint", "file"},
		"functions":    {"acquire", "status", "release", "sync", "reconcile"},
	}
	if str(info, "api_url") != s.Info.APIURL {
		t.Errorf("api_url = %q, want %q", str(info, "api_url"), s.Info.APIURL)
	}
	if str(info, "provider") != "e2b" {
		t.Errorf("provider = %q, want e2b", str(info, "provider"))
	}
	if toks, _ := info["tokens"].(map[string]any); toks[tenantA] != tokenA || toks[tenantB] != tokenB {
		t.Errorf("tokens = %v", info["tokens"])
	}
	var urls []string
	for obj, keys := range shape {
		for _, k := range keys {
			v := str(info, obj, k)
			if v == "" {
				t.Errorf("stack file lacks %s.%s", obj, k)
			}
			if strings.HasPrefix(v, "http://") {
				if !strings.HasPrefix(v, "http://127.0.0.1:") {
					t.Errorf("%s.%s = %q is not on 127.0.0.1", obj, k, v)
				}
				urls = append(urls, v)
			}
		}
	}
	if fi, err := os.Stat(s.StackFile); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("stack file mode %v (%v), want owner-only (it holds credentials)", fi.Mode(), err)
	}
	urls = append(urls, s.Info.APIURL)
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for _, u := range urls {
		host := strings.TrimPrefix(u, "http://")
		host, _, _ = strings.Cut(host, "/")
		if c, err := net.DialTimeout("tcp", host, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Close", u)
		}
	}
	if _, err := os.Stat(s.StackFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stack file still exists after Close (%v)", err)
	}
}

// TestSharedDynamoDBTableGoesWithTheStack checks that a stack made on the
// test process's DynamoDB Local has a table of its own there, deleted by
// Close.
func TestSharedDynamoDBTableGoesWithTheStack(t *testing.T) {
	s := startStackWith(t, stackOptions{provider: "e2b"})
	info := s.Info.DynamoDB
	if want := testenv.DynamoDB(t).Endpoint; info.Endpoint != want || info.Table == devstack.DefaultTable {
		t.Fatalf("stack's DynamoDB = %+v, want a table of its own on %s", info, want)
	}
	client := testenv.DynamoClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(info.Table)}); err != nil {
		t.Fatalf("DescribeTable before Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(info.Table)})
	var api smithy.APIError
	if !errors.As(err, &api) || api.ErrorCode() != "ResourceNotFoundException" {
		t.Errorf("DescribeTable after Close: %v, want ResourceNotFoundException", err)
	}
}
