package core_test

// Regression tests for races found in review: each failed before its fix
// in engine.go or the store.

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// hookProvider wraps the fake: runHook runs before each bootstrap (not
// before the probes of reuse) and may replace its result; killCheck runs
// before each Kill.
type hookProvider struct {
	*coretest.FakeProvider
	mu        sync.Mutex
	runHook   func(ref core.SandboxRef) error
	killCheck func(id string)
}

func (p *hookProvider) Run(ctx context.Context, ref core.SandboxRef, cmd core.Command) (core.CommandResult, error) {
	p.mu.Lock()
	hook := p.runHook
	p.mu.Unlock()
	if hook != nil && strings.Contains(cmd.Script, "BOOTSTRAP_OK") {
		if err := hook(ref); err != nil {
			return core.CommandResult{}, err
		}
	}
	return p.FakeProvider.Run(ctx, ref, cmd)
}

func (p *hookProvider) Kill(ctx context.Context, id string) error {
	p.mu.Lock()
	check := p.killCheck
	p.mu.Unlock()
	if check != nil {
		check(id)
	}
	return p.FakeProvider.Kill(ctx, id)
}

// hookStore lets a test act as a peer right after acquire's Lookup.
type hookStore struct {
	*ddbstore.Store
	mu          sync.Mutex
	afterLookup func()
}

func (s *hookStore) Lookup(ctx context.Context, k core.ThreadKey, limit int) (core.Lookup, error) {
	look, err := s.Store.Lookup(ctx, k, limit)
	s.mu.Lock()
	hook := s.afterLookup
	s.afterLookup = nil
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	return look, err
}

type regressionEnv struct {
	store *ddbstore.Store
	hs    *hookStore
	fake  *coretest.FakeProvider
	prov  *hookProvider
	clock *clock
	s     core.Settings
}

func newRegressionEnv(t *testing.T, mutate func(*core.Settings)) *regressionEnv {
	t.Helper()
	client := testenv.DynamoClient(t)
	table := freshTable(t, client, "rev")
	s := core.DefaultSettings()
	s.Deployment = "test"
	s.AcquireTimeout = 2 * time.Second
	if mutate != nil {
		mutate(&s)
	}
	st := ddbstore.New(client, table, s.Deployment)
	fake := coretest.NewFakeProvider()
	return &regressionEnv{store: st, hs: &hookStore{Store: st}, fake: fake, prov: &hookProvider{FakeProvider: fake}, clock: &clock{}, s: s}
}

