package ddbstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// poolSlots are the running slots used, the paused slots used, the pool's
// places, and the holders of each as reconcile counts them.
type poolSlots struct{ used, paused, places, pausedHolders, placeHolders int }

func readPoolSlots(t *testing.T, s *ddbstore.Store) poolSlots {
	t.Helper()
	ctx := context.Background()
	paused, places, err := s.CountHolders(ctx)
	if err != nil {
		t.Fatalf("CountHolders: %v", err)
	}
	return poolSlots{used: runningUsed(t, s), paused: paused.Used, places: places.Used, pausedHolders: paused.Counted, placeHolders: places.Counted}
}

// A member parked paused moves its slots as a thread's paused sandbox
// does: pausing holds both, pooled paused its paused slot and its place,
// a claim takes a running slot (and the thread's quotas) and gives the
// place back, the activation frees the paused slot.
func TestPausedPoolMemberMovesItsSlots(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	pooledMember(t, s, "m1", 5)
	check := func(step string, want poolSlots) {
		t.Helper()
		if got := readPoolSlots(t, s); got != want {
			t.Errorf("%s: slots %+v, want %+v", step, got, want)
		}
	}
	check("pooled running", poolSlots{used: 1, paused: 0, places: 1, pausedHolders: 0, placeHolders: 1})
	pausing, err := s.ClaimPoolPause(ctx, core.Claim{SandboxID: "m1", Owner: "refill", Now: t0, LeaseUntil: t0.Add(time.Minute)}, 5)
	if err != nil {
		t.Fatalf("ClaimPoolPause: %v", err)
	}
	check("pausing", poolSlots{used: 1, paused: 1, places: 1, pausedHolders: 1, placeHolders: 1})
	paused, err := s.SettlePoolPause(ctx, pausing, t0)
	if err != nil {
		t.Fatalf("SettlePoolPause: %v", err)
	}
	if paused.State != core.StatePooled || paused.Slots != (core.Slots{NoRunning: true, Paused: true, PausedRef: paused.Slots.PausedRef}) {
		t.Fatalf("settled member = %s %+v, want pooled holding a paused slot", paused.State, paused.Slots)
	}
	check("pooled paused", poolSlots{used: 0, paused: 1, places: 1, pausedHolders: 1, placeHolders: 1})
	members, err := s.PoolMembers(ctx, 10)
	if err != nil || len(members) != 1 || !members[0].Slots.Paused {
		t.Fatalf("PoolMembers = %+v, %v; want the paused member", members, err)
	}
	if _, err := s.ClaimPoolPause(ctx, core.Claim{SandboxID: "m1", Owner: "refill", Now: t0, LeaseUntil: t0.Add(time.Minute)}, 5); !errors.Is(err, core.ErrLeaseHeld) && !errors.Is(err, core.ErrConflict) {
		t.Errorf("second ClaimPoolPause of a paused member = %v, want a refusal", err)
	}
	claim := core.PoolClaim{Member: members[0], ThreadKey: thread(1), Owner: "inv", Now: t0, LeaseUntil: t0.Add(time.Minute), Limit: 10}
	claimed, err := s.ClaimPoolMember(ctx, claim)
	if err != nil {
		t.Fatalf("ClaimPoolMember: %v", err)
	}
	if claimed.State != core.StateClaiming || claimed.Slots != (core.Slots{Paused: true, PausedRef: claimed.Slots.PausedRef}) || !claimed.Slot.Quota {
		t.Errorf("claimed = %s %+v %+v, want claiming, both slots, in the quotas", claimed.State, claimed.Slots, claimed.Slot)
	}
	if stored, err := s.Get(ctx, "m1"); err != nil || stored.Slots != claimed.Slots || stored.Slot != claimed.Slot || stored.Fence != claimed.Fence {
		t.Errorf("stored = %+v %+v fence %d (%v), want the claim's %+v %+v fence %d", stored.Slots, stored.Slot, stored.Fence, err,
			claimed.Slots, claimed.Slot, claimed.Fence)
	}
	check("claiming", poolSlots{used: 1, paused: 1, places: 0, pausedHolders: 1, placeHolders: 0})
	if look, err := s.Lookup(ctx, thread(1), 10); err != nil || look.TenantUsed != 1 || look.Binding.SandboxID != "m1" {
		t.Errorf("lookup = %+v, %v; want bound to m1, the tenant holding 1", look, err)
	}
	active, err := s.SettleResume(ctx, claimed, t0, t0.Add(time.Hour))
	if err != nil {
		t.Fatalf("SettleResume: %v", err)
	}
	if active.State != core.StateActive || active.Slots != (core.Slots{}) {
		t.Errorf("active = %s %+v, want active with a running slot only", active.State, active.Slots)
	}
	check("active", poolSlots{used: 1, paused: 0, places: 0, pausedHolders: 0, placeHolders: 0})
}

