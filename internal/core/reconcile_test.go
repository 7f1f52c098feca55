package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/memstore"
	"github.com/sandbox-broker/sandbox-broker/internal/storetest"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// recClock is real time shifted by an offset the test advances.
type recClock struct{ offset atomic.Int64 }

func (c *recClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *recClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// faultProvider wraps the fake with faults reconcile must survive: list
// outages, a hook per listed page, create replies lost after the sandbox
// was made, and a check on every kill.
type faultProvider struct {
	*coretest.FakeProvider
	mu         sync.Mutex
	listErr    error
	pageHook   func()
	createLost bool
	onKill     func(id string) // runs before the kill
}

func (p *faultProvider) set(fn func(p *faultProvider)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p)
}

// Capabilities declares the wrapper as the pager, so that its list faults
// apply.
func (p *faultProvider) Capabilities() core.Capabilities {
	c := p.FakeProvider.Capabilities()
	c.Pager = p
	return c
}

func (p *faultProvider) ListPage(ctx context.Context, f core.ListFilter, cursor string, limit int) ([]core.SandboxInfo, string, error) {
	p.mu.Lock()
	err, hook := p.listErr, p.pageHook
	p.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err != nil {
		return nil, "", err
	}
	return p.FakeProvider.ListPage(ctx, f, cursor, limit)
}

func (p *faultProvider) Create(ctx context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	p.mu.Lock()
	lost := p.createLost
	p.mu.Unlock()
	ref, err := p.FakeProvider.Create(ctx, spec)
	if err == nil && lost {
		return core.SandboxRef{}, &core.ProviderError{Op: "create", StatusCode: 502, Message: "reply lost", Ambiguous: true}
	}
	return ref, err
}

func (p *faultProvider) Kill(ctx context.Context, id string) error {
	p.mu.Lock()
	hook := p.onKill
	p.mu.Unlock()
	if hook != nil {
		hook(id)
	}
	return p.FakeProvider.Kill(ctx, id)
}

type recHarness struct {
	// store is the engines' store: in memory (newRecHarness), or on
	// DynamoDB Local (newDDBRecHarness: then db and table reach its
	// table, for items a test loses or corrupts).
	store storetest.Store
	db    *dynamodb.Client
	table string
	fake  *coretest.FakeProvider
	prov  *faultProvider
	clock *recClock
	s     core.Settings
	rs    core.ReconcileSettings
	eng   *core.Engine
	opts  []core.Option // more options for engine
}

// newRecHarness wires an engine over a fresh in-memory store and the
// fault-injecting fake provider.
func newRecHarness(t *testing.T, mutate func(*core.Settings, *core.ReconcileSettings)) *recHarness {
	t.Helper()
	return wireRec(t, &recHarness{store: memstore.New()}, mutate)
}

// newDDBRecHarness is newRecHarness over a fresh DynamoDB Local table.
func newDDBRecHarness(t *testing.T, mutate func(*core.Settings, *core.ReconcileSettings)) *recHarness {
	t.Helper()
	db := testenv.DynamoClient(t)
	table := freshTable(t, db, "rec")
	return wireRec(t, &recHarness{store: ddbstore.New(db, table, "test"), db: db, table: table}, mutate)
}

// wireRec builds h's engine with the settings mutate makes of the
// reconcile tests' defaults (deployment "test", 50 replicas).
func wireRec(t *testing.T, h *recHarness, mutate func(*core.Settings, *core.ReconcileSettings)) *recHarness {
	t.Helper()
	s := core.DefaultSettings()
	s.Deployment = "test"
	s.Replicas = 50
	s.AcquireTimeout = 5 * time.Second
	rs := core.DefaultReconcileSettings()
	if mutate != nil {
		mutate(&s, &rs)
	}
	fake := coretest.NewFakeProvider()
	h.fake, h.prov, h.clock, h.s, h.rs = fake, &faultProvider{FakeProvider: fake}, &recClock{}, s, rs
	h.eng = h.engine(t)
	return h
}

