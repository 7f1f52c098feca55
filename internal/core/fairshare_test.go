package core_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/storetest"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

func TestFairShare(t *testing.T) {
	cases := []struct {
		replicas, maxPerTenant, tenants, want int
	}{
		{replicas: 10, tenants: 1, want: 10},
		{replicas: 10, tenants: 0, want: 10},
		{replicas: 10, tenants: 3, want: 4},
		{replicas: 10, tenants: 5, want: 2},
		{replicas: 3, tenants: 7, want: 1},
		{replicas: 10, maxPerTenant: 3, tenants: 2, want: 3},
		{replicas: 10, maxPerTenant: 8, tenants: 2, want: 5},
	}
	for _, c := range cases {
		s := core.DefaultSettings()
		s.Replicas, s.MaxPerTenant = c.replicas, c.maxPerTenant
		if got := s.FairShare(c.tenants); got != c.want {
			t.Errorf("FairShare(limit %d, max per tenant %d, %d tenants) = %d, want %d", c.replicas, c.maxPerTenant, c.tenants, got, c.want)
		}
	}
}

func tenantKey(tenant, thread string) core.ThreadKey {
	return core.ThreadKey{Tenant: tenant, User: "u-" + thread, Thread: thread}
}

// A tenant at or over its fair share evicts only its own tenant's warm
// sandboxes, even when another tenant's was parked longer; a tenant under
// its share may evict any tenant's least recently parked one.
func TestEvictionRespectsFairShare(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 4; s.Policy = core.PolicyReject })
	ctx := context.Background()
	release := func(rec core.Record) {
		t.Helper()
		if _, err := h.eng.Release(ctx, rec.Tenant, rec.SandboxID); err != nil {
			t.Fatalf("Release %s: %v", rec.SandboxID, err)
		}
		h.clock.advance(time.Second) // distinct park times: LRU order is defined
	}
	acmeWarm := h.acquire(t, tenantKey("acme", "a1"), core.SourceCreated)
	release(acmeWarm) // parked first: the least recently parked of the pool
	h.acquire(t, tenantKey("hog", "h1"), core.SourceCreated)
	h.acquire(t, tenantKey("hog", "h2"), core.SourceCreated)
	hogWarm := h.acquire(t, tenantKey("hog", "h3"), core.SourceCreated)
	release(hogWarm)
	// Full: acme 1 (warm), hog 3 (one warm). Two tenants: fair share 2.

	h.acquire(t, tenantKey("hog", "h4"), core.SourceCreated)
	if !h.prov.Alive(acmeWarm.SandboxID) {
		t.Fatal("hog, over its fair share, evicted acme's warm sandbox")
	}
	if h.prov.Alive(hogWarm.SandboxID) {
		t.Error("hog's own warm sandbox was not the one evicted")
	}

	var ce *core.CapacityError
	if _, err := h.eng.Acquire(ctx, tenantKey("hog", "h5")); !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
		t.Fatalf("hog's fifth = %v, want a capacity refusal (only another tenant's warm sandbox is left)", err)
	}
	if !h.prov.Alive(acmeWarm.SandboxID) {
		t.Fatal("a refused acquire of hog evicted acme's warm sandbox")
	}

	// A third tenant holds nothing (share 2 of 4 among three tenants): it
	// may take the least recently parked warm sandbox, acme's.
	h.acquire(t, tenantKey("globex", "g1"), core.SourceCreated)
	if h.prov.Alive(acmeWarm.SandboxID) {
		t.Error("globex, under its fair share, could not evict the least recently parked warm sandbox")
	}
}

// warmListHook is a store that runs hook (once) when an acquire lists the
// warm pool for an eviction.
type warmListHook struct {
	storetest.Store
	ran  atomic.Bool
	hook func()
}

