package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// newTimedHarness is newHarness over a fake provider that dates its
// timers on the harness's clock (SandboxInfo.EndAt).
func newTimedHarness(t *testing.T, mutate func(*core.Settings)) *harness {
	t.Helper()
	h := newHarness(t, mutate)
	h.prov.Set(func(f *coretest.FakeProvider) { f.Clock = h.clock.now })
	return h
}

// TestReconcileExtendsATimerEndingUnderALiveLease: an active sandbox
// whose provider timer ends before its end (a renewal written whose
// provider call never came) gets its timer moved TimerMargin past its
// end by the next pass, once; a sandbox whose timer is right, one whose
// end passed, and a paused one are left alone.
func TestReconcileExtendsATimerEndingUnderALiveLease(t *testing.T) {
	h := newTimedHarness(t, nil)
	ctx := context.Background()
	short := h.acquire(t, key("short"), core.SourceCreated)
	h.acquire(t, key("right"), core.SourceCreated)
	h.clock.advance(time.Minute)
	// The record's end moves 3 h ahead, the provider's timer does not.
	got, err := h.store.Renew(ctx, core.Renewal{SandboxID: short.SandboxID, Tenant: "acme", Now: h.clock.now(),
		Until: h.clock.now().Add(3 * time.Hour)})
	if err != nil {
		t.Fatalf("Renew in the store: %v", err)
	}
	st, err := h.eng.Reconcile(ctx)
	if err != nil || st.TimersExtended != 1 {
		t.Fatalf("Reconcile = %+v, %v; want one timer extended", st, err)
	}
	want := got.Record.ExpiresAt.Add(core.TimerMargin).Sub(h.clock.now())
	if d := h.prov.Timeout(short.SandboxID); d < want-time.Second || d > want+time.Second {
		t.Errorf("timer %s from now; want about %s (TimerMargin past the end)", d, want)
	}
	if st, err := h.eng.Reconcile(ctx); err != nil || st.TimersExtended != 0 {
		t.Errorf("second Reconcile = %+v, %v; want no timer extended", st, err)
	}
	// Past the end of both: nothing is extended.
	h.clock.advance(4 * time.Hour)
	if st, err := h.eng.Reconcile(ctx); err != nil || st.TimersExtended != 0 {
		t.Errorf("Reconcile past the ends = %+v, %v; want no timer extended", st, err)
	}
	if m := h.prov.Misuse(); len(m) != 0 {
		t.Errorf("calls on paused sandboxes: %v", m)
	}
}

// TestReconcileLeavesAPausedSandboxsTimer: a paused sandbox listed with
// a timer that ends before its record's end is not touched (moving its
// timer could resume it).
func TestReconcileLeavesAPausedSandboxsTimer(t *testing.T) {
	prov := coretest.NewFakeProvider()
	prov.Pausable = true
	h := newHarnessWith(t, prov, func(s *core.Settings) { s.PauseAfter = core.PauseNever })
	h.prov.Set(func(f *coretest.FakeProvider) { f.Clock = h.clock.now })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.store.Renew(ctx, core.Renewal{SandboxID: rec.SandboxID, Tenant: "acme", Now: h.clock.now(),
		Until: h.clock.now().Add(3 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := prov.Pause(ctx, rec.SandboxID); err != nil {
		t.Fatal(err)
	}
	st, err := h.eng.Reconcile(ctx)
	if err != nil || st.TimersExtended != 0 || len(h.prov.Misuse()) != 0 {
		t.Errorf("Reconcile = %+v, %v, misuse %v; want the paused sandbox's timer left alone", st, err, h.prov.Misuse())
	}
}