// engine returns another engine (another "invocation") over the same state.
func (h *recHarness) engine(t *testing.T) *core.Engine {
	t.Helper()
	eng, err := core.New(h.s, h.store, h.prov, nil, append([]core.Option{core.WithClock(h.clock.now), core.WithReconcileSettings(h.rs),
		core.WithLogger(slog.New(slog.DiscardHandler))}, h.opts...)...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	return eng
}

func (h *recHarness) pass(t *testing.T) core.ReconcileStats {
	t.Helper()
	st, err := h.eng.Reconcile(context.Background())
	if err != nil {
		t.Fatalf("Reconcile: %v (stats %+v)", err, st)
	}
	return st
}

func (h *recHarness) acquire(t *testing.T, thread string) core.Record {
	t.Helper()
	res, err := h.eng.Acquire(context.Background(), key(thread))
	if err != nil {
		t.Fatalf("Acquire(%s): %v", thread, err)
	}
	return res.Record
}

// untracked makes a sandbox at the provider that DynamoDB knows nothing of.
func (h *recHarness) untracked(t *testing.T, meta map[string]string) string {
	t.Helper()
	ref, err := h.fake.Create(context.Background(), core.CreateSpec{Metadata: meta})
	if err != nil {
		t.Fatalf("fake Create: %v", err)
	}
	return ref.ID
}

func (h *recHarness) threadMeta(thread string, age time.Duration) map[string]string {
	return map[string]string{core.MetaDeployment: h.s.Deployment, core.MetaTenant: "acme", core.MetaUser: "alice",
		core.MetaThread: thread, core.MetaCreatedAt: h.clock.now().Add(-age).UTC().Format(time.RFC3339)}
}

// deleteItem removes a table item behind the broker's back (DynamoDB "loses" it).
func (h *recHarness) deleteItem(t *testing.T, pk string) {
	t.Helper()
	_, err := h.db.DeleteItem(context.Background(), &dynamodb.DeleteItemInput{TableName: &h.table, Key: map[string]types.AttributeValue{
		ddbstore.AttrPK: &types.AttributeValueMemberS{Value: pk}, ddbstore.AttrSK: &types.AttributeValueMemberS{Value: "R"}}})
	if err != nil {
		t.Fatalf("DeleteItem(%s): %v", pk, err)
	}
}

// driftBucket adds add to capacity bucket 0's used count (a drifted
// counter) and bumps its revision (as any write moving "used" does).
func (h *recHarness) driftBucket(t *testing.T, add int) {
	t.Helper()
	_, err := h.db.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{TableName: &h.table,
		Key: map[string]types.AttributeValue{
			ddbstore.AttrPK: &types.AttributeValueMemberS{Value: "CAP#" + h.s.Deployment}, ddbstore.AttrSK: &types.AttributeValueMemberS{Value: "R"}},
		UpdateExpression:          aws.String("ADD used :u, revision :one"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":u": &types.AttributeValueMemberN{Value: fmt.Sprint(add)}, ":one": &types.AttributeValueMemberN{Value: "1"}}})
	if err != nil {
		t.Fatalf("drift bucket: %v", err)
	}
}

func (h *recHarness) used(t *testing.T) int {
	t.Helper()
	st, err := h.store.Capacity(context.Background())
	if err != nil {
		t.Fatalf("Capacity: %v", err)
	}
	return st.Used
}

func (h *recHarness) binding(t *testing.T, thread string) core.Binding {
	t.Helper()
	look, err := h.store.Lookup(context.Background(), key(thread), 10)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return look.Binding
}

func (h *recHarness) state(t *testing.T, id string) core.State {
	t.Helper()
	rec, err := h.store.Get(context.Background(), id)
	if errors.Is(err, core.ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return rec.State
}

// A duplicate whose record a peer holds a live lease on is left for later.
func TestReconcileDefersDuplicateWithLivePeerLease(t *testing.T) {
	h := newDDBRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) { rs.Grace = 0 })
	ctx := context.Background()
	dup := h.acquire(t, "t1")
	now := h.clock.now()
	if _, err := h.store.Claim(ctx, core.Claim{SandboxID: dup.SandboxID, Tenant: "acme", From: []core.State{core.StateActive},
		Owner: "peer", Now: now, LeaseUntil: now.Add(time.Hour)}); err != nil {
		t.Fatalf("peer lease: %v", err)
	}
	h.deleteItem(t, "THR#acme#alice#t1")                       // the binding is lost ...
	canonical := h.untracked(t, h.threadMeta("t1", time.Hour)) // ... and an older sandbox exists

	st := h.pass(t)
	if st.Adopted != 1 || st.Deferred != 1 || st.Killed != 0 {
		t.Errorf("stats = %+v, want adopted 1 deferred 1 killed 0", st)
	}
	if !h.fake.Alive(dup.SandboxID) {
		t.Error("duplicate under a peer lease was killed")
	}
	if got := h.binding(t, "t1").SandboxID; got != canonical {
		t.Errorf("binding = %q, want the oldest sandbox %q", got, canonical)
	}
}

