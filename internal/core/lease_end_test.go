package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// A lease that ends without renewal or release is taken back by the next
// reconcile pass: its outputs are copied while the sandbox still runs,
// then it is destroyed as provider_timeout, lost by its thread, and the
// thread's next acquire names it.
func TestEndedLeaseTakenBackOutputsFirst(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, func(s *core.Settings) { s.ActiveTimeout = 10 * time.Minute; s.MaxLifetime = 0 }, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	aliveAtCopy := false
	h.sync.set(func(s *fakeSyncer) { s.hook = func() { aliveAtCopy = h.prov.Alive(rec.SandboxID) } })
	h.clock.advance(10*time.Minute - time.Second)
	if st := h.reconcile(t); st.LeasesEnded != 0 || h.state(t, rec.SandboxID).State != core.StateActive {
		t.Fatalf("a second before its end the sandbox was taken back (stats %+v)", st)
	}
	h.clock.advance(2 * time.Second)
	if st := h.reconcile(t); st.LeasesEnded != 1 {
		t.Errorf("pass stats leases_ended = %d, want 1", st.LeasesEnded)
	}
	if h.sync.count(rec.SandboxID) != 1 || !aliveAtCopy {
		t.Errorf("outputs copied %d times, sandbox alive at the copy: %v; want one copy before the kill",
			h.sync.count(rec.SandboxID), aliveAtCopy)
	}
	if h.prov.Alive(rec.SandboxID) {
		t.Errorf("the sandbox still runs after its lease was taken back")
	}
	lostAndReplaced(t, h, log, rec, core.EventReasonProviderTimeout)
}

// A renewed lease is not taken back at its earlier end.
func TestRenewedLeaseNotTakenBack(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.ActiveTimeout = 10 * time.Minute; s.MaxLifetime = 0 })
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(8 * time.Minute)
	if _, err := h.eng.Renew(context.Background(), "acme", rec.SandboxID, 10*time.Minute); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	h.clock.advance(5 * time.Minute)
	if st := h.reconcile(t); st.LeasesEnded != 0 || h.sync.count(rec.SandboxID) != 0 {
		t.Errorf("stats %+v, copies %d; want the renewed sandbox left alone", st, h.sync.count(rec.SandboxID))
	}
	if got := h.state(t, rec.SandboxID); got.State != core.StateActive || got.LeaseOwner != "" || !h.prov.Alive(rec.SandboxID) {
		t.Errorf("renewed record %s (lease %q), alive %v; want active, unleased, running", got.State, got.LeaseOwner, h.prov.Alive(rec.SandboxID))
	}
}

// An ended lease whose copy is incomplete is left to the next pass while
// its provider's timer has time left, then destroyed anyway.
func TestEndedLeaseIncompleteCopyWaitsThenAbandons(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.ActiveTimeout = 10 * time.Minute; s.MaxLifetime = 0 })
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.sync.set(func(s *fakeSyncer) { s.incomplete = true })
	h.clock.advance(10*time.Minute + time.Second)
	if st := h.reconcile(t); st.LeasesEnded != 0 || st.Deferred == 0 {
		t.Fatalf("stats %+v; want the take-back deferred for its outputs", st)
	}
	if got := h.state(t, rec.SandboxID); got.State != core.StateActive || got.LeaseOwner != "" {
		t.Fatalf("deferred record %s (lease %q); want active, unleased", got.State, got.LeaseOwner)
	}
	h.clock.advance(core.TimerMargin / 2)
	if st := h.reconcile(t); st.LeasesEnded != 1 || st.OutputsAbandoned != 1 {
		t.Errorf("stats %+v; want the sandbox taken back, its outputs abandoned", st)
	}
	if got := h.state(t, rec.SandboxID); got.State != core.StateGone || got.EndReason != core.EventReasonProviderTimeout {
		t.Errorf("record %s/%q; want gone, provider_timeout", got.State, got.EndReason)
	}
}

// A lease that ended at the sandbox's lifetime bound is taken back as
// max_lifetime.
func TestLeaseEndedAtMaxLifetime(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, func(s *core.Settings) { s.ActiveTimeout = time.Hour; s.MaxLifetime = 90 * time.Minute }, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(50 * time.Minute)
	if _, err := h.eng.Renew(context.Background(), "acme", rec.SandboxID, time.Hour); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	h.clock.advance(40*time.Minute + time.Second)
	h.reconcile(t)
	lostAndReplaced(t, h, log, rec, core.EventReasonMaxLifetime)
}

// A renewal that comes while the pass copies an ended lease's outputs
// wins: the sandbox is not killed and stays the thread's.
func TestRenewalDuringTakeBackWins(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.ActiveTimeout = 10 * time.Minute; s.MaxLifetime = 0 })
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	var renewErr error
	h.sync.set(func(s *fakeSyncer) {
		s.hook = func() { _, renewErr = h.eng.Renew(context.Background(), "acme", rec.SandboxID, 10*time.Minute) }
	})
	h.clock.advance(10*time.Minute + time.Second)
	st := h.reconcile(t)
	if renewErr != nil {
		t.Fatalf("Renew during the copy: %v", renewErr)
	}
	if st.LeasesEnded != 0 || st.Errors != 0 || !h.prov.Alive(rec.SandboxID) {
		t.Errorf("stats %+v, alive %v; want the renewed sandbox kept, no error", st, h.prov.Alive(rec.SandboxID))
	}
	if got := h.state(t, rec.SandboxID); got.State != core.StateActive || got.ExpiresAt.Before(h.clock.now()) {
		t.Errorf("record %s ending %s; want active, ending after now", got.State, got.ExpiresAt)
	}
}