func (s *warmListHook) Sample(ctx context.Context, state core.State, limit int) ([]core.Record, error) {
	if state == core.StateWarm && s.hook != nil && s.ran.CompareAndSwap(false, true) {
		s.hook()
	}
	return s.Store.Sample(ctx, state, limit)
}

// A tenant's count read at an acquire's start may be stale by the time it
// evicts: another acquire of the tenant took a slot meanwhile. The
// eviction of another tenant's warm sandbox still holds to the rule: it
// applies only while the tenant holds fewer slots than its fair share,
// checked with the eviction itself.
func TestEvictionFairShareCheckedWhenEvicting(t *testing.T) {
	prov := coretest.NewFakeProvider()
	store := &warmListHook{}
	h := newHarnessWith(t, prov, func(s *core.Settings) { s.Replicas = 4; s.Policy = core.PolicyReject })
	store.Store = h.store
	s := core.DefaultSettings()
	s.Deployment, s.Replicas, s.Policy = "test", 4, core.PolicyReject
	eng, err := core.New(s, store, prov, h.sync, core.WithClock(h.clock.now))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var acmeWarm []core.Record
	for _, thread := range []string{"a1", "a2", "a3"} {
		rec := h.acquire(t, tenantKey("acme", thread), core.SourceCreated)
		if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
			t.Fatal(err)
		}
		h.clock.advance(time.Second) // distinct park times: a1 is the least recently parked
		acmeWarm = append(acmeWarm, rec)
	}
	h.acquire(t, tenantKey("hog", "h1"), core.SourceCreated)
	// Full: acme 3 warm, hog 1. Two tenants: fair share 2.

	// While hog's acquire of h2 lists the warm pool, its acquire of h3 (which
	// read the same count of 1) evicts a1 and takes the slot: hog holds 2.
	store.hook = func() {
		if _, err := eng.Acquire(ctx, tenantKey("hog", "h3")); err != nil {
			t.Errorf("hog's acquire of h3 (under its fair share): %v", err)
		}
	}
	_, err = eng.Acquire(ctx, tenantKey("hog", "h2"))
	var ce *core.CapacityError
	if !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
		t.Errorf("hog's acquire of h2, at its fair share once h3 got its slot = %v, want a capacity refusal", err)
	}
	for i, rec := range acmeWarm {
		if alive, want := prov.Alive(rec.SandboxID), i > 0; alive != want {
			t.Errorf("acme's warm sandbox a%d alive = %t, want %t (only a1 evicted, for h3)", i+1, alive, want)
		}
	}
}

// SANDBOX_MAX_PER_TENANT refuses a tenant's acquires past its quota
// (tenant_quota, at once even under wait) across its users, evicts
// nothing and creates nothing; concurrent acquires of many users never
// take the tenant past it.
func TestTenantQuotaAcrossUsers(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) {
		s.Replicas, s.MaxPerTenant, s.Policy, s.AcquireTimeout = 20, 3, core.PolicyWait, time.Hour
	})
	ctx := context.Background()
	other := h.acquire(t, tenantKey("globex", "g1"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "globex", other.SandboxID); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ok, quota := 0, 0
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h.eng.Acquire(ctx, tenantKey("acme", fmt.Sprint("t", i)))
			var ce *core.CapacityError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.As(err, &ce) && ce.Reason == api.RefusalTenantQuota:
				quota++
			default:
				t.Errorf("acquire %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if ok != 3 || quota != 9 {
		t.Errorf("acquires: %d served, %d refused tenant_quota; want 3 and 9", ok, quota)
	}
	if !h.prov.Alive(other.SandboxID) {
		t.Error("a tenant at its quota evicted another tenant's warm sandbox")
	}
	if got := h.prov.Count("create"); got != 4 {
		t.Errorf("provider creates = %d, want 4 (nothing created past the quota)", got)
	}
}

