package core_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// every runs f every d in a goroutine until the stop it returns is called,
// which waits for the run in progress.
func every(d time.Duration, f func()) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case <-time.After(d):
				f()
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// acquirerKey marks the context of a test agent's acquire with its
// *acquireNote, so that the store the engine calls knows whose acquire a
// write serves.
type acquirerKey struct{}

// acquireNote is what the checks note of one acquire: its thread, and the
// tenants' counts (with the marks of their frees, see frees) read before
// its latest reservation, whose refusal reads the tenants holding slots.
type acquireNote struct {
	key    core.ThreadKey
	mu     sync.Mutex
	counts map[string]int
	marks  map[string]freeMark
	// returned is when the acquire returned (zero: not yet).
	returned time.Time
}

// agentAcquire is a stress agent's acquire of k: its context carries its
// *acquireNote; with faulty, one in 25 is abandoned mid-step (a deadline
// of a few milliseconds, as an invocation that dies).
func agentAcquire(ctx context.Context, eng *core.Engine, clk *clock, rng *rand.Rand, k core.ThreadKey, faulty bool) (core.AcquireResult, error) {
	timeout := 20 * time.Second
	if faulty && rng.IntN(100) < 4 {
		timeout = time.Duration(1+rng.IntN(30)) * time.Millisecond
	}
	note := &acquireNote{key: k}
	actx, cancel := context.WithTimeout(context.WithValue(ctx, acquirerKey{}, note), timeout)
	defer cancel()
	res, err := eng.Acquire(actx, k)
	note.done(clk.now())
	return res, err
}

// done records that the acquire returned, at now.
func (n *acquireNote) done(now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.returned = now
}

// frees tracks the store calls that may lower a tenant's slot count
// (frees of its slots; a counter repair lowers any): while none of a
// tenant's is in flight and none starts, its count never goes down.
type frees struct {
	mu       sync.Mutex
	inFlight map[string]int
	started  map[string]int
	repairs  int
}

func (f *frees) begin(tenant string) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight[tenant]++
	f.started[tenant]++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.inFlight[tenant]--
	}
}

func (f *frees) beginRepair() func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.repairs++
	f.inFlight[""]++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.inFlight[""]--
	}
}

// freeMark is where a tenant's frees stood: whether none was in flight,
// and how many had started (frees of its slots, counter repairs).
type freeMark struct {
	quiet            bool
	started, repairs int
}

func (f *frees) mark(tenant string) freeMark {
	f.mu.Lock()
	defer f.mu.Unlock()
	return freeMark{quiet: f.inFlight[tenant] == 0 && f.inFlight[""] == 0, started: f.started[tenant], repairs: f.repairs}
}

// kept reports whether tenant's count cannot have gone down since m.
func (f *frees) kept(tenant string, m freeMark) bool {
	now := f.mark(tenant)
	return m.quiet && now.started == m.started && now.repairs == m.repairs
}

func (f *frees) marks(tenants []string) map[string]freeMark {
	m := map[string]freeMark{}
	for _, t := range tenants {
		m[t] = f.mark(t)
	}
	return m
}

// waitPlace is a waiter place as the engine's own calls say it is held.
type waitPlace struct {
	ticket string
	until  time.Time
	left   bool // LeaveWait called: the place may be free
}

// tenantWatch is the engine's store in the multi-tenant stress test: the
// real store (its optional interfaces pass through), watching the writes
// whose rule the store's state alone cannot show was kept:
//
//   - an eviction (a warm record of another tenant claimed for destruction
//     by an acquire) must be for a tenant holding fewer slots than its
//     fair share. The tenants' counters are read before the claim; while
//     no call that frees a tenant's slot runs from then until the claim
//     returned, the tenant held at least as many at the claim. The tenants
//     holding slots, as the refused reservation read them, are at least
//     the acquiring one and those whose counts were above zero before the
//     reservation and did not go down until the claim returned; fewer
//     tenants make the share larger, so a violation found this way is one
//     under docs/architecture.md's rule whatever stale tenant the ledger still
//     counts.
//   - a waiter place handed out (EnterWait) while the engine's calls say
//     another waiter still holds it: neither given back nor lapsed at any
//     waiter's clock so far.
//   - the wait queue's order: its tickets, polls and dispatches go to
//     order (see waitOrder.check).
type tenantWatch struct {
	*ddbstore.Store
	t       *testing.T
	s       core.Settings
	clk     *clock
	clean   *ddbstore.Store       // the same table without faults, for the checks' reads
	read    func() map[string]int // the tenants' counters, read now
	tenants []string
	frees   frees

	crossEvictions atomic.Int32 // of another tenant's warm sandbox, by an acquire
	ownEvictions   atomic.Int32 // of the acquiring tenant's own
	atShareChecked atomic.Int32 // cross-tenant evictions whose tenant's count was known through the claim

	mu       sync.Mutex
	places   map[string]map[int]waitPlace // tenant -> place -> holder
	latest   time.Time                    // the latest waiter clock seen: places lapsed before it may be retaken
	maxHeld  map[string]int               // tenant -> most places held at once
	tickets  map[string]bool              // tickets that took a place (while tracking)
	tracking bool

	order *waitOrder
}

