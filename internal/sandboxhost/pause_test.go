package sandboxhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// pauseMode is a way the host freezes a sandbox.
type pauseMode struct {
	name, isolation string
	signals         bool // signals even where the cgroup freezer works
}

// pauseModes are the ways that can be tested here: signals without
// isolation, the cgroup freezer under bubblewrap (where the host can make
// cgroups), and signals under bubblewrap.
func pauseModes() []pauseMode {
	modes := []pauseMode{{"none-signals", IsolationNone, true}}
	if _, err := os.Stat("/usr/bin/bwrap"); err == nil {
		modes = append(modes, pauseMode{"bwrap", IsolationBwrap, false}, pauseMode{"bwrap-signals", IsolationBwrap, true})
	}
	return modes
}

// testClock is a host clock the test moves (Options.Now).
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// startInMode starts a host pausing in mode and creates a sandbox with a
// 600 s timeout in it.
func startInMode(t *testing.T, mode pauseMode) (*Server, e2bapi.Sandbox, envdClient, *sandbox) {
	t.Helper()
	return startInModeAt(t, mode, nil)
}

// startInModeAt is startInMode with the host on clock (time.Now when nil).
func startInModeAt(t *testing.T, mode pauseMode, clock *testClock) (*Server, e2bapi.Sandbox, envdClient, *sandbox) {
	t.Helper()
	opts := Options{Isolation: mode.isolation}
	if clock != nil {
		opts.Now = clock.now
	}
	srv := startHostWith(t, opts)
	srv.Host.mu.Lock()
	srv.Host.signalPause = mode.signals
	srv.Host.mu.Unlock()
	created := createSandbox(t, srv, map[string]any{"timeout": 600})
	sb := srv.Host.mustGet(t, created.SandboxID)
	t.Logf("frozen through the cgroup freezer: %v", srv.Host.cgroupFreezes(sb))
	return srv, created, newEnvd(srv, created), sb
}

// startCounter starts, in a child of a command, a loop that counts up in
// the file counter of the sandbox's home, and waits until it counts. The
// processes carry a unique marker in their command lines; done yields the
// stream's outcome.
func startCounter(t *testing.T, c envdClient, home string) (marker string, done <-chan error) {
	t.Helper()
	marker = fmt.Sprintf("pausecounter%d", time.Now().UnixNano())
	script := ": " + marker + "; (i=0; while :; do i=$((i+1)); echo $i > counter.tmp && mv counter.tmp counter; sleep 0.02; done) & wait"
	out := make(chan error, 1)
	go func() {
		stream, err := c.startStream(context.Background(), &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}})
		if err != nil {
			out <- err
			return
		}
		defer stream.Close()
		for stream.Receive() {
		}
		out <- fmt.Errorf("stream ended: %v", stream.Err())
	}()
	waitFor(t, 20*time.Second, "the counter to count", func() bool { return readCounter(t, home) > 0 })
	return marker, out
}

// readCounter reads the counter file from the host side (0: not yet).
func readCounter(t *testing.T, home string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(home, "counter"))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatalf("read counter: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("counter %q: %v", b, err)
	}
	return n
}

// getSandbox reads GET /sandboxes/{id}.
func getSandbox(t *testing.T, srv *Server, id string) e2bapi.SandboxDetail {
	t.Helper()
	var d e2bapi.SandboxDetail
	if status, _ := apiCall(t, srv, "GET", "/sandboxes/"+id, nil, &d); status != http.StatusOK {
		t.Fatalf("get %s: status %d, want 200", id, status)
	}
	return d
}

// listIDs lists sandbox ids with GET /v2/sandboxes?<query>.
func listIDs(t *testing.T, srv *Server, query string) []string {
	t.Helper()
	var page []e2bapi.ListedSandbox
	if status, _ := apiCall(t, srv, "GET", "/v2/sandboxes?"+query, nil, &page); status != http.StatusOK {
		t.Fatalf("list ?%s: status %d", query, status)
	}
	ids := []string{}
	for _, s := range page {
		ids = append(ids, s.SandboxID)
	}
	return ids
}

// envdStatus is the status and body of an envd request of the sandbox.
func envdStatus(t *testing.T, c envdClient, method, path string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, c.srv.EnvdURL+path, nil)
	c.headers(req.Header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b [4096]byte
	n, _ := resp.Body.Read(b[:])
	return resp.StatusCode, b[:n]
}

