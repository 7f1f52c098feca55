package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// TestTenantQuotaHoldsUnderConcurrentReserves: many goroutines, spread
// over many users of two tenants, reserve at once. SANDBOX_MAX_PER_TENANT
// moves in the same transaction as the slot, so no tenant ever holds more
// than its quota, every refusal says tenant_quota, and the other tenant's
// reservations are not affected. The deployment is never full (100 slots,
// at most 8 held), so a capacity refusal is a take that lost its races for
// the room there was every time it tried: it is tried again.
func TestTenantQuotaHoldsUnderConcurrentReserves(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	const quota, perTenant = 4, 24
	var mu sync.Mutex
	got := map[string]int{}
	reasons := map[api.RefusalReason]int{}
	var wg sync.WaitGroup
	for _, tenant := range []string{"acme", "globex"} {
		for i := range perTenant {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := core.ThreadKey{Tenant: tenant, User: fmt.Sprint("u", i), Thread: "t"}
				var err error
				var ce *core.CapacityError
				for tries := 0; tries == 0 || errors.As(err, &ce) && ce.Reason == api.RefusalCapacity && tries < 10; tries++ {
					err = s.Reserve(ctx, core.Reservation{Token: fmt.Sprintf("res-%s-%d", tenant, i), ThreadKey: k, Limit: 100,
						MaxPerTenant: quota, Now: t0, ExpiresAt: t0.Add(time.Minute)})
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					got[tenant]++
				case errors.As(err, &ce):
					reasons[ce.Reason]++
				default:
					t.Errorf("Reserve(%s): %v", k, err)
				}
			}()
		}
	}
	wg.Wait()
	for _, tenant := range []string{"acme", "globex"} {
		if got[tenant] != quota {
			t.Errorf("tenant %s holds %d slots, want exactly its quota %d", tenant, got[tenant], quota)
		}
	}
	if want := map[api.RefusalReason]int{api.RefusalTenantQuota: 2 * (perTenant - quota)}; len(reasons) != 1 || reasons[api.RefusalTenantQuota] != want[api.RefusalTenantQuota] {
		t.Errorf("refusals = %v, want %v", reasons, want)
	}
	st, err := s.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Used != 2*quota {
		t.Errorf("ledger used = %d, want %d (refused reservations take nothing)", st.Used, 2*quota)
	}
	look, err := s.Lookup(ctx, core.ThreadKey{Tenant: "acme", User: "u0", Thread: "t"}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if look.TenantUsed != quota {
		t.Errorf("lookup: tenant used %d, want %d", look.TenantUsed, quota)
	}
	if tenants := refusalTenants(t, s, 2*quota); !slices.Equal(tenants, []string{"acme", "globex"}) {
		t.Errorf("tenants holding slots = %v, want [acme globex]", tenants)
	}
}

// refusalTenants returns the tenants a capacity refusal names, at limit
// (the slots held).
func refusalTenants(t *testing.T, s *ddbstore.Store, limit int) []string {
	t.Helper()
	err := s.Reserve(context.Background(), core.Reservation{Token: "res-probe", ThreadKey: core.ThreadKey{Tenant: "probe", User: "u", Thread: "t"},
		Limit: limit, Now: t0, ExpiresAt: t0.Add(time.Minute)})
	var ce *core.CapacityError
	if !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
		t.Fatalf("Reserve at limit %d = %v, want a capacity refusal", limit, err)
	}
	return ce.Tenants
}

// TestTenantCountMovesWithEverySlot: reserve, finalize, free and free
// reservation move the tenant's count with the slot; a tenant's freed slot
// can be taken again; the tenant quota is checked after the user quota.
func TestTenantCountMovesWithEverySlot(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	k := func(user string, n int) core.ThreadKey {
		return core.ThreadKey{Tenant: "acme", User: user, Thread: fmt.Sprint("t", n)}
	}
	res := func(tok string, key core.ThreadKey) error {
		return s.Reserve(ctx, core.Reservation{Token: tok, ThreadKey: key, Limit: 10, MaxPerUser: 1, MaxPerTenant: 2,
			Now: t0, ExpiresAt: t0.Add(time.Minute)})
	}
	tenantUsed := func() int {
		t.Helper()
		look, err := s.Lookup(ctx, k("x", 0), 10)
		if err != nil {
			t.Fatal(err)
		}
		return look.TenantUsed
	}
	if err := res("r1", k("alice", 1)); err != nil {
		t.Fatal(err)
	}
	var ce *core.CapacityError
	if err := res("r2", k("alice", 2)); !errors.As(err, &ce) || ce.Reason != api.RefusalUserQuota {
		t.Fatalf("alice's second = %v, want user_quota (checked before the tenant's)", err)
	}
	rec, err := s.Finalize(ctx, "r1", core.Record{SandboxID: "sbx1", ThreadKey: k("alice", 1), State: core.StateActive,
		CreatedAt: t0, UpdatedAt: t0})
	if err != nil {
		t.Fatal(err)
	}
	if err := res("r3", k("bob", 1)); err != nil {
		t.Fatal(err)
	}
	if err := res("r4", k("carol", 1)); !errors.As(err, &ce) || ce.Reason != api.RefusalTenantQuota {
		t.Fatalf("third user's reserve = %v, want tenant_quota", err)
	}
	if n := tenantUsed(); n != 2 {
		t.Errorf("tenant used = %d, want 2", n)
	}
	if err := s.Free(ctx, rec, t0); err != nil {
		t.Fatal(err)
	}
	if n := tenantUsed(); n != 1 {
		t.Errorf("after Free tenant used = %d, want 1", n)
	}
	if err := s.FreeReservation(ctx, "r3", k("bob", 1)); err != nil {
		t.Fatal(err)
	}
	if n := tenantUsed(); n != 0 {
		t.Errorf("after FreeReservation tenant used = %d, want 0", n)
	}
	if err := res("r5", k("carol", 1)); err != nil {
		t.Errorf("reserve after the tenant freed its slots: %v", err)
	}
}