func newTenantWatch(t *testing.T, store, clean *ddbstore.Store, s core.Settings, clk *clock, read func() map[string]int) *tenantWatch {
	return &tenantWatch{Store: store, t: t, s: s, clk: clk, clean: clean, read: read,
		frees:  frees{inFlight: map[string]int{}, started: map[string]int{}},
		places: map[string]map[int]waitPlace{}, maxHeld: map[string]int{}, tickets: map[string]bool{}, order: newWaitOrder()}
}

func (w *tenantWatch) Free(ctx context.Context, rec core.Record, now time.Time) error {
	defer w.frees.begin(rec.Tenant)()
	return w.Store.Free(ctx, rec, now)
}

func (w *tenantWatch) FreeReservation(ctx context.Context, token string, key core.ThreadKey) error {
	defer w.frees.begin(key.Tenant)()
	return w.Store.FreeReservation(ctx, token, key)
}

func (w *tenantWatch) RepairCounters(ctx context.Context, limit int) (core.CounterRepair, error) {
	defer w.frees.beginRepair()()
	return w.Store.RepairCounters(ctx, limit)
}

func (w *tenantWatch) Reserve(ctx context.Context, r core.Reservation) error {
	if note, ok := ctx.Value(acquirerKey{}).(*acquireNote); ok {
		marks := w.frees.marks(w.tenants)
		counts := w.read()
		note.mu.Lock()
		note.counts, note.marks = counts, marks
		note.mu.Unlock()
	}
	w.takingGrant(r.Grant)
	return w.Store.Reserve(ctx, r)
}

func (w *tenantWatch) ClaimResume(ctx context.Context, r core.ResumeClaim) (core.Record, error) {
	w.takingGrant(r.Grant)
	return w.Store.ClaimResume(ctx, r)
}

func (w *tenantWatch) ClaimPoolMember(ctx context.Context, c core.PoolClaim) (core.Record, error) {
	w.takingGrant(c.Grant)
	return w.Store.ClaimPoolMember(ctx, c)
}

// takingGrant notes a take with grant g (if any) about to be made: g's
// ticket and place may leave the queue with it from the moment its
// transaction applies, which may be before the call returns (and whatever
// the call returns: a lost answer), so the place counts as given back from
// now on, as a LeaveWait's does.
func (w *tenantWatch) takingGrant(g *core.Grant) {
	if g == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if p, ok := w.places[g.Ticket.Tenant][g.Ticket.Place]; ok && p.ticket == g.Ticket.ID {
		p.left = true
		w.places[g.Ticket.Tenant][g.Ticket.Place] = p
	}
}

func (w *tenantWatch) Claim(ctx context.Context, c core.Claim) (core.Record, error) {
	note, _ := ctx.Value(acquirerKey{}).(*acquireNote)
	if note == nil || c.To != core.StateDestroying || !slices.Equal(c.From, []core.State{core.StateWarm}) {
		return w.Store.Claim(ctx, c)
	}
	by := note.key
	if c.Tenant == by.Tenant {
		rec, err := w.Store.Claim(ctx, c)
		if err == nil {
			w.ownEvictions.Add(1)
		}
		return rec, err
	}
	before, gerr := w.clean.Get(ctx, c.SandboxID)
	marks := w.frees.marks(w.tenants)
	counts := w.read()
	rec, err := w.Store.Claim(ctx, c)
	if err != nil || gerr != nil || before.ParkedAt.Before(w.clk.now().Add(-w.s.IdleTimeout)) {
		// Not checked: one parked past the idle timeout is a sandbox past
		// its end (freed, not evicted, once the provider confirms it gone).
		return rec, err
	}
	w.crossEvictions.Add(1)
	if !w.frees.kept(by.Tenant, marks[by.Tenant]) {
		return rec, err
	}
	w.atShareChecked.Add(1)
	// The tenants that held slots from before the refused reservation
	// (which read the tenants holding slots) to the claim.
	note.mu.Lock()
	holding := map[string]bool{by.Tenant: true}
	for _, tenant := range w.tenants {
		if note.counts[tenant] > 0 && w.frees.kept(tenant, note.marks[tenant]) {
			holding[tenant] = true
		}
	}
	note.mu.Unlock()
	if share := w.s.FairShare(len(holding)); counts[by.Tenant] >= share {
		w.t.Errorf("fair share: an acquire of %s (thread %s) evicted %s's warm sandbox %s while %s held at least %d slots, its fair share at most %d (%d tenants or more holding slots since its reservation was refused; claim condition %+v)",
			by.Tenant, by.Thread, c.Tenant, c.SandboxID, by.Tenant, counts[by.Tenant], share, len(holding), c.Below)
	}
	return rec, err
}

