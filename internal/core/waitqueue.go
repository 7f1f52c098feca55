package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// Fair waiting. Under PolicyWait an acquire refused for capacity queues a
// ticket (Store.EnterWait) and then reads only its own ticket until a
// dispatch grants it a slot, held in trust for it; its next attempt takes
// that slot over (Reservation.Grant, ResumeClaim.Grant). The queue is
// served in (round, arrival) order (see Ticket). Dispatches run after every write
// that frees a running slot (dispatchFreed), once by each waiter right
// after it queued (a free that read the queue just before the ticket was
// written would otherwise leave the slot unused), every waitTurnEvery
// polls by each waiter (its turn: the queue's head also frees a slot for
// itself, as a refused acquire would), and in every reconcile pass.

// Wait queue timings.
const (
	// waitPoll is how often a waiter reads its ticket.
	waitPoll = 250 * time.Millisecond
	// waitTurnEvery is how many polls pass between a waiter's turns.
	waitTurnEvery = 4
	// grantFor is how long a grant stays its ticket's: a live waiter sees
	// it within a poll and takes it at once; a dead one's grant lapses
	// soon and passes on.
	grantFor = 5 * time.Second
	// dispatchBudget bounds a dispatch run inside another call: a
	// waiter's turn, between two polls (a grant made meanwhile must still
	// find the waiter polling well within grantFor), and a free's, before
	// the freeing call answers. A dispatch cut short wrote each of its
	// grants whole; the queue's other dispatches finish the rest.
	dispatchBudget = grantFor / 4
)

// errWaitTimedOut: the waiter's deadline came with no grant;
// errTicketGone: its ticket left the queue (it lapsed and a dispatch
// removed it, or its grant lapsed and a dispatch passed it on).
var (
	errWaitTimedOut = errors.New("wait timed out")
	errTicketGone   = errors.New("wait ticket gone")
)

// WaitEvent says what a WaitNote reports.
type WaitEvent string

// Wait events.
const (
	// WaitEnqueued: the ticket joined the queue.
	WaitEnqueued WaitEvent = "enqueued"
	// WaitServed: the ticket's waiter took the slot granted to it.
	WaitServed WaitEvent = "served"
	// WaitGaveUp: the waiter left without taking a granted slot (timed
	// out, its caller gone, served otherwise, refused for a quota) or lost
	// its ticket (it lapsed before it was taken).
	WaitGaveUp WaitEvent = "gave_up"
)

// WaitNote is what a wait observer (WithWaitObserver) hears of one ticket:
// once when it is queued, once when its waiter is served or gives up.
// Times are on the engine's clock.
type WaitNote struct {
	Event   WaitEvent
	Tenant  string
	Ticket  string
	Round   int
	SortKey string
	// Enqueued is when the ticket was queued; Served when it was served
	// or given up (zero on WaitEnqueued).
	Enqueued time.Time
	Served   time.Time
	// GaveUp is Event == WaitGaveUp.
	GaveUp bool
}

// WithWaitObserver calls observe for every WaitNote (tests, stress runs).
// It is called synchronously by the waiting acquire, from many goroutines
// at once: it must be quick and safe for concurrent use.
func WithWaitObserver(observe func(WaitNote)) Option {
	return func(e *Engine) { e.waitObserver = observe }
}

// waiting is an acquire's place in the wait queue.
type waiting struct {
	ticket Ticket
	// done: the ticket left the queue (served, or left).
	done bool
}

// note reports w's event to the observer, if any.
func (e *Engine) note(w *waiting, ev WaitEvent) {
	if e.waitObserver == nil {
		return
	}
	t := w.ticket
	n := WaitNote{Event: ev, Tenant: t.Tenant, Ticket: t.ID, Round: t.Round, SortKey: t.Key,
		Enqueued: t.Arrived, GaveUp: ev == WaitGaveUp}
	if ev != WaitEnqueued {
		n.Served = e.now()
	}
	e.waitObserver(n)
}

// enterWait queues a ticket for key's acquire, waiting until deadline, in
// one of the tenant's waiter places (MaxWaitersPerTenant). Past the bound
// the acquire is refused at once (RefusalTooManyWaiters); when the store
// cannot decide, it fails closed (RefusalCapacityBackend). The ticket and
// place lapse at the deadline (plus the response margin) by themselves,
// so an invocation that dies while waiting holds them no longer than it
// would have waited.
//
// A refusal here carries the figures of the capacity refusal that sent
// the acquire to wait (refused): the deployment was full as it says.
func (e *Engine) enterWait(ctx context.Context, key ThreadKey, owner string, deadline time.Time, st *acquireState, refused CapacityStatus) error {
	places := e.s.MaxWaitersPerTenant
	if places <= 0 {
		places = maxWaiterPlaces
	}
	t, err := e.store.EnterWait(ctx, Waiter{Tenant: key.Tenant, Ticket: owner + "-" + newOwner()[4:], Max: places,
		Now: e.now(), Until: deadline.Add(responseMargin)})
	var ce *CapacityError
	switch {
	case errors.As(err, &ce):
		ce.Status = refused
		return ce
	case err != nil:
		e.log.WarnContext(ctx, "enter wait failed; refusing", "tenant", key.Tenant, "err", err)
		return &CapacityError{Reason: api.RefusalCapacityBackend, RetryAfter: 2 * time.Second, Status: refused}
	}
	st.wait = &waiting{ticket: t}
	e.note(st.wait, WaitEnqueued)
	return nil
}

