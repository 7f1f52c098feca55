package core_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// newPoolHarness is newHarness with a pool of size members.
func newPoolHarness(t *testing.T, size int, mutate func(*core.Settings), opts ...core.Option) *harness {
	t.Helper()
	return newHarness(t, mutate, append([]core.Option{core.WithPool(core.PoolSettings{Size: size, MaxAge: 10 * time.Minute})}, opts...)...)
}

// refill runs RefillPool and checks it created want members.
func (h *harness) refill(t *testing.T, want int) {
	t.Helper()
	st, err := h.eng.RefillPool(context.Background())
	if err != nil {
		t.Fatalf("RefillPool: %v", err)
	}
	if st.Created != want {
		t.Fatalf("RefillPool created %d members, want %d", st.Created, want)
	}
}

// poolCount reads the pool's taken places.
func (h *harness) poolCount(t *testing.T) int {
	t.Helper()
	n, err := h.store.PoolCount(context.Background())
	if err != nil {
		t.Fatalf("PoolCount: %v", err)
	}
	return n
}

// members lists the pooled records.
func (h *harness) members(t *testing.T) []core.Record {
	t.Helper()
	m, err := h.store.PoolMembers(context.Background(), 100)
	if err != nil {
		t.Fatalf("PoolMembers: %v", err)
	}
	return m
}

func TestPoolSizeZeroKeepsNoPool(t *testing.T) {
	h := newPoolHarness(t, 0, nil)
	h.refill(t, 0)
	h.acquire(t, key("t1"), core.SourceCreated)
	if got := h.prov.Count("create"); got != 1 {
		t.Errorf("creates = %d, want 1 (the thread's own)", got)
	}
	st, err := h.eng.Reconcile(context.Background())
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if st.PoolCreated != 0 || h.poolCount(t) != 0 || len(h.members(t)) != 0 {
		t.Errorf("pool created %d, count %d, members %d; want no pool", st.PoolCreated, h.poolCount(t), len(h.members(t)))
	}
}

func TestPoolRefillStopsAtSizeAndClaimMakesNoCreate(t *testing.T) {
	h := newPoolHarness(t, 2, nil)
	h.refill(t, 2)
	h.refill(t, 0) // full: a second refill creates nothing
	if st := h.capacity(t); st.Used != 2 || st.Pool != 2 {
		t.Errorf("capacity used %d, pool %d; want 2 and 2 (pool members hold slots)", st.Used, st.Pool)
	}
	for _, m := range h.members(t) {
		md := h.prov.Metadata(m.SandboxID)
		if md[core.MetaPool] != core.MetaPoolMember || md[core.MetaDeployment] != "test" || md[core.MetaThread] != "" {
			t.Errorf("member %s metadata = %v, want a thread-less pool member of the deployment", m.SandboxID, md)
		}
	}
	creates := h.prov.Count("create")
	rec := h.acquire(t, key("t1"), core.SourcePool)
	if got := h.prov.Count("create"); got != creates {
		t.Errorf("claim made %d provider creates, want 0", got-creates)
	}
	if rec.ThreadKey != key("t1") || rec.State != core.StateActive {
		t.Errorf("claimed record = %+v, want active for t1", rec)
	}
	if got := h.prov.Timeout(rec.SandboxID); got != core.DefaultSettings().ActiveTimeout+core.TimerMargin {
		t.Errorf("claimed member's timeout = %s, want the active timeout plus the timer margin", got)
	}
	if st := h.capacity(t); st.Used != 2 || st.Active != 1 || st.Pool != 1 {
		t.Errorf("capacity = %+v, want used 2, active 1, pool 1", st)
	}
	if n := h.poolCount(t); n != 1 {
		t.Errorf("pool count = %d, want 1 after a claim", n)
	}
	again := h.acquire(t, key("t1"), core.SourceReused)
	if again.SandboxID != rec.SandboxID {
		t.Errorf("second acquire = %s, want the claimed %s", again.SandboxID, rec.SandboxID)
	}
	h.refill(t, 1)
}