// A duplicate nobody holds is killed once the grace period has passed.
func TestReconcileKillsUnownedDuplicateAfterGrace(t *testing.T) {
	h := newRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) { rs.Grace = 5 * time.Second })
	canonical := h.acquire(t, "t1")
	dup := h.untracked(t, h.threadMeta("t1", 0))

	first := h.pass(t)
	if first.Deferred != 1 || first.Killed != 0 || first.Duplicates != 1 {
		t.Errorf("first pass = %+v, want 1 duplicate deferred, none killed", first)
	}
	h.clock.advance(6 * time.Second)
	second := h.pass(t)
	if second.Killed != 1 {
		t.Errorf("second pass = %+v, want 1 killed", second)
	}
	if h.fake.Alive(dup) || !h.fake.Alive(canonical.SandboxID) {
		t.Errorf("alive: duplicate %v canonical %v; want false, true", h.fake.Alive(dup), h.fake.Alive(canonical.SandboxID))
	}
	if got := h.used(t); got != 1 {
		t.Errorf("used = %d, want 1", got)
	}
}

// Two passes racing over one duplicate: exactly one kills it (invariant 3).
func TestCompetingReconcilersOnlyOneKillsDuplicate(t *testing.T) {
	for round := range 5 {
		h := newRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) { rs.Grace = 0 })
		canonical := h.acquire(t, "t1")
		dup := h.untracked(t, h.threadMeta("t1", 0))
		engines := []*core.Engine{h.engine(t), h.engine(t), h.engine(t)}
		var wg sync.WaitGroup
		var killed atomic.Int64
		for _, e := range engines {
			wg.Go(func() {
				st, _ := e.Reconcile(context.Background())
				killed.Add(int64(st.Killed))
			})
		}
		wg.Wait()
		if got := h.fake.Count("kill " + dup); got != 1 || killed.Load() != 1 {
			t.Errorf("round %d: kill calls %d, stats killed %d; want 1 and 1", round, got, killed.Load())
		}
		if h.fake.Count("kill "+canonical.SandboxID) != 0 {
			t.Errorf("round %d: canonical sandbox was killed", round)
		}
	}
}

// A pass stops at its item budget; the next pass continues where it stopped.
func TestReconcileHonorsItemBudget(t *testing.T) {
	h := newRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) { rs.MaxItems = 2 })
	for i := range 5 {
		h.untracked(t, h.threadMeta(fmt.Sprintf("t%d", i), 0))
	}
	st := h.pass(t)
	if st.Discovered != 2 || !st.BudgetExhausted || st.InventoryComplete {
		t.Errorf("pass 1 = %+v, want 2 discovered, budget exhausted", st)
	}
	total := st.Discovered
	for pass := 2; pass <= 3; pass++ {
		st = h.pass(t)
		total += st.Discovered
	}
	if total != 5 || !st.InventoryComplete {
		t.Errorf("after 3 passes discovered %d (last %+v), want 5 and a complete inventory", total, st)
	}
}

// A pass stops at its page budget.
func TestReconcileHonorsPageBudget(t *testing.T) {
	h := newRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) { rs.MaxPages = 1; rs.PageSize = 1 })
	h.untracked(t, h.threadMeta("t1", 0))
	h.untracked(t, h.threadMeta("t2", 0))
	st := h.pass(t)
	if st.Discovered != 1 || !st.BudgetExhausted || st.Pages != 1 {
		t.Errorf("stats = %+v, want 1 discovered in 1 page, budget exhausted", st)
	}
	if got := h.fake.Count("list"); got != 1 {
		t.Errorf("list calls = %d, want 1", got)
	}
}

// A pass stops at its wall-time budget. The budget is far longer than a
// pass takes on a loaded machine; the page hook moves the clock past it.
func TestReconcileHonorsWallClockBudget(t *testing.T) {
	const budget = time.Minute
	h := newRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) { rs.MaxDuration = budget })
	id := h.untracked(t, h.threadMeta("t1", 0))
	h.prov.set(func(p *faultProvider) { p.pageHook = func() { h.clock.advance(2 * budget) } })
	calls := h.fake.Count("")
	st := h.pass(t)
	if st.Discovered != 0 || !st.BudgetExhausted {
		t.Errorf("stats = %+v, want nothing examined and budget exhausted", st)
	}
	if got := h.fake.Count("") - calls; got != 1 { // the one list call
		t.Errorf("provider calls = %d, want 1 (list only)", got)
	}
	h.prov.set(func(p *faultProvider) { p.pageHook = nil })
	if st := h.pass(t); st.Discovered != 1 || st.Adopted != 1 {
		t.Errorf("next pass = %+v, want the page read again and %s adopted", st, id)
	}
}

