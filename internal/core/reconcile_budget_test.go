package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// parkIdle acquires and releases a sandbox for each thread, then moves the
// clock past the idle timeout (one minute).
func parkIdle(t *testing.T, h *harness, threads ...string) []core.Record {
	t.Helper()
	var recs []core.Record
	for _, th := range threads {
		rec := h.acquire(t, key(th), core.SourceCreated)
		if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); err != nil {
			t.Fatalf("Release: %v", err)
		}
		recs = append(recs, rec)
	}
	h.clock.advance(2 * time.Minute)
	return recs
}

// TestReconcileKeepsUnsyncedSandboxWarm: an idle warm sandbox whose outputs
// are not all in S3 (the sync before expiry failed or was cut short) is not
// destroyed: it stays warm, reclaimable, and the next pass retries; a
// sandbox the provider already ended is cleaned up.
func TestReconcileKeepsUnsyncedSandboxWarm(t *testing.T) {
	tests := []struct {
		name string
		set  func(s *fakeSyncer)
	}{
		{"sync incomplete", func(s *fakeSyncer) { s.incomplete = true }},
		{"sync failed", func(s *fakeSyncer) { s.err = errors.New("s3: slow down") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = time.Minute })
			ctx := context.Background()
			rec := parkIdle(t, h, "t1")[0]
			h.sync.set(tt.set)
			st, _ := h.eng.Reconcile(ctx)
			if st.Expired != 0 || st.Deferred < 1 || !h.prov.Alive(rec.SandboxID) {
				t.Fatalf("Reconcile = %+v, alive %v; want nothing expired, the expiry deferred, the sandbox alive", st, h.prov.Alive(rec.SandboxID))
			}
			got, err := h.eng.Get(ctx, "acme", rec.SandboxID)
			if err != nil || got.State != core.StateWarm || got.LeaseOwner != "" {
				t.Fatalf("record = %+v, %v; want warm without a lease", got, err)
			}
			// The next pass, with the outputs synced, expires it.
			h.sync.set(func(s *fakeSyncer) { s.incomplete, s.err = false, nil })
			st, err = h.eng.Reconcile(ctx)
			if err != nil || st.Expired != 1 || h.prov.Alive(rec.SandboxID) {
				t.Fatalf("second Reconcile = %+v, %v, alive %v; want it expired", st, err, h.prov.Alive(rec.SandboxID))
			}
		})
	}

	t.Run("deferred sandbox is reclaimable", func(t *testing.T) {
		h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = time.Minute })
		rec := parkIdle(t, h, "t1")[0]
		h.sync.set(func(s *fakeSyncer) { s.incomplete = true })
		h.eng.Reconcile(context.Background())
		if got := h.acquire(t, key("t1"), core.SourceReclaimed); got.SandboxID != rec.SandboxID {
			t.Errorf("reclaimed %s, want %s", got.SandboxID, rec.SandboxID)
		}
	})

	t.Run("provider already ended it", func(t *testing.T) {
		h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = time.Minute })
		parkIdle(t, h, "t1")
		h.sync.set(func(s *fakeSyncer) { s.err = core.ErrSandboxGone })
		if st, err := h.eng.Reconcile(context.Background()); err != nil || st.Expired != 1 {
			t.Errorf("Reconcile = %+v, %v; want the gone sandbox expired", st, err)
		}
	})
}

// TestReconcileBoundedByInvocationDeadline: a pass stops starting work
// ReconcileReserve before its context's deadline (the Lambda's), and the
// sync before an expiry ends by then: the sandbox it was on stays warm and
// the others wait for the next pass.
func TestReconcileBoundedByInvocationDeadline(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = time.Minute })
	recs := parkIdle(t, h, "t1", "t2")
	h.sync.set(func(s *fakeSyncer) { s.untilDone, s.passes, s.deadlines = true, nil, nil }) // forget the releases' passes
	deadline := time.Now().Add(core.ReconcileReserve + 500*time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	st, _ := h.eng.Reconcile(ctx)
	if st.Expired != 0 || !st.BudgetExhausted {
		t.Errorf("stats %+v: want nothing expired and the budget exhausted", st)
	}
	h.sync.mu.Lock()
	passes, deadlines := append([]string(nil), h.sync.passes...), append([]time.Time(nil), h.sync.deadlines...)
	h.sync.mu.Unlock()
	if len(passes) != 1 {
		t.Fatalf("sync passes %v, want 1 (the second expiry waits for the next pass)", passes)
	}
	if want := deadline.Add(-core.ReconcileReserve); deadlines[0].IsZero() || deadlines[0].After(want) {
		t.Errorf("sync deadline %v, want by %v", deadlines[0], want)
	}
	for _, rec := range recs {
		if !h.prov.Alive(rec.SandboxID) {
			t.Errorf("%s destroyed", rec.SandboxID)
		}
	}
	if ctx.Err() != nil {
		t.Errorf("the pass ran into the invocation's deadline: %v", ctx.Err())
	}
}

// TestReconcileExpiresBeforeProviderTimer: reconcile expires a warm
// sandbox inside the lead before its provider timeout, while the sandbox
// still runs and its outputs can still be copied, not after the provider
// ended it; before the lead it is left warm.
func TestReconcileExpiresBeforeProviderTimer(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = 10 * time.Minute })
	ctx := context.Background()
	lead := core.Settings{IdleTimeout: 10 * time.Minute}.ExpiryLead()
	if lead <= 0 || lead >= 10*time.Minute {
		t.Fatalf("ExpiryLead = %s, want inside the idle timeout", lead)
	}
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.clock.advance(10*time.Minute - lead - time.Second)
	if st, err := h.eng.Reconcile(ctx); err != nil || st.Expired != 0 {
		t.Fatalf("Reconcile before the lead = %+v, %v; want nothing expired", st, err)
	}
	passes := h.sync.count(rec.SandboxID)
	h.clock.advance(2 * time.Second) // inside the lead, before the provider's timer
	st, err := h.eng.Reconcile(ctx)
	if err != nil || st.Expired != 1 || h.prov.Alive(rec.SandboxID) {
		t.Fatalf("Reconcile inside the lead = %+v, %v, alive %v; want it expired", st, err, h.prov.Alive(rec.SandboxID))
	}
	if got := h.sync.count(rec.SandboxID) - passes; got != 1 {
		t.Errorf("sync passes before expiry = %d, want 1 (the sandbox was still running)", got)
	}
}
