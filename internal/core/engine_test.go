package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/memstore"
	"github.com/sandbox-broker/sandbox-broker/internal/storetest"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// clock is a test clock: real time shifted by an offset tests advance.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }

type harness struct {
	eng *core.Engine
	// store is the engine's store: in memory (newHarness), or on
	// DynamoDB Local (newDDBHarness: then ddb is it, and db and table
	// reach its table, for writes a bug would make).
	store storetest.Store
	ddb   *ddbstore.Store
	prov  *coretest.FakeProvider
	sync  *fakeSyncer
	clock *clock
	db    *dynamodb.Client
	table string
}

// newHarness wires an engine over a fresh in-memory store.
func newHarness(t *testing.T, mutate func(*core.Settings), opts ...core.Option) *harness {
	t.Helper()
	return newHarnessWith(t, coretest.NewFakeProvider(), mutate, opts...)
}

// newHarnessWith is newHarness over the fake provider prov.
func newHarnessWith(t *testing.T, prov *coretest.FakeProvider, mutate func(*core.Settings), opts ...core.Option) *harness {
	t.Helper()
	return wire(t, &harness{store: memstore.New(), prov: prov}, mutate, opts...)
}

// newDDBHarness wires an engine over a fresh DynamoDB Local table: for
// the tests that count DynamoDB calls or read its items.
func newDDBHarness(t *testing.T, mutate func(*core.Settings), opts ...core.Option) *harness {
	t.Helper()
	return newDDBHarnessWith(t, coretest.NewFakeProvider(), mutate, opts...)
}

// newDDBHarnessWith is newDDBHarness over the fake provider prov.
func newDDBHarnessWith(t *testing.T, prov *coretest.FakeProvider, mutate func(*core.Settings), opts ...core.Option) *harness {
	t.Helper()
	client := testenv.DynamoClient(t)
	table := freshTable(t, client, "engine")
	h := &harness{ddb: ddbstore.New(client, table, "test"), prov: prov, db: client, table: table}
	h.store = h.ddb
	return wire(t, h, mutate, opts...)
}

// wire builds h's engine over h.store and h.prov, with the settings
// mutate makes of the tests' defaults (deployment "test").
func wire(t *testing.T, h *harness, mutate func(*core.Settings), opts ...core.Option) *harness {
	t.Helper()
	s := core.DefaultSettings()
	s.Deployment = "test"
	s.AcquireTimeout = 5 * time.Second
	if mutate != nil {
		mutate(&s)
	}
	h.sync, h.clock = &fakeSyncer{}, &clock{}
	eng, err := core.New(s, h.store, h.prov, h.sync, append([]core.Option{core.WithClock(h.clock.now)}, opts...)...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	h.eng = eng
	return h
}

func key(thread string) core.ThreadKey {
	return core.ThreadKey{Tenant: "acme", User: "alice", Thread: thread}
}

func (h *harness) acquire(t *testing.T, k core.ThreadKey, want core.Source) core.Record {
	t.Helper()
	res, err := h.eng.Acquire(context.Background(), k)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", k, err)
	}
	if res.Source != want {
		t.Fatalf("Acquire(%s) source = %s, want %s", k, res.Source, want)
	}
	if res.Record.State != core.StateActive {
		t.Fatalf("Acquire(%s) state = %s, want active", k, res.Record.State)
	}
	return res.Record
}

func (h *harness) capacity(t *testing.T) core.CapacityStatus {
	t.Helper()
	st, err := h.eng.Capacity(context.Background())
	if err != nil {
		t.Fatalf("Capacity: %v", err)
	}
	return st
}

