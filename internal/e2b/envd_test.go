package e2b

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// fakeEnvd is an envd whose process.Process/Start is a real connect-go
// handler (JSON codec) running script.
type fakeEnvd struct {
	script func(ctx context.Context, req *connect.Request[envd.StartRequest], s *connect.ServerStream[envd.StartResponse]) error
	mu     sync.Mutex
	header http.Header
	msg    *envd.StartRequest
	killed atomic.Uint32 // pid of the last SendSignal
}

func (f *fakeEnvd) start(ctx context.Context, req *connect.Request[envd.StartRequest], s *connect.ServerStream[envd.StartResponse]) error {
	f.mu.Lock()
	f.header, f.msg = req.Header().Clone(), req.Msg
	f.mu.Unlock()
	return f.script(ctx, req, s)
}

func (f *fakeEnvd) signal(_ context.Context, req *connect.Request[envd.SendSignalRequest]) (*connect.Response[envd.Empty], error) {
	if req.Msg.Signal.Name == envd.SignalKill {
		f.killed.Store(uint32(req.Msg.Process.Pid))
	}
	return connect.NewResponse(&envd.Empty{}), nil
}

func (f *fakeEnvd) serve(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/process.Process/Start", connect.NewServerStreamHandler("/process.Process/Start", f.start, connect.WithCodec(envd.Codec{})))
	mux.Handle("/process.Process/SendSignal", connect.NewUnaryHandler("/process.Process/SendSignal", f.signal, connect.WithCodec(envd.Codec{})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func send(s *connect.ServerStream[envd.StartResponse], ev envd.ProcessEvent) error {
	return s.Send(&envd.StartResponse{Event: ev})
}

func exitWith(code int32) *envd.EndEvent {
	return &envd.EndEvent{ExitCode: code, Exited: true, Status: "exit status " + strconv.Itoa(int(code))}
}

// goneControlPlane answers GET /sandboxes/{id}: 404 when gone, else running.
func goneControlPlane(t *testing.T, gone bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gone {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"code":404,"message":"sandbox not found"}`)
			return
		}
		io.WriteString(w, `{"sandboxID":"sbx1","state":"running","startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T01:00:00Z"}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

var testRef = core.SandboxRef{ID: "sbx1", Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, AccessToken: "tok"}}

func refAt(url string) core.SandboxRef { r := testRef; r.Endpoint.URL = url; return r }

func TestRunCollectsOutputAndExitCode(t *testing.T) {
	f := &fakeEnvd{script: func(ctx context.Context, req *connect.Request[envd.StartRequest], s *connect.ServerStream[envd.StartResponse]) error {
		_ = send(s, envd.ProcessEvent{Start: &envd.StartEvent{Pid: 42}})
		_ = send(s, envd.ProcessEvent{Data: &envd.DataEvent{Stdout: []byte("hello ")}})
		_ = send(s, envd.ProcessEvent{Keepalive: &struct{}{}})
		_ = send(s, envd.ProcessEvent{Data: &envd.DataEvent{Stderr: []byte("warn")}})
		_ = send(s, envd.ProcessEvent{Data: &envd.DataEvent{Stdout: []byte("world")}})
		return send(s, envd.ProcessEvent{End: exitWith(3)})
	}}
	srv := f.serve(t)
	c := newTestClient(t, "http://127.0.0.1:9", "", nil)
	res, err := c.Run(context.Background(), refAt(srv.URL), core.Command{
		Script: `echo "$TOK"`, Env: map[string]string{"TOK": "secret-v"}, Cwd: "/home/user", Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if string(res.Stdout) != "hello world" || string(res.Stderr) != "warn" || res.ExitCode != 3 {
		t.Errorf("result = %q / %q / %d, want hello world / warn / 3", res.Stdout, res.Stderr, res.ExitCode)
	}
	h, m := f.header, f.msg
	for k, want := range map[string]string{
		"E2b-Sandbox-Id": "sbx1", "E2b-Sandbox-Port": "49983", "X-Access-Token": "tok",
		"Connect-Protocol-Version": "1", "Content-Type": "application/connect+json", "Connect-Timeout-Ms": "5000",
	} {
		if got := h.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("header %s = %q, want [%q]", k, got, want)
		}
	}
	if h.Get("X-API-Key") != "" {
		t.Errorf("envd call carried the API key")
	}
	if m.Process.Cmd != "/bin/bash" || strings.Join(m.Process.Args, "|") != `-l|-c|echo "$TOK"` || m.Process.Envs["TOK"] != "secret-v" || m.Process.Cwd != "/home/user" {
		t.Errorf("start request = %+v, want bash -l -c script with envs and cwd", m.Process)
	}
}

func TestRunRejectsBadEnvKeyBeforeAnyCall(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	defer srv.Close()
	c := newTestClient(t, srv.URL, srv.URL, nil)
	for _, key := range []string{"X;rm -rf /;Y", "1A", "A-B", "", "A B"} {
		_, err := c.Run(context.Background(), refAt(srv.URL), core.Command{Script: "true", Env: map[string]string{key: "v"}})
		var ve *core.ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("Run with env key %q = %v, want *core.ValidationError", key, err)
		}
	}
	if calls.Load() != 0 {
		t.Errorf("calls = %d, want 0: validation must precede any request", calls.Load())
	}
}

func TestRunWithoutEndEventIsAnError(t *testing.T) {
	f := &fakeEnvd{script: func(ctx context.Context, req *connect.Request[envd.StartRequest], s *connect.ServerStream[envd.StartResponse]) error {
		_ = send(s, envd.ProcessEvent{Start: &envd.StartEvent{Pid: 1}})
		return send(s, envd.ProcessEvent{Data: &envd.DataEvent{Stdout: []byte("partial")}})
	}}
	srv := f.serve(t)
	c := newTestClient(t, "http://127.0.0.1:9", "", nil)
	res, err := c.Run(context.Background(), refAt(srv.URL), core.Command{Script: "x"})
	if err == nil || !core.IsAmbiguous(err) || !strings.Contains(err.Error(), "end event") {
		t.Errorf("Run without end event = %v, want an ambiguous error about the end event", err)
	}
	if string(res.Stdout) != "partial" {
		t.Errorf("partial stdout = %q, want partial", res.Stdout)
	}
}

// envelope frames one Connect streaming message.
func envelope(flags byte, payload string) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

func TestRunWithoutEndStreamEnvelopeIsAnError(t *testing.T) {
	// A hand-written server: an end event but no end-stream envelope (E2B's
	// SDK fails such a stream too).
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write(envelope(0, `{"event":{"start":{"pid":7}}}`))
		w.Write(envelope(0, `{"event":{"end":{"exitCode":0,"exited":true}}}`))
	}))
	defer srv.Close()
	c := newTestClient(t, "http://127.0.0.1:9", "", nil)
	if _, err := c.Run(context.Background(), refAt(srv.URL), core.Command{Script: "x"}); err == nil {
		t.Errorf("Run on a stream without end-stream envelope = nil error, want an error")
	}
}

func TestRunParsesLenientJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write(envelope(0, `{"event":{"start":{"pid":7,"extra":1}},"unknown":true}`))
		w.Write(envelope(0, `{"event":{"data":{"stdout":"aGk="}}}`))
		w.Write(envelope(0, `{"event":{"end":{"exit_code":5,"exited":true,"status":"exit status 5"}}}`))
		w.Write(envelope(2, `{}`))
	}))
	defer srv.Close()
	c := newTestClient(t, "http://127.0.0.1:9", "", nil)
	res, err := c.Run(context.Background(), refAt(srv.URL), core.Command{Script: "x"})
	if err != nil || string(res.Stdout) != "hi" || res.ExitCode != 5 {
		t.Errorf("Run = %+v, %v; want stdout hi, exit 5", res, err)
	}
}

func TestRunSandboxGone(t *testing.T) {
	status := func(code int) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(code)
			io.WriteString(w, "sandbox not running")
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	unavailable := &fakeEnvd{script: func(context.Context, *connect.Request[envd.StartRequest], *connect.ServerStream[envd.StartResponse]) error {
		return connect.NewError(connect.CodeUnavailable, errors.New("sandbox is gone"))
	}}
	unavailableSrv := unavailable.serve(t)
	tests := []struct {
		name     string
		envd     string
		cpGone   bool
		wantGone bool
	}{
		{"502 is gone without asking", status(502).URL, false, true},
		{"503 confirmed gone", status(503).URL, true, true},
		{"503 but running", status(503).URL, false, false},
		{"unavailable confirmed gone", unavailableSrv.URL, true, true},
		{"unavailable but running", unavailableSrv.URL, false, false},
		{"500 is not gone", status(500).URL, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, goneControlPlane(t, tt.cpGone).URL, "", nil)
			_, err := c.Run(context.Background(), refAt(tt.envd), core.Command{Script: "x"})
			if err == nil {
				t.Fatal("Run = nil error, want an error")
			}
			if got := errors.Is(err, core.ErrSandboxGone); got != tt.wantGone {
				t.Errorf("err = %v, gone = %v, want %v", err, got, tt.wantGone)
			}
		})
	}
}