func TestPausedPoolMemberClaimNeedsARunningSlot(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	pooledMember(t, s, "m1", 5)
	pausing, err := s.ClaimPoolPause(ctx, core.Claim{SandboxID: "m1", Owner: "refill", Now: t0, LeaseUntil: t0.Add(time.Minute)}, 5)
	if err != nil {
		t.Fatalf("ClaimPoolPause: %v", err)
	}
	member, err := s.SettlePoolPause(ctx, pausing, t0)
	if err != nil {
		t.Fatalf("SettlePoolPause: %v", err)
	}
	activeRecord(t, s, thread(2), "busy") // the deployment's one running slot
	_, err = s.ClaimPoolMember(ctx, core.PoolClaim{Member: member, ThreadKey: thread(1), Owner: "inv", Now: t0, LeaseUntil: t0.Add(time.Minute), Limit: 1})
	var ce *core.CapacityError
	if !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
		t.Fatalf("ClaimPoolMember in a full deployment = %v, want a capacity refusal", err)
	}
	if got := readPoolSlots(t, s); got != (poolSlots{used: 1, paused: 1, places: 1, pausedHolders: 1, placeHolders: 1}) {
		t.Errorf("after the refusal: %+v, want nothing moved", got)
	}
	// Freed instead (recycled): its paused slot and place go back.
	gone, err := s.Claim(ctx, core.Claim{SandboxID: "m1", From: []core.State{core.StatePooled}, To: core.StateDestroying,
		Owner: "rec", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	if err != nil {
		t.Fatalf("Claim for destruction: %v", err)
	}
	if err := s.Free(ctx, gone, t0); err != nil {
		t.Fatalf("Free: %v", err)
	}
	if got := readPoolSlots(t, s); got != (poolSlots{used: 1}) {
		t.Errorf("after the free: %+v, want the busy sandbox's running slot only", got)
	}
}

func TestAbortPoolPauseKeepsTheMemberRunning(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	pooledMember(t, s, "m1", 5)
	pausing, err := s.ClaimPoolPause(ctx, core.Claim{SandboxID: "m1", Owner: "refill", Now: t0, LeaseUntil: t0.Add(time.Minute)}, 5)
	if err != nil {
		t.Fatalf("ClaimPoolPause: %v", err)
	}
	back, err := s.AbortPoolPause(ctx, pausing, t0)
	if err != nil {
		t.Fatalf("AbortPoolPause: %v", err)
	}
	if back.State != core.StatePooled || back.Slots != (core.Slots{}) {
		t.Errorf("aborted = %s %+v, want pooled running", back.State, back.Slots)
	}
	if got := readPoolSlots(t, s); got != (poolSlots{used: 1, places: 1, placeHolders: 1}) {
		t.Errorf("after the abort: %+v, want the running slot and the place", got)
	}
	if m, err := s.PoolMembers(ctx, 10); err != nil || len(m) != 1 || m[0].Slots.Paused {
		t.Errorf("members = %+v, %v; want the running member", m, err)
	}
}

// poolPlaces is the pool place count, its revision and the places held,
// as CountHolders reads them.
func poolPlaces(s *ddbstore.Store) (used int, revision int64, counted int, err error) {
	_, pool, err := s.CountHolders(context.Background())
	return pool.Used, pool.Revision, pool.Counted, err
}

// A pool count that moved and came back to the value a repair read is not
// repaired (its revision moved); a count that is wrong and stays so is.
func TestPoolCountRepair(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	pooledMember(t, s, "m1", 5)
	used, rev, counted, err := poolPlaces(s)
	if err != nil || used != 1 || counted != 1 {
		t.Fatalf("pool places = %d, held %d, %v; want 1, 1", used, counted, err)
	}
	// A refill's place taken and given back: the count is where it was read.
	if err := s.ReservePool(ctx, core.PoolReservation{Token: "r2", Limit: 10, Size: 5, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
		t.Fatalf("ReservePool: %v", err)
	}
	if _, _, n, err := poolPlaces(s); err != nil || n != 2 {
		t.Errorf("places held with a reservation in flight = %d, %v; want 2", n, err)
	}
	if err := s.FreeReservation(ctx, "r2", core.ThreadKey{}); err != nil {
		t.Fatalf("FreeReservation: %v", err)
	}
	again, rev2, _, err := poolPlaces(s)
	if err != nil || again != used || rev2 == rev {
		t.Fatalf("after take and give-back: count %d revision %d (read %d, %d), %v; want the same count, another revision", again, rev2, used, rev, err)
	}
	if err := s.RepairPoolPlaces(ctx, rev, 7); !errors.Is(err, core.ErrConflict) {
		t.Errorf("RepairPoolPlaces at the old revision = %v, want ErrConflict", err)
	}
	if n := poolCount(t, s); n != 1 {
		t.Errorf("pool count = %d, want 1 (untouched)", n)
	}
	// A count gone wrong is set back to the places held.
	if err := s.RepairPoolPlaces(ctx, rev2, 5); err != nil {
		t.Fatalf("RepairPoolPlaces (corrupting): %v", err)
	}
	wrong, rev3, counted, err := poolPlaces(s)
	if err != nil || wrong != 5 || counted != 1 {
		t.Fatalf("pool places = %d, held %d, %v; want 5 and 1", wrong, counted, err)
	}
	if err := s.RepairPoolPlaces(ctx, rev3, counted); err != nil {
		t.Fatalf("RepairPoolPlaces: %v", err)
	}
	if n := poolCount(t, s); n != 1 {
		t.Errorf("repaired pool count = %d, want 1", n)
	}
}

// AdoptPoolSandbox records a leftover pool sandbox as a thread-less
// tombstone holding a slot and a place: its refill's (a reservation
// consumed) or new ones; it replaces a gone record, never a live one.
func TestAdoptPoolSandbox(t *testing.T) {
	t.Parallel()
	for _, withReservation := range []bool{true, false} {
		t.Run(map[bool]string{true: "reservation consumed", false: "new slot and place"}[withReservation], func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			token := ""
			if withReservation {
				token = "res-x"
				if err := s.ReservePool(ctx, core.PoolReservation{Token: token, Limit: 10, Size: 5, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
					t.Fatalf("ReservePool: %v", err)
				}
			}
			rec := core.Record{SandboxID: "x", State: core.StateDestroying, ThreadKey: thread(9), CreatedAt: t0, UpdatedAt: t0,
				LeaseOwner: "rec", LeaseExpiresAt: t0.Add(time.Minute)}
			got, err := s.AdoptPoolSandbox(ctx, rec, token)
			if err != nil {
				t.Fatalf("AdoptPoolSandbox: %v", err)
			}
			if got.ThreadKey != (core.ThreadKey{}) || got.Slot.Quota {
				t.Errorf("adopted = %+v slot %+v, want thread-less, outside the quotas", got.ThreadKey, got.Slot)
			}
			if sl := readPoolSlots(t, s); sl != (poolSlots{used: 1, places: 1, placeHolders: 1}) {
				t.Errorf("slots = %+v, want one running slot and one place", sl)
			}
			if _, err := s.AdoptPoolSandbox(ctx, rec, ""); !errors.Is(err, core.ErrConflict) {
				t.Errorf("second AdoptPoolSandbox of a live record = %v, want ErrConflict", err)
			}
			stored, err := s.Get(ctx, "x")
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if err := s.Free(ctx, stored, t0); err != nil {
				t.Fatalf("Free: %v", err)
			}
			if sl := readPoolSlots(t, s); sl != (poolSlots{}) {
				t.Errorf("after the free: %+v, want nothing held", sl)
			}
			if _, err := s.AdoptPoolSandbox(ctx, rec, ""); err != nil {
				t.Errorf("AdoptPoolSandbox over the gone record = %v, want it adopted again", err)
			}
		})
	}
}
