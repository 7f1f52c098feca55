package core_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/storetest"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// Under wait, a tenant's acquires past SANDBOX_MAX_WAITERS_PER_TENANT are
// refused at once (too_many_waiters) while another tenant's still wait,
// and a waiter that gives up frees its place for the next.
func TestTooManyWaitersPerTenant(t *testing.T) {
	asleep := make(chan struct{}, 16)
	sleep := func(ctx context.Context, _ time.Duration) error {
		asleep <- struct{}{}
		<-ctx.Done() // waits until its caller gives up
		return ctx.Err()
	}
	h := newHarness(t, func(s *core.Settings) {
		s.Replicas, s.Policy, s.AcquireTimeout, s.MaxWaitersPerTenant = 1, core.PolicyWait, time.Hour, 2
	}, core.WithSleep(sleep))
	ctx, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()
	h.acquire(t, tenantKey("hog", "t0"), core.SourceCreated) // the only slot

	type result struct {
		thread string
		err    error
	}
	results := make(chan result, 8)
	wait := func(ctx context.Context, k core.ThreadKey) {
		go func() {
			_, err := h.eng.Acquire(ctx, k)
			results <- result{k.Thread, err}
		}()
	}
	ctx1, give1Up := context.WithCancel(ctx)
	wait(ctx1, tenantKey("hog", "t1"))
	wait(ctx, tenantKey("hog", "t2"))
	<-asleep
	<-asleep // both hold a waiter place

	var ce *core.CapacityError
	if _, err := h.eng.Acquire(ctx, tenantKey("hog", "t3")); !errors.As(err, &ce) || ce.Reason != api.RefusalTooManyWaiters {
		t.Fatalf("hog's third waiter = %v, want too_many_waiters at once", err)
	}
	// The refusal tells the deployment is full, as the capacity refusal
	// before it read.
	if got := ce.Status; got.Limit != 1 || got.Used != 1 || got.Active != 1 || got.Policy != string(core.PolicyWait) {
		t.Errorf("too_many_waiters status = %+v, want limit 1, used 1, active 1, policy wait", got)
	}
	wait(ctx, tenantKey("acme", "a1"))
	<-asleep // another tenant waits: its places are its own

	give1Up()
	if r := <-results; r.thread != "t1" || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("first to return = %s: %v, want t1 cancelled", r.thread, r.err)
	}
	wait(ctx, tenantKey("hog", "t4"))
	select {
	case <-asleep: // t4 took the place t1 gave back
	case r := <-results:
		t.Fatalf("hog's waiter after one gave up returned %s: %v, want it waiting", r.thread, r.err)
	}
}

// stallTurns is the store with every waiter's turn (with frees, every
// dispatch) stalled until its caller gives up (a dispatch stuck on a slow
// table); turns tells when one starts.
type stallTurns struct {
	storetest.Store
	turns chan struct{}
	frees bool
	left  chan time.Duration // the time a stalled dispatch had, when set
}

func (s stallTurns) Dispatch(ctx context.Context, d core.Dispatch) (core.DispatchResult, error) {
	if d.Self == "" && !s.frees {
		return s.Store.Dispatch(ctx, d)
	}
	if end, ok := ctx.Deadline(); ok && s.left != nil {
		s.left <- time.Until(end)
	}
	select {
	case s.turns <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return core.DispatchResult{}, ctx.Err()
}

// A waiter whose own turn stalls still polls its ticket in time to take
// the grant a free makes meanwhile: the turn runs under a budget well
// within the grant's window, not until the acquire gives up.
func TestWaiterWhoseTurnStallsTakesItsGrant(t *testing.T) {
	prov := coretest.NewFakeProvider()
	prov.Pausable = true // a release pauses, freeing the running slot
	settings := func(s *core.Settings) {
		s.Replicas, s.Policy, s.PauseAfter, s.MaxPaused, s.AcquireTimeout = 1, core.PolicyWait, 0, 8, time.Minute
	}
	h := newHarnessWith(t, prov, settings)
	s := core.DefaultSettings()
	s.Deployment = "test"
	settings(&s)
	store := stallTurns{Store: h.store, turns: make(chan struct{}, 1)}
	eng, err := core.New(s, store, h.prov, h.sync, core.WithClock(h.clock.now))
	if err != nil {
		t.Fatal(err)
	}
	held := h.acquire(t, key("t0"), core.SourceCreated) // the only slot, in use
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := eng.Acquire(ctx, key("t1"))
		got <- err
	}()
	select {
	case <-store.turns: // t1 waits, its turn stalled
	case err := <-got:
		t.Fatalf("Acquire(t1) returned %v before waiting", err)
	}
	if _, err := eng.Release(context.Background(), "acme", held.SandboxID); err != nil {
		t.Fatalf("Release(t0): %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Acquire(t1) = %v, want the slot t0's pause freed (granted while its turn stalled)", err)
	}
}