// TestDropIdleTenants: only tenants holding no slot leave the
// fair-share tenant sets.
func TestDropIdleTenants(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	a := core.ThreadKey{Tenant: "acme", User: "u", Thread: "t"}
	g := core.ThreadKey{Tenant: "globex", User: "u", Thread: "t"}
	for _, key := range []core.ThreadKey{a, g} {
		if err := s.Reserve(ctx, core.Reservation{Token: "res-" + key.Tenant, ThreadKey: key, Limit: 10, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FreeReservation(ctx, "res-globex", g); err != nil {
		t.Fatal(err)
	}
	rep, err := s.RepairCounters(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.TenantsDropped, []string{"globex"}) {
		t.Errorf("dropped %v, want [globex]", rep.TenantsDropped)
	}
	if tenants := refusalTenants(t, s, 1); !slices.Equal(tenants, []string{"acme"}) {
		t.Errorf("tenants holding slots = %v, want [acme]", tenants)
	}
}

// TestClaimBelowTenantCount: a claim carrying Below applies only while
// the tenant it names holds fewer slots than Below.Slots (no count yet:
// none held); otherwise it changes nothing and says why, the record's
// own condition first.
func TestClaimBelowTenantCount(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for n := range 2 {
		activeRecord(t, s, core.ThreadKey{Tenant: "acme", User: "u", Thread: fmt.Sprint("a", n)}, fmt.Sprint("acme-", n))
	}
	cases := []struct {
		name  string
		from  core.State
		below core.TenantBelow
		want  error // nil: applied
	}{
		{name: "below", from: core.StateActive, below: core.TenantBelow{Tenant: "acme", Slots: 3}},
		{name: "at", from: core.StateActive, below: core.TenantBelow{Tenant: "acme", Slots: 2}, want: core.ErrAtFairShare},
		{name: "over", from: core.StateActive, below: core.TenantBelow{Tenant: "acme", Slots: 1}, want: core.ErrAtFairShare},
		{name: "no count", from: core.StateActive, below: core.TenantBelow{Tenant: "initech", Slots: 1}},
		{name: "record refuses first", from: core.StateWarm, below: core.TenantBelow{Tenant: "acme", Slots: 1}, want: core.ErrConflict},
	}
	for i, c := range cases {
		id := fmt.Sprint("globex-", i)
		before := activeRecord(t, s, core.ThreadKey{Tenant: "globex", User: "u", Thread: fmt.Sprint("g", i)}, id)
		below := c.below
		got, err := s.Claim(ctx, core.Claim{SandboxID: id, Tenant: "globex", From: []core.State{c.from}, To: core.StateDestroying,
			Owner: "inv-1", Now: t0, LeaseUntil: t0.Add(time.Minute), Below: &below})
		stored, gerr := s.Get(ctx, id)
		if gerr != nil {
			t.Fatal(gerr)
		}
		switch {
		case c.want == nil && err != nil:
			t.Errorf("%s: Claim = %v, want applied", c.name, err)
		case c.want == nil && (got.State != core.StateDestroying || got.Fence != before.Fence+1 || stored.State != core.StateDestroying):
			t.Errorf("%s: claimed record %s fence %d (stored %s), want destroying fence %d", c.name, got.State, got.Fence, stored.State, before.Fence+1)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: Claim = %v, want %v", c.name, err, c.want)
		case c.want != nil && (stored.State != core.StateActive || stored.Fence != before.Fence):
			t.Errorf("%s: refused claim left the record %s fence %d, want it unchanged", c.name, stored.State, stored.Fence)
		}
	}
}