func TestRunUnauthenticatedIsCertain(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer srv.Close()
	c := newTestClient(t, "http://127.0.0.1:9", "", nil)
	_, err := c.Run(context.Background(), refAt(srv.URL), core.Command{Script: "x"})
	var pe *core.ProviderError
	if !errors.As(err, &pe) || pe.Ambiguous || !strings.Contains(err.Error(), "access token") {
		t.Errorf("Run with a refused token = %v, want a non-ambiguous ProviderError about the access token", err)
	}
}

func TestRunTimeout(t *testing.T) {
	// envd enforces Connect-Timeout-Ms (a connect-go handler ends the stream
	// with deadline_exceeded).
	enforcing := &fakeEnvd{script: func(ctx context.Context, req *connect.Request[envd.StartRequest], s *connect.ServerStream[envd.StartResponse]) error {
		_ = send(s, envd.ProcessEvent{Start: &envd.StartEvent{Pid: 99}})
		_ = send(s, envd.ProcessEvent{Data: &envd.DataEvent{Stdout: []byte("so far")}})
		<-ctx.Done()
		return ctx.Err()
	}}
	// envd ignores its deadline: the client gives up after timeout + margin.
	ignoring := &fakeEnvd{}
	mux := http.NewServeMux()
	mux.Handle("/process.Process/SendSignal", connect.NewUnaryHandler("/process.Process/SendSignal", ignoring.signal, connect.WithCodec(envd.Codec{})))
	mux.HandleFunc("/process.Process/Start", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write(envelope(0, `{"event":{"start":{"pid":99}}}`))
		w.Write(envelope(0, `{"event":{"data":{"stdout":"c28gZmFy"}}}`))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ignoringSrv := httptest.NewServer(mux)
	defer ignoringSrv.Close()

	tests := []struct {
		name string
		url  string
		f    *fakeEnvd
	}{
		{"envd enforces the deadline", enforcing.serve(t).URL, enforcing},
		{"client margin", ignoringSrv.URL, ignoring},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, "http://127.0.0.1:9", "", func(o *Options) { o.Timeouts.CommandMargin = 300 * time.Millisecond })
			start := time.Now()
			res, err := c.Run(context.Background(), refAt(tt.url), core.Command{Script: "sleep 100", Timeout: 200 * time.Millisecond})
			if elapsed := time.Since(start); elapsed < 200*time.Millisecond || elapsed > 5*time.Second {
				t.Errorf("Run took %s, want between the timeout and timeout+margin (plus slack)", elapsed)
			}
			if !errors.Is(err, ErrCommandTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Run past its timeout = %v, want ErrCommandTimeout and DeadlineExceeded", err)
			}
			if string(res.Stdout) != "so far" {
				t.Errorf("partial stdout = %q, want so far", res.Stdout)
			}
			if got := tt.f.killed.Load(); got != 99 {
				t.Errorf("SIGKILL sent to pid %d, want 99", got)
			}
		})
	}
}

