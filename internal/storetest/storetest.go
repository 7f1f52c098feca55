// Package storetest is the conformance suite of the broker's store
// contract (core.Store, core.PauseStore, core.PoolStore,
// core.ReconcileStore and core.StorageStore): Run holds every
// implementation to the same behaviour, in the domain's terms (records,
// bindings, slots, tickets, leases, stored bytes), including concurrent callers and writes whose outcome is
// unknown. The DynamoDB store and the in-memory store both run it.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// Store is the whole store contract.
type Store interface {
	core.Store
	core.PauseStore
	core.PoolStore
	core.ReconcileStore
	core.StorageStore
}

// Subject is one fresh, empty store under test.
type Subject struct {
	Store Store
	// FailNext makes the store's next write fail once: before it applies
	// (applied false: nothing is written), or after it applied (applied
	// true: the error wraps core.ErrStoreUnavailable, a lost reply).
	FailNext func(applied bool)
}

// Run runs the suite; newStore returns a fresh, empty store for each case
// (cases run in parallel).
func Run(t *testing.T, newStore func(t *testing.T) Subject) {
	cases := []struct {
		name string
		fn   func(f *fixture)
	}{
		{"ReserveFinalizeFree", testReserveFinalizeFree},
		{"ReserveLimit", testReserveLimit},
		{"Quotas", testQuotas},
		{"Bindings", testBindings},
		{"Claims", testClaims},
		{"FencedApply", testFencedApply},
		{"Renew", testRenew},
		{"MarkExpiring", testMarkExpiring},
		{"EndReason", testEndReason},
		{"SeenWebhook", testSeenWebhook},
		{"PauseSettle", testPauseSettle},
		{"PauseAbortAndLimit", testPauseAbortAndLimit},
		{"Resume", testResume},
		{"Pool", testPool},
		{"PoolClaimAsListed", testPoolClaimAsListed},
		{"PoolClaimAtTheListedFence", testPoolClaimAtTheListedFence},
		{"PoolFairShare", testPoolFairShare},
		{"Storage", testStorage},
		{"RefillBackoff", testRefillBackoff},
		{"EnterWait", testEnterWait},
		{"DispatchOrder", testDispatchOrder},
		{"AnyWaiting", testAnyWaiting},
		{"GrantTakenAndPassedOn", testGrantTakenAndPassedOn},
		{"Draining", testDraining},
		{"Reconcile", testReconcile},
		{"OutputsOwed", testOutputsOwed},
		{"TenantSandboxes", testTenantSandboxes},
		{"RaceLedger", testRaceLedger},
		{"RaceBinding", testRaceBinding},
		{"RaceTicket", testRaceTicket},
		{"RaceClaim", testRaceClaim},
		{"MaybeAppliedReserve", testMaybeAppliedReserve},
		{"MaybeAppliedFinalizeFree", testMaybeAppliedFinalizeFree},
		{"Handover", testHandover},
		{"HandoverSameHolder", testHandoverSameHolder},
		{"HandoverWithinTheLimit", testHandoverWithinTheLimit},
		{"MaybeAppliedHandover", testMaybeAppliedHandover},
		{"NotApplied", testNotApplied},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sub := newStore(t)
			c.fn(&fixture{t: t, s: sub.Store, sub: sub, ctx: context.Background()})
		})
	}
}

// t0 is the suite's clock origin (whole seconds: stores may keep
// milliseconds only).
var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

// big is a limit no case reaches.
const big = 100

// fixture is one case's store and helpers.
type fixture struct {
	t   *testing.T
	s   Store
	sub Subject
	ctx context.Context
}

// key is thread n of user in tenant.
func key(tenant, user string, n int) core.ThreadKey {
	return core.ThreadKey{Tenant: tenant, User: user, Thread: fmt.Sprintf("t%d", n)}
}

// reserve reserves a slot for k under limit with token.
func (f *fixture) reserve(k core.ThreadKey, token string, limit int) error {
	return f.s.Reserve(f.ctx, core.Reservation{Token: token, ThreadKey: k, Seed: k.Seed(), Limit: limit, Now: t0,
		ExpiresAt: t0.Add(time.Minute)})
}

