package storetest

import (
	"errors"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// warmUp makes one reservation and frees it, so that a store's first
// write under big (which may set up its ledger) is behind the case.
func (f *fixture) warmUp() {
	f.t.Helper()
	k := key("warmup", "u1", 1)
	if err := f.reserve(k, "res-warmup", big); err != nil {
		f.t.Fatalf("Reserve: %v", err)
	}
	if err := f.s.FreeReservation(f.ctx, "res-warmup", k); err != nil {
		f.t.Fatalf("FreeReservation: %v", err)
	}
}

// testMaybeAppliedReserve: a reservation whose reply was lost did apply;
// the caller finds its own token in the binding, a retry of the same
// reservation is refused without taking a second slot, and the create
// goes on from the binding.
func testMaybeAppliedReserve(f *fixture) {
	f.warmUp()
	k := key("acme", "u1", 1)
	f.sub.FailNext(true)
	err := f.reserve(k, "res-1", big)
	f.wantIs("Reserve with its reply lost", err, core.ErrStoreUnavailable)
	if look := f.lookup(k); look.Binding.Reservation != "res-1" {
		f.t.Fatalf("lookup = %+v; want the binding to name res-1", look)
	}
	f.wantIs("the same Reserve again", f.reserve(k, "res-1", big), core.ErrThreadBound)
	f.wantUsed(1, 0)
	rec, err := f.s.Finalize(f.ctx, "res-1", record(k, "sbx1"))
	if err != nil || rec.Fence != 1 {
		f.t.Fatalf("Finalize after the retry = %+v, %v", rec, err)
	}
	if st := f.capacity(); st.Used != 1 || st.Active != 1 || st.Reserved != 0 {
		f.t.Errorf("capacity = %+v; want one active record", st)
	}
}

// testMaybeAppliedFinalizeFree: a finalize and a free whose replies were
// lost applied; their retries are refused (the reservation is consumed,
// the fence moved) and the state is the applied one, counted once.
func testMaybeAppliedFinalizeFree(f *fixture) {
	f.warmUp()
	k := key("acme", "u1", 1)
	if err := f.reserve(k, "res-1", big); err != nil {
		f.t.Fatalf("Reserve: %v", err)
	}
	f.sub.FailNext(true)
	_, err := f.s.Finalize(f.ctx, "res-1", record(k, "sbx1"))
	f.wantIs("Finalize with its reply lost", err, core.ErrStoreUnavailable)
	_, err = f.s.Finalize(f.ctx, "res-1", record(k, "sbx1"))
	f.wantIs("the same Finalize again", err, core.ErrConflict)
	rec := f.get("sbx1")
	if rec.State != core.StateActive || rec.Fence != 1 || f.lookup(k).Binding.SandboxID != "sbx1" {
		f.t.Fatalf("record = %+v; want active at fence 1, bound", rec)
	}
	f.wantUsed(1, 0)
	f.sub.FailNext(true)
	f.wantIs("Free with its reply lost", f.s.Free(f.ctx, rec, t0.Add(time.Minute)), core.ErrStoreUnavailable)
	f.wantIs("the same Free again", f.s.Free(f.ctx, rec, t0.Add(time.Minute)), core.ErrStaleFence)
	if got := f.get("sbx1"); got.State != core.StateGone {
		f.t.Errorf("state = %s; want gone", got.State)
	}
	f.wantUsed(0, 0)
	if look := f.lookup(k); look.TenantUsed != 0 {
		f.t.Errorf("acme's count = %d; want 0", look.TenantUsed)
	}
}

// testNotApplied: a write that failed before it applied changed nothing,
// and the same write then succeeds.
func testNotApplied(f *fixture) {
	f.warmUp()
	k := key("acme", "u1", 1)
	f.sub.FailNext(false)
	if err := f.reserve(k, "res-1", big); err == nil {
		f.t.Fatalf("Reserve with a fault succeeded")
	}
	if look := f.lookup(k); look.Bound {
		f.t.Errorf("lookup = %+v; want no binding", look)
	}
	f.wantUsed(0, 0)
	if err := f.reserve(k, "res-1", big); err != nil {
		f.t.Fatalf("Reserve again: %v", err)
	}
	rec, err := f.s.Finalize(f.ctx, "res-1", record(k, "sbx1"))
	if err != nil {
		f.t.Fatalf("Finalize: %v", err)
	}
	f.sub.FailNext(false)
	_, err = f.s.Claim(f.ctx, lease("sbx1", "acme", "o1", t0, core.StateReleasing, core.StateActive))
	if err == nil || errors.Is(err, core.ErrConflict) {
		f.t.Errorf("Claim with a fault = %v; want the fault", err)
	}
	if got := f.get("sbx1"); got.Fence != rec.Fence || got.State != core.StateActive {
		f.t.Errorf("record = %+v; want unchanged", got)
	}
	if _, err := f.s.Claim(f.ctx, lease("sbx1", "acme", "o1", t0, core.StateReleasing, core.StateActive)); err != nil {
		f.t.Errorf("Claim again: %v", err)
	}
}
