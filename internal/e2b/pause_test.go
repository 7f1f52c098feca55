package e2b

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// stateReply is a reply of the fake control plane.
type stateReply struct {
	status int
	body   string
}

var (
	readsPaused  = stateReply{200, `{"sandboxID":"sbx1","state":"paused"}`}
	readsRunning = stateReply{200, `{"sandboxID":"sbx1","state":"running"}`}
	readsGone    = stateReply{404, `{"code":404,"message":"sandbox not found"}`}
	readFails    = stateReply{500, `{"code":500,"message":"db down"}`}
)

// pauseFake answers the call under test with call and GET
// /sandboxes/sbx1 with read, and records the last call's path and body.
func pauseFake(t *testing.T, call, read stateReply) (srv *httptest.Server, path, body *string) {
	t.Helper()
	var p, b string
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reply := call
		if r.Method == http.MethodGet {
			reply = read
		} else {
			raw, _ := io.ReadAll(r.Body)
			p, b = r.URL.Path, string(raw)
		}
		w.WriteHeader(reply.status)
		io.WriteString(w, reply.body)
	}))
	t.Cleanup(srv.Close)
	return srv, &p, &b
}

// outcome is how a call's error is classified.
type outcome string

const (
	applied   outcome = "nil"
	gone      outcome = "gone"
	certain   outcome = "certain"
	ambiguous outcome = "ambiguous"
)

func classify(err error) outcome {
	var pe *core.ProviderError
	switch {
	case err == nil:
		return applied
	case errors.Is(err, core.ErrSandboxGone):
		return gone
	case core.IsAmbiguous(err):
		return ambiguous
	case errors.As(err, &pe):
		return certain
	}
	return outcome("unclassified: " + err.Error())
}

func TestPauseClassifiesReplies(t *testing.T) {
	tests := []struct {
		name string
		call stateReply
		read stateReply // the state read that settles a 409
		want outcome
	}{
		{"paused", stateReply{204, ``}, readsRunning, applied},
		{"not found", stateReply{404, `{"code":404,"message":"sandbox not found"}`}, readsGone, gone},
		{"router 404", stateReply{404, `404 page not found`}, readsGone, certain},
		{"409 already paused", stateReply{409, `{"code":409,"message":"already paused"}`}, readsPaused, applied},
		{"409 in another transition", stateReply{409, `{"code":409,"message":"cannot be paused while in 'snapshotting' state"}`}, readsRunning, ambiguous},
		{"409 then gone", stateReply{409, `{"code":409,"message":"x"}`}, readsGone, gone},
		{"409 then read fails", stateReply{409, `{"code":409,"message":"x"}`}, readFails, ambiguous},
		{"bad request", stateReply{400, `{"code":400,"message":"Invalid sandbox ID"}`}, readsRunning, certain},
		{"unauthorized", stateReply{401, `{"code":401,"message":"Invalid API key"}`}, readsRunning, certain},
		{"rate limited", stateReply{429, `{"code":429,"message":"slow down"}`}, readsRunning, ambiguous},
		{"server error", stateReply{500, `{"code":500,"message":"Error pausing sandbox"}`}, readsRunning, ambiguous},
		{"busy", stateReply{503, `{"code":503,"message":"busy"}`}, readsRunning, ambiguous},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, path, body := pauseFake(t, tt.call, tt.read)
			err := newTestClient(t, srv.URL, "", nil).Pause(context.Background(), "sbx1")
			if got := classify(err); got != tt.want {
				t.Errorf("Pause = %v: %s, want %s", err, got, tt.want)
			}
			if *path != "/sandboxes/sbx1/pause" || *body != `{}` {
				t.Errorf("Pause sent POST %s %s, want /sandboxes/sbx1/pause {}", *path, *body)
			}
		})
	}
}