func (w *tenantWatch) EnterWait(ctx context.Context, wt core.Waiter) (core.Ticket, error) {
	w.mu.Lock()
	if wt.Now.After(w.latest) {
		w.latest = wt.Now
	}
	w.mu.Unlock()
	called := w.clk.now()
	tk, err := w.Store.EnterWait(ctx, wt)
	if err != nil {
		return tk, err
	}
	note, _ := ctx.Value(acquirerKey{}).(*acquireNote)
	w.order.queued(tk, called, w.clk.now(), note)
	place := tk.Place
	w.mu.Lock()
	defer w.mu.Unlock()
	held := w.places[wt.Tenant]
	if held == nil {
		held = map[int]waitPlace{}
		w.places[wt.Tenant] = held
	}
	if prev, ok := held[place]; ok && !prev.left && prev.until.After(w.latest) {
		w.t.Errorf("waiters: %s's place %d handed to %s while %s held it (until %s, latest waiter clock %s)",
			wt.Tenant, place, wt.Ticket, prev.ticket, prev.until.Format(time.RFC3339Nano), w.latest.Format(time.RFC3339Nano))
	}
	held[place] = waitPlace{ticket: wt.Ticket, until: wt.Until}
	n := 0
	for _, p := range held {
		if !p.left && p.until.After(w.latest) {
			n++
		}
	}
	if n > w.s.MaxWaitersPerTenant {
		w.t.Errorf("waiters: %s has %d waiters, at most %d", wt.Tenant, n, w.s.MaxWaitersPerTenant)
	}
	w.maxHeld[wt.Tenant] = max(w.maxHeld[wt.Tenant], n)
	if w.tracking {
		w.tickets[wt.Ticket] = true
	}
	return tk, nil
}

func (w *tenantWatch) LeaveWait(ctx context.Context, t core.Ticket, now time.Time, grantFor time.Duration) error {
	w.mu.Lock()
	if p, ok := w.places[t.Tenant][t.Place]; ok && p.ticket == t.ID {
		p.left = true
		w.places[t.Tenant][t.Place] = p
	}
	w.mu.Unlock()
	err := w.Store.LeaveWait(ctx, t, now, grantFor)
	w.order.left(t, err)
	return err
}

func (w *tenantWatch) PollTicket(ctx context.Context, t core.Ticket) (core.TicketState, error) {
	at := w.clk.now()
	st, err := w.Store.PollTicket(ctx, t)
	if err == nil {
		w.order.polled(t, at, st)
	}
	return st, err
}

func (w *tenantWatch) Dispatch(ctx context.Context, d core.Dispatch) (core.DispatchResult, error) {
	res, err := w.Store.Dispatch(ctx, d)
	w.order.dispatched(d, w.clk.now(), res)
	return res, err
}

// trackTickets starts (or stops) recording the tickets that take a place.
func (w *tenantWatch) trackTickets(on bool) map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tracking = on
	return maps.Clone(w.tickets)
}

// tableItem is what the checks read of any item of the broker table (the
// attribute names of ddbstore's schema).
type tableItem struct {
	PK          string `dynamodbav:"pk"`
	SandboxID   string `dynamodbav:"sandbox_id"`
	Tenant      string `dynamodbav:"tenant"`
	User        string `dynamodbav:"user_id"`
	State       string `dynamodbav:"state"`
	Reservation string `dynamodbav:"reservation"`
	NoRunning   bool   `dynamodbav:"no_running_slot"`
	Quota       bool   `dynamodbav:"quota"`
	Used        int    `dynamodbav:"used"`
	Until       int64  `dynamodbav:"until"`
	Ticket      string `dynamodbav:"ticket"`
}

// ledger is one read of the whole table: the slots the records and
// reservations hold, and the counters kept with them.
type ledger struct {
	holders      map[string]core.ThreadKey // slot (reservation token, or sandbox id) -> its thread
	live         map[string]bool           // sandbox ids of records holding a running slot
	reservations int
	bucketsUsed  int
	tenantUsed   map[string]int // TEN# counters
	userUsed     map[string]int // USR# counters, by "<tenant>#<user>"
	places       []tableItem    // waiter places
}

func (l ledger) byTenant() map[string]int {
	m := map[string]int{}
	for _, k := range l.holders {
		m[k.Tenant]++
	}
	return m
}

func (l ledger) byUser() map[string]int {
	m := map[string]int{}
	for _, k := range l.holders {
		m[k.Tenant+"#"+k.User]++
	}
	return m
}