func TestPauseFreezesAndConnectResumes(t *testing.T) {
	for _, mode := range pauseModes() {
		t.Run(mode.name, func(t *testing.T) {
			clock := newTestClock()
			srv, created, c, sb := startInModeAt(t, mode, clock)
			id := created.SandboxID
			if err := os.WriteFile(filepath.Join(sb.home, "kept.txt"), []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, done := startCounter(t, c, sb.home)

			if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+id+"/pause", nil, nil); status != http.StatusNoContent {
				t.Fatalf("pause: status %d, want 204", status)
			}
			before := readCounter(t, sb.home)
			d := getSandbox(t, srv, id)
			if d.State != "paused" || !d.EndAt.Equal(clock.now()) {
				t.Errorf("paused sandbox reads state %q ending at %v, want paused, ended at its pause %v", d.State, d.EndAt, clock.now())
			}
			for query, want := range map[string]bool{"state=paused": true, "state=running": false, "": true, "state=running,paused": true} {
				if got := strings.Contains(strings.Join(listIDs(t, srv, query), ","), id); got != want {
					t.Errorf("list ?%s lists the paused sandbox: %v, want %v", query, got, want)
				}
			}

			// envd refuses it as E2B's edge does.
			for _, path := range []string{"/files?path=kept.txt"} {
				status, body := envdStatus(t, c, http.MethodGet, path)
				var reply pausedReply
				if status != http.StatusConflict || json.Unmarshal(body, &reply) != nil || reply.Code != http.StatusConflict || reply.SandboxID != id {
					t.Errorf("GET %s while paused = %d %s, want 409 with E2B's paused reply", path, status, body)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := c.runReq(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "touch ran"}}}); err == nil {
				t.Error("a command started while paused, want it refused")
			}
			if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+id+"/pause", nil, nil); status != http.StatusConflict {
				t.Errorf("second pause: status %d, want 409", status)
			}
			for _, path := range []string{"/timeout", "/refreshes"} {
				if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+id+path, map[string]any{"timeout": 60, "duration": 60}, nil); status != http.StatusNotFound {
					t.Errorf("POST %s while paused: status %d, want 404 (as E2B)", path, status)
				}
			}
			// The loop counts every 20 ms: ten times that without a count.
			for range 10 {
				time.Sleep(20 * time.Millisecond)
				if after := readCounter(t, sb.home); after != before {
					t.Fatalf("counter moved from %d to %d while paused", before, after)
				}
			}
			if _, err := os.Stat(filepath.Join(sb.home, "ran")); err == nil {
				t.Error("the refused command ran")
			}

			var resumed e2bapi.Sandbox
			if status, _ := apiCall(t, srv, "POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 30}, &resumed); status != http.StatusCreated {
				t.Fatalf("connect of the paused sandbox: status %d, want 201", status)
			}
			if resumed.SandboxID != id || resumed.EnvdAccessToken != created.EnvdAccessToken {
				t.Errorf("connect reply %+v, want the same id and access token", resumed)
			}
			d = getSandbox(t, srv, id)
			resumedEnd := clock.now().Add(30 * time.Second)
			if d.State != "running" || !d.EndAt.Equal(resumedEnd) {
				t.Errorf("resumed sandbox reads %q ending at %v, want running, ending at %v (the 30 s asked)", d.State, d.EndAt, resumedEnd)
			}
			waitFor(t, 20*time.Second, "the counter to count again after the resume", func() bool { return readCounter(t, sb.home) > before })
			if res := c.run(t, "cat kept.txt", nil); res.stdout != "kept" {
				t.Errorf("file after the resume = %q, want kept", res.stdout)
			}
			select {
			case err := <-done:
				t.Fatalf("the counting command's stream ended across the pause: %v", err)
			default:
			}

			// Connect of a running sandbox only ever extends its life.
			clock.advance(10 * time.Second)
			if status, _ := apiCall(t, srv, "POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 5}, nil); status != http.StatusOK {
				t.Errorf("connect of a running sandbox: status %d, want 200", status)
			}
			if end := getSandbox(t, srv, id).EndAt; !end.Equal(resumedEnd) {
				t.Errorf("connect with a shorter timeout set the end to %v, want the 30 s end %v kept", end, resumedEnd)
			}
		})
	}
}

