package storetest

import (
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// grantFor is how long the suite's grants last.
const grantFor = 30 * time.Second

// enter queues ticket id of tenant (max places) arriving at at, waiting
// ten minutes.
func (f *fixture) enter(tenant, id string, max int, at time.Time) core.Ticket {
	f.t.Helper()
	t, err := f.s.EnterWait(f.ctx, core.Waiter{Tenant: tenant, Ticket: id, Max: max, Now: at, Until: at.Add(10 * time.Minute)})
	if err != nil {
		f.t.Fatalf("EnterWait %s: %v", id, err)
	}
	return t
}

// poll reads ticket t.
func (f *fixture) poll(t core.Ticket) core.TicketState {
	f.t.Helper()
	st, err := f.s.PollTicket(f.ctx, t)
	if err != nil {
		f.t.Fatalf("PollTicket %s: %v", t.ID, err)
	}
	return st
}

// fill reserves limit slots (threads of tenant "fill") and returns their
// tokens' thread keys, so that the ledger's limit is set and full.
func (f *fixture) fill(limit int) []core.ThreadKey {
	f.t.Helper()
	var keys []core.ThreadKey
	for n := range limit {
		k := key("fill", "u1", n)
		if err := f.reserve(k, tok(n), limit); err != nil {
			f.t.Fatalf("Reserve %d: %v", n, err)
		}
		keys = append(keys, k)
	}
	return keys
}

// dispatch serves the queue at now under limit, reading the ledger.
func (f *fixture) dispatch(now time.Time, limit int) core.DispatchResult {
	f.t.Helper()
	res, err := f.s.Dispatch(f.ctx, core.Dispatch{Now: now, Limit: limit, Freed: core.NoSlotRef, Scan: true, GrantFor: grantFor})
	if err != nil {
		f.t.Fatalf("Dispatch: %v", err)
	}
	return res
}

// ids lists the tickets' ids.
func ids(ts []core.Ticket) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

// testEnterWait: a tenant's waiters hold its places; past them it is
// refused (too many waiters), another tenant is not; a place whose wait
// ended is free again; a ticket that left gives its place back.
func testEnterWait(f *fixture) {
	a1 := f.enter("a", "a1", 2, t0)
	f.enter("a", "a2", 2, t0.Add(time.Second))
	_, err := f.s.EnterWait(f.ctx, core.Waiter{Tenant: "a", Ticket: "a3", Max: 2, Now: t0.Add(2 * time.Second), Until: t0.Add(time.Hour)})
	f.wantRefusal("a third waiter of two places", err, api.RefusalTooManyWaiters)
	f.enter("b", "b1", 2, t0.Add(2*time.Second))
	if err := f.s.LeaveWait(f.ctx, a1, t0.Add(3*time.Second), grantFor); err != nil {
		f.t.Fatalf("LeaveWait: %v", err)
	}
	if st := f.poll(a1); !st.Gone {
		f.t.Errorf("a ticket that left = %+v; want gone", st)
	}
	f.enter("a", "a3", 2, t0.Add(4*time.Second))
	// Both places held until their waits end (ten minutes).
	_, err = f.s.EnterWait(f.ctx, core.Waiter{Tenant: "a", Ticket: "a4", Max: 2, Now: t0.Add(5 * time.Second), Until: t0.Add(time.Hour)})
	f.wantRefusal("a waiter while both places are held", err, api.RefusalTooManyWaiters)
	f.enter("a", "a5", 2, t0.Add(11*time.Minute))
	if err := f.s.LeaveWait(f.ctx, a1, t0.Add(12*time.Minute), grantFor); err != nil {
		f.t.Errorf("LeaveWait of a gone ticket: %v", err)
	}
}

// testDispatchOrder: tickets are served round-robin across tenants, in
// arrival order within a round; a dispatch grants the room the ledger has
// and leaves the next waiter at the head; lapsed tickets are removed.
func testDispatchOrder(f *fixture) {
	const limit = 3
	keys := f.fill(limit)
	a1 := f.enter("a", "a1", 4, t0)
	a2 := f.enter("a", "a2", 4, t0.Add(1*time.Second))
	a3 := f.enter("a", "a3", 4, t0.Add(2*time.Second))
	b1 := f.enter("b", "b1", 4, t0.Add(3*time.Second))
	c1, err := f.s.EnterWait(f.ctx, core.Waiter{Tenant: "c", Ticket: "c1", Max: 4, Now: t0.Add(4 * time.Second), Until: t0.Add(5 * time.Second)})
	if err != nil {
		f.t.Fatalf("EnterWait c1: %v", err)
	}
	if res := f.dispatch(t0.Add(4500*time.Millisecond), limit); len(res.Granted) != 0 || res.Head != "a1" {
		f.t.Errorf("dispatch when full = granted %v, head %q; want none, head a1", ids(res.Granted), res.Head)
	}
	for i, k := range keys[:2] {
		if err := f.s.FreeReservation(f.ctx, tok(i), k); err != nil {
			f.t.Fatalf("FreeReservation: %v", err)
		}
	}
	res := f.dispatch(t0.Add(6*time.Second), limit)
	if got := ids(res.Granted); len(got) != 2 || got[0] != "a1" || got[1] != "b1" || res.Head != "a2" {
		f.t.Errorf("dispatch of two slots = granted %v, head %q; want [a1 b1], head a2", got, res.Head)
	}
	if res.Cleaned != 1 {
		f.t.Errorf("dispatch cleaned %d; want 1 (c1's wait ended)", res.Cleaned)
	}
	if st := f.poll(c1); !st.Gone {
		f.t.Errorf("lapsed c1 = %+v; want gone", st)
	}
	for _, t := range []core.Ticket{a1, b1} {
		if st := f.poll(t); !st.Granted || !st.Grant.Until.Equal(t0.Add(6*time.Second+grantFor)) {
			f.t.Errorf("%s = %+v; want granted until t0+36s", t.ID, st)
		}
	}
	for _, t := range []core.Ticket{a2, a3} {
		if st := f.poll(t); st.Granted || st.Gone {
			f.t.Errorf("%s = %+v; want waiting", t.ID, st)
		}
	}
	if st := f.capacity(); st.Used != limit || st.Granted != 2 {
		f.t.Errorf("capacity = %+v; want %d used, 2 held in trust", st, limit)
	}
}

// anyWaiting asks whether a live ticket waits at now.
func (f *fixture) anyWaiting(now time.Time) bool {
	f.t.Helper()
	waiting, err := f.s.AnyWaiting(f.ctx, now)
	if err != nil {
		f.t.Fatalf("AnyWaiting: %v", err)
	}
	return waiting
}

// testAnyWaiting: an empty queue has nobody waiting; a queued ticket
// waits until its wait ends or it is granted; a granted ticket, a lapsed
// one and one that left do not wait.
func testAnyWaiting(f *fixture) {
	const limit = 1
	if f.anyWaiting(t0) {
		f.t.Errorf("AnyWaiting on an empty queue = true")
	}
	keys := f.fill(limit)
	f.enter("a", "a1", 2, t0)
	if !f.anyWaiting(t0.Add(time.Second)) {
		f.t.Errorf("AnyWaiting with a1 queued = false")
	}
	if f.anyWaiting(t0.Add(11 * time.Minute)) {
		f.t.Errorf("AnyWaiting after a1's wait ended = true")
	}
	if err := f.s.FreeReservation(f.ctx, tok(0), keys[0]); err != nil {
		f.t.Fatalf("FreeReservation: %v", err)
	}
	if res := f.dispatch(t0.Add(2*time.Second), limit); len(res.Granted) != 1 {
		f.t.Fatalf("dispatch of the freed slot granted %v; want a1", ids(res.Granted))
	}
	if f.anyWaiting(t0.Add(3 * time.Second)) {
		f.t.Errorf("AnyWaiting with a1 granted = true")
	}
	b1 := f.enter("b", "b1", 2, t0.Add(4*time.Second))
	if !f.anyWaiting(t0.Add(5 * time.Second)) {
		f.t.Errorf("AnyWaiting with b1 queued behind a grant = false")
	}
	if err := f.s.LeaveWait(f.ctx, b1, t0.Add(6*time.Second), grantFor); err != nil {
		f.t.Fatalf("LeaveWait: %v", err)
	}
	if f.anyWaiting(t0.Add(7 * time.Second)) {
		f.t.Errorf("AnyWaiting after b1 left = true")
	}
}

// testGrantTakenAndPassedOn: a reservation takes the slot its ticket was
// granted (the ticket and place leave the queue); a waiter that leaves
// with a grant passes it to the next waiter; a lapsed grant is passed on
// by a dispatch, and freed when nobody waits.
func testGrantTakenAndPassedOn(f *fixture) {
	const limit = 2
	keys := f.fill(limit)
	a1 := f.enter("a", "a1", 4, t0)
	b1 := f.enter("b", "b1", 4, t0.Add(time.Second))
	c1 := f.enter("c", "c1", 4, t0.Add(2*time.Second))
	for i, k := range keys {
		if err := f.s.FreeReservation(f.ctx, tok(i), k); err != nil {
			f.t.Fatalf("FreeReservation: %v", err)
		}
	}
	f.dispatch(t0.Add(3*time.Second), limit)
	g := f.poll(a1).Grant
	k := key("a", "u1", 1)
	err := f.s.Reserve(f.ctx, core.Reservation{Token: "res-a1", ThreadKey: k, Limit: limit, Now: t0.Add(4 * time.Second),
		ExpiresAt: t0.Add(time.Minute), Grant: &g})
	if err != nil {
		f.t.Fatalf("Reserve with the grant: %v", err)
	}
	if st := f.poll(a1); !st.Gone {
		f.t.Errorf("a1 after its take = %+v; want gone", st)
	}
	err = f.s.Reserve(f.ctx, core.Reservation{Token: "res-a1b", ThreadKey: key("a", "u1", 2), Limit: limit, Now: t0.Add(4 * time.Second),
		ExpiresAt: t0.Add(time.Minute), Grant: &g})
	f.wantIs("a second take of the grant", err, core.ErrGrantLost)
	if err := f.s.LeaveWait(f.ctx, b1, t0.Add(5*time.Second), grantFor); err != nil {
		f.t.Fatalf("LeaveWait of a granted ticket: %v", err)
	}
	if st := f.poll(c1); !st.Granted {
		f.t.Errorf("c1 after b1 left with a grant = %+v; want granted", st)
	}
	if st := f.capacity(); st.Used != limit || st.Granted != 1 {
		f.t.Errorf("capacity = %+v; want %d used, 1 held in trust", st, limit)
	}
	res := f.dispatch(t0.Add(5*time.Second+grantFor), limit)
	if res.Cleaned != 1 || len(res.Granted) != 0 {
		f.t.Errorf("dispatch past c1's grant = cleaned %d, granted %v; want its grant freed", res.Cleaned, ids(res.Granted))
	}
	if st := f.capacity(); st.Used != 1 || st.Granted != 0 {
		f.t.Errorf("capacity = %+v; want the lapsed grant's slot freed", st)
	}
}

// testDraining: a draining deployment refuses reservations and pauses,
// marks the waiting tickets, and serves again once the drain ends.
func testDraining(f *fixture) {
	f.warm(key("acme", "u1", 1), "sbx1")
	a1 := f.enter("a", "a1", 2, t0)
	if err := f.s.SetDraining(f.ctx, true); err != nil {
		f.t.Fatalf("SetDraining: %v", err)
	}
	k := key("acme", "u1", 2)
	if look := f.lookup(k); !look.Draining {
		f.t.Errorf("lookup while draining = %+v; want draining", look)
	}
	f.wantRefusal("Reserve while draining", f.reserve(k, "res-2", big), api.RefusalDraining)
	_, err := f.claimPause("sbx1", big)
	f.wantIs("ClaimPause while draining", err, core.ErrDraining)
	if st := f.poll(a1); !st.Draining {
		f.t.Errorf("a waiting ticket = %+v; want marked draining", st)
	}
	if st := f.capacity(); !st.Draining {
		f.t.Errorf("capacity = %+v; want draining", st)
	}
	if err := f.s.SetDraining(f.ctx, false); err != nil {
		f.t.Fatalf("SetDraining(false): %v", err)
	}
	if err := f.reserve(k, "res-2", big); err != nil {
		f.t.Errorf("Reserve after the drain: %v", err)
	}
	f.wantUsed(2, 0)
}
