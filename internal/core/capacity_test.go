package core_test

// Capacity, warm-pool, tombstone and crash tests of the engine against
// DynamoDB Local: slots are never leaked, never double-freed, and an
// invocation that dies mid-step is taken over by a peer.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// A warm sandbox whose bootstrap fails on reclaim is discarded and the
// thread gets a fresh one.
func TestAcquireDiscardsWarmSandboxWhenBootstrapFails(t *testing.T) {
	r := newRegressionEnv(t, nil)
	eng := r.engine(t, nil)
	ctx := context.Background()
	first, err := eng.Acquire(ctx, key("t1"))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := eng.Release(ctx, "acme", first.Record.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r.prov.runHook = func(ref core.SandboxRef) error {
		if ref.ID == first.Record.SandboxID {
			return errors.New("bootstrap script raised")
		}
		return nil
	}
	res, err := eng.Acquire(ctx, key("t1"))
	if err != nil {
		t.Fatalf("Acquire after failed reclaim bootstrap: %v", err)
	}
	if res.Source != core.SourceCreated || res.Record.SandboxID == first.Record.SandboxID {
		t.Errorf("acquire = %s/%s, want a fresh created sandbox", res.Record.SandboxID, res.Source)
	}
	if r.fake.Alive(first.Record.SandboxID) {
		t.Error("warm sandbox whose bootstrap failed is still alive")
	}
}

// When the kill after a failed reclaim bootstrap is uncertain, the slot is
// kept (invariant 4).
func TestCapacityKeepsSlotWhenWarmReclaimBootstrapKillFails(t *testing.T) {
	r := newRegressionEnv(t, func(s *core.Settings) { s.Replicas = 2; s.Policy = core.PolicyReject })
	eng := r.engine(t, nil)
	ctx := context.Background()
	first, _ := eng.Acquire(ctx, key("t1"))
	if _, err := eng.Release(ctx, "acme", first.Record.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r.prov.runHook = func(ref core.SandboxRef) error {
		if ref.ID == first.Record.SandboxID {
			return errors.New("bootstrap failed")
		}
		return nil
	}
	r.fake.Set(func(f *coretest.FakeProvider) { f.KillErr = errors.New("kill timed out") })
	if _, err := eng.Acquire(ctx, key("t1")); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := r.store.RepairCounters(ctx, 2); err != nil { // the counts by state Capacity reports
		t.Fatalf("RepairCounters: %v", err)
	}
	st, _ := eng.Capacity(ctx)
	if st.Used != 2 || st.Tombstones != 1 {
		t.Errorf("capacity = %+v, want the uncertain kill's tombstone holding a slot (used 2, tombstones 1)", st)
	}
}

// The burst limit only counts under the burst policy.
func TestNonBurstPolicyIgnoresBurstLimit(t *testing.T) {
	for _, policy := range []core.OverflowPolicy{core.PolicyReject, core.PolicyWait} {
		t.Run(string(policy), func(t *testing.T) {
			h := newHarness(t, func(s *core.Settings) {
				s.Replicas, s.Policy, s.BurstLimit, s.AcquireTimeout = 1, policy, 5, 300*time.Millisecond
			})
			h.acquire(t, key("t1"), core.SourceCreated)
			var ce *core.CapacityError
			if _, err := h.eng.Acquire(context.Background(), key("t2")); !errors.As(err, &ce) || ce.Status.Limit != 1 {
				t.Fatalf("second thread under %s = %v, want CapacityError with limit 1", policy, err)
			}
		})
	}
}

// Refusals under the reject policy leave no reservation behind.
func TestCapacityRejectPolicyDoesNotLeakReservedSlots(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	h.acquire(t, key("t1"), core.SourceCreated)
	for i := range 10 {
		if _, err := h.eng.Acquire(context.Background(), key(fmt.Sprint("x", i))); err == nil {
			t.Fatal("acquire over the limit succeeded")
		}
	}
	if st := h.capacity(t); st.Used != 1 || st.Reserved != 0 {
		t.Errorf("after 10 refusals capacity = %+v, want used 1 and nothing reserved", st)
	}
}

// While a release syncs, its sandbox keeps its slot and is not evictable: another
// thread is refused and nothing is killed.
func TestCapacityReleaseHoldsSlotDuringTransition(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	inSync, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.sync.hook = func() { once.Do(func() { close(inSync); <-resume }) }
	done := make(chan error, 1)
	go func() { _, err := h.eng.Release(ctx, "acme", rec.SandboxID); done <- err }()
	<-inSync
	var ce *core.CapacityError
	if _, err := h.eng.Acquire(ctx, key("t2")); !errors.As(err, &ce) {
		t.Errorf("acquire during the release = %v, want CapacityError", err)
	}
	if !h.prov.Alive(rec.SandboxID) {
		t.Error("the releasing sandbox was killed (evicted mid-transition)")
	}
	close(resume)
	if err := <-done; err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// Concurrent evictions racing for one tombstone: exactly one kill attempt.
func TestTombstoneEvictionHasOneRetryOwner(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.prov.Set(func(f *coretest.FakeProvider) { f.KillErr = errors.New("unreachable") })
	_, _ = h.eng.Acquire(ctx, key("t2")) // eviction fails: tombstone
	kills := h.prov.Count("kill " + rec.SandboxID)
	h.clock.advance(core.DefaultSettings().LeaseDuration + time.Second)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = h.eng.Acquire(ctx, key(fmt.Sprint("r", i))) }()
	}
	wg.Wait()
	if got := h.prov.Count("kill "+rec.SandboxID) - kills; got != 1 {
		t.Errorf("concurrent evictions made %d kill attempts on the tombstone, want exactly 1", got)
	}
}

// A warm sandbox a peer holds a lease on (a sync in progress) is skipped.
func TestEvictionDefersPeerLeasedWarmSandbox(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	now := h.clock.now()
	if _, err := h.store.Claim(ctx, core.Claim{SandboxID: rec.SandboxID, Tenant: "acme", From: []core.State{core.StateWarm},
		Owner: "peer-sync", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
		t.Fatalf("peer lease: %v", err)
	}
	var ce *core.CapacityError
	if _, err := h.eng.Acquire(ctx, key("t2")); !errors.As(err, &ce) {
		t.Fatalf("Acquire = %v, want CapacityError (the only warm sandbox is leased)", err)
	}
	if !h.prov.Alive(rec.SandboxID) {
		t.Error("a peer-leased warm sandbox was evicted")
	}
}

// failingReserveStore makes the ledger undecidable for Reserve.
type failingReserveStore struct{ core.Store }

func (s failingReserveStore) Reserve(context.Context, core.Reservation) error {
	return fmt.Errorf("reserve: %w: throttled", core.ErrStoreUnavailable)
}

// When the ledger cannot decide, acquire fails closed (capacity_backend)
// and creates nothing.
func TestUndecidableLedgerFailsClosed(t *testing.T) {
	h := newHarness(t, nil)
	eng, err := core.New(core.DefaultSettings(), failingReserveStore{h.store}, h.prov, h.sync)
	if err != nil {
		t.Fatal(err)
	}
	var ce *core.CapacityError
	if _, err := eng.Acquire(context.Background(), key("t1")); !errors.As(err, &ce) || ce.Reason != "capacity_backend" {
		t.Fatalf("Acquire = %v, want CapacityError reason capacity_backend", err)
	}
	if n := h.prov.Count("create"); n != 0 {
		t.Errorf("provider creates = %d, want 0 (fail closed)", n)
	}
}

// A waiter under the wait policy gets "draining" once a drain starts.
func TestDrainWakesWaiterWithDrainingError(t *testing.T) {
	waiting := make(chan struct{}, 100)
	var drained atomic.Bool
	sleep := func(ctx context.Context, d time.Duration) error {
		waiting <- struct{}{}
		for !drained.Load() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		return nil
	}
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyWait; s.AcquireTimeout = time.Minute }, core.WithSleep(sleep))
	ctx := context.Background()
	h.acquire(t, key("t1"), core.SourceCreated)
	done := make(chan error, 1)
	go func() { _, err := h.eng.Acquire(ctx, key("t2")); done <- err }()
	<-waiting
	if err := h.eng.SetDraining(ctx, true); err != nil {
		t.Fatalf("SetDraining: %v", err)
	}
	drained.Store(true)
	var ce *core.CapacityError
	if err := <-done; !errors.As(err, &ce) || ce.Reason != "draining" {
		t.Fatalf("waiter = %v, want CapacityError reason draining", err)
	}
}