// A release whose free's dispatch stalls still answers, with its sandbox
// paused: the dispatch runs under its own budget, shorter than what the
// pause's settle step leaves (the waiters' own turns and reconcile serve
// the queue).
func TestReleaseWhoseDispatchStallsAnswers(t *testing.T) {
	prov := coretest.NewFakeProvider()
	prov.Pausable = true
	settings := func(s *core.Settings) {
		s.Replicas, s.Policy, s.PauseAfter, s.MaxPaused = 1, core.PolicyWait, 0, 8
	}
	h := newHarnessWith(t, prov, settings)
	s := core.DefaultSettings()
	s.Deployment = "test"
	settings(&s)
	store := stallTurns{Store: h.store, turns: make(chan struct{}, 1), frees: true, left: make(chan time.Duration, 4)}
	eng, err := core.New(s, store, h.prov, h.sync, core.WithClock(h.clock.now))
	if err != nil {
		t.Fatal(err)
	}
	held := h.acquire(t, key("t0"), core.SourceCreated)
	if _, err := eng.Release(context.Background(), "acme", held.SandboxID); err != nil {
		t.Fatalf("Release = %v, want it answered despite its stalled dispatch", err)
	}
	select {
	case left := <-store.left:
		if budget := 5 * time.Second / 4; left > budget {
			t.Errorf("the free's dispatch had %v, want at most %v", left, budget)
		}
	default:
		t.Fatal("the release dispatched nothing under a deadline")
	}
	if rec, err := eng.Get(context.Background(), "acme", held.SandboxID); err != nil || rec.State != core.StatePaused {
		t.Fatalf("after Release: %v, %v; want paused", rec.State, err)
	}
}

// freeDispatches is the store recording the dispatches of frees (a
// bucket named).
type freeDispatches struct {
	storetest.Store
	mu    sync.Mutex
	frees []core.Dispatch
}

func (s *freeDispatches) Dispatch(ctx context.Context, d core.Dispatch) (core.DispatchResult, error) {
	if d.Bucket >= 0 {
		s.mu.Lock()
		s.frees = append(s.frees, d)
		s.mu.Unlock()
	}
	return s.Store.Dispatch(ctx, d)
}

