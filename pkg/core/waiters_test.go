package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
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
	if _, err := h.eng.Acquire(ctx, tenantKey("hog", "t3")); !errors.As(err, &ce) || ce.Reason != core.RefusalTooManyWaiters {
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
