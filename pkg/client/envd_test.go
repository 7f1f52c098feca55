package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

const hostAPIKey = "test-api-key"

// startHost runs the real local sandbox host on loopback.
func startHost(t *testing.T) *sandboxhost.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: hostAPIKey, RootDir: t.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = srv.Close()
	})
	return srv
}

// createSandbox creates a sandbox through the host's E2B API and returns
// its id and connection, as the broker's acquire response would carry them.
func createSandbox(t *testing.T, srv *sandboxhost.Server) (string, client.Connection) {
	t.Helper()
	var out struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	postCreate(t, srv.APIURL+"/sandboxes", hostAPIKey, `{"templateID":"base","timeout":120}`, http.StatusCreated, &out)
	if out.SandboxID == "" {
		t.Fatalf("create sandbox: %+v, want a sandboxID", out)
	}
	return out.SandboxID, client.Connection{EnvdURL: srv.EnvdURL, EnvdAccessToken: out.EnvdAccessToken}
}

// postCreate POSTs the JSON body to u with X-API-Key key (bounded by 30 s),
// fails the test unless the answer has status want, and decodes it into out.
func postCreate(t *testing.T, u, key, body string, want int, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(body))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil || resp.StatusCode != want {
		t.Fatalf("create sandbox: HTTP %d, %+v, %v", resp.StatusCode, out, err)
	}
}

// fileAPI is the file half Envd and AIO share.
type fileAPI interface {
	PutFile(ctx context.Context, p string, r io.Reader) error
	GetFile(ctx context.Context, p string, w io.Writer) (int64, error)
}

// checkFileRoundTrip writes ~1.2 MB of binary data to put and checks that
// get (the same file, named another way) returns exactly those bytes. It
// returns the data written.
func checkFileRoundTrip(t *testing.T, f fileAPI, put, get string) []byte {
	t.Helper()
	ctx := context.Background()
	data := bytes.Repeat([]byte("region,amount\nnorth,10\n\x00\xff"), 50000) // ~1.2 MB, binary-safe
	if err := f.PutFile(ctx, put, bytes.NewReader(data)); err != nil {
		t.Fatalf("PutFile: %v", err)
	}
	var got bytes.Buffer
	n, err := f.GetFile(ctx, get, &got)
	if err != nil {
		t.Fatalf("GetFile: %v", err)
	}
	if n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
		t.Errorf("GetFile returned %d bytes (equal=%v), want the %d bytes written", n, bytes.Equal(got.Bytes(), data), len(data))
	}
	return data
}

var (
	_ fileAPI = (*client.Envd)(nil)
	_ fileAPI = (*client.AIO)(nil)
)

