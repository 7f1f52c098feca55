package storetest

import (
	"errors"
	"slices"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// testReserveFinalizeFree: a reservation holds a slot and binds the
// thread; its finalize makes the record (fence 1) the binding's; a park
// counts it warm; its free marks it gone and frees the slot, once.
func testReserveFinalizeFree(f *fixture) {
	k := key("acme", "u1", 1)
	if err := f.reserve(k, "res-1", big); err != nil {
		f.t.Fatalf("Reserve: %v", err)
	}
	if look := f.lookup(k); !look.Bound || look.Binding.Reservation != "res-1" || look.Binding.SandboxID != "" || look.TenantUsed != 1 {
		f.t.Errorf("lookup after reserve = %+v; want bound to res-1, tenant using 1", look)
	}
	if st := f.capacity(); st.Used != 1 || st.Reserved != 1 {
		f.t.Errorf("capacity after reserve = %+v; want used 1, reserved 1", st)
	}
	rec, err := f.s.Finalize(f.ctx, "res-1", record(k, "sbx1"))
	if err != nil {
		f.t.Fatalf("Finalize: %v", err)
	}
	if rec.Fence != 1 || rec.State != core.StateActive || rec.ReservationToken != "res-1" {
		f.t.Errorf("finalized = %+v; want active at fence 1, token res-1", rec)
	}
	if look := f.lookup(k); look.Binding.SandboxID != "sbx1" || look.Binding.Reservation != "" {
		f.t.Errorf("lookup after finalize = %+v; want bound to sbx1", look)
	}
	if got := f.get("sbx1"); got.Tenant != "acme" || got.Endpoint != rec.Endpoint || got.Fence != 1 {
		f.t.Errorf("Get = %+v; want acme's record at fence 1 with its endpoint", got)
	}
	if st := f.capacity(); st.Used != 1 || st.Active != 1 || st.Reserved != 0 {
		f.t.Errorf("capacity after finalize = %+v; want used 1, active 1", st)
	}
	rec = f.park(rec, t0.Add(time.Minute))
	if st := f.capacity(); st.Warm != 1 || st.Active != 0 || rec.State != core.StateWarm || !rec.ParkedAt.Equal(t0.Add(time.Minute)) {
		f.t.Errorf("after park: capacity %+v, record %+v; want one warm record parked at t0+1m", st, rec)
	}
	if err := f.s.Free(f.ctx, rec, t0.Add(2*time.Minute)); err != nil {
		f.t.Fatalf("Free: %v", err)
	}
	if got := f.get("sbx1"); got.State != core.StateGone {
		f.t.Errorf("state after free = %s; want gone", got.State)
	}
	f.wantUsed(0, 0)
	f.wantIs("second Free", f.s.Free(f.ctx, rec, t0.Add(3*time.Minute)), core.ErrStaleFence)
	f.wantUsed(0, 0)
	if _, err := f.s.Finalize(f.ctx, "res-1", record(k, "sbx2")); err == nil {
		f.t.Errorf("Finalize of a consumed reservation succeeded")
	}
}

// testReserveLimit: no reservation beyond the limit; the refusal carries
// the counts and the tenants holding slots; a freed slot is taken again.
func testReserveLimit(f *fixture) {
	const limit = 3
	for n := range limit {
		if err := f.reserve(key("acme", "u1", n), tok(n), limit); err != nil {
			f.t.Fatalf("Reserve %d: %v", n, err)
		}
	}
	err := f.reserve(key("beta", "u1", 9), "res-9", limit)
	f.wantRefusal("Reserve past the limit", err, api.RefusalCapacity)
	if ce := capacityError(err); ce != nil && (ce.Status.Used != limit || !slices.Contains(ce.Tenants, "acme")) {
		f.t.Errorf("refusal = %+v; want used %d and tenant acme listed", ce, limit)
	}
	if look := f.lookup(key("beta", "u1", 9)); look.Bound {
		f.t.Errorf("a refused reservation bound its thread: %+v", look)
	}
	if err := f.s.FreeReservation(f.ctx, tok(0), key("acme", "u1", 0)); err != nil {
		f.t.Fatalf("FreeReservation: %v", err)
	}
	if look := f.lookup(key("acme", "u1", 0)); look.Bound {
		f.t.Errorf("binding of a freed reservation kept: %+v", look)
	}
	if err := f.reserve(key("beta", "u1", 9), "res-9", limit); err != nil {
		f.t.Fatalf("Reserve after a free: %v", err)
	}
	f.wantUsed(limit, 0)
	f.wantIs("FreeReservation of no reservation", f.s.FreeReservation(f.ctx, "res-none", key("acme", "u1", 0)), core.ErrNotFound)
}

// testQuotas: a user's and a tenant's caps bound their slots, each with
// its own refusal; a free gives the quota back.
func testQuotas(f *fixture) {
	take := func(k core.ThreadKey, token string) error {
		return f.s.Reserve(f.ctx, core.Reservation{Token: token, ThreadKey: k, Limit: big, MaxPerUser: 2, MaxPerTenant: 3,
			Now: t0, ExpiresAt: t0.Add(time.Minute)})
	}
	for n := range 2 {
		if err := take(key("acme", "u1", n), tok(n)); err != nil {
			f.t.Fatalf("Reserve %d: %v", n, err)
		}
	}
	f.wantRefusal("u1's third", take(key("acme", "u1", 2), tok(2)), api.RefusalUserQuota)
	if err := take(key("acme", "u2", 3), tok(3)); err != nil {
		f.t.Fatalf("u2's first: %v", err)
	}
	f.wantRefusal("acme's fourth", take(key("acme", "u3", 4), tok(4)), api.RefusalTenantQuota)
	if err := take(key("beta", "u1", 5), tok(5)); err != nil {
		f.t.Errorf("another tenant's first: %v", err)
	}
	if look := f.lookup(key("acme", "u9", 9)); look.TenantUsed != 3 {
		f.t.Errorf("acme's count = %d; want 3", look.TenantUsed)
	}
	if err := f.s.FreeReservation(f.ctx, tok(0), key("acme", "u1", 0)); err != nil {
		f.t.Fatalf("FreeReservation: %v", err)
	}
	if err := take(key("acme", "u1", 2), tok(2)); err != nil {
		f.t.Errorf("u1's after a free: %v", err)
	}
	f.wantUsed(4, 0)
}

// testBindings: a thread has one binding; a reservation replaces it only
// when naming what it holds (a sandbox, or a reservation).
func testBindings(f *fixture) {
	k := key("acme", "u1", 1)
	f.active(k, "sbx1")
	f.wantIs("second Reserve", f.reserve(k, "res-2", big), core.ErrThreadBound)
	replace := func(token, id, res string) error {
		return f.s.Reserve(f.ctx, core.Reservation{Token: token, ThreadKey: k, Limit: big, Now: t0, ExpiresAt: t0.Add(time.Minute),
			ReplaceSandboxID: id, ReplaceReservation: res})
	}
	f.wantIs("Reserve replacing another sandbox", replace("res-3", "other", ""), core.ErrThreadBound)
	f.wantIs("Reserve replacing a reservation", replace("res-3", "", "res-x"), core.ErrThreadBound)
	if err := replace("res-4", "sbx1", ""); err != nil {
		f.t.Fatalf("Reserve replacing sbx1: %v", err)
	}
	if err := replace("res-5", "", "res-4"); err != nil {
		f.t.Fatalf("Reserve replacing reservation res-4: %v", err)
	}
	if look := f.lookup(k); look.Binding.Reservation != "res-5" {
		f.t.Errorf("binding = %+v; want reservation res-5", look.Binding)
	}
	// The replaced record and reservation keep their slots until freed.
	f.wantUsed(3, 0)
	if _, err := f.s.Finalize(f.ctx, "res-4", record(k, "sbx4")); err == nil {
		f.t.Errorf("Finalize of a replaced reservation succeeded")
	}
}

// testClaims: a claim needs the record's tenant (else not found), one of
// its states (else a conflict, with the record) and no live lease of
// another owner (else lease held); a claim conditional on a tenant's
// count refuses at its fair share.
func testClaims(f *fixture) {
	rec := f.warm(key("acme", "u1", 1), "sbx1")
	_, err := f.s.Claim(f.ctx, lease("sbx1", "beta", "o1", t0, core.StateActive, core.StateWarm))
	f.wantIs("another tenant's claim", err, core.ErrNotFound)
	_, err = f.s.Claim(f.ctx, lease("nope", "acme", "o1", t0, core.StateActive, core.StateWarm))
	f.wantIs("claim of no record", err, core.ErrNotFound)
	got, err := f.s.Claim(f.ctx, lease("sbx1", "acme", "o1", t0, core.StateReleasing, core.StateActive))
	f.wantIs("claim from another state", err, core.ErrConflict)
	if got.State != core.StateWarm {
		f.t.Errorf("conflict's record = %+v; want the warm record", got)
	}
	_, err = f.s.Claim(f.ctx, core.Claim{SandboxID: "sbx1", Tenant: "acme", From: []core.State{core.StateWarm},
		To: core.StateDestroying, Owner: "o1", Now: t0, LeaseUntil: t0.Add(time.Minute), Below: &core.TenantBelow{Tenant: "acme", Slots: 1}})
	f.wantIs("claim at the fair share", err, core.ErrAtFairShare)
	got, err = f.s.Claim(f.ctx, lease("sbx1", "acme", "o1", t0, core.StateActive, core.StateWarm))
	if err != nil || got.State != core.StateActive || got.PrevState != core.StateWarm || got.Fence <= rec.Fence || got.LeaseOwner != "o1" {
		f.t.Fatalf("claim = %+v, %v; want active, from warm, leased to o1, fence moved", got, err)
	}
	_, err = f.s.Claim(f.ctx, lease("sbx1", "acme", "o2", t0.Add(time.Second), core.StateReleasing, core.StateActive))
	f.wantIs("claim under another's live lease", err, core.ErrLeaseHeld)
	if _, err := f.s.Claim(f.ctx, lease("sbx1", "acme", "o1", t0.Add(time.Second), "", core.StateActive)); err != nil {
		f.t.Errorf("the lease owner's own claim: %v", err)
	}
	later := t0.Add(5 * time.Minute)
	got, err = f.s.Claim(f.ctx, lease("sbx1", "acme", "o2", later, core.StateDestroying, core.StateActive))
	if err != nil || got.State != core.StateDestroying || !got.DestroyingSince.Equal(later) {
		f.t.Errorf("claim after the lease lapsed = %+v, %v; want a tombstone since %v", got, err, later)
	}
	f.wantUsed(1, 0)
}

// testFencedApply: a fenced write with an old fence is refused; the
// draining flag reads as last set.
func testFencedApply(f *fixture) {
	rec := f.active(key("acme", "u1", 1), "sbx1")
	warm := f.park(rec, t0)
	_, err := f.s.Apply(f.ctx, core.Update{SandboxID: "sbx1", Fence: rec.Fence, State: core.StateDestroying, Now: t0})
	f.wantIs("Apply with the old fence", err, core.ErrStaleFence)
	if err := f.s.SetDraining(f.ctx, true); err != nil {
		f.t.Fatalf("SetDraining: %v", err)
	}
	if draining, err := f.s.Draining(f.ctx); err != nil || !draining {
		f.t.Errorf("Draining after SetDraining(true) = %v, %v; want true", draining, err)
	}
	if err := f.s.SetDraining(f.ctx, false); err != nil {
		f.t.Fatalf("SetDraining(false): %v", err)
	}
	if draining, err := f.s.Draining(f.ctx); err != nil || draining {
		f.t.Errorf("Draining after SetDraining(false) = %v, %v; want false", draining, err)
	}
	if _, err := f.s.Apply(f.ctx, core.Update{SandboxID: "sbx1", Fence: warm.Fence, State: core.StateDestroying, Now: t0,
		KillAttempt: true, Slot: warm.Slot}); err != nil {
		f.t.Fatalf("Apply destroying: %v", err)
	}
	if got := f.get("sbx1"); got.State != core.StateDestroying || got.KillAttempts != 1 || !got.DestroyingSince.Equal(t0) {
		f.t.Errorf("tombstone = %+v; want destroying since t0, one kill attempt", got)
	}
	if st := f.capacity(); st.Tombstones != 1 || st.Used != 1 {
		f.t.Errorf("capacity = %+v; want one tombstone holding its slot", st)
	}
}

// tok is reservation token n.
func tok(n int) string { return "res-" + string(rune('a'+n)) }

// capacityError is err's *CapacityError, or nil.
func capacityError(err error) *core.CapacityError {
	var ce *core.CapacityError
	if errors.As(err, &ce) {
		return ce
	}
	return nil
}
