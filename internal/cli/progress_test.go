package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncAPI answers POST /v1/sandboxes/sb1/sync with bodies in turn (the last
// one repeats). Before answering it calls hold, if set.
type syncAPI struct {
	mu     sync.Mutex
	bodies []string
	calls  int
	hold   func()
}

func (f *syncAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/sandboxes/sb1/sync" {
		w.WriteHeader(404)
		io.WriteString(w, `{"error":{"code":"SANDBOX_NOT_FOUND","message":"sandbox not found"}}`)
		return
	}
	if f.hold != nil {
		f.hold()
	}
	f.mu.Lock()
	body := f.bodies[min(f.calls, len(f.bodies)-1)]
	f.calls++
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, body)
}

func runSync(t *testing.T, api *syncAPI, stderr io.Writer, args ...string) (int, string) {
	t.Helper()
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	writeStack(t, dir, `{"api_url":"`+srv.URL+`","tokens":{"dev":"dev-token"}}`)
	var out bytes.Buffer
	a := &App{Stdout: &out, Stderr: stderr, Getenv: envOf(nil), Dir: dir}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return a.Run(ctx, append([]string{"sync", "sb1"}, args...)), out.String()
}

const (
	passPartial = `{"uploaded":2,"skipped":1,"deferred":[{"path":"outputs/c","reason":"deadline"},{"path":"outputs/d","reason":"deadline"}],"bytes":20,"complete":false}`
	passDone    = `{"uploaded":2,"skipped":3,"deferred":[],"bytes":30,"complete":true}`
	passStuck   = `{"uploaded":0,"skipped":5,"deferred":[{"path":"outputs/huge","reason":"file_too_large"}],"bytes":0,"complete":false}`
)

func TestSyncUntilComplete(t *testing.T) {
	tests := []struct {
		name       string
		bodies     []string
		args       []string
		wantCalls  int
		wantStdout []string
		wantStderr []string
		wantCode   int
	}{
		{"one pass by default", []string{passPartial, passDone}, nil, 1,
			[]string{"synced sb1: 2 uploaded (20 bytes), 1 unchanged, 2 deferred, INCOMPLETE", "deferred outputs/c: deadline"}, nil, 0},
		{"until complete", []string{passPartial, passDone}, []string{"--until-complete"}, 2,
			[]string{"synced sb1 in 2 passes: 4 uploaded (50 bytes), 3 unchanged, 0 deferred, complete"},
			[]string{"pass 1: 2 uploaded (20 bytes), 1 unchanged, 2 deferred, INCOMPLETE in ", "pass 2: 2 uploaded (30 bytes)"}, 0},
		{"stops when a pass makes no progress", []string{passPartial, passStuck}, []string{"--until-complete"}, 2,
			[]string{"synced sb1 in 2 passes: 2 uploaded (20 bytes), 5 unchanged, 1 deferred, INCOMPLETE", "deferred outputs/huge: file_too_large"}, nil, 0},
		{"max passes", []string{passPartial}, []string{"--until-complete", "--max-passes", "3"}, 3,
			[]string{"synced sb1 in 3 passes: 6 uploaded (60 bytes)"}, nil, 0},
		{"bad progress mode", []string{passDone}, []string{"--progress", "sometimes"}, 0, nil, []string{"--progress must be auto, always or never"}, ExitUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &syncAPI{bodies: tt.bodies}
			var errb bytes.Buffer
			code, out := runSync(t, api, &errb, tt.args...)
			if code != tt.wantCode || api.calls != tt.wantCalls {
				t.Fatalf("exit %d after %d passes, want %d after %d (stderr %q)", code, api.calls, tt.wantCode, tt.wantCalls, errb.String())
			}
			for _, s := range tt.wantStdout {
				if !strings.Contains(out, s) {
					t.Errorf("stdout = %q, want %q in it", out, s)
				}
			}
			for _, s := range tt.wantStderr {
				if !strings.Contains(errb.String(), s) {
					t.Errorf("stderr = %q, want %q in it", errb.String(), s)
				}
			}
			if strings.Contains(errb.String(), "\r") {
				t.Errorf("stderr %q has spinner output; stderr is not a terminal", errb.String())
			}
		})
	}
}

func TestSyncUntilCompleteJSONReportsTotals(t *testing.T) {
	api := &syncAPI{bodies: []string{passPartial, passDone}}
	code, out := runSync(t, api, io.Discard, "--until-complete", "--json")
	var got struct {
		Uploaded int   `json:"uploaded"`
		Bytes    int64 `json:"bytes"`
		Complete bool  `json:"complete"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
		t.Fatalf("exit %d, stdout %q: %v", code, out, err)
	}
	if got.Uploaded != 4 || got.Bytes != 50 || !got.Complete {
		t.Errorf("JSON = %+v, want 4 uploaded, 50 bytes, complete", got)
	}
}

// signalWriter is a goroutine-safe buffer that closes seen once the text
// written so far contains want.
type signalWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// While a pass runs, --progress always draws a spinner with the label
// and elapsed time; it is cleared before the pass line.
func TestSyncProgressSpinner(t *testing.T) {
	errw := &signalWriter{want: "syncing sb1 (pass 1) ", seen: make(chan struct{})}
	// The broker answers only once the spinner is on screen.
	api := &syncAPI{bodies: []string{passDone}, hold: func() {
		select {
		case <-errw.seen:
		case <-time.After(10 * time.Second):
		}
	}}
	code, out := runSync(t, api, errw, "--progress", "always", "--until-complete")
	if code != 0 || !strings.Contains(out, "synced sb1: 2 uploaded") {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	select {
	case <-errw.seen:
	default:
		t.Fatalf("stderr %q: no spinner while the pass ran", errw.String())
	}
	got := errw.String()
	if !strings.Contains(got, "\r\x1b[K|") {
		t.Errorf("stderr %q: want a spinner frame", got)
	}
	if i, j := strings.LastIndex(got, "\r\x1b[K"), strings.Index(got, "pass 1: 2 uploaded"); j < 0 || i > j {
		t.Errorf("stderr %q: want the spinner line cleared before the pass line", got)
	}
}

func TestElapsed(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1500 * time.Millisecond: "1.5s",
		59 * time.Second:        "59.0s",
		125 * time.Second:       "2m05s",
	} {
		if got := elapsed(d); got != want {
			t.Errorf("elapsed(%s) = %q, want %q", d, got, want)
		}
	}
}