func TestKillOfPausedSandbox(t *testing.T) {
	for _, mode := range pauseModes() {
		t.Run(mode.name, func(t *testing.T) {
			srv, created, c, sb := startInMode(t, mode)
			id := created.SandboxID
			marker, done := startCounter(t, c, sb.home)
			if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+id+"/pause", nil, nil); status != http.StatusNoContent {
				t.Fatalf("pause: status %d, want 204", status)
			}
			if status, _ := apiCall(t, srv, "DELETE", "/sandboxes/"+id, nil, nil); status != http.StatusNoContent {
				t.Fatalf("kill of the paused sandbox: status %d, want 204", status)
			}
			// No stopped or frozen process is left behind.
			assertDead(t, srv, c, sb.dir, marker, done)
			if status, _ := apiCall(t, srv, "POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 30}, nil); status != http.StatusNotFound {
				t.Errorf("connect of the killed sandbox: status %d, want 404", status)
			}
			if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+id+"/pause", nil, nil); status != http.StatusNotFound {
				t.Errorf("pause of the killed sandbox: status %d, want 404", status)
			}
		})
	}
}

// TestPausedSandboxOutlivesItsTimeout: the timeout clock stops while
// paused. On the host's injected clock, a sandbox paused with 400 s left
// and kept paused an hour is still there, its kill timer stopped, and a
// connect without a timeout gives it back the 400 s it had left.
func TestPausedSandboxOutlivesItsTimeout(t *testing.T) {
	clock := newTestClock()
	srv := startHostWith(t, Options{Isolation: IsolationNone, Now: clock.now})
	id := createSandbox(t, srv, map[string]any{"timeout": 600}).SandboxID
	clock.advance(200 * time.Second)
	if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+id+"/pause", nil, nil); status != http.StatusNoContent {
		t.Fatalf("pause: status %d, want 204", status)
	}
	if d := getSandbox(t, srv, id); !d.EndAt.Equal(clock.now()) {
		t.Errorf("paused sandbox ends at %v, want its pause time %v", d.EndAt, clock.now())
	}
	sb := srv.Host.mustGet(t, id)
	sb.mu.Lock()
	armed := sb.timer != nil && sb.timer.Stop()
	sb.mu.Unlock()
	if armed {
		t.Error("the paused sandbox's kill timer was still armed")
	}
	clock.advance(time.Hour)
	if d := getSandbox(t, srv, id); d.State != "paused" {
		t.Errorf("paused sandbox an hour past its end reads %q, want paused", d.State)
	}
	if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+id+"/connect", map[string]any{}, nil); status != http.StatusCreated {
		t.Fatalf("connect: status %d, want 201", status)
	}
	if d := getSandbox(t, srv, id); !d.EndAt.Equal(clock.now().Add(400 * time.Second)) {
		t.Errorf("resumed without a timeout, the sandbox ends at %v, want %v (the 400 s it had left)", d.EndAt, clock.now().Add(400*time.Second))
	}
}

func TestPauseRefusesFilesOnlySnapshots(t *testing.T) {
	srv := startHost(t, IsolationNone)
	id := createSandbox(t, srv, nil).SandboxID
	for _, tc := range []struct{ path, name string }{{"/sandboxes/" + id + "/pause", "pause"}, {"/v2/sandboxes/" + id + "/connect", "connect"}} {
		if status, _ := apiCall(t, srv, "POST", tc.path, map[string]any{"memory": false}, nil); status != http.StatusBadRequest {
			t.Errorf("%s {memory: false}: status %d, want 400", tc.name, status)
		}
	}
	if d := getSandbox(t, srv, id); d.State != "running" {
		t.Errorf("after refused calls the sandbox reads %q, want running", d.State)
	}
	if status, _ := apiCall(t, srv, "POST", "/sandboxes/nosuch/pause", nil, nil); status != http.StatusNotFound {
		t.Errorf("pause of an unknown sandbox: status %d, want 404", status)
	}
}

// TestStartRacingPauseIsRefused: a start that passed routing before the
// pause is refused by start itself.
func TestStartRacingPauseIsRefused(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := srv.Host.mustGet(t, createSandbox(t, srv, nil).SandboxID)
	if err := srv.Host.pause(sb); err != nil {
		t.Fatalf("pause: %v", err)
	}
	_, err := srv.Host.start(sb, startSpec{cmd: "/bin/true"})
	if !errors.Is(err, errPaused) {
		t.Errorf("start in a paused sandbox = %v, want errPaused", err)
	}
	if got := connect.CodeOf(startError(err)); got != connect.CodeFailedPrecondition {
		t.Errorf("its Connect code = %v, want failed_precondition", got)
	}
}
