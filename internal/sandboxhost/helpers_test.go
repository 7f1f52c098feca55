package sandboxhost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

const testAPIKey = "test-api-key"

// startHost starts a Server on free loopback ports with a per-test root.
func startHost(t *testing.T, isolation string) *Server {
	t.Helper()
	return startHostWith(t, Options{Isolation: isolation})
}

// startHostWith is startHost with opts (key, root dir and logger filled in).
func startHostWith(t *testing.T, opts Options) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts.APIKey, opts.RootDir = testAPIKey, t.TempDir()
	opts.Logger = slog.New(slog.NewJSONHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := Start(ctx, opts, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		cancel()
	})
	return srv
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// needBwrap skips when bubblewrap is not installed.
func needBwrap(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bubblewrap not installed (apt-get install -y bubblewrap); isolation not testable")
	}
}

// apiCall does a control-plane request with the test key and decodes a
// JSON reply into out (if non-nil and the body is non-empty).
func apiCall(t *testing.T, srv *Server, method, path string, body any, out any) (int, http.Header) {
	t.Helper()
	return apiCallKey(t, srv, testAPIKey, method, path, body, out)
}

func apiCallKey(t *testing.T, srv *Server, key, method, path string, body any, out any) (int, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, srv.APIURL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("x-api-key", key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode, resp.Header
}

// createSandbox creates a sandbox and returns the create reply.
func createSandbox(t *testing.T, srv *Server, body map[string]any) e2bapi.Sandbox {
	t.Helper()
	var got e2bapi.Sandbox
	if status, _ := apiCall(t, srv, "POST", "/sandboxes", body, &got); status != http.StatusCreated {
		t.Fatalf("create: status %d, want 201", status)
	}
	return got
}

// envdClient talks to one sandbox's envd with connect-go and the host's
// JSON codec.
type envdClient struct {
	srv   *Server
	id    string
	token string
}

func newEnvd(srv *Server, sb e2bapi.Sandbox) envdClient {
	return envdClient{srv: srv, id: sb.SandboxID, token: sb.EnvdAccessToken}
}

func (c envdClient) headers(h http.Header) {
	h.Set(envd.HeaderSandboxID, c.id)
	h.Set("E2b-Sandbox-Port", "49983")
	if c.token != "" {
		h.Set(envd.HeaderAccessToken, c.token)
	}
}

// unary calls an envd unary procedure.
func unary[Req, Res any](ctx context.Context, c envdClient, procedure string, msg *Req) (*Res, error) {
	cl := connect.NewClient[Req, Res](http.DefaultClient, c.srv.EnvdURL+procedure, connect.WithCodec(envd.Codec{}))
	req := connect.NewRequest(msg)
	c.headers(req.Header())
	resp, err := cl.CallUnary(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// result is a finished command.
type result struct {
	pid            uint32
	stdout, stderr string
	end            *envd.EndEvent
	events         []envd.ProcessEvent
}

// startStream starts a command and returns the open stream.
func (c envdClient) startStream(ctx context.Context, req *envd.StartRequest) (*connect.ServerStreamForClient[envd.StartResponse], error) {
	cl := connect.NewClient[envd.StartRequest, envd.StartResponse](http.DefaultClient, c.srv.EnvdURL+envd.ProcedureStart, connect.WithCodec(envd.Codec{}))
	creq := connect.NewRequest(req)
	c.headers(creq.Header())
	return cl.CallServerStream(ctx, creq)
}

// run runs a bash script to completion.
func (c envdClient) run(t *testing.T, script string, envs map[string]string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.runReq(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}, Envs: envs}})
	if err != nil {
		t.Fatalf("run %q: %v", script, err)
	}
	return res
}

func (c envdClient) runReq(ctx context.Context, req *envd.StartRequest) (result, error) {
	stream, err := c.startStream(ctx, req)
	if err != nil {
		return result{}, err
	}
	defer stream.Close()
	var res result
	var out, errb bytes.Buffer
	for stream.Receive() {
		ev := stream.Msg().Event
		res.events = append(res.events, ev)
		switch {
		case ev.Start != nil:
			res.pid = ev.Start.Pid
		case ev.Data != nil:
			out.Write(ev.Data.Stdout)
			errb.Write(ev.Data.Stderr)
		case ev.End != nil:
			res.end = ev.End
		}
	}
	res.stdout, res.stderr = out.String(), errb.String()
	if err := stream.Err(); err != nil {
		return res, err
	}
	if res.end == nil {
		return res, errors.New("stream ended without an end event")
	}
	return res, nil
}

// runInBackground starts a bash script and returns a channel closed once
// its stream ended, however it ended: a test may kill the sandbox under
// it, which drops the stream.
func (c envdClient) runInBackground(script string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, _ = c.runReq(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}})
	}()
	return done
}

// files does a GET or POST /files request.
func (c envdClient) files(t *testing.T, method, query string, body io.Reader, hdr map[string]string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.srv.EnvdURL+"/files?"+query, body)
	if err != nil {
		t.Fatal(err)
	}
	c.headers(req.Header)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s /files?%s: %v", method, query, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processGone reports whether pid no longer exists (or is a zombie of
// someone else: reaped processes return ESRCH).
func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// State is the field after the ")" of the command name.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 {
		return s[i+2] == 'Z'
	}
	return false
}