func TestPoolClaimRestoresTheThreadsOutputs(t *testing.T) {
	h, rs := newRestoreHarness(t, nil)
	s := core.DefaultSettings()
	s.Deployment = "test"
	eng, err := core.New(s, h.store, h.prov, rs, core.WithClock(h.clock.now),
		core.WithPool(core.PoolSettings{Size: 1, MaxAge: time.Hour}))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	h.eng = eng
	h.refill(t, 1)
	if len(rs.restored) != 0 {
		t.Fatalf("refill restored %v; a member belongs to no thread", rs.restored)
	}
	res, err := h.eng.Acquire(context.Background(), key("t1"))
	if err != nil || res.Source != core.SourcePool {
		t.Fatalf("Acquire = %s, %v; want pool", res.Source, err)
	}
	if want := []string{res.Record.SandboxID + " t1"}; !slices.Equal(rs.restored, want) {
		t.Errorf("restored = %v, want %v", rs.restored, want)
	}
	if res.Restore == nil || res.Restore.Uploaded != 2 {
		t.Errorf("restore result = %+v, want the restorer's", res.Restore)
	}
}

// TestPoolMemberNeverHandedToTwoThreads starts many first acquires at once
// on DynamoDB Local: each member is handed to one thread only, every
// thread gets a sandbox of its own (the rest are created), and the counts
// add up.
func TestPoolMemberNeverHandedToTwoThreads(t *testing.T) {
	const (
		pool    = 6
		threads = 24
	)
	h := newPoolHarness(t, pool, func(s *core.Settings) { s.Replicas = threads + pool })
	h.refill(t, pool)
	members := map[string]bool{}
	for _, m := range h.members(t) {
		members[m.SandboxID] = true
	}
	type got struct {
		rec core.Record
		src core.Source
		err error
	}
	results := make([]got, threads)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := h.eng.Acquire(context.Background(), key(fmt.Sprintf("race-%d", i)))
			results[i] = got{res.Record, res.Source, err}
		}()
	}
	close(start)
	wg.Wait()
	owner := map[string]int{}
	fromPool := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("thread %d: Acquire: %v", i, r.err)
		}
		if prev, dup := owner[r.rec.SandboxID]; dup {
			t.Fatalf("sandbox %s handed to threads %d and %d", r.rec.SandboxID, prev, i)
		}
		owner[r.rec.SandboxID] = i
		switch r.src {
		case core.SourcePool:
			fromPool++
			if !members[r.rec.SandboxID] {
				t.Errorf("thread %d: source pool but %s was no member", i, r.rec.SandboxID)
			}
		case core.SourceCreated:
			if members[r.rec.SandboxID] {
				t.Errorf("thread %d: source created but %s is a member", i, r.rec.SandboxID)
			}
		default:
			t.Errorf("thread %d: source %s, want pool or created", i, r.src)
		}
	}
	if fromPool != pool {
		t.Errorf("claims = %d, want %d (every member once)", fromPool, pool)
	}
	if n := h.poolCount(t); n != 0 {
		t.Errorf("pool count = %d, want 0", n)
	}
	if st := h.capacity(t); st.Used != threads || st.Active != threads {
		t.Errorf("capacity = %+v, want used and active %d", st, threads)
	}
}

func TestPoolDeadMemberIsDiscardedAndNextTried(t *testing.T) {
	tests := []struct {
		name string
		dead int
		want []core.Source // sources of two first acquires, in any order
	}{
		{"one dead: the live member, then a create", 1, []core.Source{core.SourceCreated, core.SourcePool}},
		{"all dead: creates", 2, []core.Source{core.SourceCreated, core.SourceCreated}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newPoolHarness(t, 2, nil)
			h.refill(t, 2)
			members := h.members(t)
			for _, m := range members[:tc.dead] {
				h.prov.Drop(m.SandboxID)
			}
			var got []core.Source
			for _, th := range []string{"t1", "t2"} {
				res, err := h.eng.Acquire(context.Background(), key(th))
				if err != nil {
					t.Fatalf("Acquire(%s): %v", th, err)
				}
				got = append(got, res.Source)
				for _, m := range members[:tc.dead] {
					if res.Record.SandboxID == m.SandboxID {
						t.Errorf("handed out the dead member %s", m.SandboxID)
					}
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("sources = %v, want %v", got, tc.want)
			}
			for _, m := range members[:tc.dead] {
				rec, err := h.store.Get(context.Background(), m.SandboxID)
				if err != nil || rec.State != core.StateGone {
					t.Errorf("dead member %s record = %s, %v; want gone", m.SandboxID, rec.State, err)
				}
			}
			if st := h.capacity(t); st.Used != 2 || st.Active != 2 {
				t.Errorf("capacity = %+v, want used and active 2", st)
			}
			if n := h.poolCount(t); n != 0 {
				t.Errorf("pool count = %d, want 0", n)
			}
		})
	}
}