// readLedger scans the table (strongly consistent). It is one view only
// while nothing writes: the checks call it between phases. A reservation
// and the record finalized from it are one slot (the record keeps the
// token).
func readLedger(t testing.TB, ddb *dynamodb.Client, table, deployment string) ledger {
	t.Helper()
	l := ledger{holders: map[string]core.ThreadKey{}, live: map[string]bool{}, tenantUsed: map[string]int{}, userUsed: map[string]int{}}
	p := dynamodb.NewScanPaginator(ddb, &dynamodb.ScanInput{TableName: &table, ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("scan %s: %v", table, err)
		}
		for _, av := range page.Items {
			var it tableItem
			if err := attributevalue.UnmarshalMap(av, &it); err != nil {
				t.Fatalf("decode %v: %v", av, err)
			}
			k := core.ThreadKey{Tenant: it.Tenant, User: it.User}
			switch {
			case strings.HasPrefix(it.PK, "RES#"):
				l.reservations++
				l.holders[it.Reservation] = k
			case strings.HasPrefix(it.PK, "SBX#"):
				if it.State == string(core.StateGone) || it.NoRunning || !it.Quota {
					continue
				}
				l.live[it.SandboxID] = true
				slot := it.Reservation
				if slot == "" {
					slot = it.SandboxID
				}
				l.holders[slot] = k
			case strings.HasPrefix(it.PK, "CAP#"+deployment):
				l.bucketsUsed += it.Used
			case strings.HasPrefix(it.PK, "TEN#"+deployment+"#"):
				l.tenantUsed[strings.TrimPrefix(it.PK, "TEN#"+deployment+"#")] = it.Used
			case strings.HasPrefix(it.PK, "USR#"+deployment+"#"):
				l.userUsed[strings.TrimPrefix(it.PK, "USR#"+deployment+"#")] = it.Used
			case strings.HasPrefix(it.PK, "WTR#"+deployment+"#"):
				l.places = append(l.places, it)
			}
		}
	}
	return l
}

// readCounters reads the tenants' counters and their agents' users'
// (one BatchGetItem; each item is read atomically, not all together).
func readCounters(t *testing.T, ddb *dynamodb.Client, table, deployment string, tenants []stressTenant) ledger {
	t.Helper()
	l := ledger{tenantUsed: map[string]int{}, userUsed: map[string]int{}}
	var keys []map[string]types.AttributeValue
	key := func(pk string) {
		keys = append(keys, map[string]types.AttributeValue{ddbstore.AttrPK: &types.AttributeValueMemberS{Value: pk},
			ddbstore.AttrSK: &types.AttributeValueMemberS{Value: "R"}})
	}
	for _, tn := range tenants {
		key("TEN#" + deployment + "#" + tn.name)
		for a := range tn.agents {
			key("USR#" + deployment + "#" + tn.name + "#" + agentUser(tn.name, a))
		}
	}
	for len(keys) > 0 {
		out, err := ddb.BatchGetItem(context.Background(), &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{
			table: {Keys: keys, ConsistentRead: aws.Bool(true)}}})
		if err != nil {
			t.Errorf("read counters: %v", err)
			return l
		}
		for _, av := range out.Responses[table] {
			var it tableItem
			if err := attributevalue.UnmarshalMap(av, &it); err != nil {
				t.Fatalf("decode %v: %v", av, err)
			}
			if name, ok := strings.CutPrefix(it.PK, "TEN#"+deployment+"#"); ok {
				l.tenantUsed[name] = it.Used
			} else if name, ok := strings.CutPrefix(it.PK, "USR#"+deployment+"#"); ok {
				l.userUsed[name] = it.Used
			}
		}
		keys = out.UnprocessedKeys[table].Keys
	}
	return l
}

func agentUser(tenant string, agent int) string { return fmt.Sprintf("%s-u%d", tenant, agent) }

// stressTenant is one tenant of the multi-tenant stress test: agents
// (each its own user) with their own threads.
type stressTenant struct {
	name    string
	agents  int
	threads int // per agent
	hostile bool
}

