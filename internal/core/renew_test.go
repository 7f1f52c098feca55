package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// A renewal moves the record's end and the provider's timer together, the
// timer TimerMargin past the end; a second renewal to the same end writes
// nothing and calls nothing.
func TestRenewMovesEndAndTimerOnce(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if got := h.prov.Timeout(rec.SandboxID); got != time.Hour+core.TimerMargin {
		t.Errorf("created sandbox's timer = %s, want its end plus the margin", got)
	}
	h.clock.advance(10 * time.Minute)
	res, err := h.eng.Renew(ctx, "acme", rec.SandboxID, 0)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if !res.ExpiresAt.After(rec.ExpiresAt) || res.ExpiresAt.Sub(h.clock.now()) > time.Hour {
		t.Errorf("renewed end = %s, want an hour from now (was %s)", res.ExpiresAt, rec.ExpiresAt)
	}
	stored, err := h.eng.Get(ctx, "acme", rec.SandboxID)
	if err != nil || !stored.ExpiresAt.Equal(res.ExpiresAt) {
		t.Fatalf("stored end = %s (%v), want %s", stored.ExpiresAt, err, res.ExpiresAt)
	}
	if got := h.prov.Timeout(rec.SandboxID); got <= time.Hour || got > time.Hour+core.TimerMargin {
		t.Errorf("timer after renewal = %s, want past the end by at most the margin", got)
	}
	timeouts := h.prov.Count("timeout")
	again, err := h.eng.Renew(ctx, "acme", rec.SandboxID, 0)
	if err != nil || !again.ExpiresAt.Equal(res.ExpiresAt) {
		t.Fatalf("Renew again = %v, %v; want the same end", again, err)
	}
	if h.prov.Count("timeout") != timeouts {
		t.Errorf("a renewal to the same end called the provider")
	}
	if after, _ := h.eng.Get(ctx, "acme", rec.SandboxID); after.Fence != stored.Fence {
		t.Errorf("a renewal to the same end wrote the record (fence %d, was %d)", after.Fence, stored.Fence)
	}
	short, err := h.eng.Renew(ctx, "acme", rec.SandboxID, time.Minute)
	if err != nil || !short.ExpiresAt.Equal(res.ExpiresAt) {
		t.Errorf("a shorter renewal = %v, %v; want the end unchanged", short, err)
	}
}

// No renewal goes past the maximum lifetime: the end and the timer stop
// there.
func TestRenewStopsAtMaxLifetime(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.MaxLifetime = 2 * time.Hour })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(90 * time.Minute)
	res, err := h.eng.Renew(ctx, "acme", rec.SandboxID, time.Hour)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	bound := rec.CreatedAt.Add(2 * time.Hour)
	if res.ExpiresAt.After(bound) || res.ExpiresAt.Before(bound.Add(-time.Second)) {
		t.Errorf("end = %s, want the lifetime bound %s", res.ExpiresAt, bound)
	}
	if got := h.prov.Timeout(rec.SandboxID); got > bound.Sub(h.clock.now())+time.Second {
		t.Errorf("timer = %s, past the lifetime bound", got)
	}
}

// A renewal refuses bad input, another tenant's sandbox and one that is
// not active, changing nothing.
func TestRenewRefusals(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	var ve *core.ValidationError
	for _, d := range []time.Duration{-time.Second, time.Millisecond, 8 * 24 * time.Hour} {
		if _, err := h.eng.Renew(ctx, "acme", rec.SandboxID, d); !errors.As(err, &ve) {
			t.Errorf("Renew(%s) = %v, want a ValidationError", d, err)
		}
	}
	if _, err := h.eng.Renew(ctx, "acme", "bad/id", 0); !errors.As(err, &ve) {
		t.Errorf("Renew(bad id) = %v, want a ValidationError", err)
	}
	if _, err := h.eng.Renew(ctx, "other", rec.SandboxID, 0); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Renew(another tenant's) = %v, want ErrNotFound", err)
	}
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	timeouts := h.prov.Count("timeout")
	if _, err := h.eng.Renew(ctx, "acme", rec.SandboxID, 0); !errors.Is(err, core.ErrConflict) {
		t.Errorf("Renew(warm) = %v, want ErrConflict", err)
	}
	if h.prov.Count("timeout") != timeouts {
		t.Errorf("a refused renewal called the provider")
	}
}

// A renewal whose provider call fails answers ErrProviderUnavailable and
// leaves the earlier end, so the next renewal moves the timer again.
func TestRenewProviderFailureUndone(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(10 * time.Minute)
	h.prov.Set(func(f *coretest.FakeProvider) {
		f.SetTimeoutErr = &core.ProviderError{Op: "timeout", Message: "outage", Ambiguous: true}
	})
	if _, err := h.eng.Renew(ctx, "acme", rec.SandboxID, 0); !errors.Is(err, core.ErrProviderUnavailable) {
		t.Fatalf("Renew with a failing provider = %v, want ErrProviderUnavailable", err)
	}
	stored, _ := h.eng.Get(ctx, "acme", rec.SandboxID)
	if !stored.ExpiresAt.Equal(rec.ExpiresAt) {
		t.Errorf("end after a failed renewal = %s, want the earlier %s", stored.ExpiresAt, rec.ExpiresAt)
	}
	h.prov.Set(func(f *coretest.FakeProvider) { f.SetTimeoutErr = nil })
	timeouts := h.prov.Count("timeout")
	if _, err := h.eng.Renew(ctx, "acme", rec.SandboxID, 0); err != nil {
		t.Fatalf("Renew after the outage: %v", err)
	}
	if h.prov.Count("timeout") != timeouts+1 {
		t.Errorf("the renewal after a failed one did not move the timer")
	}
}
