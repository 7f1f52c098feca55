package core_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// has reports whether the events of sandbox id include want ("kind
// from->to reason").
func (l *eventLog) has(id, want string) bool { return slices.Contains(l.seen(id), want) }

// count is how many events of kind were published for sandbox id.
func (l *eventLog) count(id string, kind core.EventKind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ev := range l.events {
		if ev.SandboxID == id && ev.Kind == kind {
			n++
		}
	}
	return n
}

// lostAndReplaced acquires for t1 after its active sandbox rec vanished
// at the provider, and checks the acquire replaced it naming reason once:
// in the reply's Previous, on the record, in sandbox.lost and
// sandbox.destroyed; the next acquire names nothing.
func lostAndReplaced(t *testing.T, h *harness, log *eventLog, rec core.Record, reason string) {
	t.Helper()
	ctx := context.Background()
	res, err := h.eng.Acquire(ctx, key("t1"))
	if err != nil {
		t.Fatalf("Acquire after the loss: %v", err)
	}
	want := core.Previous{SandboxID: rec.SandboxID, Reason: reason}
	if res.Source != core.SourceCreated || res.Previous == nil || *res.Previous != want {
		t.Fatalf("acquire after the loss = %s, previous %+v; want created, previous %+v", res.Source, res.Previous, want)
	}
	if old, err := h.store.Get(ctx, rec.SandboxID); err != nil || old.State != core.StateGone || old.EndReason != reason {
		t.Errorf("lost record = %s/%q (%v); want gone, end reason %s", old.State, old.EndReason, err, reason)
	}
	if !log.has(rec.SandboxID, "lost active->gone "+reason) || !log.has(rec.SandboxID, "destroyed active->gone "+reason) {
		t.Errorf("events = %v; want lost and destroyed with %s", log.seen(rec.SandboxID), reason)
	}
	again, err := h.eng.Acquire(ctx, key("t1"))
	if err != nil || again.Source != core.SourceReused || again.Previous != nil {
		t.Errorf("the next acquire = %s, previous %+v, %v; want reused, no previous (named once)", again.Source, again.Previous, err)
	}
}

// A sandbox the provider ended before its timer is lost as
// provider_killed, never unresponsive.
func TestLostSandboxKilledAtProvider(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, nil, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(10 * time.Minute)
	h.prov.Drop(rec.SandboxID)
	lostAndReplaced(t, h, log, rec, core.EventReasonProviderKilled)
}

// A sandbox the provider ended after the timer the broker set (its lease
// plus the margin) ran out is lost as provider_timeout.
func TestLostSandboxAtItsTimer(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, nil, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(time.Hour + core.TimerMargin + time.Second)
	h.prov.Drop(rec.SandboxID)
	lostAndReplaced(t, h, log, rec, core.EventReasonProviderTimeout)
}

// A sandbox renewed up to its lifetime bound and ended there is lost as
// max_lifetime.
func TestLostSandboxAtMaxLifetime(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, func(s *core.Settings) { s.MaxLifetime = 2 * time.Hour }, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(90 * time.Minute)
	if _, err := h.eng.Renew(context.Background(), "acme", rec.SandboxID, time.Hour); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	h.clock.advance(31 * time.Minute)
	h.prov.Drop(rec.SandboxID)
	lostAndReplaced(t, h, log, rec, core.EventReasonMaxLifetime)
}

// A sandbox that exists but does not answer is lost as unresponsive.
func TestLostSandboxUnresponsive(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, nil, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	// The probe fails; the copy of its outputs that follows heals the
	// provider, so the sandbox that replaces it answers.
	h.prov.Set(func(p *coretest.FakeProvider) { p.RunErr = errors.New("envd: connection reset") })
	h.sync.set(func(s *fakeSyncer) {
		s.hook = func() { h.prov.Set(func(p *coretest.FakeProvider) { p.RunErr = nil }) }
	})
	if !h.prov.Alive(rec.SandboxID) {
		t.Fatal("sandbox not alive before the probe")
	}
	lostAndReplaced(t, h, log, rec, core.EventReasonUnresponsive)
}

// A sandbox whose probe fails because the provider ended it meanwhile is
// recorded as ended by the provider, not unresponsive.
func TestProbeOfEndedSandboxIsNotUnresponsive(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, nil, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.prov.Set(func(p *coretest.FakeProvider) { p.RunErr = errors.New("envd: 502") })
	h.sync.set(func(s *fakeSyncer) {
		s.hook = func() {
			h.prov.Drop(rec.SandboxID)
			h.prov.Set(func(p *coretest.FakeProvider) { p.RunErr = nil })
		}
	})
	lostAndReplaced(t, h, log, rec, core.EventReasonProviderKilled)
}

// A warm sandbox killed at the provider is destroyed by expiry as
// provider_killed, not idle_expired, and it was not lost (not held).
func TestWarmSandboxKilledAtProviderIsNotIdleExpired(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, nil, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.prov.Drop(rec.SandboxID)
	h.sync.set(func(s *fakeSyncer) { s.err = core.ErrSandboxGone })
	h.clock.advance(29 * time.Minute) // inside the expiry lead, before the idle timer
	h.reconcile(t)
	if old, _ := h.store.Get(context.Background(), rec.SandboxID); old.State != core.StateGone || old.EndReason != core.EventReasonProviderKilled {
		t.Fatalf("record = %s/%q; want gone, provider_killed", old.State, old.EndReason)
	}
	if !log.has(rec.SandboxID, "destroyed warm->gone provider_killed") || log.count(rec.SandboxID, core.EventLost) != 0 {
		t.Errorf("events = %v; want destroyed provider_killed and no lost", log.seen(rec.SandboxID))
	}
	h.sync.set(func(s *fakeSyncer) { s.err = nil })
	res, err := h.eng.Acquire(context.Background(), key("t1"))
	if err != nil || res.Previous == nil || res.Previous.Reason != core.EventReasonProviderKilled {
		t.Errorf("next acquire previous = %+v, %v; want provider_killed", res.Previous, err)
	}
}

// An active sandbox missing from a complete inventory is freed by
// reconcile and lost with the provider's reason.
func TestReconcileFreesLostActiveSandbox(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, nil, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(time.Minute)
	h.prov.Drop(rec.SandboxID)
	if st := h.reconcile(t); st.Dead != 1 {
		t.Fatalf("reconcile dead = %d, want 1", st.Dead)
	}
	if !log.has(rec.SandboxID, "lost active->gone provider_killed") {
		t.Errorf("events = %v; want lost provider_killed", log.seen(rec.SandboxID))
	}
}

// A released sandbox that a kill at release ends names nothing to the
// thread's next acquire: the thread asked for it.
func TestKilledAtReleaseIsNoPrevious(t *testing.T) {
	h := newHarness(t, nil)
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.ReleaseWith(context.Background(), "acme", rec.SandboxID, core.ReleaseOptions{Destroy: true}); err != nil {
		t.Fatalf("ReleaseWith destroy: %v", err)
	}
	res, err := h.eng.Acquire(context.Background(), key("t1"))
	if err != nil || res.Previous != nil {
		t.Errorf("acquire after a kill = previous %+v, %v; want none", res.Previous, err)
	}
}