// TestStressTenantsUnderFaults runs four tenants against one deployment
// whose limit is well below their demand, under the wait policy with
// per-tenant and per-user quotas and a small bound on each tenant's
// waiters, on DynamoDB Local and the local sandbox host: three tenants
// of three agents each, and a hostile one with sixteen agents, each its
// own user id. Every agent keeps the sandbox it holds while it acquires
// its next thread, so tenants hold several slots at once. A first phase
// injects faults (those of TestStressInvariantsUnderFaults, without
// pause), a second runs without; then reconcile passes run until they
// converge. Checked throughout, from a checker goroutine and after every
// successful acquire: the sandboxes that run at the provider (each holds
// a slot) and the tenants' and users' counters never exceed the tenant
// quota, the user quota or the deployment limit; no eviction takes
// another tenant's warm sandbox for a tenant at or over its fair share;
// no waiter place is held by two waiters, so a tenant's waiters past the
// bound are refused (too_many_waiters). After each phase, the waiters'
// tickets, polls and the dispatches' grants are checked against the
// queue's fairness rule (waitOrder.check): grants in queue order, a
// tenant's further waiter a round later, and, in the fault-free phase, a
// tenant's first waiter in the head's round. Between phases and at the end,
// with nothing writing, the records and reservations themselves are
// counted against the same bounds; the waiters of the fault-free phase
// gave every place back; after reconcile the counters equal what the
// records hold, every running sandbox is a live record's and every live
// record's sandbox runs, and no waiter place is held. A last phase (flood)
// fills the hostile tenant's waiter places one at a time, so the bound's
// refusal is checked however fast the machine runs the phases before it.
func TestStressTenantsUnderFaults(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stress test: skipped in -short mode")
	}
	const (
		deployment = "tenants"
		limit      = 8
		perTenant  = 3
		perUser    = 2
		maxWaiters = 3
		opsFaulty  = 6 // per agent
		opsClean   = 3
	)
	tenants := []stressTenant{
		{name: "acme", agents: 3, threads: 3},
		{name: "globex", agents: 3, threads: 3},
		{name: "initech", agents: 3, threads: 3},
		{name: "hog", agents: 16, threads: 2, hostile: true},
	}
	ctx := context.Background()
	rig := newStressRig(t, deployment, 11)
	client, table, store, ddbFaults := rig.client, rig.table, rig.store, rig.ddbFaults
	ddbFaults.ArmFunc(rig.fault)
	ddb := testenv.DynamoClient(t) // the checks' reads, without faults
	prov := &faultyProvider{Provider: client, t: t, store: store, rng: rand.New(rand.NewPCG(5, 6)), created: map[string]core.ThreadKey{}}
	prov.faults.Store(true)
	clk := &clock{}
	s := core.DefaultSettings()
	s.Deployment = deployment
	s.Replicas = limit
	s.MaxPerTenant = perTenant
	s.MaxPerUser = perUser
	s.MaxWaitersPerTenant = maxWaiters
	s.Policy = core.PolicyWait
	s.AcquireTimeout = 3 * time.Second
	s.LeaseDuration = 3 * time.Second
	s.PauseAfter = core.PauseNever
	rs := core.DefaultReconcileSettings()
	rs.Grace = time.Second
	watch := newTenantWatch(t, ddbstore.New(rig.faultyDB, table, deployment), store, s, clk,
		func() map[string]int { return readCounters(t, ddb, table, deployment, tenants).tenantUsed })
	for _, tn := range tenants {
		watch.tenants = append(watch.tenants, tn.name)
	}
	eng, err := core.New(s, watch, prov, &fakeSyncer{}, core.WithClock(clk.now), core.WithReconcileSettings(rs))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}

	// What runs at the provider: each running sandbox holds a slot of its
	// tenant and user, so these are lower bounds of the slots held.
	checkFleet := func(step string) {
		running, _ := prov.live(t, deployment)
		if len(running) > limit {
			t.Errorf("%s: %d sandboxes run, limit %d", step, len(running), limit)
		}
		byTenant, byUser := map[string]int{}, map[string]int{}
		for _, in := range running {
			byTenant[in.Metadata[core.MetaTenant]]++
			byUser[in.Metadata[core.MetaTenant]+"#"+in.Metadata[core.MetaUser]]++
		}
		for tenant, n := range byTenant {
			if n > perTenant {
				t.Errorf("%s: %d sandboxes of tenant %s run, quota %d", step, n, tenant, perTenant)
			}
		}
		for user, n := range byUser {
			if n > perUser {
				t.Errorf("%s: %d sandboxes of user %s run, quota %d", step, n, user, perUser)
			}
		}
	}
	// The counters, each item read atomically.
	checkCounters := func(step string, l ledger) {
		for tenant, n := range l.tenantUsed {
			if n < 0 || n > perTenant {
				t.Errorf("%s: tenant %s's counter is %d, quota %d", step, tenant, n, perTenant)
			}
		}
		for user, n := range l.userUsed {
			if n < 0 || n > perUser {
				t.Errorf("%s: user %s's counter is %d, quota %d", step, user, n, perUser)
			}
		}
	}
	// The records and reservations, read while nothing writes.
	checkLedger := func(step string) ledger {
		l := readLedger(t, ddb, table, deployment)
		checkCounters(step, l)
		if len(l.holders) > limit {
			t.Errorf("%s: %d slots held by records and reservations, limit %d", step, len(l.holders), limit)
		}
		for tenant, n := range l.byTenant() {
			if n > perTenant {
				t.Errorf("%s: tenant %s's records and reservations hold %d slots, quota %d", step, tenant, n, perTenant)
			}
		}
		for user, n := range l.byUser() {
			if n > perUser {
				t.Errorf("%s: user %s's records and reservations hold %d slots, quota %d", step, user, n, perUser)
			}
		}
		return l
	}

	var reasonsMu sync.Mutex
	reasons := map[string]map[api.RefusalReason]int{} // tenant -> refusals by reason
	var acquired atomic.Int32
	// agent runs one agent's ops: acquire one of its threads (not the one
	// it holds), then release the sandbox it held before (or kill it
	// behind the broker's back, while faults run).
	agent := func(tn stressTenant, a int, ops int, faulty bool, seed uint64, afterFirst func()) {
		rng := rand.New(rand.NewPCG(seed, uint64(a)))
		user := agentUser(tn.name, a)
		var held core.Record // the sandbox this agent is using
		let := func() {
			if held.SandboxID == "" {
				return
			}
			if faulty && rng.IntN(100) < 5 {
				_ = client.Kill(ctx, held.SandboxID)
			} else {
				_, _ = eng.Release(ctx, tn.name, held.SandboxID)
			}
			held = core.Record{}
		}
		heldThread := -1
		for range ops {
			thread := rng.IntN(tn.threads)
			if thread == heldThread { // another thread than the one in use
				thread = (thread + 1 + rng.IntN(tn.threads-1)) % tn.threads
			}
			k := core.ThreadKey{Tenant: tn.name, User: user, Thread: fmt.Sprint("t", thread)}
			res, err := agentAcquire(ctx, eng, clk, rng, k, faulty)
			var ce *core.CapacityError
			switch {
			case err == nil:
				acquired.Add(1)
				checkFleet(fmt.Sprintf("%s acquired %s", k, res.Record.SandboxID))
				let()
				held, heldThread = res.Record, thread
			case errors.As(err, &ce):
				reasonsMu.Lock()
				if reasons[tn.name] == nil {
					reasons[tn.name] = map[api.RefusalReason]int{}
				}
				reasons[tn.name][ce.Reason]++
				reasonsMu.Unlock()
			}
			afterFirst()
			afterFirst = func() {}
		}
		let()
	}
	// runAgents runs every agent. The hostile tenant's start once the
	// others made their first acquire: the deployment is then full of
	// sandboxes in use, none to evict, so the flood waits, past the bound.
	runAgents := func(ops int, faulty bool, seed uint64) {
		var wg, first sync.WaitGroup
		for _, tn := range tenants {
			for a := range tn.agents {
				wg.Add(1)
				if !tn.hostile {
					first.Add(1)
				}
				go func() {
					defer wg.Done()
					if tn.hostile {
						first.Wait()
						agent(tn, a, ops, faulty, seed, func() {})
					} else {
						agent(tn, a, ops, faulty, seed, first.Done)
					}
				}()
			}
		}
		wg.Wait()
	}

	// The checker and the scheduled reconcile run throughout.
	stopReconcile := reconcileSchedule(eng)
	stopChecker := every(100*time.Millisecond, func() {
		checkFleet("checker")
		checkCounters("checker", readCounters(t, ddb, table, deployment, tenants))
	})

	// converge runs reconcile passes (the clock past leases, grace and
	// reservation expiry) until the counters equal what the records hold,
	// the provider runs exactly the live records' sandboxes and no waiter
	// place is held.
	converge := func(step string) {
		why := converged(t, readLedger(t, ddb, table, deployment), prov, deployment, clk.now())
		t.Logf("%s: %d differences before reconcile", step, len(why))
		for pass := range 10 {
			clk.advance(5 * time.Minute)
			if _, err := eng.Reconcile(ctx); err != nil {
				t.Logf("reconcile pass %d: %v", pass, err)
			}
			if why = converged(t, readLedger(t, ddb, table, deployment), prov, deployment, clk.now()); len(why) == 0 {
				t.Logf("%s: converged after %d reconcile passes", step, pass+1)
				break
			}
		}
		if len(why) > 0 {
			t.Errorf("%s: reconcile did not converge: %s", step, strings.Join(why, "; "))
		}
		checkLedger(step + ", reconciled")
	}

	// The wait queue's order is checked after each phase (complete: no
	// faults, every call's outcome known). Here quotas refuse most
	// acquires before they wait, so few do; TestStressWaitOrderUnderFaults
	// keeps the queue busy and requires the checks to have been exercised.
	start := time.Now()
	runAgents(opsFaulty, true, 1)
	ddbFaults.Disarm()
	prov.faults.Store(false)
	t.Logf("faulty phase (%s): DynamoDB calls hit by faults %d, ambiguous creates %d, kills %d",
		time.Since(start).Round(time.Millisecond), ddbFaults.Hits(), prov.lost.Load(), prov.kills.Load())
	// Quiet: the slots themselves, with nothing writing.
	stopReconcile()
	stopChecker()
	watch.order.report(t, "faulty phase", false)
	checkFleet("after the faulty phase")
	checkLedger("after the faulty phase")
	converge("after the faulty phase")
	// emptied lets the warm sandboxes expire and converges: the next
	// phase starts from an empty deployment, as the faulty one did.
	emptied := func(step string) {
		clk.advance(s.IdleTimeout)
		if _, err := eng.Reconcile(ctx); err != nil {
			t.Logf("reconcile: %v", err)
		}
		converge(step)
	}
	emptied("after the warm sandboxes expired")

	stopChecker = every(100*time.Millisecond, func() { checkFleet("checker") })
	start = time.Now()
	watch.order.reset()
	watch.trackTickets(true)
	runAgents(opsClean, false, 2)
	cleanTickets := watch.trackTickets(false)
	stopChecker()
	t.Logf("clean phase: %s", time.Since(start).Round(time.Millisecond))
	watch.order.report(t, "clean phase", true)
	checkFleet("after the clean phase")
	l := checkLedger("after the clean phase")
	now := clk.now()
	for _, p := range l.places {
		if cleanTickets[p.Ticket] && time.UnixMilli(p.Until).After(now) {
			t.Errorf("after the clean phase: waiter place %s still held by %s, whose acquire returned", p.PK, p.Ticket)
		}
	}
	converge("after the clean phase")

	// The flood: the bound on the hostile tenant's waiters, exercised
	// whatever the machine's speed (the phases above leave it to timing).
	emptied("before the flood")
	fl := flood{s: s, rs: rs, store: watch, prov: prov, clk: clk, hog: "hog", fill: fillThreads(tenants, limit, perTenant, perUser)}
	refused := fl.run(t)
	converge("after the flood")
	emptied("before the quota")
	quotaRefusals := fl.quotaRefused(t)
	converge("after the quota")

	reasonsMu.Lock()
	defer reasonsMu.Unlock()
	t.Logf("acquired %d; refusals by tenant %v; evictions of another tenant's warm sandbox %d (%d checked against the fair share), of the tenant's own %d; most waiters at once %v",
		acquired.Load(), reasons, watch.crossEvictions.Load(), watch.atShareChecked.Load(), watch.ownEvictions.Load(), watch.maxHeld)
	if refused+reasons["hog"][api.RefusalTooManyWaiters] == 0 || watch.maxHeld["hog"] < maxWaiters {
		t.Errorf("the hostile tenant never filled its %d waiter places (most %d) nor was refused too_many_waiters (%d): the bound was not exercised",
			maxWaiters, watch.maxHeld["hog"], refused+reasons["hog"][api.RefusalTooManyWaiters])
	}
	for _, r := range reasons {
		quotaRefusals += r[api.RefusalTenantQuota]
	}
	if quotaRefusals == 0 {
		t.Error("no tenant was refused tenant_quota: the quota was not exercised")
	}
	if watch.atShareChecked.Load() == 0 {
		t.Error("no eviction of another tenant's warm sandbox was checked against the fair share: the rule was not exercised")
	}
}

