package core

import (
	"context"
	"errors"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// Fair waiting. Under PolicyWait an acquire refused for capacity queues a
// ticket (Store.EnterWait) and answers its caller at once with its place
// (Waiting): waiting holds a ticket, never an invocation. Each later ask
// reads only its own ticket and takes a turn (waitTurn), until a dispatch
// grants it a slot, held in trust for it; that ask's attempt takes the
// slot over (Reservation.Grant, ResumeClaim.Grant). The queue is served in
// (round, arrival) order (see Ticket). Dispatches run after every write
// that frees a running slot (dispatchFreed), at every ask of a waiter
// (its turn: the queue's head also frees a slot for itself, as a refused
// acquire would), and in every reconcile pass.

// Wait queue timings.
const (
	// grantFor is how long a grant stays its ticket's: a live waiter sees
	// it at its next ask and takes it at once; a dead one's grant lapses
	// soon and passes on.
	grantFor = 5 * time.Second
	// dispatchBudget bounds a dispatch run inside another call: a
	// waiter's turn, and a free's, before the freeing call answers. A
	// dispatch cut short wrote each of its grants whole; the queue's
	// other dispatches finish the rest.
	dispatchBudget = grantFor / 4
)

// errTicketGone: a waiter's ticket left the queue (it lapsed and a
// dispatch removed it, or its grant lapsed and was passed on).
var errTicketGone = errors.New("wait ticket gone")

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
// place lapse by themselves at the wait's end (plus ticketGrace), so a
// caller that stops asking holds them no longer than it would have
// waited.
//
// A refusal here carries the figures of the capacity refusal that sent
// the acquire to wait (refused): the deployment was full as it says.
func (e *Engine) enterWait(ctx context.Context, key ThreadKey, owner string, waitEnd time.Time, st *acquireState, refused CapacityStatus) error {
	places := e.s.MaxWaitersPerTenant
	if places <= 0 {
		places = maxWaiterPlaces
	}
	t, err := e.store.EnterWait(ctx, Waiter{Tenant: key.Tenant, Ticket: owner + "-" + newOwner()[4:], Max: places,
		Now: e.now(), Until: waitEnd.Add(ticketGrace)})
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

// queue puts key's acquire in the wait queue (once: st.wait keeps its
// ticket) and takes its turn (see turnAndPoll).
func (e *Engine) queue(ctx context.Context, key ThreadKey, owner string, st *acquireState, waitEnd time.Time, refused CapacityStatus) (*Waiting, error) {
	if st.wait == nil {
		if err := e.enterWait(ctx, key, owner, waitEnd, st, refused); err != nil {
			return nil, err
		}
	}
	return e.turnAndPoll(ctx, key, owner, st, waitEnd)
}

// continueWait is the start of an ask that carries its ticket (st.wait):
// it reads the ticket, and answers nil, nil when the ask should attempt
// the acquire (granted: st.grant is set; or the ticket is gone: the ask
// is a new arrival), a refusal once the wait ended, and otherwise takes
// the waiter's turn (see turnAndPoll).
func (e *Engine) continueWait(ctx context.Context, key ThreadKey, owner string, st *acquireState, waitEnd time.Time) (*Waiting, error) {
	ts, err := e.pollTicket(ctx, st)
	if err != nil || ts.Gone || ts.Granted {
		return nil, err
	}
	if !e.now().Before(waitEnd) {
		e.leaveWait(ctx, st)
		status, _ := e.store.Capacity(ctx) // the refusal's figures, best effort
		return nil, e.refused(&CapacityError{Reason: api.RefusalCapacity, Status: status})
	}
	return e.turnAndPoll(ctx, key, owner, st, waitEnd)
}

// turnAndPoll takes the waiter's turn, then reads its ticket: nil, nil
// when a slot is granted to it (st.grant: the next attempt takes it),
// errTicketGone when the ticket left the queue (it lapsed and a dispatch
// removed it, or its grant lapsed and was passed on), the draining
// refusal, or the Waiting to hand the caller.
func (e *Engine) turnAndPoll(ctx context.Context, key ThreadKey, owner string, st *acquireState, waitEnd time.Time) (*Waiting, error) {
	if err := e.waitTurn(ctx, key, owner, st); err != nil {
		return nil, err
	}
	ts, err := e.pollTicket(ctx, st)
	switch {
	case err != nil || ts.Granted:
		return nil, err
	case ts.Gone:
		return nil, errTicketGone
	}
	return &Waiting{Ticket: encodeTicket(st.wait.ticket, key), RetryAfter: waitRetry, Until: waitEnd}, nil
}

// pollTicket reads st's ticket. Granted, it sets st.grant. Gone, it gives
// back the place the ask may still hold, so that queueing again neither
// spends a second place nor counts this one when picking the new ticket's
// round. Draining, it answers the refusal. A failed read is logged and
// reads as still waiting.
func (e *Engine) pollTicket(ctx context.Context, st *acquireState) (TicketState, error) {
	ts, err := e.store.PollTicket(ctx, st.wait.ticket)
	switch {
	case err != nil:
		e.log.WarnContext(ctx, "poll wait ticket failed", "ticket", st.wait.ticket.ID, "err", err)
		return TicketState{}, nil
	case ts.Draining:
		return ts, e.drainingError()
	case ts.Gone:
		e.leaveWait(ctx, st)
	case ts.Granted:
		st.grant = &ts.Grant
	}
	return ts, nil
}

// handOver answers w, the acquire's place in the queue, to its caller:
// the ticket stays in the queue (st no longer holds it, so the ask's end
// does not leave the queue).
func (e *Engine) handOver(st *acquireState, w *Waiting) AcquireResult {
	if w != nil {
		st.wait, st.grant = nil, nil
	}
	return AcquireResult{Waiting: w}
}

// giveUpTicket takes the ticket of req, a wait its caller stopped, out of
// the queue (a grant it holds passes on). Best effort: an abandoned
// ticket lapses by itself.
func (e *Engine) giveUpTicket(ctx context.Context, req AcquireRequest) {
	t, err := decodeTicket(req.Ticket, req.Key)
	if err != nil {
		return
	}
	e.leaveWait(ctx, &acquireState{wait: &waiting{ticket: t}})
}

// waitTurn is a waiter's own dispatch: it cleans the head of the queue and
// grants the slots there is room for (reading each ticket first), reading
// capacity only when this waiter is the first live waiting
// ticket. The head then frees a slot for itself as a refused acquire does
// (one eviction under its tenant's fair share, else, once per acquire,
// the slots of sandboxes the provider ended): the free's dispatch serves
// the queue in order, and so grants it to the head. The
// only error is the draining refusal, when the head finds the deployment
// draining.
func (e *Engine) waitTurn(ctx context.Context, key ThreadKey, owner string, st *acquireState) error {
	me := st.wait.ticket.ID
	tctx, cancel := context.WithTimeout(ctx, dispatchBudget)
	res, err := e.store.Dispatch(tctx, Dispatch{Now: e.now(), Limit: e.s.Limit(), Freed: NoSlotRef, Self: me, GrantFor: grantFor})
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
	ev := e.evictOne(ctx, key, owner, e.fairShareBelow(key, st, res.Tenants))
	if ev.atShare {
		st.atShare = true // evict only its own from now on
	}
	if !e.freeEvicted(ctx, ev) && !st.lostChecked {
		st.lostChecked = true
		_, _ = e.freeLost(ctx, owner)
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
// at ref (NoSlotRef: not known; capacity is then read when someone
// waits). Only the wait policy queues. A failure is logged: the waiters'
// own turns and reconcile serve the queue too.
func (e *Engine) dispatchFreed(ctx context.Context, ref SlotRef) {
	if e.s.Policy != PolicyWait {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, dispatchBudget)
	defer cancel()
	d := Dispatch{Now: e.now(), Limit: e.s.Limit(), Freed: ref, Scan: ref == NoSlotRef, GrantFor: grantFor}
	if _, err := e.store.Store.Dispatch(dctx, d); err != nil {
		e.log.WarnContext(ctx, "dispatch after a free failed", "slot", ref, "err", err)
	}
}