func TestAcquireCreatesThenReusesWithoutExtendingLife(t *testing.T) {
	h := newHarness(t, nil)
	first := h.acquire(t, key("t1"), core.SourceCreated)
	if first.Endpoint.AccessToken == "" || first.Endpoint.Protocol != core.ProtocolEnvd || first.Backend != "fake" {
		t.Errorf("created record = %+v, want token and backend", first)
	}
	meta := h.prov.Metadata(first.SandboxID)
	for k, want := range map[string]string{core.MetaTenant: "acme", core.MetaUser: "alice", core.MetaThread: "t1", core.MetaDeployment: "test"} {
		if meta[k] != want {
			t.Errorf("metadata[%s] = %q, want %q", k, meta[k], want)
		}
	}
	if meta[core.MetaReservation] == "" || meta[core.MetaCreatedAt] == "" {
		t.Errorf("metadata lacks reservation token or created-at: %v", meta)
	}
	timeouts := h.prov.Count("timeout")
	second := h.acquire(t, key("t1"), core.SourceReused)
	if second.SandboxID != first.SandboxID {
		t.Errorf("reuse returned %s, want %s", second.SandboxID, first.SandboxID)
	}
	if got := h.prov.Count("timeout"); got != timeouts {
		t.Errorf("reuse called SetTimeout %d times; the liveness probe must not extend life", got-timeouts)
	}
	if st := h.capacity(t); st.Used != 1 || st.Active != 1 {
		t.Errorf("capacity = %+v, want used 1 active 1", st)
	}
}

func TestReleaseParksWarmAndAcquireReclaims(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	res, err := h.eng.Release(ctx, "acme", rec.SandboxID)
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	if res.State != "warm" || res.Sync == nil || !res.Sync.Complete {
		t.Errorf("release = %+v, want warm with a complete sync", res)
	}
	if got := h.prov.Timeout(rec.SandboxID); got != core.DefaultSettings().IdleTimeout {
		t.Errorf("parked sandbox timeout = %s, want the idle timeout", got)
	}
	again, err := h.eng.Release(ctx, "acme", rec.SandboxID)
	if err != nil || again.State != "warm" {
		t.Errorf("second release = %+v, %v; want warm no-op", again, err)
	}
	if st := h.capacity(t); st.Warm != 1 || st.Used != 1 {
		t.Errorf("capacity = %+v, want warm 1 used 1 (warm sandboxes hold slots)", st)
	}
	back := h.acquire(t, key("t1"), core.SourceReclaimed)
	if back.SandboxID != rec.SandboxID {
		t.Errorf("reclaimed %s, want %s", back.SandboxID, rec.SandboxID)
	}
	if got := h.prov.Timeout(rec.SandboxID); got != core.DefaultSettings().ActiveTimeout+core.TimerMargin {
		t.Errorf("reclaimed sandbox timeout = %s, want the active timeout plus the timer margin", got)
	}
	// The stored record carries the active deadline the reply announced,
	// not the warm idle deadline the release wrote.
	stored, err := h.eng.Get(ctx, "acme", rec.SandboxID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !stored.ExpiresAt.Equal(back.ExpiresAt) {
		t.Errorf("stored expires_at = %s, want the reclaim reply's %s", stored.ExpiresAt, back.ExpiresAt)
	}
}

func TestCapacityRejectPolicy(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	h.acquire(t, key("t1"), core.SourceCreated)
	_, err := h.eng.Acquire(context.Background(), key("t2"))
	var ce *core.CapacityError
	if !errors.As(err, &ce) {
		t.Fatalf("Acquire over limit = %v, want *CapacityError", err)
	}
	if ce.Reason != "capacity" || ce.RetryAfter <= 0 || ce.Status.Limit != 1 || ce.Status.Policy != "reject" ||
		ce.Status.Active != 1 || ce.Status.Used != 1 {
		t.Errorf("capacity error = %+v, want reason capacity, retry-after, limit 1, policy reject", ce)
	}
	if n := h.prov.Count("create"); n != 1 {
		t.Errorf("provider creates = %d, want 1 (refusal must create nothing)", n)
	}
}

func TestCapacityWaitPolicyTimesOut(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) {
		s.Replicas = 1
		s.Policy = core.PolicyWait
		s.AcquireTimeout = 600 * time.Millisecond
	})
	h.acquire(t, key("t1"), core.SourceCreated)
	start := time.Now()
	_, err := h.eng.Acquire(context.Background(), key("t2"))
	var ce *core.CapacityError
	if !errors.As(err, &ce) {
		t.Fatalf("Acquire = %v, want *CapacityError after waiting", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("wait lasted %s, far beyond the 600ms acquire timeout", time.Since(start))
	}
}

