package storetest

import (
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// tombstone parks sandbox id of k and claims it for destruction (owner
// "evictor"), as an eviction does before its kill.
func (f *fixture) tombstone(k core.ThreadKey, id string) core.Record {
	f.t.Helper()
	f.warm(k, id)
	tomb, err := f.s.Claim(f.ctx, core.Claim{SandboxID: id, Tenant: k.Tenant, From: []core.State{core.StateWarm},
		To: core.StateDestroying, Owner: "evictor", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	if err != nil {
		f.t.Fatalf("Claim %s for destruction: %v", id, err)
	}
	tomb.EndReason = core.EventReasonCapacity
	return tomb
}

// handOver reserves a slot for k with token under limit and quotas of
// maxPer slots a user and a tenant, taking over tomb's slot.
func (f *fixture) handOver(k core.ThreadKey, token string, limit, maxPer int, tomb core.Record) error {
	return f.s.Reserve(f.ctx, core.Reservation{Token: token, ThreadKey: k, Seed: k.Seed(), Limit: limit, Now: t0.Add(time.Minute),
		ExpiresAt: t0.Add(2 * time.Minute), MaxPerUser: maxPer, MaxPerTenant: maxPer, Handover: &tomb})
}

// testHandover: a reservation takes over a tombstone's running slot in a
// full deployment: the tombstone ends gone with its reason, the slot and
// the quota counts change holder, and the limit is not checked. A stale
// tombstone, the new holder's quota and draining refuse it, and a refused
// handover leaves the tombstone and every count as they were.
func testHandover(f *fixture) {
	const limit = 2
	other := key("beta", "u9", 9)
	f.active(other, "sbx0")
	tomb := f.tombstone(key("acme", "u1", 1), "sbx1") // the deployment is full
	f.wantRefusal("Reserve in the full deployment", f.reserve(key("gamma", "u1", 3), "res-x", limit), api.RefusalCapacity)

	// beta/u9 holds one slot: at a quota of one, taking one more is refused.
	k := key("beta", "u9", 3)
	f.wantRefusal("a handover past the new holder's quota", f.handOver(k, "res-3", limit, 1, tomb), api.RefusalUserQuota)
	if err := f.s.SetDraining(f.ctx, true); err != nil {
		f.t.Fatal(err)
	}
	f.wantRefusal("a handover while draining", f.handOver(k, "res-3", limit, 2, tomb), api.RefusalDraining)
	if err := f.s.SetDraining(f.ctx, false); err != nil {
		f.t.Fatal(err)
	}
	if got := f.get("sbx1"); got.State != core.StateDestroying || got.Fence != tomb.Fence {
		f.t.Fatalf("tombstone after refused handovers = %+v; want unchanged", got)
	}
	if look := f.lookup(k); look.Bound || look.TenantUsed != 1 {
		f.t.Errorf("beta after refused handovers = %+v; want unbound, one slot", look)
	}

	if err := f.handOver(k, "res-3", limit, 2, tomb); err != nil {
		f.t.Fatalf("Reserve taking the tombstone's slot over: %v", err)
	}
	if got := f.get("sbx1"); got.State != core.StateGone || got.EndReason != core.EventReasonCapacity {
		f.t.Errorf("tombstone after the handover = %+v; want gone for %s", got, core.EventReasonCapacity)
	}
	if look := f.lookup(k); look.Binding.Reservation != "res-3" || look.TenantUsed != 2 {
		f.t.Errorf("beta after the handover = %+v; want bound to res-3, two slots", look)
	}
	if look := f.lookup(key("acme", "u1", 1)); look.TenantUsed != 0 {
		f.t.Errorf("acme's count after the handover = %d; want 0", look.TenantUsed)
	}
	f.wantIs("the same tombstone handed over again", f.handOver(key("gamma", "u1", 4), "res-4", limit, 0, tomb), core.ErrStaleFence)
	if look := f.lookup(key("gamma", "u1", 4)); look.Bound {
		f.t.Errorf("a refused handover bound its thread: %+v", look)
	}
	if _, err := f.s.Finalize(f.ctx, "res-3", record(k, "sbx3")); err != nil {
		f.t.Fatalf("Finalize of the handed-over reservation: %v", err)
	}
	f.wantRefusal("Reserve in the still full deployment", f.reserve(key("gamma", "u1", 5), "res-5", limit), api.RefusalCapacity)
	f.wantUsed(limit, 0)
}

// testHandoverSameHolder: a tombstone's slot handed over to another
// thread of its own user stays in the user's and the tenant's counts, so
// a user at its quota swaps a warm sandbox for a new one.
func testHandoverSameHolder(f *fixture) {
	tomb := f.tombstone(key("acme", "u1", 1), "sbx1")
	k := key("acme", "u1", 2)
	if err := f.handOver(k, "res-2", big, 1, tomb); err != nil {
		f.t.Fatalf("a handover within the user's own quota: %v", err)
	}
	if look := f.lookup(k); look.Binding.Reservation != "res-2" || look.TenantUsed != 1 {
		f.t.Errorf("lookup after the handover = %+v; want bound to res-2, one slot", look)
	}
	f.wantRefusal("one more slot for the user", f.s.Reserve(f.ctx, core.Reservation{Token: "res-3", ThreadKey: key("acme", "u1", 3),
		Limit: big, MaxPerUser: 1, Now: t0, ExpiresAt: t0.Add(time.Minute)}), api.RefusalUserQuota)
	f.wantUsed(1, 0)
}

// testMaybeAppliedHandover: a handover whose reply was lost applied
// whole: the tombstone is gone, the thread bound to the reservation, the
// slot counted once; a retry is refused (the binding, the fence), and
// one that failed before it applied changed nothing.
func testMaybeAppliedHandover(f *fixture) {
	f.warmUp()
	tomb := f.tombstone(key("acme", "u1", 1), "sbx1")
	k := key("beta", "u1", 2)
	f.sub.FailNext(false)
	if err := f.handOver(k, "res-2", big, 0, tomb); err == nil {
		f.t.Fatalf("a handover with a fault succeeded")
	}
	if got := f.get("sbx1"); got.State != core.StateDestroying || got.Fence != tomb.Fence || f.lookup(k).Bound {
		f.t.Fatalf("after a handover that did not apply: tombstone %+v, binding %+v; want both unchanged", got, f.lookup(k))
	}
	f.sub.FailNext(true)
	f.wantIs("a handover with its reply lost", f.handOver(k, "res-2", big, 0, tomb), core.ErrStoreUnavailable)
	if got := f.get("sbx1"); got.State != core.StateGone {
		f.t.Errorf("tombstone = %+v; want gone", got)
	}
	if look := f.lookup(k); look.Binding.Reservation != "res-2" || look.TenantUsed != 1 {
		f.t.Errorf("lookup = %+v; want bound to res-2, one slot", look)
	}
	f.wantIs("the same handover again", f.handOver(k, "res-2", big, 0, tomb), core.ErrThreadBound)
	f.wantIs("the tombstone handed over to another thread", f.handOver(key("beta", "u1", 3), "res-3", big, 0, tomb), core.ErrStaleFence)
	f.wantUsed(1, 0)
}

// testHandoverWithinTheLimit: a slot changes holder only as a free and a
// take would: over a lowered limit it cannot (ErrConflict, nothing
// changed), and a user over its quota cannot keep it for another of its
// threads.
func testHandoverWithinTheLimit(f *fixture) {
	const limit = 3
	tomb := f.tombstone(key("acme", "u1", 1), "sbx1")
	for n := range 2 { // u1 holds 3 slots
		if err := f.reserve(key("acme", "u1", 10+n), tok(n), limit); err != nil {
			f.t.Fatalf("Reserve %d: %v", n, err)
		}
	}
	f.wantIs("a handover over a lowered limit", f.handOver(key("beta", "u2", 2), "res-2", 1, 0, tomb), core.ErrConflict)
	f.wantRefusal("a handover to the same user over its quota", f.handOver(key("acme", "u1", 3), "res-3", limit, 2, tomb), api.RefusalUserQuota)
	if got := f.get("sbx1"); got.State != core.StateDestroying || got.Fence != tomb.Fence {
		f.t.Fatalf("tombstone after refused handovers = %+v; want unchanged", got)
	}
	if err := f.handOver(key("acme", "u1", 3), "res-3", limit, 3, tomb); err != nil {
		f.t.Fatalf("a handover within the user's quota and the limit: %v", err)
	}
	f.wantUsed(limit, 0)
}