func TestPoolEmptyFallsBackToCreate(t *testing.T) {
	h := newPoolHarness(t, 1, nil)
	h.refill(t, 1)
	h.acquire(t, key("t1"), core.SourcePool)
	h.acquire(t, key("t2"), core.SourceCreated)
}

func TestPoolMembersPastMaxAgeAreNotHandedOutAndAreRecycled(t *testing.T) {
	h := newPoolHarness(t, 1, nil)
	h.refill(t, 1)
	old := h.members(t)[0]
	h.clock.advance(9 * time.Minute) // past MaxAge less the lead (10 min - 2 min)
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if rec.SandboxID == old.SandboxID {
		t.Fatalf("handed out the member past its age")
	}
	st, err := h.eng.Reconcile(context.Background())
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if st.PoolRecycled != 1 || st.PoolCreated != 1 {
		t.Errorf("reconcile pool recycled %d created %d, want 1 and 1", st.PoolRecycled, st.PoolCreated)
	}
	if h.prov.Alive(old.SandboxID) {
		t.Errorf("old member %s still runs", old.SandboxID)
	}
	if m := h.members(t); len(m) != 1 || m[0].SandboxID == old.SandboxID {
		t.Errorf("members = %v, want one new member", m)
	}
	if n := h.poolCount(t); n != 1 {
		t.Errorf("pool count = %d, want 1", n)
	}
}