// record is the record sandbox id of k as a create finalizes it.
func record(k core.ThreadKey, id string) core.Record {
	return core.Record{SandboxID: id, ThreadKey: k, Seed: k.Seed(), State: core.StateActive, Backend: "test",
		Endpoint:  core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: "tok"},
		CreatedAt: t0, UpdatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
}

// active reserves and finalizes sandbox id for k.
func (f *fixture) active(k core.ThreadKey, id string) core.Record {
	f.t.Helper()
	if err := f.reserve(k, "res-"+id, big); err != nil {
		f.t.Fatalf("Reserve %s: %v", id, err)
	}
	rec, err := f.s.Finalize(f.ctx, "res-"+id, record(k, id))
	if err != nil {
		f.t.Fatalf("Finalize %s: %v", id, err)
	}
	return rec
}

// get reads sandbox id.
func (f *fixture) get(id string) core.Record {
	f.t.Helper()
	rec, err := f.s.Get(f.ctx, id)
	if err != nil {
		f.t.Fatalf("Get %s: %v", id, err)
	}
	return rec
}

// park moves rec (active, leased or not) to warm, parked at at, as a
// release does, and returns it as read back.
func (f *fixture) park(rec core.Record, at time.Time) core.Record {
	f.t.Helper()
	if _, err := f.s.Apply(f.ctx, core.Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: core.StateWarm, Now: at,
		ParkedAt: at, Owner: rec.ThreadKey, Slot: rec.Slot}); err != nil {
		f.t.Fatalf("Apply warm %s: %v", rec.SandboxID, err)
	}
	return f.get(rec.SandboxID)
}

// warm is a warm record of k, sandbox id, parked at t0.
func (f *fixture) warm(k core.ThreadKey, id string) core.Record {
	f.t.Helper()
	return f.park(f.active(k, id), t0)
}

// capacity reads the capacity status after a counter repair (for a
// limit of big): its counts by state are the repair's.
func (f *fixture) capacity() core.CapacityStatus {
	f.t.Helper()
	if _, err := f.s.RepairCounters(f.ctx, big); err != nil {
		f.t.Fatalf("RepairCounters: %v", err)
	}
	st, err := f.s.Capacity(f.ctx)
	if err != nil {
		f.t.Fatalf("Capacity: %v", err)
	}
	return st
}

// wantUsed checks the running and paused slots held.
func (f *fixture) wantUsed(used, paused int) {
	f.t.Helper()
	if st := f.capacity(); st.Used != used || st.Paused != paused {
		f.t.Errorf("capacity = %+v; want used %d, paused %d", st, used, paused)
	}
}

// lookup reads k's lookup.
func (f *fixture) lookup(k core.ThreadKey) core.Lookup {
	f.t.Helper()
	look, err := f.s.Lookup(f.ctx, k, big)
	if err != nil {
		f.t.Fatalf("Lookup %s: %v", k, err)
	}
	return look
}

// refusal returns err's *CapacityError reason ("" when it is not one).
func refusal(err error) api.RefusalReason {
	var ce *core.CapacityError
	if errors.As(err, &ce) {
		return ce.Reason
	}
	return ""
}

// wantRefusal checks that err is a *CapacityError with reason.
func (f *fixture) wantRefusal(what string, err error, reason api.RefusalReason) {
	f.t.Helper()
	if got := refusal(err); got != reason {
		f.t.Errorf("%s = %v; want a capacity refusal %q", what, err, reason)
	}
}

// wantIs checks that err is target.
func (f *fixture) wantIs(what string, err, target error) {
	f.t.Helper()
	if !errors.Is(err, target) {
		f.t.Errorf("%s = %v; want %v", what, err, target)
	}
}

// lease is a claim by owner of sandbox id of tenant from states to state
// to, leased for a minute from now.
func lease(id, tenant, owner string, now time.Time, to core.State, from ...core.State) core.Claim {
	return core.Claim{SandboxID: id, Tenant: tenant, From: from, To: to, Owner: owner, Now: now, LeaseUntil: now.Add(time.Minute)}
}