// Crashed invocations: the dead invocation's lease or reservation lapses
// and a peer takes over.

// A releaser that dies mid-sync leaves the record
// releasing under its lease; once the lease lapses the thread's next
// acquire takes the sandbox back.
func TestCrashedReleaseIsTakenOverAfterLeaseLapses(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	now := h.clock.now()
	if _, err := h.store.Claim(ctx, core.Claim{SandboxID: rec.SandboxID, Tenant: "acme", From: []core.State{core.StateActive},
		To: core.StateReleasing, Owner: "inv-dead", Now: now, LeaseUntil: now.Add(core.DefaultSettings().LeaseDuration)}); err != nil {
		t.Fatalf("dead releaser's claim: %v", err)
	}
	short := newHarnessEngine(t, h, func(s *core.Settings) { s.AcquireTimeout = 300 * time.Millisecond })
	if _, err := short.Acquire(ctx, key("t1")); !errors.Is(err, core.ErrLeaseHeld) {
		t.Fatalf("acquire under the dead releaser's live lease = %v, want ErrLeaseHeld", err)
	}
	h.clock.advance(core.DefaultSettings().LeaseDuration + time.Second)
	back := h.acquire(t, key("t1"), core.SourceReclaimed)
	if back.SandboxID != rec.SandboxID {
		t.Errorf("took over %s, want %s", back.SandboxID, rec.SandboxID)
	}
}