func TestPoolMemberIsGivenUpBeforeAThreadsWarmSandbox(t *testing.T) {
	h := newPoolHarness(t, 1, func(s *core.Settings) { s.Replicas = 2; s.Policy = core.PolicyReject })
	ctx := context.Background()
	warm := h.acquire(t, key("warm"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", warm.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.refill(t, 1)
	member := h.members(t)[0]
	// The member ages past hand-out, so the next thread must create, and
	// the deployment is full: the member goes, the warm sandbox stays.
	h.clock.advance(9 * time.Minute)
	h.acquire(t, key("new"), core.SourceCreated)
	if h.prov.Alive(member.SandboxID) {
		t.Errorf("pool member %s still runs; it must be given up first", member.SandboxID)
	}
	if !h.prov.Alive(warm.SandboxID) {
		t.Errorf("warm sandbox %s was evicted while a pool member held a slot", warm.SandboxID)
	}
	h.acquire(t, key("warm"), core.SourceReclaimed)
	if n := h.poolCount(t); n != 0 {
		t.Errorf("pool count = %d, want 0", n)
	}
}

func TestPoolDrainingEmptiesThePool(t *testing.T) {
	h := newPoolHarness(t, 2, nil)
	ctx := context.Background()
	h.refill(t, 2)
	if err := h.eng.SetDraining(ctx, true); err != nil {
		t.Fatalf("SetDraining: %v", err)
	}
	st, err := h.eng.Reconcile(ctx)
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if st.PoolRecycled != 2 || st.PoolCreated != 0 {
		t.Errorf("draining pass recycled %d created %d, want 2 and 0", st.PoolRecycled, st.PoolCreated)
	}
	if h.prov.Live() != 0 || h.poolCount(t) != 0 || h.capacity(t).Used != 0 {
		t.Errorf("live %d, pool count %d, used %d; want all 0", h.prov.Live(), h.poolCount(t), h.capacity(t).Used)
	}
	h.refill(t, 0)
	if _, err := h.eng.Acquire(ctx, key("t1")); err == nil {
		t.Errorf("acquire while draining succeeded")
	}
}

func TestPoolRefillFailureFreesItsPlaceAndSlot(t *testing.T) {
	h := newPoolHarness(t, 2, nil)
	h.prov.Set(func(f *coretest.FakeProvider) {
		f.CreateErr = &core.ProviderError{Op: "create", StatusCode: 400, Message: "bad template"}
	})
	st, err := h.eng.RefillPool(context.Background())
	if err == nil || st.Created != 0 || st.Failed == 0 {
		t.Fatalf("refill = %+v, %v; want failures and an error", st, err)
	}
	if n, used := h.poolCount(t), h.capacity(t).Used; n != 0 || used != 0 {
		t.Errorf("pool count %d, used %d after certain create failures; want 0 and 0", n, used)
	}
}

func TestPoolReconcileKnowsMembers(t *testing.T) {
	h := newPoolHarness(t, 2, nil, core.WithReconcileSettings(core.ReconcileSettings{MaxPages: 10, MaxItems: 100,
		MaxDuration: time.Minute, Grace: time.Second, OrphanTTL: time.Second}))
	ctx := context.Background()
	h.refill(t, 2)
	claimed := h.acquire(t, key("t1"), core.SourcePool)
	h.clock.advance(time.Minute) // past the grace and the orphan TTL
	for range 2 {
		st, err := h.eng.Reconcile(ctx)
		if err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
		if st.Orphans != 0 || st.Duplicates != 0 || st.Killed != 0 || st.Dead != 0 || st.LedgerRepaired != 0 {
			t.Errorf("reconcile = %+v; pool members are neither orphans, duplicates nor dead", st)
		}
	}
	if !h.prov.Alive(claimed.SandboxID) {
		t.Errorf("claimed member %s was killed", claimed.SandboxID)
	}
	if m := h.members(t); len(m) != 2 {
		t.Errorf("members = %d, want 2 (refilled)", len(m))
	}
	if st := h.capacity(t); st.Used != 3 {
		t.Errorf("used = %d, want 3", st.Used)
	}
}

func TestPoolClaimKicksARefillAndACreateDoesNot(t *testing.T) {
	var kicks atomic.Int32
	h := newPoolHarness(t, 1, nil, core.WithPoolRefill(func(context.Context) error {
		kicks.Add(1)
		return errors.New("refill function unreachable") // logged, never the caller's
	}))
	h.refill(t, 1)
	h.acquire(t, key("t1"), core.SourcePool)
	if got := kicks.Load(); got != 1 {
		t.Errorf("kicks after a claim = %d, want 1", got)
	}
	h.acquire(t, key("t2"), core.SourceCreated)
	if got := kicks.Load(); got != 1 {
		t.Errorf("kicks after a create = %d, want still 1", got)
	}
}

// TestPoolWedgedMemberIsNotHandedOut: a member the provider still lists
// and whose daemon still serves files, but whose processes are stopped,
// fails the claim's probe (a command) and is discarded, its slot and
// place freed; the thread's first acquire gets a sandbox that runs
// commands. So does a member whose marker is missing.
func TestPoolWedgedMemberIsNotHandedOut(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(h *harness, id string)
	}{
		{"wedged", func(h *harness, id string) { h.prov.Wedge(id) }},
		{"marker missing", func(h *harness, id string) {
			if err := h.prov.WriteFile(context.Background(), core.SandboxRef{ID: id}, "/tmp/.sbx-pool-member", strings.NewReader("other")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newPoolHarness(t, 1, nil)
			h.refill(t, 1)
			member := h.members(t)[0]
			tc.spoil(h, member.SandboxID)
			res, err := h.eng.Acquire(context.Background(), key("t1"))
			if err != nil || res.Record.SandboxID == member.SandboxID || res.Source != core.SourceCreated {
				t.Fatalf("Acquire = %s from %s, %v; want a created sandbox, not the member %s", res.Record.SandboxID, res.Source, err, member.SandboxID)
			}
			if out, err := h.prov.Run(context.Background(), res.Record.Ref(), core.Command{Script: "true"}); err != nil || out.ExitCode != 0 {
				t.Errorf("a command in the handed-out sandbox = %+v, %v; want it to run", out, err)
			}
			rec, gerr := h.store.Get(context.Background(), member.SandboxID)
			if gerr != nil || rec.State != core.StateGone || h.prov.Alive(member.SandboxID) {
				t.Errorf("member record = %s, %v, alive %t; want gone and killed", rec.State, gerr, h.prov.Alive(member.SandboxID))
			}
			if st := h.capacity(t); st.Used != 1 || st.Active != 1 || h.poolCount(t) != 0 {
				t.Errorf("capacity = %+v, pool count %d; want the member's slot and place freed", st, h.poolCount(t))
			}
		})
	}
}

// TestPoolConcurrentRefillsNeverOvershoot starts many refills at once (the
// asynchronous refill of several claims and a reconcile pass, say): the
// pool ends exactly full, no refill creates past its size, and nothing is
// left half-made.
func TestPoolConcurrentRefillsNeverOvershoot(t *testing.T) {
	const (
		size     = 3
		refills  = 8
		replicas = 10
	)
	h := newPoolHarness(t, size, func(s *core.Settings) { s.Replicas = replicas })
	var wg sync.WaitGroup
	var created atomic.Int32
	for range refills {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := h.eng.RefillPool(context.Background())
			if err != nil {
				t.Errorf("RefillPool: %v", err)
			}
			created.Add(int32(st.Created))
		}()
	}
	wg.Wait()
	if got := created.Load(); got != size {
		t.Errorf("members created by %d concurrent refills = %d, want %d", refills, got, size)
	}
	if m, n, live := len(h.members(t)), h.poolCount(t), h.prov.Live(); m != size || n != size || live != size {
		t.Errorf("members %d, pool places %d, live sandboxes %d; want %d each", m, n, live, size)
	}
	if st := h.capacity(t); st.Used != size || st.Reserved != 0 {
		t.Errorf("capacity = %+v, want used %d and no reservation left", st, size)
	}
}

// TestPoolLifecycleEvents: a member's create, its claim and its recycling
// are published, the claim as pool-claimed with the claiming thread.
func TestPoolLifecycleEvents(t *testing.T) {
	events := &eventLog{}
	h := newPoolHarness(t, 2, nil, core.WithEventSink(events))
	h.refill(t, 2)
	claimed := h.acquire(t, key("t1"), core.SourcePool)
	if got, want := events.seen(claimed.SandboxID), []string{"created creating->pooled ", "pool-claimed pooled->active "}; !sameList(got, want) {
		t.Errorf("claimed member's events = %q, want %q", got, want)
	}
	for _, ev := range events.all() {
		if ev.Kind == core.EventPoolClaimed && (ev.Tenant != "acme" || ev.Thread != "t1") {
			t.Errorf("pool-claimed event = %+v, want the claiming thread", ev)
		}
	}
	other := h.members(t)[0]
	h.clock.advance(9 * time.Minute) // past MaxAge less the lead
	if _, err := h.eng.Reconcile(context.Background()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if got, want := events.seen(other.SandboxID), []string{"created creating->pooled ", "destroyed pooled->gone " + core.EventReasonPoolRecycled}; !sameList(got, want) {
		t.Errorf("recycled member's events = %q, want %q", got, want)
	}
}

// TestPoolReconcileKillsAnUnfinishedMember: a sandbox created for the
// pool that no record names (its refill died after the create) is left
// alone while its reservation may still be finalized, then killed, its
// slot and pool place given back.
func TestPoolReconcileKillsAnUnfinishedMember(t *testing.T) {
	h := newPoolHarness(t, 2, func(s *core.Settings) { s.Replicas = 5 }, core.WithReconcileSettings(core.ReconcileSettings{
		MaxPages: 10, MaxItems: 100, MaxDuration: time.Minute, Grace: time.Second, OrphanTTL: time.Hour}))
	ctx := context.Background()
	if err := h.store.ReservePool(ctx, core.PoolReservation{Token: "res-left", Limit: 5, Size: 2, Now: h.clock.now(),
		ExpiresAt: h.clock.now().Add(time.Minute)}); err != nil {
		t.Fatalf("ReservePool: %v", err)
	}
	left, err := h.prov.Create(ctx, core.CreateSpec{Metadata: map[string]string{core.MetaDeployment: "test",
		core.MetaPool: core.MetaPoolMember, core.MetaReservation: "res-left", core.MetaCreatedAt: h.clock.now().UTC().Format(time.RFC3339)}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	st, err := h.eng.Reconcile(ctx) // the refill may still finalize it
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if !h.prov.Alive(left.ID) || st.Orphans != 0 {
		t.Fatalf("in-flight member killed or counted an orphan (%+v)", st)
	}
	h.clock.advance(10 * time.Minute) // the reservation's create is presumed crashed
	if st, err = h.eng.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if st.Killed != 1 || st.ReservationsSettled != 1 {
		t.Errorf("second pass = %+v, want the unfinished member killed and its reservation settled", st)
	}
	if h.prov.Alive(left.ID) {
		t.Errorf("unfinished member %s still runs", left.ID)
	}
	members := len(h.members(t))
	if n, used := h.poolCount(t), h.capacity(t).Used; n != members || used != h.prov.Live() {
		t.Errorf("pool places %d for %d members, used %d for %d live sandboxes", n, members, used, h.prov.Live())
	}
}

// TestPoolReconcileKillsALeakedFormerMember: a pool member whose record is
// gone while the provider still runs it (a kill that did not take) is not
// tracked: reconcile kills it once its grace is over, and its slot count
// matches the sandboxes that run.
func TestPoolReconcileKillsALeakedFormerMember(t *testing.T) {
	h := newPoolHarness(t, 1, func(s *core.Settings) { s.Replicas = 5 }, core.WithReconcileSettings(core.ReconcileSettings{
		MaxPages: 10, MaxItems: 100, MaxDuration: time.Minute, Grace: time.Second, OrphanTTL: time.Hour}))
	ctx := context.Background()
	h.refill(t, 1)
	m := h.members(t)[0]
	now := h.clock.now()
	claimed, err := h.store.Claim(ctx, core.Claim{SandboxID: m.SandboxID, Tenant: m.Tenant, From: []core.State{core.StatePooled},
		To: core.StateDestroying, Owner: "test", Now: now, LeaseUntil: now.Add(time.Minute)})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if err := h.store.Free(ctx, claimed, now); err != nil {
		t.Fatalf("Free: %v", err)
	}
	h.clock.advance(10 * time.Minute)
	st, err := h.eng.Reconcile(ctx)
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if h.prov.Alive(m.SandboxID) || st.Killed != 1 {
		t.Errorf("pass = %+v, former member alive %v; want it killed", st, h.prov.Alive(m.SandboxID))
	}
	if used := h.capacity(t).Used; used != h.prov.Live() {
		t.Errorf("used %d for %d live sandboxes", used, h.prov.Live())
	}
}

// A pool place count gone wrong is set back to the places held by the
// second reconcile pass that sees it unchanged (never by the first).
func TestPoolPlaceCountIsRepairedByReconcile(t *testing.T) {
	t.Parallel()
	h := newDDBHarness(t, nil, core.WithPool(core.PoolSettings{Size: 2, MaxAge: 10 * time.Minute}))
	h.refill(t, 2)
	ctx := context.Background()
	_, places, err := h.ddb.CountHolders(ctx)
	if err != nil {
		t.Fatalf("CountHolders: %v", err)
	}
	if err := h.ddb.RepairPoolPlaces(ctx, places.Revision, 5); err != nil { // corrupt it
		t.Fatalf("RepairPoolPlaces: %v", err)
	}
	for pass, want := range []int{5, 2} {
		h.reconcile(t)
		if got := h.poolCount(t); got != want {
			t.Errorf("after pass %d: pool count = %d, want %d", pass+1, got, want)
		}
	}
	if st := h.reconcile(t); st.PoolCreated != 0 {
		t.Errorf("a third pass created %d members, want 0 (the pool is full)", st.PoolCreated)
	}
}
