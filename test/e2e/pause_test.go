package e2e

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestPauseAtReleaseThenResume runs the stack as `make run` does with
// SANDBOX_PAUSE_AFTER_SECONDS=0 on the local host's E2B face: the release
// pauses the sandbox (its processes frozen, a paused slot instead of the
// running one), and the thread's next acquire resumes it: same sandbox,
// its files and its background process still there, the process running
// again.
func TestPauseAtReleaseThenResume(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, stackOptions{provider: "e2b", env: []string{
		"SANDBOX_REPLICAS=1", "SANDBOX_OVERFLOW_POLICY=reject", "SANDBOX_PAUSE_AFTER_SECONDS=0", "LOG_LEVEL=DEBUG",
	}})
	a := newAPI(t, s)
	r := a.acquire(tokenA, "alice", "parked")
	want(t, "first acquire", r, 200)
	c := connOf(r)
	if out, code := run(t, c, `echo kept > "$HOME/outputs/kept.txt" && echo written`); code != 0 || out != "written\n" {
		t.Fatalf("setup: %q exit %d", out, code)
	}
	// A background process, as an SDK's background command: its stream
	// stays open while it runs.
	background(t, c, `n=0; while :; do n=$((n+1)); echo $n > "$HOME/ticks"; sleep 0.1; done`)
	ticks := func() string {
		out, code := run(t, c, `cat "$HOME/ticks" 2>/dev/null || echo none`)
		if code != 0 {
			t.Fatalf("read ticks: exit %d", code)
		}
		return strings.TrimSpace(out)
	}
	advances := func(step string) {
		t.Helper()
		first := ticks()
		for deadline := time.Now().Add(time.Minute); ticks() == first; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the background process does not run (ticks stay %s)", step, first)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	advances("before the release")

	r = a.do("POST", "/v1/sandboxes/"+c.id+"/release", tokenA, "")
	want(t, "release", r, 200)
	if st := str(r.body, "state"); st != "paused" {
		t.Fatalf("release state = %q, want paused (body %s)", st, r.raw)
	}
	r = a.do("GET", "/v1/capacity", tokenA, "")
	want(t, "capacity while paused", r, 200)
	if used, paused := r.body["used"], r.body["paused"]; used != 0.0 || paused != 1.0 {
		t.Errorf("capacity while paused: used %v, paused %v; want 0 and 1 (body %s)", used, paused, r.raw)
	}
	// Frozen: the agent's envd calls are refused until the resume.
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	resp := startProcess(pctx, t, c, "-c", "true")
	resp.Body.Close()
	pcancel()
	if resp.StatusCode == 200 {
		t.Errorf("a command in the paused sandbox answered 200, want it refused")
	}
	// The one running slot is free: another thread gets a sandbox.
	r = a.acquire(tokenA, "alice", "other")
	want(t, "another thread's acquire while the first is paused", r, 200)
	other := connOf(r)
	r = a.do("POST", "/v1/sandboxes/"+other.id+"/release", tokenA, "")
	want(t, "release of the other thread", r, 200)

	r = a.acquire(tokenA, "alice", "parked")
	want(t, "acquire of the paused thread", r, 200)
	if src, id := str(r.body, "source"), str(r.body, "sandbox_id"); src != "resumed" || id != c.id {
		t.Fatalf("acquire = source %q sandbox %s, want resumed %s (body %s)", src, id, c.id, r.raw)
	}
	c = connOf(r)
	if out, code := run(t, c, `cat "$HOME/outputs/kept.txt"`); code != 0 || out != "kept\n" {
		t.Errorf("file after the resume: %q exit %d, want kept", out, code)
	}
	advances("after the resume")
}

// background starts `bash -c script` in the sandbox through envd and
// leaves its stream open until the end of t (the process runs while it is).
func background(t *testing.T, c conn, script string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp := startProcess(ctx, t, c, "-c", script)
	t.Cleanup(func() {
		cancel()
		resp.Body.Close()
	})
}