func TestRunHonoursCallerContext(t *testing.T) {
	hung := hungServer(t)
	c := newTestClient(t, "http://127.0.0.1:9", "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Run(ctx, refAt(hung.URL), core.Command{Script: "x", Timeout: time.Hour})
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Run took %s, want about 150ms", elapsed)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !core.IsAmbiguous(err) {
		t.Errorf("Run with an expiring ctx = %v, want ambiguous DeadlineExceeded", err)
	}
}

func TestRunKeepsOutputTail(t *testing.T) {
	f := &fakeEnvd{script: func(ctx context.Context, req *connect.Request[envd.StartRequest], s *connect.ServerStream[envd.StartResponse]) error {
		_ = send(s, envd.ProcessEvent{Start: &envd.StartEvent{Pid: 1}})
		for i := range 10 {
			_ = send(s, envd.ProcessEvent{Data: &envd.DataEvent{Stdout: []byte(strconv.Itoa(i) + "abcdefgh")}})
		}
		return send(s, envd.ProcessEvent{End: exitWith(0)})
	}}
	srv := f.serve(t)
	c := newTestClient(t, "http://127.0.0.1:9", "", func(o *Options) { o.MaxOutputBytes = 12 })
	res, err := c.Run(context.Background(), refAt(srv.URL), core.Command{Script: "x"})
	var te *OutputTruncatedError
	if !errors.As(err, &te) || te.Stream != "stdout" || te.Total != 90 || te.Kept != 12 {
		t.Errorf("err = %v, want OutputTruncatedError stdout 12 of 90", err)
	}
	if string(res.Stdout) != "fgh9abcdefgh" {
		t.Errorf("stdout = %q, want the last 12 bytes fgh9abcdefgh", res.Stdout)
	}
}

func TestTailBuffer(t *testing.T) {
	tests := []struct {
		max    int
		writes []string
		want   string
	}{
		{5, []string{"ab", "cd"}, "abcd"},
		{5, []string{"abc", "def"}, "bcdef"},
		{5, []string{"abcdefghij"}, "fghij"},
		{3, []string{"a", "b", "c", "d", "e", "f", "g", "h"}, "fgh"},
	}
	for _, tt := range tests {
		b := tailBuffer{max: tt.max}
		total := 0
		for _, w := range tt.writes {
			b.Write([]byte(w))
			total += len(w)
		}
		if got := string(b.Bytes()); got != tt.want || b.total != int64(total) {
			t.Errorf("tail(%d, %q) = %q total %d, want %q total %d", tt.max, tt.writes, got, b.total, tt.want, total)
		}
	}
}

