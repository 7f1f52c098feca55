package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// releaseOwing acquires a sandbox for thread and releases it with a copy
// that stays incomplete (the syncer keeps deferring) until the test says.
func releaseOwing(t *testing.T, h *harness, thread string) core.Record {
	t.Helper()
	rec := h.acquire(t, key(thread), core.SourceCreated)
	h.sync.set(func(s *fakeSyncer) { s.incomplete = true })
	res, err := h.eng.Release(context.Background(), "acme", rec.SandboxID)
	if err != nil || res.State != string(core.StateWarm) || res.Sync == nil || res.Sync.Complete {
		t.Fatalf("Release = %+v, %v; want parked warm with outputs deferred", res, err)
	}
	return rec
}

// TestReleaseDeferredOutputsCopiedAtOnce: the outputs a release left
// deferred are copied by the next reconcile pass, long before the idle
// timeout, and pass after pass until they are all stored; the sandbox
// stays warm for its thread meanwhile and after.
func TestReleaseDeferredOutputsCopiedAtOnce(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = 30 * time.Minute })
	ctx := context.Background()
	rec := releaseOwing(t, h, "t1")
	h.clock.advance(10 * time.Second)
	st, err := h.eng.Reconcile(ctx)
	if err != nil || h.sync.count(rec.SandboxID) != 2 || st.Deferred < 1 || st.OutputsStored != 0 {
		t.Fatalf("first Reconcile = %+v, %v, passes %d; want a second copy at once, still incomplete", st, err, h.sync.count(rec.SandboxID))
	}
	h.sync.set(func(s *fakeSyncer) { s.incomplete = false })
	h.clock.advance(time.Minute)
	st, err = h.eng.Reconcile(ctx)
	if err != nil || st.OutputsStored != 1 || st.Expired != 0 || h.sync.count(rec.SandboxID) != 3 {
		t.Fatalf("second Reconcile = %+v, %v, passes %d; want the outputs stored, nothing expired", st, err, h.sync.count(rec.SandboxID))
	}
	got, err := h.eng.Get(ctx, "acme", rec.SandboxID)
	if err != nil || got.State != core.StateWarm || got.LeaseOwner != "" || !h.prov.Alive(rec.SandboxID) {
		t.Fatalf("record = %+v, %v; want warm, unleased, running", got, err)
	}
	h.clock.advance(time.Minute)
	if _, err := h.eng.Reconcile(ctx); err != nil || h.sync.count(rec.SandboxID) != 3 {
		t.Errorf("third Reconcile: %v, passes %d; want no copy once the outputs are stored", err, h.sync.count(rec.SandboxID))
	}
}

// TestOwedOutputsOfReclaimedSandboxForgotten: a sandbox its thread took
// back is not copied by reconcile (its next release copies), and its note
// goes.
func TestOwedOutputsOfReclaimedSandboxForgotten(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := releaseOwing(t, h, "t1")
	h.acquire(t, key("t1"), core.SourceReclaimed)
	if _, err := h.eng.Reconcile(ctx); err != nil || h.sync.count(rec.SandboxID) != 1 {
		t.Fatalf("Reconcile: %v, passes %d; want no copy of an active sandbox", err, h.sync.count(rec.SandboxID))
	}
	if owed, err := h.store.OutputsOwed(ctx, 10); err != nil || len(owed) != 0 {
		t.Errorf("owed = %v, %v; want the note forgotten", owed, err)
	}
}

// TestExpiryWaitsForOutputs: an idle-expiring warm sandbox whose outputs
// are not all stored gets its provider timer moved, pass after pass, and
// is destroyed only after a copy stored them all.
func TestExpiryWaitsForOutputs(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = time.Minute })
	ctx := context.Background()
	rec := releaseOwing(t, h, "t1")
	for i := range 3 {
		h.clock.advance(9 * time.Minute)
		st, err := h.eng.Reconcile(ctx)
		if err != nil || st.Expired != 0 || st.TimersExtended != 1 || !h.prov.Alive(rec.SandboxID) {
			t.Fatalf("pass %d = %+v, %v; want the sandbox kept, its timer moved", i, st, err)
		}
		if d := h.prov.Timeout(rec.SandboxID); d != 10*time.Minute {
			t.Fatalf("pass %d: timer %s from now; want 10m", i, d)
		}
		got, _ := h.eng.Get(ctx, "acme", rec.SandboxID)
		if want := h.clock.now().Add(10 * time.Minute); got.State != core.StateWarm || got.ExpiresAt.Before(want.Add(-time.Second)) {
			t.Fatalf("pass %d: record %+v; want warm, ending about %s", i, got, want)
		}
	}
	passes := h.sync.count(rec.SandboxID)
	h.sync.set(func(s *fakeSyncer) {
		s.incomplete = false
		s.hook = func() {
			if !h.prov.Alive(rec.SandboxID) {
				t.Error("a copy ran after the sandbox was destroyed")
			}
		}
	})
	h.clock.advance(time.Minute)
	st, err := h.eng.Reconcile(ctx)
	if err != nil || st.Expired != 1 || st.OutputsAbandoned != 0 || h.prov.Alive(rec.SandboxID) || h.sync.count(rec.SandboxID) != passes+1 {
		t.Fatalf("last pass = %+v, %v; want it destroyed after one complete copy", st, err)
	}
}

// TestExpiryGivesUpOnOutputsPastTheBound: past MaxOutputsWait after its
// idle timeout, a sandbox whose outputs are still owed is destroyed
// anyway, and the pass reports it; its timer never went past the bound.
func TestExpiryGivesUpOnOutputsPastTheBound(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = time.Minute })
	ctx := context.Background()
	rec := releaseOwing(t, h, "t1")
	parked, _ := h.eng.Get(ctx, "acme", rec.SandboxID)
	bound := parked.ParkedAt.Add(time.Minute + core.MaxOutputsWait)
	h.clock.advance(core.MaxOutputsWait - 4*time.Minute)
	if st, err := h.eng.Reconcile(ctx); err != nil || st.TimersExtended != 1 || st.Expired != 0 {
		t.Fatalf("pass before the bound = %+v, %v; want the timer moved", st, err)
	}
	got, _ := h.eng.Get(ctx, "acme", rec.SandboxID)
	if last := bound.Add(core.Settings{IdleTimeout: time.Minute}.ExpiryLead()); got.ExpiresAt.After(last) {
		t.Errorf("end %s; want at most the bound plus the expiry lead, %s", got.ExpiresAt, last)
	}
	h.clock.advance(6 * time.Minute)
	st, err := h.eng.Reconcile(ctx)
	if err != nil || st.Expired != 1 || st.OutputsAbandoned != 1 || h.prov.Alive(rec.SandboxID) {
		t.Fatalf("pass past the bound = %+v, %v, alive %v; want it destroyed and reported", st, err, h.prov.Alive(rec.SandboxID))
	}
}