// A create that dies after reserving blocks its thread only until
// the reservation expires; the slot stays held (the create may have
// happened) until reconcile settles it.
func TestCrashedCreateIsTakenOverAfterReservationExpires(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	now := h.clock.now()
	if err := h.store.Reserve(ctx, core.Reservation{Token: "res-dead", ThreadKey: key("t1"), Limit: 10, Now: now,
		ExpiresAt: now.Add(core.DefaultSettings().LeaseDuration)}); err != nil {
		t.Fatalf("dead create's reservation: %v", err)
	}
	h.clock.advance(core.DefaultSettings().LeaseDuration + time.Second)
	h.acquire(t, key("t1"), core.SourceCreated)
	if st := h.capacity(t); st.Used != 2 || st.Reserved != 1 {
		t.Errorf("capacity = %+v, want the dead reservation still holding its slot (used 2, reserved 1)", st)
	}
}

// newHarnessEngine builds a second engine over h's store and provider.
func newHarnessEngine(t *testing.T, h *harness, mutate func(*core.Settings)) *core.Engine {
	t.Helper()
	s := core.DefaultSettings()
	s.Deployment = "test"
	mutate(&s)
	eng, err := core.New(s, h.store, h.prov, h.sync, core.WithClock(h.clock.now))
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// A waiting acquire that is finally refused reports the deployment's
// counts (kept with the slots, not counted from the index), including the
// tombstone holding the slot.
func TestWaitRefusalReportsTombstones(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.prov.Set(func(f *coretest.FakeProvider) { f.KillErr = errors.New("unreachable") })
	_, _ = h.eng.Acquire(ctx, key("t2")) // the eviction's kill fails: a tombstone holds the slot

	polls := 0
	s := core.DefaultSettings()
	s.Deployment, s.Replicas, s.Policy, s.AcquireTimeout = "test", 1, core.PolicyWait, time.Hour
	eng, err := core.New(s, h.store, h.prov, h.sync, core.WithClock(h.clock.now), core.WithSleep(func(context.Context, time.Duration) error {
		if polls++; polls == 4 {
			h.clock.advance(2 * time.Hour) // past the acquire timeout
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	var ce *core.CapacityError
	if _, err := eng.Acquire(ctx, key("t3")); !errors.As(err, &ce) {
		t.Fatalf("Acquire = %v, want CapacityError", err)
	}
	if polls < 3 {
		t.Errorf("polls %d, want several", polls)
	}
	if ce.Status.Tombstones != 1 || ce.Status.Used != 1 {
		t.Errorf("refusal status = %+v, want used 1 held by 1 tombstone", ce.Status)
	}
}

// racingReserveStore loses every reservation to a peer with err, as a
// thread whose binding keeps moving does.
type racingReserveStore struct {
	core.Store
	err error
}

func (s racingReserveStore) Reserve(context.Context, core.Reservation) error { return s.err }

// An acquire that loses the race for its thread until its time runs out
// is refused with the retryable held-lease conflict, whatever the last
// attempt met: never a 404 for a sandbox nobody asked about, nor a final
// conflict.
func TestAcquireContendedUntilTheDeadlineIsRetryable(t *testing.T) {
	for _, race := range []error{core.ErrThreadBound, core.ErrConflict, core.ErrNotFound} {
		t.Run(race.Error(), func(t *testing.T) {
			h := newHarness(t, nil)
			s := core.DefaultSettings()
			s.Deployment, s.AcquireTimeout = "test", 5*time.Second
			attempts := 0
			eng, err := core.New(s, racingReserveStore{h.store, fmt.Errorf("reserve: %w", race)}, h.prov, h.sync,
				core.WithClock(h.clock.now), core.WithSleep(func(_ context.Context, d time.Duration) error {
					attempts++
					h.clock.advance(d)
					return nil
				}))
			if err != nil {
				t.Fatal(err)
			}
			_, err = eng.Acquire(context.Background(), key("t1"))
			if !errors.Is(err, core.ErrLeaseHeld) || errors.Is(err, race) {
				t.Errorf("Acquire = %v, want ErrLeaseHeld and not %v", err, race)
			}
			if attempts == 0 {
				t.Error("the acquire gave up without retrying")
			}
			if n := h.prov.Count("create"); n != 0 {
				t.Errorf("provider creates = %d, want 0", n)
			}
		})
	}
}