func TestResumeClassifiesReplies(t *testing.T) {
	tests := []struct {
		name string
		call stateReply
		want outcome
	}{
		{"was running", stateReply{200, `{"sandboxID":"sbx1","envdVersion":"0.6.4"}`}, applied},
		{"resumed", stateReply{201, `{"sandboxID":"sbx1","envdVersion":"0.6.4"}`}, applied},
		{"not found", stateReply{404, `{"code":404,"message":"Paused sandbox sbx1 not found"}`}, gone},
		{"being killed", stateReply{409, `{"code":409,"message":"sandbox is being killed"}`}, certain},
		{"bad request", stateReply{400, `{"code":400,"message":"Timeout cannot be greater than 24 hours"}`}, certain},
		{"forbidden", stateReply{403, `{"code":403,"message":"nope"}`}, certain},
		{"rate limited", stateReply{429, `{"code":429,"message":"slow down"}`}, ambiguous},
		{"server error", stateReply{500, `{"code":500,"message":"Error when resuming"}`}, ambiguous},
		{"gateway timeout", stateReply{504, `upstream timed out`}, ambiguous},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, path, body := pauseFake(t, tt.call, readsRunning)
			err := newTestClient(t, srv.URL, "", nil).Resume(context.Background(), "sbx1", 1500*time.Millisecond)
			if got := classify(err); got != tt.want {
				t.Errorf("Resume = %v: %s, want %s", err, got, tt.want)
			}
			if *path != "/v2/sandboxes/sbx1/connect" || *body != `{"timeout":2}` {
				t.Errorf("Resume sent POST %s %s, want /v2/sandboxes/sbx1/connect {\"timeout\":2}", *path, *body)
			}
		})
	}

	srv, _, body := pauseFake(t, stateReply{201, `{}`}, readsRunning)
	if err := newTestClient(t, srv.URL, "", nil).Resume(context.Background(), "sbx1", 0); err != nil || *body != `{}` {
		t.Errorf("Resume without a timeout = %v, sent %s, want nil and {} (the API's default)", err, *body)
	}
}

func TestPauseAndResumeTimeOutAmbiguously(t *testing.T) {
	hung := hungServer(t)
	c := newTestClient(t, hung.URL, "", func(o *Options) { o.Timeouts.Pause = 100 * time.Millisecond })
	for name, call := range map[string]func() error{
		"Pause":  func() error { return c.Pause(context.Background(), "sbx1") },
		"Resume": func() error { return c.Resume(context.Background(), "sbx1", time.Minute) },
	} {
		if err := call(); !core.IsAmbiguous(err) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s against a hung API = %v, want ambiguous DeadlineExceeded", name, err)
		}
	}
	for name, call := range map[string]func() error{
		"Pause":  func() error { return c.Pause(context.Background(), "../x") },
		"Resume": func() error { return c.Resume(context.Background(), "", time.Minute) },
	} {
		var ve *core.ValidationError
		if err := call(); !errors.As(err, &ve) {
			t.Errorf("%s with a bad id = %v, want a *core.ValidationError (nothing sent)", name, err)
		}
	}
}

func TestSetTimeoutOfPausedSandboxIsNotGone(t *testing.T) {
	notFound := stateReply{404, `{"code":404,"message":"sandbox not found"}`}
	tests := []struct {
		name string
		read stateReply
		want outcome
	}{
		{"paused", readsPaused, certain},
		{"gone", readsGone, gone},
		{"running again", readsRunning, ambiguous},
		{"read fails", readFails, ambiguous},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _, _ := pauseFake(t, notFound, tt.read)
			err := newTestClient(t, srv.URL, "", nil).SetTimeout(context.Background(), "sbx1", time.Minute)
			if got := classify(err); got != tt.want {
				t.Errorf("SetTimeout answered 404, sandbox %s: %v: %s, want %s", tt.name, err, got, tt.want)
			}
		})
	}
}

func TestCapabilitiesDeclarePause(t *testing.T) {
	c := newTestClient(t, "http://127.0.0.1:1", "", nil)
	if got := c.Capabilities().Pause; got != core.Pauser(c) {
		t.Errorf("Capabilities().Pause = %v, want the client", got)
	}
}

func TestEnvdRefusalOfPausedSandboxIsCertain(t *testing.T) {
	// E2B's edge answers every envd call to a paused sandbox so.
	envdSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"sandboxId":"sbx1","message":"The sandbox is paused","code":409,"canAutoResume":false}`)
	}))
	defer envdSrv.Close()
	c := newTestClient(t, goneControlPlane(t, false).URL, envdSrv.URL, nil)
	ctx, ref := context.Background(), refAt(envdSrv.URL)
	for name, call := range map[string]func() error{
		"Run": func() error { _, err := c.Run(ctx, ref, core.Command{Script: "true"}); return err },
		"OpenFile": func() error {
			rc, err := c.OpenFile(ctx, ref, "/home/user/x", 0)
			if rc != nil {
				rc.Close()
			}
			return err
		},
		"WriteFile": func() error { return c.WriteFile(ctx, ref, "/home/user/x", nil) },
	} {
		err := call()
		var pe *core.ProviderError
		if got := classify(err); got != certain || !errors.As(err, &pe) || pe.StatusCode != http.StatusConflict {
			t.Errorf("%s on a paused sandbox = %v: %s, want a certain ProviderError with status 409", name, err, got)
		}
	}
}