// Sandboxes the store has no record of are adopted back from their metadata.
func TestReconcileAdoptsCanonicalAfterStoreLosesRecords(t *testing.T) {
	t.Parallel()
	h := newDDBRecHarness(t, nil)
	rec := h.acquire(t, "t1")
	h.deleteItem(t, "SBX#"+rec.SandboxID)
	h.deleteItem(t, "THR#acme#alice#t1")

	st := h.pass(t)
	if st.Adopted != 1 || st.Killed != 0 {
		t.Fatalf("stats = %+v, want 1 adopted", st)
	}
	if got := h.binding(t, "t1").SandboxID; got != rec.SandboxID {
		t.Errorf("binding = %q, want %q", got, rec.SandboxID)
	}
	if got := h.state(t, rec.SandboxID); got != core.StateWarm {
		t.Errorf("adopted record state = %q, want warm", got)
	}
	// The slot was counted twice (the lost record's and the adoption's);
	// two quiet passes repair the ledger.
	if st2, st3 := h.pass(t), h.pass(t); st2.LedgerRepaired+st3.LedgerRepaired != -1 {
		t.Errorf("ledger repairs = %d, %d; want -1 in all", st2.LedgerRepaired, st3.LedgerRepaired)
	}
	if got := h.used(t); got != 1 {
		t.Errorf("used = %d, want 1", got)
	}
	res, err := h.eng.Acquire(context.Background(), key("t1"))
	if err != nil || res.Record.SandboxID != rec.SandboxID || res.Source != core.SourceReclaimed {
		t.Errorf("Acquire = %+v, %v; want the adopted sandbox reclaimed", res, err)
	}
}

// A sandbox whose metadata names no thread is killed only after OrphanTTL.
func TestReconcileKillsMetadataOrphanOnlyAfterTTL(t *testing.T) {
	h := newRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) { rs.OrphanTTL = 5 * time.Second })
	orphan := h.untracked(t, map[string]string{core.MetaDeployment: h.s.Deployment})
	other := h.untracked(t, map[string]string{core.MetaDeployment: "other-deployment"})

	first := h.pass(t)
	if first.Deferred != 1 || first.Killed != 0 || first.Orphans != 1 {
		t.Errorf("first pass = %+v, want the orphan deferred", first)
	}
	h.clock.advance(6 * time.Second)
	second := h.pass(t)
	if second.Killed != 1 || h.fake.Alive(orphan) {
		t.Errorf("second pass = %+v, orphan alive %v; want it killed", second, h.fake.Alive(orphan))
	}
	if !h.fake.Alive(other) || second.Discovered != 1 {
		t.Errorf("another deployment's sandbox was touched (alive %v, discovered %d)", h.fake.Alive(other), second.Discovered)
	}
	if got := h.used(t); got != 0 {
		t.Errorf("used = %d, want 0", got)
	}
}

