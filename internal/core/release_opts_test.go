package core_test

import (
	"context"
	"slices"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// TestReleaseDestroy: a release asked to destroy copies the outputs, then
// kills the sandbox and frees its slot; when the copy is incomplete it
// parks the sandbox warm instead, so the rest is copied before it ends.
func TestReleaseDestroy(t *testing.T) {
	h := newHarness(t, nil)
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	res, err := h.eng.ReleaseWith(context.Background(), "acme", rec.SandboxID, core.ReleaseOptions{Destroy: true})
	if err != nil || res.State != "destroyed" || res.Sync == nil {
		t.Fatalf("ReleaseWith destroy = %+v, %v; want destroyed after a sync", res, err)
	}
	if !slices.Contains(h.prov.Killed(), rec.SandboxID) || h.state(t, rec.SandboxID).State != core.StateGone {
		t.Errorf("sandbox %s not killed and gone (killed %v)", rec.SandboxID, h.prov.Killed())
	}
	if st := h.capacity(t); st.Used != 0 {
		t.Errorf("capacity after destroy = %+v; want no slot used", st)
	}

	h.sync.incomplete = true
	rec = h.acquire(t, key("t2"), core.SourceCreated)
	res, err = h.eng.ReleaseWith(context.Background(), "acme", rec.SandboxID, core.ReleaseOptions{Destroy: true})
	if err != nil || res.State != string(core.StateWarm) {
		t.Fatalf("ReleaseWith destroy, outputs incomplete = %+v, %v; want parked warm", res, err)
	}
}

// TestReleasePause: a release asked to pause parks the sandbox paused at
// once although the deployment pauses idle sandboxes only later; the
// thread's next acquire resumes it.
func TestReleasePause(t *testing.T) {
	h := newPauseHarness(t, nil)
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	res, err := h.eng.ReleaseWith(context.Background(), "acme", rec.SandboxID, core.ReleaseOptions{Pause: true})
	if err != nil || res.State != string(core.StatePaused) || !h.prov.Paused(rec.SandboxID) {
		t.Fatalf("ReleaseWith pause = %+v, %v; want paused at the provider", res, err)
	}
	h.acquire(t, key("t1"), core.SourceResumed)

	plain := h.acquire(t, key("t2"), core.SourceCreated)
	if res, err := h.eng.Release(context.Background(), "acme", plain.SandboxID); err != nil || res.State != string(core.StateWarm) {
		t.Errorf("Release = %+v, %v; want warm (the deployment pauses later)", res, err)
	}
}

// TestSandboxesOfTenant: the engine lists the caller tenant's own
// sandboxes only.
func TestSandboxesOfTenant(t *testing.T) {
	h := newHarness(t, nil)
	a := h.acquire(t, key("t1"), core.SourceCreated)
	h.acquire(t, core.ThreadKey{Tenant: "beta", User: "u", Thread: "t1"}, core.SourceCreated)
	recs, next, err := h.eng.Sandboxes(context.Background(), "acme", "", 10)
	if err != nil || next != "" || len(recs) != 1 || recs[0].SandboxID != a.SandboxID {
		t.Errorf("Sandboxes(acme) = %v, %q, %v; want only %s", recs, next, err, a.SandboxID)
	}
}
