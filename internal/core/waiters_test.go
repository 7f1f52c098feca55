package core_test

import (
	"context"
	"errors"
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
