package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// expiringEnds returns the ends the sandbox.expiring events of sandbox id
// carry, in publish order.
func (l *eventLog) expiringEnds(id string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Time
	for _, ev := range l.events {
		if ev.SandboxID == id && ev.Kind == core.EventExpiring && ev.ExpiresAt != nil {
			out = append(out, *ev.ExpiresAt)
		}
	}
	return out
}

// Reconcile sends sandbox.expiring once per lease end, within the lead
// before it: not earlier, not again on the next pass, and again for the
// end a renewal moved it to.
func TestExpiringSentOncePerEnd(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, func(s *core.Settings) {
		s.ActiveTimeout = 10 * time.Minute
		s.MaxLifetime = 0
	}, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(8 * time.Minute)
	h.reconcile(t)
	if n := log.count(rec.SandboxID, core.EventExpiring); n != 0 {
		t.Fatalf("expiring sent %d times 2 minutes before the end; want none before the 60 s lead", n)
	}
	h.clock.advance(90 * time.Second)
	if st := h.reconcile(t); st.ExpiringSent != 1 {
		t.Errorf("pass stats expiring_sent = %d, want 1", st.ExpiringSent)
	}
	h.reconcile(t)
	ends := log.expiringEnds(rec.SandboxID)
	if len(ends) != 1 || !ends[0].Equal(rec.ExpiresAt.Truncate(time.Millisecond)) {
		t.Fatalf("expiring ends = %v; want one, %s", ends, rec.ExpiresAt)
	}
	renewed, err := h.eng.Renew(context.Background(), "acme", rec.SandboxID, 5*time.Minute)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	h.clock.advance(4*time.Minute + 30*time.Second)
	h.reconcile(t)
	h.reconcile(t)
	if ends := log.expiringEnds(rec.SandboxID); len(ends) != 2 || !ends[1].Equal(renewed.ExpiresAt) {
		t.Errorf("expiring ends after the renewal = %v; want a second one for %s", ends, renewed.ExpiresAt)
	}
}

// A released sandbox, and a lead of 0, send no sandbox.expiring.
func TestExpiringNotSentForReleasedOrDisabled(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, func(s *core.Settings) { s.ActiveTimeout = 10 * time.Minute }, core.WithEventSink(log))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.clock.advance(9*time.Minute + 30*time.Second)
	h.reconcile(t)
	if n := log.count(rec.SandboxID, core.EventExpiring); n != 0 {
		t.Errorf("expiring sent for a released sandbox")
	}
	off := &eventLog{}
	h2 := newHarness(t, func(s *core.Settings) { s.ActiveTimeout = 10 * time.Minute; s.ExpiringLead = 0 }, core.WithEventSink(off))
	rec2 := h2.acquire(t, key("t1"), core.SourceCreated)
	h2.clock.advance(9*time.Minute + 30*time.Second)
	h2.reconcile(t)
	if n := off.count(rec2.SandboxID, core.EventExpiring); n != 0 {
		t.Errorf("expiring sent with a lead of 0")
	}
}

// During a provider outage a deployment full of warm sandboxes answers
// ErrProviderUnavailable (503), not a capacity refusal: the eviction's
// kill was not confirmed, so its slot stays held.
func TestFullOfWarmDuringOutageIsProviderUnavailable(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	outage := &core.ProviderError{Op: "kill", StatusCode: 503, Message: "unavailable", Ambiguous: true}
	h.prov.Set(func(p *coretest.FakeProvider) { p.KillErr, p.InfoErr, p.CreateErr = outage, outage, outage })
	_, err := h.eng.Acquire(context.Background(), key("t2"))
	var ce *core.CapacityError
	if !errors.Is(err, core.ErrProviderUnavailable) || errors.As(err, &ce) {
		t.Fatalf("acquire during the outage = %v; want ErrProviderUnavailable, not a capacity refusal", err)
	}
	if used := h.capacity(t).Used; used != 1 {
		t.Errorf("used = %d; want the tombstone still holding its slot", used)
	}
}

// A deployment full of active sandboxes is a capacity refusal, outage or
// not: nothing could be evicted.
func TestFullOfActiveIsCapacity(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	h.acquire(t, key("t1"), core.SourceCreated)
	outage := &core.ProviderError{Op: "kill", StatusCode: 503, Message: "unavailable", Ambiguous: true}
	h.prov.Set(func(p *coretest.FakeProvider) { p.KillErr, p.InfoErr = outage, outage })
	_, err := h.eng.Acquire(context.Background(), key("t2"))
	var ce *core.CapacityError
	if !errors.As(err, &ce) || errors.Is(err, core.ErrProviderUnavailable) {
		t.Fatalf("acquire of a full deployment = %v; want a capacity refusal", err)
	}
}
