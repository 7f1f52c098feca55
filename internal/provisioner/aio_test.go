package provisioner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// aioFixture is a scripted AIO sandbox plus a provisioner that reports the
// sandbox alive (or gone).
func aioFixture(t *testing.T, gone bool, aio http.Handler) (*Client, core.SandboxRef) {
	t.Helper()
	f := newFakeProv(t)
	f.set(func() {
		if gone {
			f.get = func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }
		} else {
			f.get = reply200(map[string]any{"sandbox_id": "abc123", "sandbox_url": "http://x", "status": "Running"})
		}
	})
	srv := httptest.NewServer(aio)
	t.Cleanup(srv.Close)
	c := newClient(t, f.srv.URL, func(o *Options) { o.Timeouts.Ready = 200 * time.Millisecond })
	return c, core.SandboxRef{ID: "abc123", Endpoint: core.Endpoint{Protocol: core.ProtocolAIO, URL: srv.URL + "/", AccessToken: "tok"}}
}

func TestRunReplies(t *testing.T) {
	exec := func(v any, status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/bash/exec" {
				http.NotFound(w, r)
				return
			}
			replyJSON(status, v)(w, r)
		}
	}
	tests := []struct {
		name    string
		gone    bool
		handler http.HandlerFunc
		check   func(t *testing.T, res core.CommandResult, err error)
	}{
		{"completed non-zero exit is no error", false, exec(map[string]any{"success": true, "data": map[string]any{
			"session_id": "s", "command_id": "c", "command": "x", "status": "completed", "stdout": "out", "stderr": "err", "exit_code": 3}}, 200),
			func(t *testing.T, res core.CommandResult, err error) {
				if err != nil || res.ExitCode != 3 || string(res.Stdout) != "out" || string(res.Stderr) != "err" {
					t.Errorf("Run = %+v, %v", res, err)
				}
			}},
		{"timed out", false, exec(map[string]any{"success": true, "data": map[string]any{"status": "timed_out", "stdout": "partial"}}, 200),
			func(t *testing.T, res core.CommandResult, err error) {
				if !errors.Is(err, ErrCommandTimeout) || !errors.Is(err, context.DeadlineExceeded) || string(res.Stdout) != "partial" {
					t.Errorf("Run = %+v, %v; want ErrCommandTimeout with partial output", res, err)
				}
			}},
		{"killed is ambiguous", false, exec(map[string]any{"success": true, "data": map[string]any{"status": "killed"}}, 200),
			func(t *testing.T, _ core.CommandResult, err error) {
				if err == nil || !core.IsAmbiguous(err) {
					t.Errorf("Run = %v, want ambiguous", err)
				}
			}},
		{"success false inside 200", false, exec(map[string]any{"success": false, "message": "nope",
			"data": map[string]any{"error_type": "permission_denied", "message": "denied"}}, 200),
			func(t *testing.T, _ core.CommandResult, err error) {
				var pe *core.ProviderError
				if !errors.As(err, &pe) || !strings.Contains(err.Error(), "permission_denied") || core.IsAmbiguous(err) {
					t.Errorf("Run = %v, want a certain error naming permission_denied", err)
				}
			}},
		{"404 from a live sandbox: image too old", false, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) },
			func(t *testing.T, _ core.CommandResult, err error) {
				if !errors.Is(err, ErrImageTooOld) || core.IsAmbiguous(err) {
					t.Errorf("Run = %v, want certain ErrImageTooOld", err)
				}
			}},
		{"404 from a gone sandbox", true, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) },
			func(t *testing.T, _ core.CommandResult, err error) {
				if !errors.Is(err, core.ErrSandboxGone) {
					t.Errorf("Run = %v, want ErrSandboxGone", err)
				}
			}},
		{"502 from a live sandbox is ambiguous", false, exec(map[string]any{}, 502),
			func(t *testing.T, _ core.CommandResult, err error) {
				if err == nil || errors.Is(err, core.ErrSandboxGone) || !core.IsAmbiguous(err) {
					t.Errorf("Run = %v, want ambiguous, not gone", err)
				}
			}},
		{"malformed reply", false, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>") },
			func(t *testing.T, _ core.CommandResult, err error) {
				if err == nil || !core.IsAmbiguous(err) {
					t.Errorf("Run = %v, want ambiguous", err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ref := aioFixture(t, tt.gone, tt.handler)
			res, err := c.Run(context.Background(), ref, core.Command{Script: "x"})
			tt.check(t, res, err)
		})
	}
}