// fillThreads picks threads of the tenants other than the hostile one
// that together hold every slot of the deployment (limit) within the
// tenant and user quotas, one thread per slot.
func fillThreads(tenants []stressTenant, limit, perTenant, perUser int) []core.ThreadKey {
	var keys []core.ThreadKey
	for _, tn := range tenants {
		if tn.hostile {
			continue
		}
		for n := range min(perTenant, tn.agents*perUser) {
			if len(keys) == limit {
				return keys
			}
			keys = append(keys, core.ThreadKey{Tenant: tn.name, User: agentUser(tn.name, n/perUser), Thread: fmt.Sprint("fill", n%perUser)})
		}
	}
	return keys
}

// flood is the stress test's last phase: the deployment full of the
// other tenants' sandboxes in use, the hostile tenant's acquires queue
// one at a time (each waits until it queued) until every waiter place it
// has is held; then one more of its acquires must be refused
// too_many_waiters at once. Released, the sandboxes of the fill park warm,
// and the queued waiters' turns evict them for the hostile tenant (below
// its fair share): every queued waiter must be served.
type flood struct {
	s     core.Settings
	rs    core.ReconcileSettings
	store *tenantWatch
	prov  *faultyProvider
	clk   *clock
	hog   string
	fill  []core.ThreadKey
}

