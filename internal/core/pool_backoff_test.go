package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// refillFailing is the error of a create the provider certainly refused.
var refillFailing = &core.ProviderError{Op: "create", StatusCode: 400, Message: "template not found"}

// refillOnce runs RefillPool and returns its stats (its error is the
// failed creates', expected here).
func (h *harness) refillOnce(t *testing.T) core.PoolStats {
	t.Helper()
	st, _ := h.eng.RefillPool(context.Background())
	return st
}

// TestPoolRefillBacksOffAfterFailedCreates: a refill whose creates fail
// backs off, doubling with each failure, creates nothing meanwhile, then
// tries one create; a success clears the back-off. GET /v1/capacity and
// the pass's stats show the state, kept in the store between refills.
func TestPoolRefillBacksOffAfterFailedCreates(t *testing.T) {
	h := newPoolHarness(t, 4, func(s *core.Settings) { s.Replicas = 4 })
	ctx := context.Background()
	h.prov.Set(func(f *coretest.FakeProvider) { f.CreateErr = refillFailing })
	st := h.refillOnce(t)
	first := h.prov.Count("create")
	if st.Created != 0 || st.Failed < 1 || first > 4 || st.Backoff.Failures != st.Failed {
		t.Fatalf("first refill = %+v after %d creates; want failures counted, at most 4 creates", st, first)
	}
	wantUntil := h.clock.now().Add(time.Minute << (st.Failed - 1))
	if d := st.Backoff.Until.Sub(wantUntil); d < -time.Second || d > time.Second {
		t.Errorf("backing off until %s; want about %s", st.Backoff.Until, wantUntil)
	}
	capa, err := h.eng.Capacity(ctx)
	if err != nil || capa.PoolRefill == nil || capa.PoolRefill.Failures != st.Failed {
		t.Fatalf("capacity = %+v, %v; want the refill's failures", capa, err)
	}
	// Backing off: nothing is created, by a refill or by a pass.
	if again := h.refillOnce(t); again.Failed != 0 || h.prov.Count("create") != first || again.Backoff.Failures != st.Failed {
		t.Fatalf("refill while backing off = %+v, creates %d; want none", again, h.prov.Count("create"))
	}
	if rs, _ := h.eng.Reconcile(ctx); rs.PoolRefillFailures != st.Failed || h.prov.Count("create") != first {
		t.Fatalf("pass while backing off = %+v, creates %d; want none, the failures reported", rs, h.prov.Count("create"))
	}
	// Past the back-off: one create, failing again, doubles the wait.
	h.clock.advance(time.Minute<<(st.Failed-1) + time.Second)
	next := h.refillOnce(t)
	if h.prov.Count("create") != first+1 || next.Backoff.Failures != st.Failed+1 {
		t.Fatalf("refill after the back-off = %+v, creates %d; want one more create, one more failure", next, h.prov.Count("create"))
	}
	wait := time.Minute << st.Failed
	if d := next.Backoff.Until.Sub(h.clock.now().Add(wait)); d < -time.Second || d > time.Second {
		t.Errorf("backing off until %s; want about %s from now", next.Backoff.Until, wait)
	}
	// The provider recovers: the next refill after the back-off fills
	// the pool and clears the state.
	h.prov.Set(func(f *coretest.FakeProvider) { f.CreateErr = nil })
	h.clock.advance(wait + time.Second)
	if ok := h.refillOnce(t); ok.Created != 4 || ok.Backoff != (core.RefillBackoff{}) {
		t.Fatalf("refill after recovery = %+v; want the pool filled, the back-off cleared", ok)
	}
	if capa, err := h.eng.Capacity(ctx); err != nil || capa.PoolRefill != nil {
		t.Errorf("capacity = %+v, %v; want no refill back-off", capa, err)
	}
}

// TestPoolRefillBackoffIsBounded: however many creates failed, the
// refill waits at most 30 minutes.
func TestPoolRefillBackoffIsBounded(t *testing.T) {
	h := newPoolHarness(t, 1, nil)
	if err := h.store.SetRefillBackoff(context.Background(), core.RefillBackoff{Failures: 40, Until: h.clock.now().Add(-time.Second)}); err != nil {
		t.Fatal(err)
	}
	h.prov.Set(func(f *coretest.FakeProvider) { f.CreateErr = refillFailing })
	st := h.refillOnce(t)
	if want := h.clock.now().Add(30 * time.Minute); st.Backoff.Failures != 41 || st.Backoff.Until.After(want.Add(time.Second)) ||
		st.Backoff.Until.Before(want.Add(-time.Second)) {
		t.Errorf("back-off = %+v; want 41 failures, 30 minutes", st.Backoff)
	}
}
