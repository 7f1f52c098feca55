package storetest

import (
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// member reserves a pool place (pool size size) and finalizes sandbox id
// into it.
func (f *fixture) member(id string, size int) core.Record {
	f.t.Helper()
	if err := f.s.ReservePool(f.ctx, core.PoolReservation{Token: "pool-" + id, Limit: big, Size: size, Now: t0,
		ExpiresAt: t0.Add(time.Minute)}); err != nil {
		f.t.Fatalf("ReservePool %s: %v", id, err)
	}
	rec, err := f.s.FinalizePool(f.ctx, "pool-"+id, record(core.ThreadKey{}, id))
	if err != nil {
		f.t.Fatalf("FinalizePool %s: %v", id, err)
	}
	return rec
}

// poolClaim is a claim of member m for k by owner.
func poolClaim(m core.Record, k core.ThreadKey, owner string) core.PoolClaim {
	return core.PoolClaim{Member: m, ThreadKey: k, Owner: owner, Now: t0.Add(time.Minute), LeaseUntil: t0.Add(2 * time.Minute), Limit: big}
}

// testPool: the pool's places are bounded; a member holds a slot and a
// place, names no thread, and a claim binds it to a thread (the place
// given back, the user's and tenant's counts taken); a claim sent again
// is the same claim; a member claimed is no longer pooled.
func testPool(f *fixture) {
	m := f.member("p1", 1)
	if m.State != core.StatePooled || m.Tenant != "" || m.Fence != 1 {
		f.t.Errorf("member = %+v; want pooled, thread-less, fence 1", m)
	}
	err := f.s.ReservePool(f.ctx, core.PoolReservation{Token: "pool-p2", Limit: big, Size: 1, Now: t0, ExpiresAt: t0.Add(time.Minute)})
	f.wantIs("ReservePool past the size", err, core.ErrPoolFull)
	if n, err := f.s.PoolCount(f.ctx); err != nil || n != 1 {
		f.t.Errorf("PoolCount = %d, %v; want 1", n, err)
	}
	if st := f.capacity(); st.Used != 1 || st.Pool != 1 {
		f.t.Errorf("capacity = %+v; want one pool member holding a slot", st)
	}
	members, err := f.s.PoolMembers(f.ctx, 10)
	if err != nil || len(members) != 1 || members[0].SandboxID != "p1" {
		f.t.Fatalf("PoolMembers = %v, %v; want p1", members, err)
	}
	k := key("acme", "u1", 1)
	rec, err := f.s.ClaimPoolMember(f.ctx, poolClaim(members[0], k, "o1"))
	if err != nil {
		f.t.Fatalf("ClaimPoolMember: %v", err)
	}
	if rec.State != core.StateClaiming || rec.ThreadKey != k || rec.LeaseOwner != "o1" {
		f.t.Errorf("claimed = %+v; want claiming for %s under o1", rec, k)
	}
	if again, err := f.s.ClaimPoolMember(f.ctx, poolClaim(members[0], k, "o1")); err != nil || again.SandboxID != "p1" {
		f.t.Errorf("the same claim again = %+v, %v; want the claimed member", again, err)
	}
	_, err = f.s.ClaimPoolMember(f.ctx, poolClaim(members[0], key("acme", "u1", 2), "o2"))
	f.wantIs("another thread's claim of the member", err, core.ErrConflict)
	if look := f.lookup(k); look.Binding.SandboxID != "p1" || look.TenantUsed != 1 {
		f.t.Errorf("lookup = %+v; want bound to p1, acme using 1", look)
	}
	if n, _ := f.s.PoolCount(f.ctx); n != 0 {
		f.t.Errorf("PoolCount after the claim = %d; want 0", n)
	}
	f.wantUsed(1, 0)
	m2 := f.member("p2", 1)
	_, err = f.s.ClaimPoolMember(f.ctx, poolClaim(m2, k, "o3"))
	f.wantIs("a claim for a bound thread", err, core.ErrThreadBound)
	if err := f.s.Free(f.ctx, f.get("p2"), t0.Add(time.Minute)); err != nil {
		f.t.Fatalf("Free of a member: %v", err)
	}
	if n, _ := f.s.PoolCount(f.ctx); n != 0 {
		f.t.Errorf("PoolCount after a member's free = %d; want 0", n)
	}
	f.wantUsed(1, 0)
}

// listedThenPausing refills a pool of one running member p1 under limit
// and returns the member as a claimer lists it, then as a refill's pause
// claim leaves it (pausing, at the next fence).
func (f *fixture) listedThenPausing(limit int) (listed, pausing core.Record) {
	if err := f.s.ReservePool(f.ctx, core.PoolReservation{Token: "pool-p1", Limit: limit, Size: 1, Now: t0,
		ExpiresAt: t0.Add(time.Minute)}); err != nil {
		f.t.Fatalf("ReservePool: %v", err)
	}
	listed, err := f.s.FinalizePool(f.ctx, "pool-p1", record(core.ThreadKey{}, "p1"))
	if err != nil {
		f.t.Fatalf("FinalizePool: %v", err)
	}
	pausing, err = f.s.ClaimPoolPause(f.ctx, core.Claim{SandboxID: "p1", Owner: "refill", Now: t0, LeaseUntil: t0.Add(time.Minute)}, big)
	if err != nil {
		f.t.Fatalf("ClaimPoolPause: %v", err)
	}
	return listed, pausing
}

// testPoolClaimAsListed: a claim takes the slots of the member as its
// claimer listed it. A member listed running and parked paused since (its
// running slot freed) is refused (ErrConflict, nothing written), or the
// thread would get a sandbox that runs on no running slot; listed again,
// it is claimed as the paused member it is, taking a running slot within
// the limit. Limit 1 puts the member's running slot in the first bucket.
func testPoolClaimAsListed(f *fixture) {
	listed, pausing := f.listedThenPausing(1)
	if _, err := f.s.SettlePoolPause(f.ctx, pausing, t0); err != nil {
		f.t.Fatalf("SettlePoolPause: %v", err)
	}
	relisted, rec := f.claimStaleThenRelisted(listed, 1, "a claim of a member listed running, parked paused since")
	if relisted.Slots.Running() || !relisted.Slots.Paused {
		f.t.Errorf("member after the refused claim = %s %+v; want pooled, paused", relisted.State, relisted.Slots)
	}
	if rec.State != core.StateClaiming || !rec.Slots.Running() || !rec.Slots.Paused {
		f.t.Errorf("claimed = %s %+v; want claiming, holding a running and a paused slot", rec.State, rec.Slots)
	}
	err := f.reserve(key("acme", "u2", 2), "res-full", 1)
	f.wantRefusal("a reservation past the limit the claim reached", err, api.RefusalCapacity)
	f.wantUsed(1, 1)
}

// testPoolClaimAtTheListedFence: a member whose pause was claimed and
// given up since its listing is back as listed, but at a later fence: a
// claim from the old listing is refused (ErrConflict, nothing written),
// and one from a fresh listing returns the record at its fence.
func testPoolClaimAtTheListedFence(f *fixture) {
	listed, pausing := f.listedThenPausing(2)
	if _, err := f.s.AbortPoolPause(f.ctx, pausing, t0); err != nil {
		f.t.Fatalf("AbortPoolPause: %v", err)
	}
	relisted, rec := f.claimStaleThenRelisted(listed, 2, "a claim at the fence before the given-up pause")
	if relisted.Fence == listed.Fence {
		f.t.Errorf("member relisted at fence %d, want a later fence than %d", relisted.Fence, listed.Fence)
	}
	if got := f.get("p1"); got.Fence != rec.Fence || got.State != core.StateClaiming {
		f.t.Errorf("claim returned fence %d; stored %s at fence %d", rec.Fence, got.State, got.Fence)
	}
}

// claimStaleThenRelisted claims p1 for a thread from the stale listing
// listed under limit, wanting ErrConflict (what) with the thread left
// unbound and p1 still the pool's one member; then claims p1 as listed
// again. It returns p1 as relisted, and the second claim's record.
func (f *fixture) claimStaleThenRelisted(listed core.Record, limit int, what string) (relisted, claimed core.Record) {
	f.t.Helper()
	k := key("acme", "u1", 1)
	claim := poolClaim(listed, k, "o1")
	claim.Limit = limit
	_, err := f.s.ClaimPoolMember(f.ctx, claim)
	f.wantIs(what, err, core.ErrConflict)
	if look := f.lookup(k); look.Bound {
		f.t.Errorf("lookup after the refused claim = %+v; want the thread unbound", look)
	}
	members, err := f.s.PoolMembers(f.ctx, 10)
	if err != nil || len(members) != 1 || members[0].State != core.StatePooled {
		f.t.Fatalf("PoolMembers = %+v, %v; want p1, pooled", members, err)
	}
	claim = poolClaim(members[0], k, "o1")
	claim.Limit = limit
	rec, err := f.s.ClaimPoolMember(f.ctx, claim)
	if err != nil {
		f.t.Fatalf("ClaimPoolMember as listed again: %v", err)
	}
	return members[0], rec
}

// testReconcile: an adoption takes a slot without a limit check and binds
// the thread when asked; a rebind needs the binding as read; the first
// sighting is kept; the cursor is compare-and-swap; the inventory parts
// read back; reservations are listed as creating.
func testReconcile(f *fixture) {
	k := key("acme", "u1", 1)
	adopted := record(k, "orphan")
	adopted.State = core.StateWarm
	adopted.ParkedAt = t0
	rec, err := f.s.Adopt(f.ctx, core.Adoption{Record: adopted, Bind: true})
	if err != nil || rec.Fence != 1 {
		f.t.Fatalf("Adopt = %+v, %v; want fence 1", rec, err)
	}
	_, err = f.s.Adopt(f.ctx, core.Adoption{Record: adopted, Bind: true})
	f.wantIs("Adopt again", err, core.ErrConflict)
	if look := f.lookup(k); look.Binding.SandboxID != "orphan" || look.TenantUsed != 1 {
		f.t.Errorf("lookup = %+v; want bound to orphan, acme using 1", look)
	}
	f.wantUsed(1, 0)
	f.active(key("acme", "u1", 2), "sbx2")
	stale := core.Binding{ThreadKey: k, SandboxID: "nope"}
	f.wantIs("Rebind from a stale binding", f.s.Rebind(f.ctx, k, "sbx2", stale, true), core.ErrConflict)
	if err := f.s.Rebind(f.ctx, k, "sbx2", core.Binding{ThreadKey: k, SandboxID: "orphan"}, true); err != nil {
		f.t.Errorf("Rebind: %v", err)
	}
	if first, err := f.s.FirstSeen(f.ctx, "x", t0); err != nil || !first.Equal(t0) {
		f.t.Errorf("FirstSeen = %v, %v; want t0", first, err)
	}
	if first, err := f.s.FirstSeen(f.ctx, "x", t0.Add(time.Hour)); err != nil || !first.Equal(t0) {
		f.t.Errorf("FirstSeen again = %v, %v; want t0 kept", first, err)
	}
	c := core.ReconcileCursor{Cycle: "c1", CycleStart: t0, Token: "page2", Pass: 1}
	if err := f.s.SaveCursor(f.ctx, c); err != nil {
		f.t.Fatalf("SaveCursor: %v", err)
	}
	f.wantIs("SaveCursor at an old version", f.s.SaveCursor(f.ctx, c), core.ErrConflict)
	if got, err := f.s.Cursor(f.ctx); err != nil || got.Version != 1 || got.Token != "page2" || got.Cycle != "c1" {
		f.t.Errorf("Cursor = %+v, %v; want c1 at page2, version 1", got, err)
	}
	seen := []core.SeenSandbox{{ID: "a"}, {ID: "b", Reservation: "res-b"}}
	if err := f.s.SaveSeen(f.ctx, "c1", "p1", seen); err != nil {
		f.t.Fatalf("SaveSeen: %v", err)
	}
	if got, err := f.s.Seen(f.ctx, "c1"); err != nil || len(got) != 2 || got[1] != seen[1] {
		f.t.Errorf("Seen = %v, %v; want %v", got, err, seen)
	}
	if err := f.reserve(key("acme", "u1", 3), "res-3", big); err != nil {
		f.t.Fatalf("Reserve: %v", err)
	}
	var tokens []string
	if err := f.s.ScanState(f.ctx, core.StateCreating, func(r core.Record) bool {
		tokens = append(tokens, r.ReservationToken)
		return true
	}); err != nil || len(tokens) != 1 || tokens[0] != "res-3" {
		f.t.Errorf("ScanState(creating) = %v, %v; want res-3", tokens, err)
	}
}

// testPoolFairShare: the tenants holding slots are listed; a pool claim
// carrying a fair share is refused (ErrAtFairShare, nothing written) for a
// tenant holding that many slots and applies for one holding fewer; the
// tenant's quota is still the refusal when it is the one reached.
func testPoolFairShare(f *fixture) {
	if tenants, err := f.s.TenantsHolding(f.ctx); err != nil || len(tenants) != 0 {
		f.t.Errorf("TenantsHolding of an empty store = %v, %v; want none", tenants, err)
	}
	f.active(key("acme", "u1", 1), "a1")
	f.active(key("zeta", "u1", 1), "z1")
	if tenants, err := f.s.TenantsHolding(f.ctx); err != nil || len(tenants) != 2 || tenants[0] != "acme" || tenants[1] != "zeta" {
		f.t.Errorf("TenantsHolding = %v, %v; want [acme zeta]", tenants, err)
	}
	m := f.member("p1", 2)
	k := key("acme", "u1", 2)
	at := poolClaim(m, k, "o1")
	at.Below = &core.TenantBelow{Tenant: "acme", Slots: 1}
	_, err := f.s.ClaimPoolMember(f.ctx, at)
	f.wantIs("a claim of a tenant at its share", err, core.ErrAtFairShare)
	if got := f.get("p1"); got.State != core.StatePooled {
		f.t.Errorf("member after a refused claim = %s; want pooled", got.State)
	}
	if look := f.lookup(k); look.Bound || look.TenantUsed != 1 {
		f.t.Errorf("lookup after a refused claim = %+v; want unbound, acme using 1", look)
	}
	quota := at
	quota.MaxPerTenant = 1
	_, err = f.s.ClaimPoolMember(f.ctx, quota)
	f.wantRefusal("a claim at the tenant's quota and share", err, api.RefusalTenantQuota)
	below := poolClaim(m, k, "o1")
	below.Below = &core.TenantBelow{Tenant: "acme", Slots: 2}
	if rec, err := f.s.ClaimPoolMember(f.ctx, below); err != nil || rec.ThreadKey != k {
		f.t.Fatalf("a claim below the share = %+v, %v; want claimed for %s", rec, err, k)
	}
	if look := f.lookup(k); look.TenantUsed != 2 {
		f.t.Errorf("acme's slots after the claim = %d; want 2", look.TenantUsed)
	}
}

// testRefillBackoff: the refill's back-off state reads back as set, is
// cleared by the zero value, and leaves the pool's place count alone.
func testRefillBackoff(f *fixture) {
	if b, err := f.s.RefillBackoff(f.ctx); err != nil || b != (core.RefillBackoff{}) {
		f.t.Fatalf("RefillBackoff of an empty store = %+v, %v; want the zero value", b, err)
	}
	if err := f.s.ReservePool(f.ctx, core.PoolReservation{Token: "res-p1", Limit: big, Size: 2, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
		f.t.Fatalf("ReservePool: %v", err)
	}
	want := core.RefillBackoff{Failures: 3, Until: t0.Add(4 * time.Minute)}
	if err := f.s.SetRefillBackoff(f.ctx, want); err != nil {
		f.t.Fatalf("SetRefillBackoff: %v", err)
	}
	if b, err := f.s.RefillBackoff(f.ctx); err != nil || b.Failures != want.Failures || !b.Until.Equal(want.Until) {
		f.t.Errorf("RefillBackoff = %+v, %v; want %+v", b, err, want)
	}
	if n, err := f.s.PoolCount(f.ctx); err != nil || n != 1 {
		f.t.Errorf("pool places = %d, %v; want the reservation's one", n, err)
	}
	if err := f.s.SetRefillBackoff(f.ctx, core.RefillBackoff{}); err != nil {
		f.t.Fatalf("SetRefillBackoff(zero): %v", err)
	}
	if b, err := f.s.RefillBackoff(f.ctx); err != nil || b != (core.RefillBackoff{}) {
		f.t.Errorf("RefillBackoff after clearing = %+v, %v; want the zero value", b, err)
	}
	if n, err := f.s.PoolCount(f.ctx); err != nil || n != 1 {
		f.t.Errorf("pool places after clearing = %d, %v; want 1", n, err)
	}
}