// run runs the phase and returns how many too_many_waiters refusals it
// saw (1 when the bound holds).
func (f flood) run(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	enqueued := make(chan core.WaitNote, f.s.MaxWaitersPerTenant+1)
	s := f.s
	s.AcquireTimeout = time.Minute // the waiters outlast the phase's steps on a slow machine
	eng, err := core.New(s, f.store, f.prov, &fakeSyncer{}, core.WithClock(f.clk.now), core.WithReconcileSettings(f.rs),
		core.WithWaitObserver(func(n core.WaitNote) {
			if n.Event != core.WaitEnqueued {
				return
			}
			select {
			case enqueued <- n: // a ticket queued anew past the buffer would block its waiter: dropped
			default:
			}
		}))
	if err != nil {
		t.Fatalf("flood: core.New: %v", err)
	}
	acquire := func(k core.ThreadKey) (core.AcquireResult, error) {
		actx, cancel := context.WithTimeout(context.WithValue(ctx, acquirerKey{}, &acquireNote{key: k}), 2*s.AcquireTimeout)
		defer cancel()
		return eng.Acquire(actx, k)
	}
	var held []core.Record
	for _, k := range f.fill {
		res, err := acquire(k)
		if err != nil {
			t.Fatalf("flood: filling the deployment with %s: %v", k, err)
		}
		held = append(held, res.Record)
	}
	type outcome struct {
		key core.ThreadKey
		res core.AcquireResult
		err error
	}
	served := make(chan outcome, s.MaxWaitersPerTenant)
	for n := range s.MaxWaitersPerTenant {
		k := core.ThreadKey{Tenant: f.hog, User: agentUser(f.hog, n), Thread: "flood"}
		go func() {
			res, err := acquire(k)
			served <- outcome{k, res, err}
		}()
		select {
		case note := <-enqueued:
			if note.Tenant != f.hog {
				t.Fatalf("flood: a ticket of %s queued, want %s's", note.Tenant, f.hog)
			}
		case o := <-served:
			t.Fatalf("flood: %s's acquire returned before it queued (err %v)", o.key, o.err)
		case <-time.After(s.AcquireTimeout):
			t.Fatalf("flood: %s's acquire did not queue", k)
		}
	}
	refused := 0
	extra := core.ThreadKey{Tenant: f.hog, User: agentUser(f.hog, s.MaxWaitersPerTenant), Thread: "flood"}
	_, err = acquire(extra)
	var ce *core.CapacityError
	switch {
	case errors.As(err, &ce) && ce.Reason == api.RefusalTooManyWaiters:
		refused++
	default:
		t.Errorf("flood: acquire of %s with all %d of %s's waiter places held = %v, want a %s refusal",
			extra, s.MaxWaitersPerTenant, f.hog, err, api.RefusalTooManyWaiters)
	}
	select {
	case note := <-enqueued:
		t.Errorf("flood: ticket %s of %s queued past the bound", note.Ticket, note.Tenant)
	default:
	}
	for _, rec := range held {
		if _, err := eng.Release(ctx, rec.Tenant, rec.SandboxID); err != nil {
			t.Errorf("flood: release %s: %v", rec.SandboxID, err)
		}
	}
	for range s.MaxWaitersPerTenant {
		o := <-served
		if o.err != nil {
			t.Errorf("flood: queued acquire of %s = %v, want served once the fill was released", o.key, o.err)
			continue
		}
		if _, err := eng.Release(ctx, f.hog, o.res.Record.SandboxID); err != nil {
			t.Errorf("flood: release %s: %v", o.res.Record.SandboxID, err)
		}
	}
	return refused
}