// TestCapacityWaitPolicySucceedsWhenSlotFrees: a waiter gets a slot once
// the holder releases (its sandbox turns warm and is evicted for the
// waiter).
func TestCapacityWaitPolicySucceedsWhenSlotFrees(t *testing.T) {
	waiting := make(chan struct{}, 100)
	sleep := func(ctx context.Context, d time.Duration) error {
		waiting <- struct{}{}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	h := newHarness(t, func(s *core.Settings) {
		s.Replicas = 1
		s.Policy = core.PolicyWait
		s.AcquireTimeout = 30 * time.Second
	}, core.WithSleep(sleep))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	done := make(chan error, 1)
	go func() {
		_, err := h.eng.Acquire(ctx, key("t2"))
		done <- err
	}()
	<-waiting // t2 found no slot (t1 is active: not evictable) and backs off
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting Acquire: %v", err)
	}
	if h.prov.Alive(rec.SandboxID) {
		t.Error("t1's warm sandbox still alive; it should have been evicted for the waiter")
	}
}

// TestCapacityRejectEvictsOtherThreadsWarmSandbox: a full deployment under
// reject first destroys the least recently parked warm sandbox of another
// thread.
func TestCapacityRejectEvictsOtherThreadsWarmSandbox(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 2; s.Policy = core.PolicyReject })
	ctx := context.Background()
	old := h.acquire(t, key("old"), core.SourceCreated)
	newer := h.acquire(t, key("newer"), core.SourceCreated)
	for _, r := range []core.Record{old, newer} {
		if _, err := h.eng.Release(ctx, "acme", r.SandboxID); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	h.acquire(t, key("t3"), core.SourceCreated)
	if h.prov.Alive(old.SandboxID) || !h.prov.Alive(newer.SandboxID) {
		t.Errorf("alive old=%v newer=%v; want the least recently parked (old) evicted", h.prov.Alive(old.SandboxID), h.prov.Alive(newer.SandboxID))
	}
	if st := h.capacity(t); st.Used != 2 || st.Warm != 1 || st.Active != 1 {
		t.Errorf("capacity = %+v, want used 2 (1 warm, 1 active)", st)
	}
	// The thread's own warm sandbox is never evicted for itself: it is reclaimed.
	h.acquire(t, key("newer"), core.SourceReclaimed)
}

// TestCapacityBurstDoesNotEvict: burst grows past replicas instead of
// evicting, and is refused at replicas + burst_limit.
func TestCapacityBurstAllowsLimitedOverflow(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyBurst; s.BurstLimit = 1 })
	h.acquire(t, key("t1"), core.SourceCreated)
	h.acquire(t, key("t2"), core.SourceCreated)
	var ce *core.CapacityError
	if _, err := h.eng.Acquire(context.Background(), key("t3")); !errors.As(err, &ce) || ce.Status.Limit != 2 {
		t.Fatalf("third acquire = %v, want CapacityError with limit 2", err)
	}
}

// TestCapacityKeepsSlotWhenWarmEvictionKillFails: an eviction whose kill
// fails leaves a tombstone holding the slot; the acquire answers the
// provider's outage; a later eviction retries the tombstone (one retry
// owner) and frees it.
func TestCapacityKeepsSlotWhenWarmEvictionKillFails(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.prov.Set(func(f *coretest.FakeProvider) { f.KillErr = errors.New("connection reset") })
	var ce *core.CapacityError
	if _, err := h.eng.Acquire(ctx, key("t2")); !errors.Is(err, core.ErrProviderUnavailable) || errors.As(err, &ce) {
		t.Fatalf("Acquire with failing eviction = %v, want ErrProviderUnavailable", err)
	}
	if st := h.capacity(t); st.Used != 1 || st.Tombstones != 1 {
		t.Errorf("capacity = %+v, want the tombstone holding the slot", st)
	}
	h.prov.Set(func(f *coretest.FakeProvider) { f.KillErr = nil })
	// The failed evictor's lease must lapse before another may retry.
	if _, err := h.eng.Acquire(ctx, key("t2")); !errors.As(err, &ce) {
		t.Fatalf("Acquire under the evictor's live lease = %v, want CapacityError", err)
	}
	h.clock.advance(core.DefaultSettings().LeaseDuration + time.Second)
	h.acquire(t, key("t2"), core.SourceCreated)
	if h.prov.Alive(rec.SandboxID) {
		t.Error("tombstoned sandbox still alive after the retry")
	}
}