// Creates cut short by a crash are settled: adopted when the sandbox exists,
// freed once the reservation is old enough that no create can still land.
func TestReconcileSettlesCrashedCreates(t *testing.T) {
	t.Run("create reply lost: adopted", func(t *testing.T) {
		h := newRecHarness(t, nil)
		h.prov.set(func(p *faultProvider) { p.createLost = true })
		if _, err := h.eng.Acquire(context.Background(), key("t1")); err == nil {
			t.Fatal("Acquire succeeded, want the ambiguous create error")
		}
		h.prov.set(func(p *faultProvider) { p.createLost = false })
		if st := h.pass(t); st.Deferred != 1 || st.Adopted != 0 || st.ReservationsSettled != 0 {
			t.Errorf("pass during the create = %+v, want deferred", st)
		}
		h.clock.advance(h.s.LeaseDuration + h.rs.Grace + time.Second)
		st := h.pass(t)
		if st.Adopted != 1 || st.ReservationsSettled != 1 {
			t.Errorf("pass after = %+v, want adopted and settled", st)
		}
		if got := h.used(t); got != 1 {
			t.Errorf("used = %d, want 1 (the reservation's slot became the record's)", got)
		}
		res, err := h.eng.Acquire(context.Background(), key("t1"))
		if err != nil || res.Source != core.SourceReclaimed {
			t.Errorf("Acquire = %+v, %v; want the adopted sandbox reclaimed", res, err)
		}
	})
	t.Run("create never happened: freed", func(t *testing.T) {
		h := newRecHarness(t, nil)
		h.fake.Set(func(f *coretest.FakeProvider) {
			f.CreateErr = &core.ProviderError{Op: "create", StatusCode: 503, Message: "busy", Ambiguous: true}
		})
		if _, err := h.eng.Acquire(context.Background(), key("t1")); err == nil {
			t.Fatal("Acquire succeeded, want the ambiguous create error")
		}
		if st := h.pass(t); st.ReservationsSettled != 0 {
			t.Errorf("young reservation settled: %+v", st)
		}
		h.clock.advance(h.s.LeaseDuration + h.rs.Grace + time.Second)
		h.prov.set(func(p *faultProvider) { p.listErr = errors.New("provider outage") })
		if st, err := h.eng.Reconcile(context.Background()); err == nil || st.ReservationsSettled != 0 {
			t.Errorf("pass with an incomplete inventory = %+v, %v; want an error and nothing freed", st, err)
		}
		h.prov.set(func(p *faultProvider) { p.listErr = nil })
		if st := h.pass(t); st.ReservationsSettled != 1 {
			t.Errorf("pass = %+v, want the reservation freed", st)
		}
		if got := h.used(t); got != 0 {
			t.Errorf("used = %d, want 0", got)
		}
		if b := h.binding(t, "t1"); b.Reservation != "" {
			t.Errorf("binding still names reservation %s", b.Reservation)
		}
	})
}

func TestReconcileFreesRecordWhoseSandboxVanished(t *testing.T) {
	h := newRecHarness(t, nil)
	rec := h.acquire(t, "t1")
	h.fake.Drop(rec.SandboxID) // killed behind the broker's back
	h.clock.advance(time.Second)
	st := h.pass(t)
	if st.Dead != 1 {
		t.Errorf("stats = %+v, want 1 dead", st)
	}
	if got := h.state(t, rec.SandboxID); got != core.StateGone {
		t.Errorf("state = %s, want gone", got)
	}
	if got := h.used(t); got != 0 {
		t.Errorf("used = %d, want 0", got)
	}
}

// TestReconcileDeadDetectionWaitsForCompleteInventory: a fleet larger than
// one pass is walked over several passes; a record is judged dead only by
// the pass that completes the walk.
func TestReconcileDeadDetectionWaitsForCompleteInventory(t *testing.T) {
	h := newRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) { rs.MaxItems = 4; rs.PageSize = 4 })
	var recs []core.Record
	for i := range 10 {
		recs = append(recs, h.acquire(t, fmt.Sprintf("t%02d", i)))
	}
	h.fake.Drop(recs[3].SandboxID)
	h.clock.advance(time.Second)
	for pass := 1; pass <= 2; pass++ {
		if st := h.pass(t); st.Dead != 0 || st.InventoryComplete {
			t.Fatalf("pass %d = %+v; want incomplete and nothing freed", pass, st)
		}
	}
	st := h.pass(t)
	if !st.InventoryComplete || st.Dead != 1 {
		t.Errorf("pass 3 = %+v, want complete with 1 dead", st)
	}
	if got := h.used(t); got != 9 {
		t.Errorf("used = %d, want 9", got)
	}
}

func TestReconcileRepairsLedgerWithoutOverwritingConcurrentAcquire(t *testing.T) {
	t.Parallel()
	h := newDDBRecHarness(t, nil)
	h.acquire(t, "t1")
	h.driftBucket(t, 4)
	if st := h.pass(t); st.LedgerRepaired != 0 {
		t.Errorf("first pass repaired on a single observation: %+v", st)
	}
	h.acquire(t, "t2")
	h.driftBucket(t, 0) // a concurrent write to the drifted bucket moves its revision
	if st := h.pass(t); st.LedgerRepaired != 0 {
		t.Errorf("pass after a write to the bucket repaired: %+v", st)
	}
	if st := h.pass(t); st.LedgerRepaired != -4 {
		t.Errorf("quiet pass repaired %d, want -4 (6 -> 2)", st.LedgerRepaired)
	}
	if got := h.used(t); got != 2 {
		t.Errorf("used = %d, want 2", got)
	}
}