func TestEnvdExecStreamsOutputAndExitCode(t *testing.T) {
	srv := startHost(t)
	id, conn := createSandbox(t, srv)
	e, err := client.NewEnvd(id, conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.PutFile(context.Background(), "sub/marker", strings.NewReader("m")); err != nil {
		t.Fatalf("PutFile: %v", err)
	}
	tests := []struct {
		name       string
		req        client.ExecRequest
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{
			name:       "stdout, stderr and exit code",
			req:        client.ExecRequest{Script: `echo out; echo err >&2; exit 7`},
			wantCode:   7,
			wantStdout: "out\n", wantStderr: "err\n",
		},
		{
			name:       "env values stay out of the command line",
			req:        client.ExecRequest{Script: `printf '%s' "$GREETING"`, Env: map[string]string{"GREETING": "a'b; $(rm -rf /) \"c\""}},
			wantStdout: "a'b; $(rm -rf /) \"c\"",
		},
		{
			name:       "cwd",
			req:        client.ExecRequest{Script: `ls`, Cwd: "/home/user/sub"},
			wantStdout: "marker\n",
		},
		{
			name:       "binary-safe output",
			req:        client.ExecRequest{Script: `printf '\x00\xff\n'`},
			wantStdout: "\x00\xff\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			tt.req.Stdout, tt.req.Stderr = &stdout, &stderr
			code, err := e.Exec(context.Background(), tt.req)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if code != tt.wantCode {
				t.Errorf("exit code = %d, want %d", code, tt.wantCode)
			}
			if stdout.String() != tt.wantStdout {
				t.Errorf("stdout = %q, want %q", stdout.String(), tt.wantStdout)
			}
			if stderr.String() != tt.wantStderr {
				t.Errorf("stderr = %q, want %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

// streamWriter reports the first write on a channel, so a test can see
// output arrive before the process ends.
type streamWriter struct {
	first chan string
}

func (w *streamWriter) Write(p []byte) (int, error) {
	select {
	case w.first <- string(p):
	default:
	}
	return len(p), nil
}

func TestEnvdExecStreamsBeforeTheProcessEnds(t *testing.T) {
	srv := startHost(t)
	id, conn := createSandbox(t, srv)
	e, _ := client.NewEnvd(id, conn, nil)
	w := &streamWriter{first: make(chan string, 1)}
	done := make(chan error, 1)
	go func() {
		// The process waits for a file the test creates after seeing "ready".
		_, err := e.Exec(context.Background(), client.ExecRequest{
			Script: `echo ready; while [ ! -e /home/user/go ]; do sleep 0.05; done; echo done`,
			Stdout: w, Timeout: 30 * time.Second,
		})
		done <- err
	}()
	select {
	case got := <-w.first:
		if got != "ready\n" {
			t.Errorf("first output = %q, want %q", got, "ready\n")
		}
	case err := <-done:
		t.Fatalf("Exec ended before streaming anything: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no output streamed within 20s")
	}
	if err := e.PutFile(context.Background(), "go", strings.NewReader("")); err != nil {
		t.Fatalf("PutFile: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Exec: %v", err)
	}
}

func TestEnvdExecTimeoutKillsTheProcess(t *testing.T) {
	srv := startHost(t)
	id, conn := createSandbox(t, srv)
	e, _ := client.NewEnvd(id, conn, nil)
	start := time.Now()
	_, err := e.Exec(context.Background(), client.ExecRequest{Script: `sleep 3; touch /home/user/survived`, Timeout: 300 * time.Millisecond})
	if !errors.Is(err, client.ErrExecTimeout) {
		t.Fatalf("Exec error = %v, want ErrExecTimeout", err)
	}
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Errorf("Exec took %s, want about 0.3s (well before the command's 3 s)", d)
	}
	// Had the process survived, it would have created the file by now.
	time.Sleep(3500*time.Millisecond - time.Since(start))
	if _, err := e.GetFile(context.Background(), "survived", &bytes.Buffer{}); !errors.Is(err, client.ErrFileNotFound) {
		t.Errorf("GetFile(survived) error = %v, want ErrFileNotFound (the process must be killed)", err)
	}
}

func TestEnvdFilesRoundTrip(t *testing.T) {
	srv := startHost(t)
	id, conn := createSandbox(t, srv)
	e, _ := client.NewEnvd(id, conn, nil)
	ctx := context.Background()
	data := checkFileRoundTrip(t, e, "uploads/sales.csv", "/home/user/uploads/sales.csv")
	// The process sees the uploaded file at the same path.
	var out bytes.Buffer
	if _, err := e.Exec(ctx, client.ExecRequest{Script: `wc -c < /home/user/uploads/sales.csv`, Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out.String()), strconv.Itoa(len(data)); got != want {
		t.Errorf("size seen inside = %q, want %s", got, want)
	}

	if _, err := e.GetFile(ctx, "nope/missing.txt", &bytes.Buffer{}); !errors.Is(err, client.ErrFileNotFound) {
		t.Errorf("GetFile(missing) error = %v, want ErrFileNotFound", err)
	}
}

func TestEnvdRejectsWrongTokenAndUnknownSandbox(t *testing.T) {
	srv := startHost(t)
	id, conn := createSandbox(t, srv)
	ctx := context.Background()

	bad, _ := client.NewEnvd(id, client.Connection{EnvdURL: conn.EnvdURL, EnvdAccessToken: "wrong"}, nil)
	if _, err := bad.Exec(ctx, client.ExecRequest{Script: "true"}); err == nil {
		t.Error("Exec with a wrong token: nil error, want one")
	}
	if err := bad.PutFile(ctx, "x", strings.NewReader("x")); err == nil {
		t.Error("PutFile with a wrong token: nil error, want one")
	}

	// Another sandbox's token tells nothing of an unknown id: refused as
	// unauthenticated, as a wrong token is.
	unknown, _ := client.NewEnvd("doesnotexist", conn, nil)
	if _, err := unknown.Exec(ctx, client.ExecRequest{Script: "true"}); err == nil || errors.Is(err, client.ErrSandboxUnreachable) {
		t.Errorf("Exec on an unknown sandbox: error = %v, want a refusal that is not ErrSandboxUnreachable", err)
	}
	// A sandbox that ended, reached with its own token, is unreachable.
	endedID, endedConn := createSandbox(t, srv)
	deleteSandbox(t, srv.APIURL+"/sandboxes/"+endedID, hostAPIKey)
	ended, _ := client.NewEnvd(endedID, endedConn, nil)
	if _, err := ended.Exec(ctx, client.ExecRequest{Script: "true"}); !errors.Is(err, client.ErrSandboxUnreachable) {
		t.Errorf("Exec on an ended sandbox: error = %v, want ErrSandboxUnreachable", err)
	}
	if _, err := ended.GetFile(ctx, "x", &bytes.Buffer{}); !errors.Is(err, client.ErrSandboxUnreachable) {
		t.Errorf("GetFile on an ended sandbox: error = %v, want ErrSandboxUnreachable", err)
	}
}

// deleteSandbox DELETEs u with X-API-Key key and fails the test unless
// the answer is a 2xx.
func deleteSandbox(t *testing.T, u, key string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, u, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("DELETE %s: %v", u, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("DELETE %s: HTTP %d", u, resp.StatusCode)
	}
}

func TestEnvdRejectsBadEnvKeys(t *testing.T) {
	e, err := client.NewEnvd("sb", client.Connection{EnvdURL: "http://127.0.0.1:1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"", "1X", "A-B", "A B", "A=B"} {
		if _, err := e.Exec(context.Background(), client.ExecRequest{Script: "true", Env: map[string]string{k: "v"}}); err == nil || !strings.Contains(err.Error(), "env key") {
			t.Errorf("Exec with env key %q: error = %v, want an env key error", k, err)
		}
	}
}

func TestResolvePath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"outputs/r.md", "/home/user/outputs/r.md"},
		{"/tmp/x", "/tmp/x"},
		{"a/../b", "/home/user/b"},
		{"/home/user/./x", "/home/user/x"},
	}
	for _, tt := range tests {
		if got := client.ResolvePath(tt.in); got != tt.want {
			t.Errorf("ResolvePath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