func TestDrainingRefusesAcquireAndDestroysOnRelease(t *testing.T) {
	tests := []struct {
		name    string
		harness func(t *testing.T) *harness
	}{
		{"parked warm", func(t *testing.T) *harness { return newHarness(t, nil) }},
		// The release's claim into pausing finds the drain in its paused
		// bucket.
		{"paused at release", func(t *testing.T) *harness {
			return newPauseHarness(t, func(s *core.Settings) { s.PauseAfter = 0 })
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.harness(t)
			ctx := context.Background()
			rec := h.acquire(t, key("t1"), core.SourceCreated)
			if err := h.eng.SetDraining(ctx, true); err != nil {
				t.Fatalf("SetDraining: %v", err)
			}
			var ce *core.CapacityError
			for _, k := range []string{"t1", "t2"} {
				if _, err := h.eng.Acquire(ctx, key(k)); !errors.As(err, &ce) || ce.Reason != "draining" {
					t.Errorf("Acquire(%s) while draining = %v, want reason draining", k, err)
				}
			}
			res, err := h.eng.Release(ctx, "acme", rec.SandboxID)
			if err != nil || res.State != "destroyed" {
				t.Fatalf("Release while draining = %+v, %v; want destroyed", res, err)
			}
			if res.Sync == nil {
				t.Error("release while draining skipped the output sync")
			}
			if h.prov.Alive(rec.SandboxID) {
				t.Errorf("sandbox %s still exists after its release while draining", rec.SandboxID)
			}
			if err := h.eng.SetDraining(ctx, false); err != nil {
				t.Fatalf("undrain: %v", err)
			}
			h.acquire(t, key("t1"), core.SourceCreated)
		})
	}
}

func TestPerUserQuota(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.MaxPerUser = 1; s.Policy = core.PolicyReject })
	h.acquire(t, key("t1"), core.SourceCreated)
	var ce *core.CapacityError
	if _, err := h.eng.Acquire(context.Background(), key("t2")); !errors.As(err, &ce) || ce.Reason != "user_quota" {
		t.Fatalf("second thread of alice = %v, want user_quota", err)
	}
	bob := core.ThreadKey{Tenant: "acme", User: "bob", Thread: "t1"}
	h.acquire(t, bob, core.SourceCreated)
}

// TestConcurrentAcquireAndReleaseLinearize: an acquire racing the same
// sandbox's release either reuses it before the release (which then parks
// it) or waits for the park and reclaims it (it ends active); never a
// "reused" answer for a sandbox the release is parking.
func TestConcurrentAcquireAndReleaseLinearize(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	for i := range 20 {
		var wg sync.WaitGroup
		var got core.AcquireResult
		var aerr, rerr error
		wg.Add(2)
		go func() { defer wg.Done(); got, aerr = h.eng.Acquire(ctx, key("t1")) }()
		go func() { defer wg.Done(); _, rerr = h.eng.Release(ctx, "acme", rec.SandboxID) }()
		wg.Wait()
		if aerr != nil || rerr != nil {
			t.Fatalf("round %d: acquire %v, release %v", i, aerr, rerr)
		}
		if got.Record.SandboxID != rec.SandboxID {
			t.Fatalf("round %d: acquire returned %s, want %s", i, got.Record.SandboxID, rec.SandboxID)
		}
		stored, err := h.store.Get(ctx, rec.SandboxID)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		switch got.Source {
		case core.SourceReused:
			if stored.State != core.StateWarm {
				t.Fatalf("round %d: reused before the release, but the record ended %s, want warm", i, stored.State)
			}
			h.acquire(t, key("t1"), core.SourceReclaimed)
		case core.SourceReclaimed:
			if stored.State != core.StateActive {
				t.Fatalf("round %d: reclaimed after the release, but the record ended %s, want active", i, stored.State)
			}
		default:
			t.Fatalf("round %d: source %s, want reused or reclaimed", i, got.Source)
		}
	}
}

func TestAcquireReplacesSandboxKilledBehindOurBack(t *testing.T) {
	h := newHarness(t, nil)
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.prov.Drop(rec.SandboxID)
	fresh := h.acquire(t, key("t1"), core.SourceCreated)
	if fresh.SandboxID == rec.SandboxID {
		t.Fatalf("acquire returned the dead sandbox %s", rec.SandboxID)
	}
	old, err := h.store.Get(context.Background(), rec.SandboxID)
	if err != nil || old.State != core.StateGone {
		t.Errorf("dead record = %+v, %v; want gone", old, err)
	}
	if st := h.capacity(t); st.Used != 1 {
		t.Errorf("used = %d, want 1 (the dead sandbox's slot freed)", st.Used)
	}
}