// maxWaiterPlaces is the places a tenant has when MaxWaitersPerTenant is
// 0 (no bound of its own), and the most it may be set to: the most one
// read of them fetches.
const maxWaiterPlaces = 100

// waitForGrant waits for a slot for key's acquire: it queues a ticket
// (once per acquire), then reads only the ticket, every waitPoll, until a
// dispatch grants it (nil: st.grant is set), the deadline comes
// (errWaitTimedOut) or the ticket is gone (errTicketGone). Every
// waitTurnEvery polls, and right after queueing, it takes its turn
// (waitTurn).
func (e *Engine) waitForGrant(ctx context.Context, key ThreadKey, owner string, st *acquireState, deadline time.Time, refused CapacityStatus) error {
	if st.wait == nil {
		if err := e.enterWait(ctx, key, owner, deadline, st, refused); err != nil {
			return err
		}
		if err := e.waitTurn(ctx, key, owner, st); err != nil {
			return err
		}
	}
	for polls := 1; ; polls++ {
		ts, err := e.store.PollTicket(ctx, st.wait.ticket)
		switch {
		case err != nil:
			e.log.WarnContext(ctx, "poll wait ticket failed", "ticket", st.wait.ticket.ID, "err", err)
		case ts.Draining:
			return e.drainingError()
		case ts.Gone:
			// Lapsed and removed, or its grant lapsed and was passed on:
			// give back the place it may still hold, so that queueing
			// again neither spends a second place nor counts this one
			// when picking the new ticket's round.
			e.leaveWait(ctx, st)
			return errTicketGone
		case ts.Granted:
			st.grant = &ts.Grant
			return nil
		}
		if !e.now().Add(waitPoll).Before(deadline) {
			return errWaitTimedOut
		}
		if err := e.sleep(ctx, waitPoll); err != nil {
			return fmt.Errorf("acquire: %w", err)
		}
		if polls%waitTurnEvery == 0 {
			if err := e.waitTurn(ctx, key, owner, st); err != nil {
				return err
			}
		}
	}
}

// waitTurn is a waiter's own dispatch: it cleans the head of the queue and
// grants the slots there is room for (reading each ticket first), reading
// the capacity buckets only when this waiter is the first live waiting
// ticket. The head then frees a slot for itself as a refused acquire does
// (one eviction under its tenant's fair share, else, once per acquire,
// the slots of sandboxes the provider ended): the free's dispatch serves
// the queue in order, and so grants it to the head. The
// only error is the draining refusal, when the head finds the deployment
// draining.
func (e *Engine) waitTurn(ctx context.Context, key ThreadKey, owner string, st *acquireState) error {
	me := st.wait.ticket.ID
	tctx, cancel := context.WithTimeout(ctx, dispatchBudget)
	res, err := e.store.Dispatch(tctx, Dispatch{Now: e.now(), Limit: e.s.Limit(), Bucket: -1, Self: me, GrantFor: grantFor})
	cancel()
	switch {
	case err != nil:
		e.log.WarnContext(ctx, "wait turn: dispatch failed", "ticket", me, "err", err)
		return nil
	case res.Read && res.Status.Draining:
		return e.drainingError()
	case res.Head != me || !res.Read:
		return nil
	}
	ok, atShare := e.evictOne(ctx, key, owner, e.fairShareBelow(key, st, res.Tenants), res.Status)
	if atShare {
		st.atShare = true // evict only its own from now on
	}
	if !ok && !st.deadChecked {
		st.deadChecked = true
		e.freeDead(ctx, owner)
	}
	return nil
}

// took returns err, the outcome of a take that was given st's grant (if
// any): applied, it consumed the grant, and the ticket and its place left
// the queue with it.
func (e *Engine) took(st *acquireState, err error) error {
	if err != nil || st.grant == nil || st.wait == nil {
		return err
	}
	st.wait.done = true
	e.note(st.wait, WaitServed)
	st.wait, st.grant = nil, nil // a later refusal queues a new ticket
	return nil
}

// leaveWait takes st's ticket out of the queue if it is still in it (a
// grant it holds passes on to the next waiter). Given back even when the
// caller went away: a short call of its own.
func (e *Engine) leaveWait(ctx context.Context, st *acquireState) {
	w := st.wait
	st.wait, st.grant = nil, nil
	if w == nil || w.done {
		return
	}
	w.done = true
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	err := e.store.LeaveWait(lctx, w.ticket, e.now(), grantFor)
	if err != nil {
		e.log.WarnContext(ctx, "leave wait failed; the ticket lapses by itself", "tenant", w.ticket.Tenant, "ticket", w.ticket.ID, "err", err)
	}
	e.note(w, WaitGaveUp)
}

// dispatchFreed serves the wait queue after a write freed a running slot
// in bucket (-1: not known; every bucket is then read when someone
// waits). Only the wait policy queues. A failure is logged: the waiters'
// own turns and reconcile serve the queue too.
func (e *Engine) dispatchFreed(ctx context.Context, bucket int) {
	if e.s.Policy != PolicyWait {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, dispatchBudget)
	defer cancel()
	d := Dispatch{Now: e.now(), Limit: e.s.Limit(), Bucket: bucket, Scan: bucket < 0, GrantFor: grantFor}
	if _, err := e.store.Store.Dispatch(dctx, d); err != nil {
		e.log.WarnContext(ctx, "dispatch after a free failed", "bucket", bucket, "err", err)
	}
}