// A reconcile pass drops the tenants that hold no slot any more from the
// fair-share tenant sets, so fair shares are divided among those holding
// slots.
func TestReconcileDropsIdleTenantsFromFairShare(t *testing.T) {
	h := newDDBRecHarness(t, nil)
	ctx := context.Background()
	h.acquire(t, "t1") // acme holds a slot
	g := tenantKey("globex", "g1")
	now := h.clock.now()
	if err := h.store.Reserve(ctx, core.Reservation{Token: "res-g", ThreadKey: g, Limit: 50, Now: now, ExpiresAt: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if err := h.store.FreeReservation(ctx, "res-g", g); err != nil {
		t.Fatal(err)
	}
	tenants := func() []string { // as a capacity refusal names them (one slot held)
		t.Helper()
		err := h.store.Reserve(ctx, core.Reservation{Token: "res-probe", ThreadKey: tenantKey("probe", "p"), Limit: 1,
			Now: now, ExpiresAt: now.Add(time.Minute)})
		var ce *core.CapacityError
		if !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
			t.Fatalf("Reserve at the limit = %v, want a capacity refusal", err)
		}
		return ce.Tenants
	}
	if got := len(tenants()); got != 2 {
		t.Fatalf("before the pass the ledger names %d tenants, want 2", got)
	}
	h.pass(t)
	if got := tenants(); len(got) != 1 || got[0] != "acme" {
		t.Errorf("after the pass the ledger names %v, want [acme]", got)
	}
}

// A pause that finds the paused slots full takes one from another tenant
// only when that tenant holds at least two more than the pausing tenant
// (afterwards it still holds no fewer): a tenant cannot pause its way
// into another's share. Otherwise it takes its own tenant's least
// recently paused, or none.
func TestPausedEvictionKeepsToTheTenantsShare(t *testing.T) {
	h := newPauseHarness(t, func(s *core.Settings) { s.MaxPaused = 2 })
	ctx := context.Background()
	parkFor := func(k core.ThreadKey) core.Record {
		t.Helper()
		rec := h.acquire(t, k, core.SourceCreated)
		if _, err := h.eng.Release(ctx, k.Tenant, rec.SandboxID); err != nil {
			t.Fatalf("Release %s: %v", rec.SandboxID, err)
		}
		return rec
	}
	pausePass := func() {
		t.Helper()
		h.clock.advance(301 * time.Second) // past SANDBOX_PAUSE_AFTER_SECONDS's default
		h.reconcile(t)
	}
	recs := map[string]core.Record{}
	// step parks the named threads' sandboxes, runs a pass that pauses
	// them, and checks which sandboxes are then paused (every other one
	// parked so far is destroyed).
	step := func(name string, park []core.ThreadKey, paused ...string) {
		t.Helper()
		for _, k := range park {
			recs[k.Thread] = parkFor(k)
		}
		pausePass()
		for thread, rec := range recs {
			want := slices.Contains(paused, thread)
			if got := h.prov.Paused(rec.SandboxID); got != want {
				t.Errorf("%s: %s paused %v, want %v", name, thread, got, want)
			}
			if !want && h.prov.Alive(rec.SandboxID) {
				t.Errorf("%s: %s alive, want destroyed", name, thread)
			}
		}
	}
	step("acme pauses two", []core.ThreadKey{tenantKey("acme", "a1"), tenantKey("acme", "a2")}, "a1", "a2")
	step("beta, holding none, takes acme's least recently paused", []core.ThreadKey{tenantKey("beta", "b1")}, "a2", "b1")
	step("beta, holding one as acme does, takes its own", []core.ThreadKey{tenantKey("beta", "b2")}, "a2", "b2")
	step("acme, holding one as beta does, takes its own", []core.ThreadKey{tenantKey("acme", "a3")}, "b2", "a3")
	held, err := h.store.TenantsPaused(ctx, []string{"acme", "beta"})
	if err != nil || held["acme"] != 1 || held["beta"] != 1 {
		t.Errorf("paused counts = %v, %v; want acme 1, beta 1", held, err)
	}
}