func TestReleaseDestroysSandboxFoundDeadDuringSync(t *testing.T) {
	h := newHarness(t, nil)
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.sync.err = fmt.Errorf("list outputs: %w", core.ErrSandboxGone)
	res, err := h.eng.Release(context.Background(), "acme", rec.SandboxID)
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	if res.State != "destroyed" {
		t.Errorf("release state = %s, want destroyed", res.State)
	}
	if h.prov.Alive(rec.SandboxID) {
		t.Error("sandbox still alive; a dead-during-sync sandbox must be killed, not parked")
	}
	if st := h.capacity(t); st.Used != 0 || st.Warm != 0 {
		t.Errorf("capacity = %+v, want empty", st)
	}
}

func TestAmbiguousCreateKeepsReservation(t *testing.T) {
	h := newHarness(t, nil)
	h.prov.CreateErr = &core.ProviderError{Op: "create", StatusCode: 502, Message: "bad gateway", Ambiguous: true}
	if _, err := h.eng.Acquire(context.Background(), key("t1")); err == nil {
		t.Fatal("Acquire succeeded despite the create failure")
	}
	if st := h.capacity(t); st.Used != 1 || st.Reserved != 1 {
		t.Errorf("capacity = %+v, want the reservation kept (used 1, reserved 1)", st)
	}
}

func TestCertainCreateFailureFreesReservation(t *testing.T) {
	h := newHarness(t, nil)
	h.prov.CreateErr = &core.ProviderError{Op: "create", StatusCode: 400, Message: "bad template"}
	if _, err := h.eng.Acquire(context.Background(), key("t1")); err == nil {
		t.Fatal("Acquire succeeded despite the create failure")
	}
	if st := h.capacity(t); st.Used != 0 || st.Reserved != 0 {
		t.Errorf("capacity = %+v, want the slot freed", st)
	}
	h.prov.Set(func(f *coretest.FakeProvider) { f.CreateErr = nil })
	h.acquire(t, key("t1"), core.SourceCreated)
}

func TestBootstrapFailureKillsAndFreesSlot(t *testing.T) {
	h := newHarness(t, nil)
	h.prov.RunExit = 1
	_, err := h.eng.Acquire(context.Background(), key("t1"))
	if !errors.Is(err, core.ErrProviderUnavailable) {
		t.Fatalf("Acquire = %v, want ErrProviderUnavailable (retryable) after the retries", err)
	}
	if got := h.prov.Killed(); len(got) != 3 {
		t.Errorf("killed = %v, want the 3 bootstrap-failed sandboxes (one per try)", got)
	}
	if st := h.capacity(t); st.Used != 0 {
		t.Errorf("used = %d, want 0", st.Used)
	}
}

func TestBootstrapFailureWithUncertainKillKeepsSlot(t *testing.T) {
	h := newHarness(t, nil)
	h.prov.RunExit = 1
	h.prov.KillErr = errors.New("connection reset")
	if _, err := h.eng.Acquire(context.Background(), key("t1")); !errors.Is(err, core.ErrProviderUnavailable) {
		t.Fatalf("Acquire = %v, want ErrProviderUnavailable", err)
	}
	if st := h.capacity(t); st.Used != 1 {
		t.Errorf("used = %d, want 1: an uncertain kill keeps its slot", st.Used)
	}
}

func TestWarmReclaimReconnectFailureDiscardsAndCreates(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.prov.Set(func(f *coretest.FakeProvider) { f.SetTimeoutErr = core.ErrSandboxGone })
	fresh := h.acquire(t, key("t1"), core.SourceCreated)
	if fresh.SandboxID == rec.SandboxID {
		t.Fatal("reclaimed a warm sandbox whose reconnect failed")
	}
	if st := h.capacity(t); st.Used != 1 {
		t.Errorf("used = %d, want 1 (discarded sandbox freed)", st.Used)
	}
}

