package core_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/storetest"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// waitNotes collects a wait observer's notes and signals each.
type waitNotes struct {
	mu    sync.Mutex
	notes []core.WaitNote
	ch    chan core.WaitNote
}

func newWaitNotes() *waitNotes { return &waitNotes{ch: make(chan core.WaitNote, 256)} }

func (w *waitNotes) observe(n core.WaitNote) {
	w.mu.Lock()
	w.notes = append(w.notes, n)
	w.mu.Unlock()
	w.ch <- n
}

// next waits for the next note of event ev (others are kept).
func (w *waitNotes) next(t *testing.T, ev core.WaitEvent) core.WaitNote {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case n := <-w.ch:
			if n.Event == ev {
				return n
			}
		case <-timeout:
			t.Fatalf("no %s note within a minute", ev)
		}
	}
}

// pollSleep is a waiter's poll interval in these tests: short, real, and
// ended by the context.
func pollSleep(ctx context.Context, _ time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Millisecond):
		return nil
	}
}

// TestWaitersAreServedRoundRobinInArrivalOrder: tenant a queues eight
// waiters, then tenant b one. With one slot freed at a time, b is served
// in the first round (second, right after a's first), and a's waiters in
// their arrival order.
func TestWaitersAreServedRoundRobinInArrivalOrder(t *testing.T) {
	notes := newWaitNotes()
	h := newHarness(t, func(s *core.Settings) {
		s.Replicas, s.Policy, s.AcquireTimeout, s.MaxWaitersPerTenant = 1, core.PolicyWait, time.Hour, 10
	}, core.WithSleep(pollSleep), core.WithWaitObserver(notes.observe))
	ctx := context.Background()
	holder := h.acquire(t, tenantKey("x", "hold"), core.SourceCreated) // the only slot, active: nobody evicts it

	type result struct {
		thread string
		rec    core.Record
		err    error
	}
	results := make(chan result, 16)
	var threads []string
	enqueue := func(tenant, thread string) {
		go func() {
			res, err := h.eng.Acquire(ctx, tenantKey(tenant, thread))
			results <- result{thread, res.Record, err}
		}()
		n := notes.next(t, core.WaitEnqueued)
		if n.Tenant != tenant {
			t.Fatalf("enqueued %s's ticket, want %s's", n.Tenant, tenant)
		}
		threads = append(threads, thread)
		h.clock.advance(time.Millisecond) // arrivals a millisecond apart
	}
	for i := range 8 {
		enqueue("a", fmt.Sprint("a", i+1))
	}
	enqueue("b", "b1")

	// Free the slot: park the holder warm; the queue's head evicts it, the
	// free's dispatch grants it to the head. Each waiter served parks its
	// sandbox in turn.
	release := func(id string) {
		if _, err := h.eng.Release(ctx, "x", id); err != nil && !errors.Is(err, core.ErrNotFound) {
			t.Fatalf("Release %s: %v", id, err)
		}
	}
	release(holder.SandboxID)
	var served []string
	for range threads {
		r := <-results
		if r.err != nil {
			t.Fatalf("%s: %v", r.thread, r.err)
		}
		served = append(served, r.thread)
		if _, err := h.eng.Release(ctx, r.rec.Tenant, r.rec.SandboxID); err != nil {
			t.Fatalf("Release %s: %v", r.thread, err)
		}
	}
	want := []string{"a1", "b1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"}
	if !slices.Equal(served, want) {
		t.Errorf("served %v, want %v", served, want)
	}
	// The observer saw the same order, each served once, in (round, arrival) order.
	notes.mu.Lock()
	defer notes.mu.Unlock()
	var servedNotes []core.WaitNote
	for _, n := range notes.notes {
		if n.Event == core.WaitServed {
			servedNotes = append(servedNotes, n)
		}
	}
	if len(servedNotes) != len(want) {
		t.Fatalf("%d served notes, want %d", len(servedNotes), len(want))
	}
	for i := 1; i < len(servedNotes); i++ {
		if servedNotes[i].SortKey < servedNotes[i-1].SortKey {
			t.Errorf("served %s (key %s) after %s (key %s): out of order", servedNotes[i].Ticket, servedNotes[i].SortKey,
				servedNotes[i-1].Ticket, servedNotes[i-1].SortKey)
		}
	}
	if servedNotes[1].Tenant != "b" || servedNotes[1].Round != 0 {
		t.Errorf("second served = %s round %d, want b's in round 0", servedNotes[1].Tenant, servedNotes[1].Round)
	}
}