// quotaRefused is the stress test's check of the tenant quota whatever
// the machine's speed (the phases leave it to timing): on an empty
// deployment the hostile tenant takes its quota's worth of sandboxes and
// keeps them in use (none warm to evict for it), and one more acquire of
// its must be refused tenant_quota at once. It returns the refusals.
func (f flood) quotaRefused(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	eng, err := core.New(f.s, f.store, f.prov, &fakeSyncer{}, core.WithClock(f.clk.now), core.WithReconcileSettings(f.rs))
	if err != nil {
		t.Fatalf("quota: core.New: %v", err)
	}
	var held []core.Record
	defer func() {
		for _, rec := range held {
			if _, err := eng.Release(ctx, f.hog, rec.SandboxID); err != nil {
				t.Errorf("quota: release %s: %v", rec.SandboxID, err)
			}
		}
	}()
	for n := range f.s.MaxPerTenant {
		k := core.ThreadKey{Tenant: f.hog, User: agentUser(f.hog, n), Thread: "quota"}
		res, err := eng.Acquire(ctx, k)
		if err != nil {
			t.Fatalf("quota: acquire %s on an empty deployment: %v", k, err)
		}
		held = append(held, res.Record)
	}
	extra := core.ThreadKey{Tenant: f.hog, User: agentUser(f.hog, f.s.MaxPerTenant), Thread: "quota"}
	_, err = eng.Acquire(ctx, extra)
	if ce := (*core.CapacityError)(nil); !errors.As(err, &ce) || ce.Reason != api.RefusalTenantQuota {
		t.Errorf("quota: acquire of %s with %d of %s's sandboxes in use, its quota = %v, want a %s refusal",
			extra, len(held), f.hog, err, api.RefusalTenantQuota)
		return 0
	}
	return 1
}

// converged lists what still differs between the counters, the records
// and the provider (nothing: reconcile converged).
func converged(t *testing.T, l ledger, prov *faultyProvider, deployment string, now time.Time) []string {
	var why []string
	if l.bucketsUsed != len(l.holders) {
		why = append(why, fmt.Sprintf("buckets count %d slots, records and reservations hold %d", l.bucketsUsed, len(l.holders)))
	}
	if l.reservations != 0 {
		why = append(why, fmt.Sprintf("%d reservations left", l.reservations))
	}
	diff := func(kind string, counters, held map[string]int) {
		names := map[string]bool{}
		for k := range counters {
			names[k] = true
		}
		for k := range held {
			names[k] = true
		}
		for _, k := range slices.Sorted(maps.Keys(names)) {
			if counters[k] != held[k] {
				why = append(why, fmt.Sprintf("%s %s's counter is %d, its records hold %d", kind, k, counters[k], held[k]))
			}
		}
	}
	diff("tenant", l.tenantUsed, l.byTenant())
	diff("user", l.userUsed, l.byUser())
	running, _ := prov.live(t, deployment)
	runs := map[string]bool{}
	for _, in := range running {
		runs[in.ID] = true
		if !l.live[in.ID] {
			why = append(why, fmt.Sprintf("sandbox %s runs without a live record (leaked)", in.ID))
		}
	}
	for id := range l.live {
		if !runs[id] {
			why = append(why, fmt.Sprintf("record %s holds a slot for a sandbox that does not run", id))
		}
	}
	for _, p := range l.places {
		if time.UnixMilli(p.Until).After(now) {
			why = append(why, fmt.Sprintf("waiter place %s held by %s", p.PK, p.Ticket))
		}
	}
	sort.Strings(why)
	return why
}
