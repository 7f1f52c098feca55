package e2e

import (
	"path/filepath"
	"testing"
	"time"
)

// TestPoolClaimStartsARefill runs the stack as `make run` does with a pool
// of one: the stack's first reconcile pass fills it, a new thread's first
// acquire claims the member (source pool), and the claim's asynchronous
// invocation of the reconcile function (through the local Lambda Invoke
// API) refills the pool, the schedule (a minute) aside.
func TestPoolClaimStartsARefill(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, stackOptions{provider: "e2b", env: []string{
		"SANDBOX_REPLICAS=3", "SANDBOX_OVERFLOW_POLICY=reject", "SANDBOX_POOL_SIZE=1", "LOG_LEVEL=DEBUG",
	}})
	a := newAPI(t, s)
	r := a.acquire(tokenA, "alice", "pool-1")
	want(t, "first acquire", r, 200)
	if src := str(r.body, "source"); src != "pool" {
		t.Fatalf("first acquire source = %q, want pool (body %s)", src, r.raw)
	}
	c := connOf(r)
	if out, code := run(t, c, "test -d \"$HOME/outputs\" && echo ready"); code != 0 || out != "ready\n" {
		t.Errorf("claimed member: %q exit %d, want a bootstrapped sandbox", out, code)
	}
	// The refill event reaches the reconcile function as its own
	// invocation: its handler logs "pool refill invocation" (a scheduled pass logs
	// "reconcile pass"). Waiting for the line is bounded by the test's
	// own deadline, not a timed assertion.
	deadline := time.Now().Add(2 * time.Minute)
	for !refilled(t, s.Info.LogDir) {
		if time.Now().After(deadline) {
			t.Fatal("no pool refill invocation logged after the claim")
		}
		time.Sleep(200 * time.Millisecond)
	}
	r = a.acquire(tokenA, "alice", "pool-2")
	want(t, "second thread's acquire", r, 200)
	if src := str(r.body, "source"); src != "pool" {
		t.Errorf("second thread's acquire source = %q, want pool (the refilled member)", src)
	}
}

// refilled reports whether a function log holds a refill invocation that
// created a member.
func refilled(t *testing.T, logDir string) bool {
	t.Helper()
	found := false
	eachLogLine(t, filepath.Join(logDir, "fn-reconcile-*.log"), func(_, _ string, line map[string]any) bool {
		created, _ := line["created"].(float64)
		found = line["msg"] == "pool refill invocation" && created >= 1
		return !found
	})
	return found
}