func TestRunRequest(t *testing.T) {
	var got map[string]any
	var auth string
	c, ref := aioFixture(t, false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Get("Authorization")
		_ = json.NewDecoder(r.Body).Decode(&got)
		reply200(map[string]any{"success": true, "data": map[string]any{"status": "completed", "exit_code": 0}})(w, r)
	}))
	c.opts.Home = "/home/gem"
	if _, err := c.Run(context.Background(), ref, core.Command{Script: "echo $A", Env: map[string]string{"A": "1"}, Timeout: 1500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	env, _ := got["env"].(map[string]any)
	if auth != "Bearer tok" || got["command"] != "echo $A" || env["A"] != "1" || got["exec_dir"] != "/home/gem" ||
		got["hard_timeout"] != float64(2) || got["async_mode"] != false || got["max_output_length"] != float64(0) {
		t.Errorf("request = %v (auth %q)", got, auth)
	}
	if _, err := c.Run(context.Background(), ref, core.Command{Script: "x", Env: map[string]string{"1BAD": "x"}}); err == nil {
		t.Error("Run with a bad env name succeeded")
	}
}

func TestOpenFileReplies(t *testing.T) {
	big := strings.Repeat("x", 1<<16)
	tests := []struct {
		name    string
		gone    bool
		handler http.HandlerFunc
		max     int64
		check   func(t *testing.T, body string, err error)
	}{
		{"streams bytes", false, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("path") != "/a b/c" {
				http.Error(w, "bad path", 400)
				return
			}
			io.WriteString(w, "content")
		}, 0, func(t *testing.T, body string, err error) {
			if err != nil || body != "content" {
				t.Errorf("read %q, %v", body, err)
			}
		}},
		{"cap without content length", false, func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush()
			io.WriteString(w, big)
		}, 10, func(t *testing.T, body string, err error) {
			var tl *core.FileTooLargeError
			if !errors.As(err, &tl) || len(body) > 10 {
				t.Errorf("read %d bytes, %v; want <= 10 and FileTooLargeError", len(body), err)
			}
		}},
		{"missing file", false, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, 0,
			func(t *testing.T, _ string, err error) {
				if !errors.Is(err, core.ErrFileNotFound) {
					t.Errorf("err = %v, want ErrFileNotFound", err)
				}
			}},
		{"gone sandbox", true, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, 0,
			func(t *testing.T, _ string, err error) {
				if !errors.Is(err, core.ErrSandboxGone) {
					t.Errorf("err = %v, want ErrSandboxGone", err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ref := aioFixture(t, tt.gone, tt.handler)
			rc, err := c.OpenFile(context.Background(), ref, "/a b/c", tt.max)
			var body []byte
			if err == nil {
				body, err = io.ReadAll(rc)
				rc.Close()
			}
			tt.check(t, string(body), err)
		})
	}
}

func TestWriteFileFailureInside200(t *testing.T) {
	c, ref := aioFixture(t, false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/bash/exec":
			reply200(map[string]any{"success": true, "data": map[string]any{"status": "completed", "exit_code": 0}})(w, r)
		case "/v1/file/upload":
			_, _ = io.Copy(io.Discard, r.Body)
			reply200(map[string]any{"success": false, "message": "x", "data": map[string]any{
				"path": "/ro/f", "operation": "upload", "message": "read-only", "error_type": "read_only_filesystem"}})(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	err := c.WriteFile(context.Background(), ref, "/ro/f", strings.NewReader("data"))
	if err == nil || !strings.Contains(err.Error(), "read_only_filesystem") || core.IsAmbiguous(err) {
		t.Errorf("WriteFile = %v, want a certain error naming read_only_filesystem", err)
	}
}

func TestWaitReadyDeadline(t *testing.T) {
	c, ref := aioFixture(t, false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	if err := c.WaitReady(context.Background(), ref); !errors.Is(err, ErrNotReady) {
		t.Errorf("WaitReady = %v, want ErrNotReady", err)
	}
}