// In a queue of two lanes, the slot a lane's head frees for itself at its
// turn (an eviction of a sandbox parked after it queued) is dispatched to
// the head's lane, whatever the lane of the bucket it was freed in, and
// the head is served with it.
func TestHeadsEvictionServesItsOwnLane(t *testing.T) {
	settings := func(s *core.Settings) {
		s.Replicas, s.Policy, s.PauseAfter, s.WaitLanes, s.AcquireTimeout = 2, core.PolicyWait, core.PauseNever, 2, 20*time.Second
	}
	h := newHarness(t, settings)
	s := core.DefaultSettings()
	s.Deployment = "test"
	settings(&s)
	store := &freeDispatches{Store: h.store}
	queued := make(chan core.WaitNote, 1)
	eng, err := core.New(s, store, h.prov, h.sync, core.WithClock(h.clock.now), core.WithWaitObserver(func(n core.WaitNote) {
		if n.Event == core.WaitEnqueued {
			queued <- n
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	h.acquire(t, key("t0"), core.SourceCreated)
	t1 := h.acquire(t, key("t1"), core.SourceCreated) // both slots in use: nothing to evict
	got := make(chan error, 1)
	go func() {
		_, err := eng.Acquire(context.Background(), key("t2"))
		got <- err
	}()
	var n core.WaitNote
	select {
	case n = <-queued:
	case err := <-got:
		t.Fatalf("Acquire(t2) returned %v before it queued", err)
	}
	if _, err := eng.Release(context.Background(), "acme", t1.SandboxID); err != nil { // warm: its slot still held
		t.Fatalf("Release(t1): %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Acquire(t2) = %v, want served by its turn's eviction of t1's sandbox", err)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.frees) != 1 || !store.frees[0].ServeLane || store.frees[0].Lane != n.Lane {
		t.Fatalf("the frees' dispatches = %+v, want one, serving lane %d (the evicting head's)", store.frees, n.Lane)
	}
}

// TestALaneRefusalAnswersWithTheWholeStatus: with wait lanes, an acquire
// reads only its lane's buckets for a slot (half of them here). One that
// cannot wait (its wait ran out, no waiter place, no time to wait) looks
// at every bucket before it answers: it takes a slot another lane's
// bucket has, and when there is none its refusal counts every bucket, as
// a refusal does without lanes.
func TestALaneRefusalAnswersWithTheWholeStatus(t *testing.T) {
	const limit, lanes = 4, 2
	late := key("late")
	for _, tc := range []struct {
		name string
		// placeTaken: the tenant's one waiter place is held by another
		// ticket of its own.
		placeTaken bool
		timeout    time.Duration
		// otherLaneOpen: a bucket of the other lane than late's home's
		// has room.
		otherLaneOpen bool
		reason        api.RefusalReason // "": served
	}{
		{"its wait ran out", false, time.Second, false, api.RefusalCapacity},
		// Time enough to wait however slow the first attempt (a wait must
		// have a poll's time left): the waiter place is what refuses.
		{"no waiter place", true, time.Minute, false, api.RefusalTooManyWaiters},
		{"no waiter place, another lane open", true, time.Minute, true, ""},
		{"no time to wait, another lane open", false, 100 * time.Millisecond, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h *harness
			h = newDDBHarness(t, func(s *core.Settings) {
				s.Replicas, s.Policy, s.WaitLanes, s.AcquireTimeout, s.MaxWaitersPerTenant = limit, core.PolicyWait, lanes, tc.timeout, 1
			}, core.WithSleep(func(ctx context.Context, d time.Duration) error {
				h.clock.advance(d)
				return ctx.Err()
			}))
			ctx := context.Background()
			var holders []core.Record
			for n := range limit {
				holders = append(holders, h.acquire(t, tenantKey("hold", fmt.Sprint("t", n)), core.SourceCreated)) // in use: nothing to evict
			}
			if first := tenantKey("hold", "t0"); holders[0].Slot.Bucket != homeBucket(first, limit) {
				t.Fatalf("setup: the first create took bucket %d, want its home %d: homeBucket is not the store's", holders[0].Slot.Bucket, homeBucket(first, limit))
			}
			if tc.otherLaneOpen {
				i := slices.IndexFunc(holders, func(r core.Record) bool { return r.Slot.Bucket%lanes != homeBucket(late, limit)%lanes })
				if i < 0 {
					t.Fatalf("setup: no holder outside the lane of bucket %d", homeBucket(late, limit))
				}
				if err := h.store.Free(ctx, holders[i], h.clock.now()); err != nil { // no dispatch: the slot stays open
					t.Fatalf("free holder: %v", err)
				}
			}
			if look, err := h.store.Lookup(ctx, late, limit); err != nil || !look.HomeFull {
				t.Fatalf("setup: lookup = %+v, %v; want late's home full", look, err)
			}
			if tc.placeTaken {
				if _, err := h.store.EnterWait(ctx, core.Waiter{Tenant: "acme", Ticket: "other", Max: 1, Lanes: lanes,
					Now: h.clock.now(), Until: h.clock.now().Add(time.Hour)}); err != nil {
					t.Fatalf("EnterWait: %v", err)
				}
			}
			res, err := h.eng.Acquire(ctx, late)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("Acquire = %v, want the other lane's slot", err)
				}
				if res.Source != core.SourceCreated {
					t.Errorf("source = %s, want created", res.Source)
				}
				return
			}
			var ce *core.CapacityError
			if !errors.As(err, &ce) || ce.Reason != tc.reason {
				t.Fatalf("Acquire = %v, want a %s refusal", err, tc.reason)
			}
			if ce.Status.Used != limit || ce.Status.Active != limit || ce.Status.Limit != limit || ce.Partial {
				t.Errorf("refusal's status = %+v (partial %v), want every bucket's: used and active %d of %d", ce.Status, ce.Partial, limit, limit)
			}
		})
	}
}

// homeBucket is the capacity bucket k's takes try first under limit (at
// most 64): the store's FNV-1a hash of the thread. Were the store to pick
// otherwise, the tests that use it fail their setup check of the lookup.
func homeBucket(k core.ThreadKey, limit int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(k.Tenant + "\x00" + k.User + "\x00" + k.Thread))
	return int(h.Sum32() % uint32(min(limit, 64)))
}