func TestWarmReclaimWithUncertainKillKeepsTombstone(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.prov.Set(func(f *coretest.FakeProvider) {
		f.SetTimeoutErr = errors.New("timeout")
		f.KillErr = errors.New("timeout")
	})
	if _, err := h.eng.Acquire(ctx, key("t1")); err == nil {
		// The replacement create works (kill failures don't block create).
		t.Log("replacement created")
	}
	old, _ := h.store.Get(ctx, rec.SandboxID)
	if old.State != core.StateDestroying {
		t.Errorf("old record state = %s, want destroying (tombstone)", old.State)
	}
	// A later reconcile pass retries the tombstone once its back-off
	// (lease duration doubled per failed kill) has passed.
	h.prov.Set(func(f *coretest.FakeProvider) { f.KillErr = nil })
	h.clock.advance(3*core.DefaultSettings().LeaseDuration + time.Second)
	st, err := h.eng.Reconcile(ctx)
	if err != nil || st.Killed != 1 {
		t.Fatalf("Reconcile = %+v, %v; want the tombstone killed", st, err)
	}
	if old, _ := h.store.Get(ctx, rec.SandboxID); old.State != core.StateGone {
		t.Errorf("after retry state = %s, want gone", old.State)
	}
}

func TestTenantIsolation(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Get(ctx, "other", rec.SandboxID); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Get by other tenant = %v, want ErrNotFound", err)
	}
	if _, err := h.eng.Release(ctx, "other", rec.SandboxID); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Release by other tenant = %v, want ErrNotFound", err)
	}
	if _, err := h.eng.Sync(ctx, "other", rec.SandboxID); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Sync by other tenant = %v, want ErrNotFound", err)
	}
	if got, _ := h.store.Get(ctx, rec.SandboxID); got.State != core.StateActive {
		t.Errorf("state after foreign calls = %s, want active", got.State)
	}
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	var ve *core.ValidationError
	for _, k := range []core.ThreadKey{
		{Tenant: "acme", User: "", Thread: "t"}, {Tenant: "acme", User: "a/b", Thread: "t"},
		{Tenant: "acme", User: "u", Thread: "../x"}, {Tenant: "acme", User: "u", Thread: string(make([]byte, 65))},
	} {
		if _, err := h.eng.Acquire(ctx, k); !errors.As(err, &ve) {
			t.Errorf("Acquire(%q) = %v, want ValidationError", k, err)
		}
	}
	for _, id := range []string{"", "a/b", "..", "x y", string(make([]byte, 200))} {
		if _, err := h.eng.Release(ctx, "acme", id); !errors.As(err, &ve) {
			t.Errorf("Release(%q) = %v, want ValidationError", id, err)
		}
	}
	if st := h.capacity(t); st.Used != 0 || h.prov.Count("") != 0 {
		t.Errorf("bad input changed state: capacity %+v, provider calls %v", st, h.prov.Count(""))
	}
}

func TestReconcileExpiresIdleWarmSandboxes(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = time.Minute })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if st, _ := h.eng.Reconcile(ctx); st.Expired != 0 {
		t.Fatalf("reconcile expired a sandbox parked just now: %+v", st)
	}
	h.clock.advance(2 * time.Minute)
	st, err := h.eng.Reconcile(ctx)
	if err != nil || st.Expired != 1 {
		t.Fatalf("Reconcile = %+v, %v; want 1 expired", st, err)
	}
	if h.prov.Alive(rec.SandboxID) {
		t.Error("expired sandbox still alive")
	}
	if n := h.prov.Count("timeout " + rec.SandboxID); n != 1 {
		t.Errorf("SetTimeout calls = %d, want only the park (reconcile must not extend life)", n)
	}
	if c := h.capacity(t); c.Used != 0 {
		t.Errorf("used = %d, want 0", c.Used)
	}
}

// TestConcurrentAcquiresForOneThreadYieldOneSandbox: per-thread mutual
// exclusion across concurrent invocations (many goroutines, many rounds).
func TestConcurrentAcquiresForOneThreadYieldOneSandbox(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 50; s.AcquireTimeout = 20 * time.Second })
	ctx := context.Background()
	for round := range 3 {
		k := key(fmt.Sprintf("race%d", round))
		ids := make(chan string, 12)
		var wg sync.WaitGroup
		for range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := h.eng.Acquire(ctx, k)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				ids <- res.Record.SandboxID
			}()
		}
		wg.Wait()
		close(ids)
		seen := map[string]bool{}
		for id := range ids {
			seen[id] = true
		}
		if len(seen) != 1 {
			t.Fatalf("round %d: concurrent acquires got %d sandboxes %v, want 1", round, len(seen), seen)
		}
	}
	if n := h.prov.Count("create"); n != 3 {
		t.Errorf("creates = %d, want 3 (one per thread)", n)
	}
}