func (r *regressionEnv) engine(t *testing.T, rs *core.ReconcileSettings) *core.Engine {
	t.Helper()
	opts := []core.Option{core.WithClock(r.clock.now), core.WithLogger(slog.New(slog.DiscardHandler))}
	if rs != nil {
		opts = append(opts, core.WithReconcileSettings(*rs))
	}
	eng, err := core.New(r.s, r.hs, r.prov, nil, opts...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	return eng
}

// A reclaim takes the warm record back without a lease, so a concurrent
// acquire of the same thread reuses it mid-reclaim; when the reclaim's
// bootstrap then fails, the reclaimer's fresh destroy claim succeeds and it
// kills the sandbox the peer was just handed (invariants 2 and 3).
func TestReclaimFailureNeverKillsSandboxHandedToConcurrentAcquire(t *testing.T) {
	r := newRegressionEnv(t, nil)
	ctx := context.Background()
	eng := r.engine(t, nil)
	first, err := eng.Acquire(ctx, key("t1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Release(ctx, "acme", first.Record.SandboxID); err != nil {
		t.Fatal(err)
	}
	entered, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.prov.mu.Lock()
	r.prov.runHook = func(ref core.SandboxRef) error {
		if ref.ID != first.Record.SandboxID {
			return nil
		}
		fail := false
		once.Do(func() { fail = true; close(entered); <-proceed })
		if fail {
			return errors.New("bootstrap: transient envd error")
		}
		return nil
	}
	r.prov.mu.Unlock()

	done := make(chan core.AcquireResult, 1)
	go func() {
		res, _ := r.engine(t, nil).Acquire(ctx, key("t1")) // invocation A: reclaims
		done <- res
	}()
	<-entered
	b, err := r.engine(t, nil).Acquire(ctx, key("t1")) // invocation B, same thread
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	close(proceed)
	a := <-done
	t.Logf("A got %s (%s), B got %s (%s)", a.Record.SandboxID, a.Source, b.Record.SandboxID, b.Source)
	if !r.fake.Alive(b.Record.SandboxID) {
		t.Errorf("sandbox %s handed to B (source %s) was killed by A's failed reclaim; killed = %v",
			b.Record.SandboxID, b.Source, r.fake.Killed())
	}
}

// A create slower than LeaseDuration+Grace (slow bootstrap/restore) has its
// reservation adopted by reconcile as the thread's canonical sandbox; the
// create then fails Finalize, assumes "nobody else knows this sandbox" and
// kills it without a destroy claim, while the record says warm (invariant 3).
func TestFinalizeConflictNeverKillsSandboxReconcileAdopted(t *testing.T) {
	r := newRegressionEnv(t, func(s *core.Settings) { s.AcquireTimeout = time.Second })
	rs := core.DefaultReconcileSettings()
	rec := r.engine(t, &rs)
	var mu sync.Mutex
	var violations []string
	r.prov.killCheck = func(id string) {
		got, err := r.store.Get(context.Background(), id)
		if err == nil && got.State != core.StateDestroying {
			mu.Lock()
			violations = append(violations, id+" killed while its record is "+string(got.State))
			mu.Unlock()
		}
	}
	var once sync.Once
	r.prov.runHook = func(ref core.SandboxRef) error {
		once.Do(func() {
			r.clock.advance(r.s.LeaseDuration + rs.Grace + time.Second) // bootstrap/restore was slow
			st, err := rec.Reconcile(context.Background())
			t.Logf("reconcile during bootstrap: %+v err=%v", st, err)
		})
		return nil
	}
	_, err := r.engine(t, nil).Acquire(context.Background(), key("t1"))
	t.Logf("acquire: %v", err)
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Errorf("kills without a destroy claim: %v", violations)
	}
}

// Reserve reports "capacity" when both the ledger and the binding condition
// fail, so an acquire that lost the thread's binding race to a peer evicts
// another thread's warm sandbox for nothing.
func TestLostBindingRaceDoesNotEvictOtherThreadsWarmSandbox(t *testing.T) {
	r := newRegressionEnv(t, func(s *core.Settings) { s.Replicas = 2; s.Policy = core.PolicyReject })
	ctx := context.Background()
	eng := r.engine(t, nil)
	w, err := eng.Acquire(ctx, key("warm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Release(ctx, "acme", w.Record.SandboxID); err != nil {
		t.Fatal(err)
	}
	r.hs.afterLookup = func() { // peer reserves t2 (the last slot) after our lookup
		now := r.clock.now()
		if err := r.store.Reserve(ctx, core.Reservation{Token: "res-peer", ThreadKey: key("t2"), Seed: key("t2").Seed(),
			Limit: 2, Now: now, ExpiresAt: now.Add(r.s.LeaseDuration)}); err != nil {
			t.Errorf("peer Reserve: %v", err)
		}
	}
	_, err = eng.Acquire(ctx, key("t2"))
	t.Logf("acquire t2: %v", err)
	if !r.fake.Alive(w.Record.SandboxID) {
		t.Errorf("warm sandbox of another thread was evicted although the slot race was for t2's binding; killed = %v", r.fake.Killed())
	}
}

// The store-level root cause of the test above (and of a needless eviction
// when the user's quota, not the deployment, is the limit).
func TestReserveReportsThreadBoundBeforeCapacity(t *testing.T) {
	r := newRegressionEnv(t, nil)
	ctx := context.Background()
	now := time.Now()
	res := core.Reservation{Token: "res-a", ThreadKey: key("t1"), Limit: 1, Now: now, ExpiresAt: now.Add(time.Minute)}
	if err := r.store.Reserve(ctx, res); err != nil {
		t.Fatal(err)
	}
	res.Token = "res-b"
	err := r.store.Reserve(ctx, res)
	if !errors.Is(err, core.ErrThreadBound) {
		t.Errorf("second Reserve for a bound thread at full capacity = %v, want ErrThreadBound", err)
	}
}

// Burst with a zero burst limit behaves as reject: reject evicts another
// thread's warm sandbox when full, and so does burst(0).
func TestCapacityBurstWithZeroLimitFallsBackToReject(t *testing.T) {
	r := newRegressionEnv(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyBurst; s.BurstLimit = 0 })
	ctx := context.Background()
	eng := r.engine(t, nil)
	w, err := eng.Acquire(ctx, key("t1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Release(ctx, "acme", w.Record.SandboxID); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Acquire(ctx, key("t2")); err != nil {
		t.Errorf("burst(0) acquire with another thread's warm sandbox evictable = %v, want eviction then create (as reject)", err)
	}
}

// Reuse does not extend the provider timeout (correct) but records
// expires_at = now + ActiveTimeout, so the API reports a deadline later than
// the one the provider will enforce.
func TestReuseDoesNotOverstateExpiresAt(t *testing.T) {
	r := newRegressionEnv(t, nil)
	ctx := context.Background()
	eng := r.engine(t, nil)
	first, err := eng.Acquire(ctx, key("t1"))
	if err != nil {
		t.Fatal(err)
	}
	r.clock.advance(50 * time.Minute)
	again, err := eng.Acquire(ctx, key("t1"))
	if err != nil || again.Source != core.SourceReused {
		t.Fatalf("reuse: %v %s", err, again.Source)
	}
	if again.Record.ExpiresAt.After(first.Record.ExpiresAt.Add(time.Second)) {
		t.Errorf("reused expires_at = %s, but the provider timeout still ends at %s (never extended)",
			again.Record.ExpiresAt.Format(time.RFC3339), first.Record.ExpiresAt.Format(time.RFC3339))
	}
}

var _ = slices.Contains[[]string]