// deadLeaver is a store whose LeaveWait does nothing: the invocation died
// before it could leave the queue.
type deadLeaver struct{ core.Store }

func (deadLeaver) LeaveWait(context.Context, core.Ticket, time.Time, time.Duration) error { return nil }

// TestDeadWaiterDoesNotBlockTheQueue: a waiter whose invocation died
// (cancelled, its leave never written) is first in line. Granted a slot,
// its grant lapses and passes to the next waiter; never granted, its
// ticket lapses at the end of its wait and the next waiter becomes the
// head and frees a slot for itself.
//
// Both waits are far longer than the steps between the clock's jumps take
// on a loaded machine: the dead waiter's ticket is still queued when the
// dispatch grants it, and the live waiter still waits when the clock has
// jumped past the dead one's grant or wait. Only the jumps end them.
func TestDeadWaiterDoesNotBlockTheQueue(t *testing.T) {
	const deadWait, liveWait = time.Minute, 3 * time.Minute
	for _, granted := range []bool{true, false} {
		t.Run(fmt.Sprint("granted=", granted), func(t *testing.T) {
			notes := newWaitNotes()
			settings := func(s *core.Settings) {
				s.Replicas, s.Policy, s.AcquireTimeout, s.MaxWaitersPerTenant = 1, core.PolicyWait, liveWait, 10
			}
			h := newHarness(t, settings, core.WithSleep(pollSleep), core.WithWaitObserver(notes.observe))
			s := core.DefaultSettings()
			s.Deployment = "test"
			settings(&s)
			s.AcquireTimeout = deadWait
			dying, err := core.New(s, deadLeaver{h.store}, h.prov, h.sync, core.WithClock(h.clock.now), core.WithSleep(pollSleep),
				core.WithWaitObserver(notes.observe))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			holder := h.acquire(t, tenantKey("x", "hold"), core.SourceCreated)

			dctx, die := context.WithCancel(ctx)
			dead := make(chan error, 1)
			go func() { _, err := dying.Acquire(dctx, tenantKey("a", "dead")); dead <- err }()
			notes.next(t, core.WaitEnqueued)
			die()
			if err := <-dead; !errors.Is(err, context.Canceled) {
				t.Fatalf("dying waiter = %v, want cancelled", err)
			}
			h.clock.advance(5 * time.Second) // the live waiter queues 5 s after the dead one
			live := make(chan error, 1)
			go func() { _, err := h.eng.Acquire(ctx, tenantKey("b", "live")); live <- err }()
			liveNote := notes.next(t, core.WaitEnqueued)

			if granted {
				// The holder is destroyed (released while draining), and a
				// dispatch grants its slot to the head: the dead waiter.
				if err := h.eng.SetDraining(ctx, true); err != nil {
					t.Fatal(err)
				}
				if err := <-live; err == nil {
					t.Fatal("live waiter served while draining")
				}
				if _, err := h.eng.Release(ctx, "x", holder.SandboxID); err != nil {
					t.Fatal(err)
				}
				if err := h.eng.SetDraining(ctx, false); err != nil {
					t.Fatal(err)
				}
				res, err := h.store.Dispatch(ctx, core.Dispatch{Now: h.clock.now(), Limit: 1, Freed: core.NoSlotRef, Scan: true, GrantFor: 5 * time.Second})
				if err != nil || len(res.Granted) != 1 || res.Granted[0].Tenant != "a" {
					t.Fatalf("dispatch granted %+v, %v; want the dead waiter's ticket", res.Granted, err)
				}
				go func() { _, err := h.eng.Acquire(ctx, tenantKey("b", "live")); live <- err }()
				liveNote = notes.next(t, core.WaitEnqueued)
				h.clock.advance(6 * time.Second) // past the grant's term
			} else {
				if _, err := h.eng.Release(ctx, "x", holder.SandboxID); err != nil {
					t.Fatal(err)
				}
				// Past the dead waiter's wait and its ticket's margin, not
				// the live one's.
				h.clock.advance(deadWait + 2*time.Second)
			}
			if err := <-live; err != nil {
				t.Fatalf("live waiter: %v", err)
			}
			served := notes.next(t, core.WaitServed)
			if served.Ticket != liveNote.Ticket {
				t.Errorf("served %s, want the live waiter's %s", served.Ticket, liveNote.Ticket)
			}
		})
	}
}