// TestConcurrentAcquiresNeverExceedLimit is invariant 1 through the engine.
func TestConcurrentAcquiresNeverExceedLimit(t *testing.T) {
	const limit = 3
	h := newHarness(t, func(s *core.Settings) { s.Replicas = limit; s.Policy = core.PolicyReject })
	ctx := context.Background()
	var ok, full atomic.Int32
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h.eng.Acquire(ctx, key(fmt.Sprintf("t%d", i)))
			var ce *core.CapacityError
			switch {
			case err == nil:
				ok.Add(1)
			case errors.As(err, &ce):
				full.Add(1)
			default:
				t.Errorf("Acquire: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != limit {
		t.Errorf("acquired %d, want %d", ok.Load(), limit)
	}
	live := h.prov.Live()
	if live > limit {
		t.Errorf("%d sandboxes live at the provider, limit %d", live, limit)
	}
}

// TestAcquireWaitsForSameThreadRelease: an acquire arriving while the
// thread's release is syncing waits and then gets that same sandbox.
func TestAcquireWaitsForSameThreadRelease(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	inSync, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.sync.hook = func() { once.Do(func() { close(inSync); <-resume }) }
	released := make(chan error, 1)
	go func() {
		_, err := h.eng.Release(ctx, "acme", rec.SandboxID)
		released <- err
	}()
	<-inSync
	acquired := make(chan core.AcquireResult, 1)
	go func() {
		res, err := h.eng.Acquire(ctx, key("t1"))
		if err != nil {
			t.Errorf("Acquire during release: %v", err)
		}
		acquired <- res
	}()
	select {
	case res := <-acquired:
		t.Fatalf("acquire returned %+v while the release was still syncing", res)
	case <-time.After(300 * time.Millisecond):
	}
	close(resume)
	if err := <-released; err != nil {
		t.Fatalf("Release: %v", err)
	}
	res := <-acquired
	if res.Record.SandboxID != rec.SandboxID || res.Source != core.SourceReclaimed {
		t.Errorf("acquire after release = %s/%s, want %s reclaimed", res.Record.SandboxID, res.Source, rec.SandboxID)
	}
}

// restoringSyncer is a fakeSyncer that also restores (core.OutputRestorer).
type restoringSyncer struct {
	fakeSyncer
	restored []string
	err      error
}

func (r *restoringSyncer) Restore(_ context.Context, t core.SyncTarget) (core.SyncResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restored = append(r.restored, t.Ref.ID+" "+t.Thread)
	return core.SyncResult{Uploaded: 2, Complete: r.err == nil}, r.err
}

func newRestoreHarness(t *testing.T, restoreErr error) (*harness, *restoringSyncer) {
	t.Helper()
	rs := &restoringSyncer{err: restoreErr}
	return newSyncerHarness(t, rs), rs
}

// newSyncerHarness is a harness whose engine uses syncer.
func newSyncerHarness(t *testing.T, syncer core.OutputSyncer) *harness {
	t.Helper()
	h := newHarness(t, nil)
	s := core.DefaultSettings()
	s.Deployment = "test"
	s.AcquireTimeout = 2 * time.Second
	eng, err := core.New(s, h.store, h.prov, syncer, core.WithClock(h.clock.now))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	h.eng = eng
	return h
}

func TestCreatedSandboxGetsOutputsRestored(t *testing.T) {
	h, rs := newRestoreHarness(t, nil)
	res, err := h.eng.Acquire(context.Background(), key("t1"))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if res.Restore == nil || res.Restore.Uploaded != 2 {
		t.Errorf("restore result = %+v, want the restorer's", res.Restore)
	}
	if want := []string{res.Record.SandboxID + " t1"}; !slices.Equal(rs.restored, want) {
		t.Errorf("restored = %v, want %v", rs.restored, want)
	}
	// Reuse and reclaim never restore (the sandbox already has its files).
	if _, err := h.eng.Release(context.Background(), "acme", res.Record.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.acquire(t, key("t1"), core.SourceReclaimed)
	if len(rs.restored) != 1 {
		t.Errorf("restores = %v, want only the create's", rs.restored)
	}
}

func TestRestoreFailureOtherThanGoneStillHandsOut(t *testing.T) {
	h, _ := newRestoreHarness(t, errors.New("s3 listing failed"))
	h.acquire(t, key("t1"), core.SourceCreated)
}

func TestSandboxDeadDuringRestoreIsKilledAndReplaced(t *testing.T) {
	h, rs := newRestoreHarness(t, fmt.Errorf("write: %w", core.ErrSandboxGone))
	_, err := h.eng.Acquire(context.Background(), key("t1"))
	if err == nil {
		t.Fatal("Acquire succeeded although every created sandbox died during restore")
	}
	if len(rs.restored) < 2 {
		t.Errorf("restores = %v, want a retry with a fresh sandbox", rs.restored)
	}
	if st := h.capacity(t); st.Used != 0 {
		t.Errorf("used = %d, want 0: killed sandboxes free their reservations", st.Used)
	}
}

func TestRecordLogValueHidesAccessToken(t *testing.T) {
	var buf strings.Builder
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "record", core.Record{SandboxID: "sb1", Endpoint: core.Endpoint{AccessToken: "secret-token"}})
	if strings.Contains(buf.String(), "secret-token") || !strings.Contains(buf.String(), "sb1") {
		t.Errorf("log line = %s; want the id and not the token", buf.String())
	}
}

// resumingSyncer is a restoringSyncer whose first restore stops short and
// that continues it on ResumeRestore (core.RestoreResumer): one file per
// call until none remains.
type resumingSyncer struct {
	restoringSyncer
	remaining int
	resumes   []string
}

func (r *resumingSyncer) Restore(ctx context.Context, t core.SyncTarget) (core.SyncResult, error) {
	res, err := r.restoringSyncer.Restore(ctx, t)
	r.mu.Lock()
	defer r.mu.Unlock()
	res.Remaining, res.Complete = r.remaining, false
	return res, err
}

func (r *resumingSyncer) ResumeRestore(_ context.Context, t core.SyncTarget) (core.SyncResult, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resumes = append(r.resumes, t.Ref.ID)
	if r.remaining == 0 {
		return core.SyncResult{}, false, nil
	}
	r.remaining--
	return core.SyncResult{Uploaded: 1, Remaining: r.remaining, Complete: r.remaining == 0}, true, nil
}

// A restore cut short continues on the thread's next acquires (reuse and
// reclaim), whose results report it, until nothing remains.
func TestIncompleteRestoreResumesOnNextAcquire(t *testing.T) {
	rs := &resumingSyncer{remaining: 2}
	h := newSyncerHarness(t, rs)
	ctx := context.Background()
	first, err := h.eng.Acquire(ctx, key("t1"))
	if err != nil || first.Restore == nil || first.Restore.Remaining != 2 || first.Restore.Complete {
		t.Fatalf("first acquire restore = %+v, %v; want 2 remaining, incomplete", first.Restore, err)
	}
	id := first.Record.SandboxID
	steps := []struct {
		name          string
		release       bool
		source        core.Source
		wantRemaining int // -1: no restore reported
	}{
		{"reuse", false, core.SourceReused, 1},
		{"reclaim", true, core.SourceReclaimed, 0},
		{"nothing pending", true, core.SourceReclaimed, -1},
	}
	for _, st := range steps {
		if st.release {
			if _, err := h.eng.Release(ctx, "acme", id); err != nil {
				t.Fatalf("%s: Release: %v", st.name, err)
			}
		}
		res, err := h.eng.Acquire(ctx, key("t1"))
		if err != nil || res.Source != st.source || res.Record.SandboxID != id {
			t.Fatalf("%s: acquire = %s %s, %v; want %s of %s", st.name, res.Source, res.Record.SandboxID, err, st.source, id)
		}
		switch {
		case st.wantRemaining < 0 && res.Restore != nil:
			t.Errorf("%s: restore = %+v, want none reported", st.name, res.Restore)
		case st.wantRemaining >= 0 && (res.Restore == nil || res.Restore.Remaining != st.wantRemaining):
			t.Errorf("%s: restore = %+v, want %d remaining", st.name, res.Restore, st.wantRemaining)
		}
	}
	if len(rs.resumes) != 3 {
		t.Errorf("resumes = %v, want one per later acquire", rs.resumes)
	}
}