// TestReconcileNeverExtendsLife: a pass over active, warm and untracked
// sandboxes calls nothing that resets a timeout or touches the sandbox.
func TestReconcileNeverExtendsLife(t *testing.T) {
	h := newRecHarness(t, nil)
	h.acquire(t, "t1")
	warm := h.acquire(t, "t2")
	if _, err := h.eng.Release(context.Background(), "acme", warm.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.untracked(t, h.threadMeta("t3", 0))
	timeouts, runs := h.fake.Count("timeout"), h.fake.Count("run")
	for range 3 {
		h.pass(t)
	}
	if h.fake.Count("timeout") != timeouts || h.fake.Count("run") != runs {
		t.Errorf("reconcile called SetTimeout %d and Run %d times; want 0",
			h.fake.Count("timeout")-timeouts, h.fake.Count("run")-runs)
	}
}

func TestReconcileRetriesTombstonesWithBackoff(t *testing.T) {
	h := newRecHarness(t, nil)
	rec := h.acquire(t, "t1")
	h.fake.Drop(rec.SandboxID)
	h.fake.Set(func(f *coretest.FakeProvider) { f.KillErr = errors.New("timeout") })
	if _, err := h.eng.Acquire(context.Background(), key("t1")); err != nil {
		t.Fatalf("Acquire replacing the dead sandbox: %v", err)
	}
	if got := h.state(t, rec.SandboxID); got != core.StateDestroying {
		t.Fatalf("state = %s, want a tombstone", got)
	}
	h.clock.advance(h.s.LeaseDuration + time.Second)
	if st := h.pass(t); st.TombstonesRetried != 1 || st.Killed != 0 {
		t.Errorf("first retry = %+v, want 1 retried, 0 killed", st)
	}
	h.clock.advance(h.s.LeaseDuration + time.Second)
	if st := h.pass(t); st.TombstonesRetried != 0 {
		t.Errorf("retry inside the back-off: %+v", st)
	}
	h.fake.Set(func(f *coretest.FakeProvider) { f.KillErr = nil })
	h.clock.advance(4 * h.s.LeaseDuration)
	if st := h.pass(t); st.TombstonesRetried != 1 || st.Killed != 1 {
		t.Errorf("retry after back-off = %+v, want killed", st)
	}
	if got := h.used(t); got != 1 {
		t.Errorf("used = %d, want 1", got)
	}
}

func TestReconcileSettingsValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*core.ReconcileSettings)
		ok     bool
	}{
		{"defaults", func(*core.ReconcileSettings) {}, true},
		{"zero grace", func(r *core.ReconcileSettings) { r.Grace = 0 }, true},
		{"no pages", func(r *core.ReconcileSettings) { r.MaxPages = 0 }, false},
		{"no items", func(r *core.ReconcileSettings) { r.MaxItems = 0 }, false},
		{"no time", func(r *core.ReconcileSettings) { r.MaxDuration = 0 }, false},
		{"negative grace", func(r *core.ReconcileSettings) { r.Grace = -time.Second }, false},
		{"no orphan ttl", func(r *core.ReconcileSettings) { r.OrphanTTL = 0 }, false},
		{"page too big", func(r *core.ReconcileSettings) { r.PageSize = 101 }, false},
	}
	for _, tt := range tests {
		rs := core.DefaultReconcileSettings()
		tt.mutate(&rs)
		if err := rs.Validate(); (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v, want ok %v", tt.name, err, tt.ok)
		}
	}
}

// A sandbox of a tenant the deployment no longer serves
// (RECONCILE_KNOWN_TENANTS) is an orphan: killed once older than the
// orphan TTL; sandboxes of known tenants are left alone.
func TestReconcileKillsSandboxOfUnknownTenantAfterTTL(t *testing.T) {
	h := newRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) {
		rs.OrphanTTL = 5 * time.Second
		rs.KnownTenants = []string{"acme"}
	})
	meta := func(tenant string) map[string]string {
		return map[string]string{core.MetaDeployment: h.s.Deployment, core.MetaTenant: tenant, core.MetaUser: "u", core.MetaThread: "t"}
	}
	gone := h.untracked(t, meta("formerly-a-customer"))
	first := h.pass(t)
	if first.Orphans != 1 || first.Killed != 0 || !h.fake.Alive(gone) {
		t.Errorf("first pass = %+v, want the unknown tenant's sandbox counted as an orphan and deferred", first)
	}
	h.clock.advance(6 * time.Second)
	if second := h.pass(t); second.Killed != 1 || h.fake.Alive(gone) {
		t.Errorf("second pass = %+v, alive %v; want the unknown tenant's sandbox killed", second, h.fake.Alive(gone))
	}
}