// heldPolls is a store whose PollTicket waits until open is closed: a
// waiter too slow to see its grant in time.
type heldPolls struct {
	core.Store
	open chan struct{}
}

func (h heldPolls) PollTicket(ctx context.Context, t core.Ticket) (core.TicketState, error) {
	select {
	case <-h.open:
	case <-ctx.Done():
		return core.TicketState{}, ctx.Err()
	}
	return h.Store.PollTicket(ctx, t)
}

// TestLapsedGrantGivesBackThePlace: a waiter too slow to take its grant
// finds its ticket gone (the grant lapsed and was passed on) and, the
// deployment full again, queues anew. Its tenant has one waiter place:
// the first ticket's place must have been given back, or the waiter
// would be refused too_many_waiters by its own lapsed ticket.
func TestLapsedGrantGivesBackThePlace(t *testing.T) {
	notes := newWaitNotes()
	settings := func(s *core.Settings) {
		s.Replicas, s.Policy, s.AcquireTimeout, s.MaxWaitersPerTenant = 1, core.PolicyWait, 2*time.Hour, 1
		s.IdleTimeout = time.Minute
	}
	h := newHarness(t, settings, core.WithSleep(pollSleep), core.WithWaitObserver(notes.observe))
	s := core.DefaultSettings()
	s.Deployment = "test"
	settings(&s)
	open := make(chan struct{})
	slow, err := core.New(s, heldPolls{h.store, open}, h.prov, h.sync, core.WithClock(h.clock.now), core.WithSleep(pollSleep),
		core.WithWaitObserver(notes.observe))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	holder := h.acquire(t, tenantKey("x", "hold"), core.SourceCreated)

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	waited := make(chan error, 1)
	go func() { _, err := slow.Acquire(wctx, tenantKey("a", "slow")); waited <- err }()
	first := notes.next(t, core.WaitEnqueued)

	// The holder is parked; the waiter's own turn right after queueing
	// evicts it, or else it expires and reconcile frees its slot: either
	// way the slot is granted to the waiter, which does not see it (its
	// polls are held).
	if _, err := h.eng.Release(ctx, "x", holder.SandboxID); err != nil {
		t.Fatal(err)
	}
	h.clock.advance(2 * time.Minute)
	if _, err := h.eng.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	ts, err := h.store.PollTicket(ctx, core.Ticket{ID: first.Ticket, Tenant: first.Tenant, Key: first.SortKey})
	if err != nil || !ts.Granted {
		t.Fatalf("ticket after reconcile = %+v, %v; want granted", ts, err)
	}
	if c := h.capacity(t); c.Granted != 1 || c.Used != 1 {
		t.Errorf("capacity with a grant = %+v; want the one slot used, held in trust (granted 1)", c)
	}
	// The grant lapses; a dispatch frees its slot (nobody else waits) and
	// another acquire takes it: the deployment is full again.
	h.clock.advance(6 * time.Second)
	if res, err := h.store.Dispatch(ctx, core.Dispatch{Now: h.clock.now(), Limit: 1, Freed: core.NoSlotRef, Scan: true, GrantFor: 5 * time.Second}); err != nil || res.Cleaned != 1 {
		t.Fatalf("dispatch = %+v, %v; want the lapsed grant cleaned", res, err)
	}
	h.acquire(t, tenantKey("x", "next"), core.SourceCreated)

	close(open)
	for queued := false; !queued; {
		select {
		case err := <-waited:
			t.Fatalf("the slow waiter returned %v; want it queued again", err)
		case n := <-notes.ch:
			if queued = n.Event == core.WaitEnqueued; queued && (n.Tenant != "a" || n.Ticket == first.Ticket) {
				t.Errorf("queued %s's ticket %s; want a's new one", n.Tenant, n.Ticket)
			}
		case <-time.After(time.Minute):
			t.Fatal("the slow waiter neither returned nor queued again within a minute")
		}
	}
	stop()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Errorf("slow waiter after cancel = %v, want cancelled", err)
	}
}