func TestOpenFileCapsAndClassifies(t *testing.T) {
	payload := bytes.Repeat([]byte("x"), 1000)
	var gotHeader http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHeader = r.Header.Clone()
		switch r.URL.Query().Get("path") {
		case "/home/user/f":
			w.Header().Set("Content-Type", "application/octet-stream")
			// Chunked: no Content-Length, the cap must act while reading.
			for i := 0; i < len(payload); i += 100 {
				w.Write(payload[i : i+100])
				w.(http.Flusher).Flush()
			}
		case "/home/user/sized":
			w.Header().Set("Content-Length", "1000")
			w.Write(payload)
		case "/home/user/missing":
			w.WriteHeader(404)
			io.WriteString(w, `{"code":404,"message":"path not found"}`)
		case "/gone":
			w.WriteHeader(502)
		case "/denied":
			w.WriteHeader(401)
			io.WriteString(w, `{"code":401,"message":"invalid token"}`)
		}
	}))
	defer srv.Close()
	c := newTestClient(t, goneControlPlane(t, false).URL, "", nil)
	ctx := context.Background()
	ref := refAt(srv.URL)

	for _, max := range []int64{0, 1000, 5000} {
		rc, err := c.OpenFile(ctx, ref, "/home/user/f", max)
		if err != nil {
			t.Fatalf("OpenFile(max %d): %v", max, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("read with max %d = %d bytes, %v; want all 1000", max, len(got), err)
		}
	}
	if gotHeader.Get("E2b-Sandbox-Id") != "sbx1" || gotHeader.Get("X-Access-Token") != "tok" || gotHeader.Get("X-API-Key") != "" {
		t.Errorf("file headers = %v, want sandbox id and access token, no API key", gotHeader)
	}

	rc, err := c.OpenFile(ctx, ref, "/home/user/f", 250)
	if err != nil {
		t.Fatalf("OpenFile: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	var tl *core.FileTooLargeError
	if !errors.As(err, &tl) || tl.MaxBytes != 250 || tl.Path != "/home/user/f" || len(got) != 250 {
		t.Errorf("capped read = %d bytes, %v; want exactly 250 bytes then FileTooLargeError", len(got), err)
	}

	if _, err := c.OpenFile(ctx, ref, "/home/user/sized", 999); !errors.As(err, &tl) {
		t.Errorf("OpenFile with Content-Length over the cap = %v, want FileTooLargeError at once", err)
	}
	if _, err := c.OpenFile(ctx, ref, "/home/user/missing", 0); !errors.Is(err, core.ErrFileNotFound) {
		t.Errorf("OpenFile missing = %v, want ErrFileNotFound", err)
	}
	if _, err := c.OpenFile(ctx, ref, "/gone", 0); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("OpenFile on 502 = %v, want ErrSandboxGone", err)
	}
	var pe *core.ProviderError
	if _, err := c.OpenFile(ctx, ref, "/denied", 0); !errors.As(err, &pe) || pe.Ambiguous || !strings.Contains(err.Error(), "access token") {
		t.Errorf("OpenFile on 401 = %v, want a certain ProviderError about the access token", err)
	}
}

func TestOpenFileHeaderTimeout(t *testing.T) {
	hung := hungServer(t)
	c := newTestClient(t, "http://127.0.0.1:9", "", func(o *Options) { o.Timeouts.FileHeader = 100 * time.Millisecond })
	_, err := c.OpenFile(context.Background(), refAt(hung.URL), "/x", 0)
	if !errors.Is(err, context.DeadlineExceeded) || !core.IsAmbiguous(err) {
		t.Errorf("OpenFile on a hung envd = %v, want DeadlineExceeded", err)
	}
}

func TestWriteFileStreamsRawBody(t *testing.T) {
	var got struct {
		path, ctype, encoding string
		body                  []byte
		chunked               bool
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.path, got.ctype = r.URL.Query().Get("path"), r.Header.Get("Content-Type")
		got.chunked = r.ContentLength == -1
		got.body, _ = io.ReadAll(r.Body)
		json.NewEncoder(w).Encode([]map[string]string{{"name": "f", "type": "file", "path": got.path}})
	}))
	defer srv.Close()
	c := newTestClient(t, "http://127.0.0.1:9", "", nil)
	// An io.Reader without a known length must be streamed (chunked).
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("hello "))
		pw.Write([]byte("world"))
		pw.Close()
	}()
	if err := c.WriteFile(context.Background(), refAt(srv.URL), "/home/user/a b&c.txt", pr); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if got.path != "/home/user/a b&c.txt" || got.ctype != "application/octet-stream" || string(got.body) != "hello world" || !got.chunked {
		t.Errorf("upload = %+v, want raw chunked octet-stream of the path", got)
	}
}