// heldTakes is a store whose takes of a grant (a reservation or resume
// claim carrying one) wait until open is closed: a waiter too slow to
// take the slot granted to it in time. taking hears each take held.
type heldTakes struct {
	storetest.Store
	taking chan struct{}
	open   chan struct{}
}

func (h heldTakes) hold(ctx context.Context, g *core.Grant) error {
	if g == nil {
		return nil
	}
	select {
	case h.taking <- struct{}{}:
	default:
	}
	select {
	case <-h.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h heldTakes) Reserve(ctx context.Context, r core.Reservation) error {
	if err := h.hold(ctx, r.Grant); err != nil {
		return err
	}
	return h.Store.Reserve(ctx, r)
}

func (h heldTakes) ClaimResume(ctx context.Context, r core.ResumeClaim) (core.Record, error) {
	if err := h.hold(ctx, r.Grant); err != nil {
		return core.Record{}, err
	}
	return h.Store.ClaimResume(ctx, r)
}

// TestGrantLostAtTheDeadlineIsACapacityRefusal: a waiter granted a slot
// is too slow to take it: by the time its take (a create's reservation,
// a paused sandbox's resume claim) is written, the grant has lapsed and
// been passed on, another acquire has taken the slot, and the wait's
// deadline has come. The acquire is refused as a waiter that timed out
// is (429, reason capacity), not failed with the store's lost grant, and
// leaves nothing held in the queue.
func TestGrantLostAtTheDeadlineIsACapacityRefusal(t *testing.T) {
	tests := []struct {
		name string
		// prep leaves the waiter's thread as the take needs it.
		prep func(t *testing.T, h *harness)
	}{
		{"reservation", func(*testing.T, *harness) {}},
		{"resume claim", func(t *testing.T, h *harness) { h.pauseThread(t, "slow") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = time.Minute
			settings := func(s *core.Settings) {
				s.Replicas, s.Policy, s.AcquireTimeout, s.MaxWaitersPerTenant = 1, core.PolicyWait, timeout, 1
			}
			notes := newWaitNotes()
			h := newPauseHarness(t, settings, core.WithSleep(pollSleep))
			tc.prep(t, h)
			s := core.DefaultSettings()
			s.Deployment = "test"
			settings(&s)
			held := heldTakes{h.store, make(chan struct{}, 1), make(chan struct{})}
			slow, err := core.New(s, held, h.prov, h.sync, core.WithClock(h.clock.now), core.WithSleep(pollSleep),
				core.WithWaitObserver(notes.observe))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			holder := h.acquire(t, key("hold"), core.SourceCreated) // the only running slot

			waited := make(chan error, 1)
			go func() { _, err := slow.Acquire(ctx, key("slow")); waited <- err }()
			notes.next(t, core.WaitEnqueued)
			// Parked, the holder is evicted by the waiter's turn and its
			// slot granted to the waiter, which then takes it: held.
			if _, err := h.eng.Release(ctx, "acme", holder.SandboxID); err != nil {
				t.Fatal(err)
			}
			select {
			case <-held.taking:
			case err := <-waited:
				t.Fatalf("the waiter returned %v before taking a grant", err)
			case <-time.After(time.Minute):
				t.Fatal("the waiter took no grant within a minute")
			}
			// Past the grant's term and the wait's deadline: a dispatch
			// frees the lapsed grant's slot (nobody else waits) and another
			// acquire takes it.
			h.clock.advance(2 * timeout)
			if res, err := h.store.Dispatch(ctx, core.Dispatch{Now: h.clock.now(), Limit: 1, Freed: core.NoSlotRef, Scan: true,
				GrantFor: 5 * time.Second}); err != nil || res.Cleaned != 1 {
				t.Fatalf("dispatch = %+v, %v; want the lapsed grant cleaned", res, err)
			}
			h.acquire(t, key("next"), core.SourceCreated)
			close(held.open)

			err = <-waited
			var ce *core.CapacityError
			if !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity || ce.RetryAfter <= 0 {
				t.Fatalf("slow waiter = %v; want a capacity refusal with a Retry-After", err)
			}
			if errors.Is(err, core.ErrGrantLost) {
				t.Errorf("slow waiter = %v; want the refusal alone, not the lost grant", err)
			}
			if c := h.capacity(t); c.Used != 1 || c.Granted != 0 {
				t.Errorf("capacity after the refusal = %+v; want the one slot used by the next acquire, none in trust", c)
			}
		})
	}
}
