package core_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// DynamoDB's documented limits of one partition (and so of one partition
// key, which never spans partitions), and the cost of a transactional
// write: twice a plain one.
const (
	partitionWriteUnits = 1000.0
	partitionReadUnits  = 3000.0
	txnWriteFactor      = 2.0
)

// keyLoad records, per partition key (of the table, "pk=...", of the
// state index, "gsi1pk=...", or of the owner index, "gsi2pk=..."), the
// write and read units the broker's calls would consume for items under
// 1 KB (writes) and 4 KB (reads), through an Initialize-step middleware
// (one record per logical call; writeTxn's retries of a cancelled
// transaction are calls of their own). A cancelled transaction's units
// count (it was sent) and are also recorded in cancelled, by key.
type keyLoad struct {
	mu        sync.Mutex
	write     map[string]float64
	read      map[string]float64
	cancelled map[string]float64
	// queueReads is the wait queue's read units by call ("Query
	// strong", "GetItem eventual", ...).
	queueReads map[string]float64
	// cancels counts the cancelled transactions by cause: a condition
	// failed, or only contention (DynamoDB's TransactionConflict).
	cancels map[string]int
	// cancelledBy counts the cancelled transactions by the broker's
	// functions that sent them (see callerChain) and cause.
	cancelledBy map[string]int
	calls       int
	// index knows each item's index entries, so that an applied write
	// is charged the index writes it causes (see indexShadow).
	index indexShadow
}

func newKeyLoad() *keyLoad {
	return &keyLoad{write: map[string]float64{}, read: map[string]float64{}, cancelled: map[string]float64{},
		queueReads: map[string]float64{}, cancels: map[string]int{}, cancelledBy: map[string]int{}, index: indexShadow{}}
}

// cancelCause is why a transaction was cancelled: the kinds of its
// items' keys and of those whose condition failed ("CAP+WQ failed WQ"),
// or "conflict" for contention alone. A capacity bucket that failed while
// it held slots in trust for wait tickets is "CAP(granted)": with one slot
// a bucket, a grant took the room the transaction raced for.
func cancelCause(tce *types.TransactionCanceledException, items []types.TransactWriteItem) string {
	kindOf := func(it types.TransactWriteItem) string {
		kind, _, _ := strings.Cut(strings.TrimPrefix(pkOf(txnItemKey(it)), "pk="), "#")
		return kind
	}
	var all, failed []string
	for i, it := range items {
		all = append(all, kindOf(it))
		if i < len(tce.CancellationReasons) && aws.ToString(tce.CancellationReasons[i].Code) == "ConditionalCheckFailed" {
			kind := kindOf(it)
			if g, ok := tce.CancellationReasons[i].Item["granted"].(*types.AttributeValueMemberN); ok && kind == "CAP" && g.Value != "0" {
				kind += "(granted)"
			}
			failed = append(failed, kind)
		}
	}
	if len(failed) == 0 {
		return strings.Join(all, "+") + " conflict"
	}
	return strings.Join(all, "+") + " failed " + strings.Join(failed, "+")
}

func (l *keyLoad) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("recordKeys",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			l.record(in.Parameters)
			out, md, err := next.HandleInitialize(ctx, in)
			if err == nil {
				l.mu.Lock()
				l.index.applied(in.Parameters, l.write)
				l.mu.Unlock()
			}
			var tce *types.TransactionCanceledException
			if txn, ok := in.Parameters.(*dynamodb.TransactWriteItemsInput); ok && errors.As(err, &tce) {
				l.mu.Lock()
				for _, it := range txn.TransactItems {
					l.cancelled[pkOf(txnItemKey(it))] += txnWriteFactor
				}
				cause := cancelCause(tce, txn.TransactItems)
				l.cancels[cause]++
				l.cancelledBy[callerChain()+": "+cause]++
				l.mu.Unlock()
			}
			return out, md, err
		}), middleware.After)
}

// callerChain names the broker's functions (of internal/core and
// internal/ddbstore) on the calling goroutine's stack, outermost first, joined
// by ">": which path sent a call, told apart from the SDK's frames.
func callerChain() string {
	pcs := make([]uintptr, 256) // deep enough for the SDK's middleware stack under any broker path
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	var chain []string
	for {
		f, more := frames.Next()
		for _, pkg := range []string{"/internal/core.", "/internal/ddbstore."} {
			if _, name, ok := strings.Cut(f.Function, pkg); ok {
				chain = append(chain, name)
			}
		}
		if !more {
			break
		}
	}
	slices.Reverse(chain)
	return strings.Join(chain, ">")
}

// txnItemKey is the key (or item) a transaction item writes or checks.
func txnItemKey(it types.TransactWriteItem) map[string]types.AttributeValue {
	switch {
	case it.Update != nil:
		return it.Update.Key
	case it.Put != nil:
		return it.Put.Item
	case it.Delete != nil:
		return it.Delete.Key
	case it.ConditionCheck != nil:
		return it.ConditionCheck.Key
	}
	return nil
}

func (l *keyLoad) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.write)
	clear(l.read)
	clear(l.cancelled)
	clear(l.queueReads)
	clear(l.cancels)
	clear(l.cancelledBy)
	l.calls = 0
}

func pkOf(key map[string]types.AttributeValue) string {
	if pk, ok := key[ddbstore.AttrPK].(*types.AttributeValueMemberS); ok {
		return "pk=" + pk.Value
	}
	return "pk=?"
}

// keyClause finds the "name = :value" pairs of a key condition, whose
// name may be written out.
var keyClause = regexp.MustCompile(`(#?\w+)\s*=\s*(:\w+)`)

func (l *keyLoad) record(params any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	switch in := params.(type) {
	case *dynamodb.UpdateItemInput:
		l.write[pkOf(in.Key)]++
	case *dynamodb.PutItemInput:
		l.write[pkOf(in.Item)]++
	case *dynamodb.DeleteItemInput:
		l.write[pkOf(in.Key)]++
	case *dynamodb.TransactWriteItemsInput:
		for _, it := range in.TransactItems {
			l.write[pkOf(txnItemKey(it))] += txnWriteFactor
		}
	case *dynamodb.GetItemInput:
		l.read[pkOf(in.Key)] += readUnits(in.ConsistentRead)
		l.queueRead("GetItem", pkOf(in.Key), in.ConsistentRead)
	case *dynamodb.BatchGetItemInput:
		for _, ka := range in.RequestItems {
			for _, k := range ka.Keys {
				l.read[pkOf(k)] += readUnits(ka.ConsistentRead)
			}
		}
	case *dynamodb.ExecuteStatementInput:
		// The wait queue's read: a SELECT whose parameters are the
		// partition keys it reads, one read each.
		for _, p := range in.Parameters {
			if v, ok := p.(*types.AttributeValueMemberS); ok {
				k := "pk=" + v.Value
				l.read[k] += readUnits(in.ConsistentRead)
				l.queueRead("ExecuteStatement", k, in.ConsistentRead)
			}
		}
	case *dynamodb.QueryInput:
		// The partition key is the one equality of the key condition
		// naming a partition key attribute (a sort key condition may
		// name a string too), by placeholder or by name (the wait
		// queue's "pk = :pk").
		for _, m := range keyClause.FindAllStringSubmatch(aws.ToString(in.KeyConditionExpression), -1) {
			attr := m[1]
			if strings.HasPrefix(attr, "#") {
				attr = in.ExpressionAttributeNames[attr]
			}
			v, ok := in.ExpressionAttributeValues[m[2]].(*types.AttributeValueMemberS)
			if !ok || (attr != ddbstore.AttrPK && attr != ddbstore.AttrGSI1PK && attr != ddbstore.AttrGSI2PK) {
				continue
			}
			if in.IndexName != nil { // index reads are eventually consistent
				l.read[attr+"="+v.Value] += readUnits(nil)
			} else {
				l.read[attr+"="+v.Value] += readUnits(in.ConsistentRead)
				l.queueRead("Query", attr+"="+v.Value, in.ConsistentRead)
			}
		}
	}
}

// queueRead tallies a read of key by call when key is a wait queue's.
func (l *keyLoad) queueRead(call, key string, consistent *bool) {
	if !strings.HasPrefix(key, "pk=WQ#") {
		return
	}
	kind := " eventual"
	if consistent != nil && *consistent {
		kind = " strong"
	}
	l.queueReads[call+kind] += readUnits(consistent)
}

// readUnits is the read units of one small item's read: one strongly
// consistent, half otherwise.
func readUnits(consistent *bool) float64 {
	if consistent != nil && *consistent {
		return 1
	}
	return 0.5
}

// hottest returns the key with the most units and its units, and the total.
func hottest(m map[string]float64) (string, float64, float64) {
	var key string
	var top, total float64
	for _, k := range slices.Sorted(maps.Keys(m)) {
		total += m[k]
		if m[k] > top {
			key, top = k, m[k]
		}
	}
	return key, top, total
}

// topUnder is the most units of one key starting with prefix.
func topUnder(m map[string]float64, prefix string) float64 {
	var top float64
	for k, u := range m {
		if strings.HasPrefix(k, prefix) {
			top = max(top, u)
		}
	}
	return top
}

// unitsUnder sums the units of the keys starting with prefix.
func unitsUnder(m map[string]float64, prefix string) float64 {
	var sum float64
	for k, u := range m {
		if strings.HasPrefix(k, prefix) {
			sum += u
		}
	}
	return sum
}

// byKind formats the units per acquire (of a acquires) of each kind of
// key: its attribute and its value's first "#"-separated part ("pk=CAP").
func byKind(m map[string]float64, a float64) string {
	kinds := map[string]float64{}
	for k, u := range m {
		kind, _, _ := strings.Cut(k, "#")
		kinds[kind] += u / a
	}
	parts := make([]string, 0, len(kinds))
	for _, kind := range slices.Sorted(maps.Keys(kinds)) {
		parts = append(parts, fmt.Sprintf("%s %.2f", kind, kinds[kind]))
	}
	return strings.Join(parts, ", ")
}

// BenchmarkHotKeys drives loads through the real store on DynamoDB Local
// and records every call's partition keys. It reports the hottest write
// key's share of all write units and, from the hottest write and read
// keys' units per acquire and DynamoDB's documented per-partition limits
// (1,000 write units/s, 3,000 read units/s, transactional writes at twice
// the units), the acquires per second one deployment can sustain before
// its hottest partition throttles. It reports the wait queue's tickets
// too (waited/op: tickets queued; served-waiters/op: waiters that took
// the slot granted to them; gave-up/op), and logs the units of the
// queue's keys (WQ#: the queue's shards; WTR#: the tenants' waiter
// places) per acquire and per waited acquire (per ticket queued), the
// queue's reads by call, and the cancelled transactions by their items'
// keys and the keys whose condition failed. A Query
// counts as one small item's read (results under 4 KB). Five loads:
//
//   - steady: 16 tenants' threads acquire (reuse, reclaim, create, with
//     evictions), release and are refused (a full deployment, a tenant
//     quota), 32 callers at once on a limit of 256 slots, a quarter of
//     them under the wait policy (waiting up to 300 ms). The deployment
//     starts full of warm sandboxes; each tenant's agents mostly come back
//     to their 8 busy threads (reuse, reclaim), and one acquire in eight
//     picks any of the tenant's threads (a create, evicting the least
//     recently parked warm sandbox, when the thread has none);
//   - saturated: the same callers, every acquire picking any of 288
//     threads for 256 slots (creates and evictions throughout, refusals
//     when every slot is held), and a hog tenant runs past its quota of
//     24. Neither load queues a ticket in practice: a full deployment
//     nearly always has a warm sandbox to evict;
//   - waiting: 24 callers of 6 tenants, all under the wait policy, on a
//     limit of 8 slots held from the start by sandboxes in use (nothing to
//     evict). Each caller holds its sandbox 5 ms; its release pauses it
//     (pause at release), which frees the running slot, and the free's
//     dispatch grants the slot to the first waiter, which takes it at its
//     next poll (the engine's own 250 ms: polls are part of the read load)
//     and resumes its thread's paused sandbox (or creates one). About 70 %
//     of the acquires wait (the others take a slot between a free and its
//     dispatch). A waited acquire writes its ticket three times in
//     transactions (queued, granted, taken: 6 units applied, and about 3
//     more in cancelled grants), spread over the queue's shards; every
//     read of the queue's head reads each shard. Its polls' reads grow
//     with the wait, which DynamoDB Local's latency lengthens. Its limit
//     gives only 8 of the 64 capacity buckets a share;
//   - waiting-wide: the same with 96 callers of 24 tenants on 64 slots,
//     one in each capacity bucket: the waiting load of a deployment whose
//     buckets all take part, bounded by the queue rather than by its
//     limit.
func BenchmarkHotKeys(b *testing.B) {
	for _, bm := range []struct {
		name string
		load func(*testing.B, *hotRig)
	}{
		{"steady", func(b *testing.B, r *hotRig) { mixedLoad(b, r, false) }},
		{"saturated", func(b *testing.B, r *hotRig) { mixedLoad(b, r, true) }},
		{"waiting", func(b *testing.B, r *hotRig) { waitingLoad(b, r, waitingShape{slots: 8, callers: 24, tenants: 6}) }},
		{"waiting-wide", func(b *testing.B, r *hotRig) { waitingLoad(b, r, waitingShape{slots: 64, callers: 96, tenants: 24}) }},
	} {
		b.Run(bm.name, func(b *testing.B) {
			r := newHotRig(b)
			bm.load(b, r)
			b.StopTimer()
			r.checkInvariants(b)
			r.report(b)
		})
	}
}

// hotRig is one sub-benchmark's store (on a fresh table, its calls
// recorded by load), provider, and the tallies of its load.
type hotRig struct {
	load     *keyLoad
	client   *dynamodb.Client
	store    *ddbstore.Store // sized for the limit of the last engine built
	table    string
	settings core.Settings // the load's engine's (the last built)
	prov     *coretest.FakeProvider
	waits    waitTally

	acquires, refused atomic.Int64
	mu                sync.Mutex
	sources           map[core.Source]int
	byTenant          map[string]int // acquires by tenant
	refusals          map[string]int
	releases          map[string]int // by the state a release left
}

func newHotRig(b *testing.B) *hotRig {
	base := testenv.DynamoClient(b)
	load := newKeyLoad()
	client := dynamodb.New(base.Options(), func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, load.middleware) })
	table := freshTable(b, client, "hotkeys")
	return &hotRig{load: load, client: client, store: ddbstore.New(client, table, "hot"), table: table,
		prov:    coretest.NewFakeProvider(), // one provider: sandbox ids are unique
		waits:   waitTally{queued: make(chan struct{})},
		sources: map[core.Source]int{}, byTenant: map[string]int{}, refusals: map[string]int{}, releases: map[string]int{}}
}

// waitTally counts the wait queue's tickets (a wait observer).
type waitTally struct {
	enqueued, served, gaveUp atomic.Int64
	once                     sync.Once
	queued                   chan struct{} // closed when the first ticket queues
}

func (w *waitTally) observe(n core.WaitNote) {
	switch n.Event {
	case core.WaitEnqueued:
		w.enqueued.Add(1)
		w.once.Do(func() { close(w.queued) })
	case core.WaitServed:
		w.served.Add(1)
	case core.WaitGaveUp:
		w.gaveUp.Add(1)
	}
}

// engine builds an engine of deployment "hot" on the rig's store, with the
// default settings changed by set, its wait queue observed by the rig.
func (r *hotRig) engine(b *testing.B, set func(*core.Settings)) *core.Engine {
	s := core.DefaultSettings()
	s.Deployment = "hot"
	set(&s)
	r.settings = s
	r.store = ddbstore.New(r.client, r.table, "hot", ddbstore.WithLimit(s.Limit()))
	eng, err := core.New(s, r.store, r.prov, &fakeSyncer{}, core.WithLogger(slog.New(slog.DiscardHandler)),
		core.WithWaitObserver(r.waits.observe))
	if err != nil {
		b.Fatal(err)
	}
	return eng
}

// hold acquires a sandbox for each of keys (before the load: untallied).
func (r *hotRig) hold(b *testing.B, eng *core.Engine, keys []core.ThreadKey) []core.AcquireResult {
	held := make([]core.AcquireResult, len(keys))
	for n, k := range keys {
		res, err := eng.Acquire(context.Background(), k)
		if err != nil {
			b.Fatalf("fill: %v", err)
		}
		held[n] = res
	}
	return held
}

// start starts the timed load of callers at once: from here on the calls
// count.
func (r *hotRig) start(b *testing.B, callers int) {
	r.load.reset()
	b.SetParallelism(max(1, callers/max(1, testingGOMAXPROCS())))
	b.ResetTimer()
}

// acquire runs one Acquire and tallies its source, or its refusal.
func (r *hotRig) acquire(ctx context.Context, eng *core.Engine, k core.ThreadKey) (core.AcquireResult, bool) {
	res, err := eng.Acquire(ctx, k)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.refused.Add(1)
		r.refusals[errKind(err)]++
		return res, false
	}
	r.acquires.Add(1)
	r.sources[res.Source]++
	r.byTenant[k.Tenant]++
	return res, true
}

// errKind names err for the tallies: a refusal's reason, or the engine's
// error it is.
func errKind(err error) string {
	var ce *core.CapacityError
	if errors.As(err, &ce) {
		return string(ce.Reason)
	}
	for _, e := range []error{core.ErrLeaseHeld, core.ErrConflict, core.ErrNotFound, core.ErrStaleFence, core.ErrThreadBound,
		core.ErrGrantLost, core.ErrStoreUnavailable, core.ErrProviderUnavailable} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	msg := err.Error()
	return msg[:min(len(msg), 60)]
}

// release releases res's sandbox and tallies the state it was left in.
func (r *hotRig) release(ctx context.Context, eng *core.Engine, res core.AcquireResult) {
	out, err := eng.Release(ctx, res.Record.Tenant, res.Record.SandboxID)
	state := out.State
	if err != nil {
		state = errKind(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releases[state]++
}

// mixedLoad is the steady (or saturated) load: see BenchmarkHotKeys.
func mixedLoad(b *testing.B, r *hotRig, saturated bool) {
	engine := func(policy core.OverflowPolicy) *core.Engine {
		return r.engine(b, func(s *core.Settings) {
			s.Replicas, s.Policy, s.MaxPerTenant = 256, policy, 24
			s.AcquireTimeout, s.MaxWaitersPerTenant = 300*time.Millisecond, 2
		})
	}
	rejecting, waiting := engine(core.PolicyReject), engine(core.PolicyWait)
	ctx := context.Background()
	if !saturated {
		// Full of warm sandboxes, as a busy deployment is.
		keys := make([]core.ThreadKey, 256)
		for n := range keys {
			keys[n] = core.ThreadKey{Tenant: fmt.Sprint("tenant", 1+n%(mixedTenants-1)), User: "old", Thread: fmt.Sprint("o", n)}
		}
		for _, res := range r.hold(b, rejecting, keys) {
			if _, err := rejecting.Release(ctx, res.Record.Tenant, res.Record.SandboxID); err != nil {
				b.Fatalf("fill: %v", err)
			}
		}
	}
	r.start(b, 32)
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
		for pb.Next() {
			eng := rejecting
			if rng.IntN(4) == 0 {
				eng = waiting
			}
			k := mixedThread(rng, saturated)
			res, ok := r.acquire(ctx, eng, k)
			if !ok {
				continue
			}
			if rng.IntN(3) == 0 { // a second turn before release: a reuse
				r.acquire(ctx, eng, k)
			}
			r.release(ctx, eng, res)
		}
	})
}

// The mixed loads' tenants: fifteen with 16 threads each and a hog with
// 48 (past its quota of 24: refused tenant_quota), 288 threads for 256
// slots.
const mixedTenants, mixedThreads, hogThreads = 16, 16, 48

// mixedThread picks the thread of a mixed load's acquire: any thread of a
// tenant, or under the steady load mostly one of its 8 busy threads.
func mixedThread(rng *rand.Rand, saturated bool) core.ThreadKey {
	n := rng.IntN(mixedTenants)
	tenant, threads := fmt.Sprint("tenant", n), mixedThreads
	if n == 0 {
		tenant, threads = "hog", hogThreads
	}
	thread := rng.IntN(threads)
	if !saturated && rng.IntN(8) != 0 {
		thread = rng.IntN(8) // a busy thread
	}
	return core.ThreadKey{Tenant: tenant, User: fmt.Sprint("u", thread%3), Thread: fmt.Sprint("t", thread)}
}

// waitingShape is the size of a waiting load: its limit, callers and
// their tenants (each caller's threads are its own).
type waitingShape struct{ slots, callers, tenants int }

// waitingLoad is the waiting load: see BenchmarkHotKeys.
func waitingLoad(b *testing.B, r *hotRig, shape waitingShape) {
	const threadsPerCaller, inUse = 4, 5 * time.Millisecond
	slots, callers, tenants := shape.slots, shape.callers, shape.tenants
	r.prov.Pausable = true // before the engine is built
	eng := r.engine(b, func(s *core.Settings) {
		s.Replicas, s.Policy, s.PauseAfter = slots, core.PolicyWait, 0
		s.MaxPaused = 4096 // room for every thread's paused sandbox: no pause evicts
		s.AcquireTimeout = 20 * time.Second
	})
	ctx := context.Background()
	keys := make([]core.ThreadKey, slots)
	for n := range keys {
		keys[n] = core.ThreadKey{Tenant: "holder", User: "h", Thread: fmt.Sprint("h", n)}
	}
	held := r.hold(b, eng, keys)
	r.start(b, callers)
	// Every slot stays in use until the first ticket queues (or a while):
	// the first callers find nothing free and nothing to evict.
	var holders sync.WaitGroup
	for _, res := range held {
		holders.Go(func() {
			select {
			case <-r.waits.queued:
			case <-time.After(2 * time.Second):
			}
			time.Sleep(inUse)
			r.release(ctx, eng, res)
		})
	}
	var callerIDs atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		id := callerIDs.Add(1) - 1
		rng := rand.New(rand.NewPCG(uint64(id), 3))
		for pb.Next() {
			k := core.ThreadKey{Tenant: fmt.Sprint("tenant", id%int64(tenants)), User: fmt.Sprint("u", id),
				Thread: fmt.Sprint("t", rng.IntN(threadsPerCaller))}
			res, ok := r.acquire(ctx, eng, k)
			if !ok {
				continue
			}
			time.Sleep(inUse)
			r.release(ctx, eng, res)
		}
	})
	holders.Wait()
	if r.waits.enqueued.Load() == 0 {
		b.Fatal("the waiting load queued no ticket: it measured nothing of the wait queue")
	}
}

// checkInvariants reads the table once the load is over (nothing writes
// then) and fails the benchmark when the load broke what its figures
// assume: the running slots held (by records and reservations) within the
// limit and each tenant's quota, and every tenant's and user's slot count
// equal to the slots its records and reservations hold.
func (r *hotRig) checkInvariants(b *testing.B) {
	l := readLedger(b, testenv.DynamoClient(b), r.table, r.settings.Deployment)
	if n, limit := len(l.holders), r.settings.Limit(); n > limit {
		b.Errorf("after the load %d running slots are held, limit %d", n, limit)
	}
	byTenant, byUser := l.byTenant(), l.byUser()
	for tenant, n := range byTenant {
		if q := r.settings.MaxPerTenant; q > 0 && n > q {
			b.Errorf("after the load tenant %s holds %d slots, quota %d", tenant, n, q)
		}
	}
	for _, c := range []struct {
		what            string
		counts, holders map[string]int
	}{{"tenant", l.tenantUsed, byTenant}, {"user", l.userUsed, byUser}} {
		for k := range mergedKeys(c.counts, c.holders) {
			if c.counts[k] != c.holders[k] {
				b.Errorf("after the load %s %s's slot count is %d, its records and reservations hold %d", c.what, k, c.counts[k], c.holders[k])
			}
		}
	}
}

// mergedKeys is the set of the keys of a and b.
func mergedKeys(a, b map[string]int) map[string]bool {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return keys
}

// report reports the load's metrics and logs its hottest keys and the
// wait queue's units. Only runs of more than one op log: testing keeps 10
// lines of all runs' logs together, and the probe run it makes first (b.N
// = 1) would fill them.
func (r *hotRig) report(b *testing.B) {
	a := float64(r.acquires.Load())
	if a == 0 {
		b.Fatal("no acquire succeeded")
	}
	l := r.load
	l.mu.Lock()
	defer l.mu.Unlock()
	_, wTop, wTotal := hottest(l.write)
	_, rTop, _ := hottest(l.read)
	perOp := func(n int64) float64 { return float64(n) / float64(b.N) }
	b.ReportMetric(wTop/wTotal, "hottest-write-share")
	b.ReportMetric(min(partitionWriteUnits*a/wTop, partitionReadUnits*a/max(rTop, 1)), "predicted-acquires/s")
	_, wShared, _ := hottest(sharedKeys(l.write))
	_, rShared, _ := hottest(sharedKeys(l.read))
	b.ReportMetric(min(partitionWriteUnits*a/max(wShared, 1), partitionReadUnits*a/max(rShared, 1)), "shared-keys-acquires/s")
	b.ReportMetric(r.tenantCeiling(), "tenant-acquires/s")
	b.ReportMetric(perOp(r.refused.Load()), "refused/op")
	b.ReportMetric(perOp(r.waits.enqueued.Load()), "waited/op")
	b.ReportMetric(perOp(r.waits.served.Load()), "served-waiters/op")
	b.ReportMetric(perOp(r.waits.gaveUp.Load()), "gave-up/op")
	if b.N == 1 {
		return
	}
	b.Logf("hottest writes (units per acquire, share of all): %s", topKeys(l.write, 5, a))
	b.Logf("hottest reads (units per acquire, share of all): %s", topKeys(l.read, 3, a))
	b.Logf("units per acquire by key kind: write %s; read %s", byKind(l.write, a), byKind(l.read, a))
	b.Logf("acquires %d (sources %v), refused %d (%v), releases %v, %d sandboxes killed; per acquire %.1f write units (%.1f in cancelled transactions: %v) and %.1f DynamoDB calls",
		r.acquires.Load(), r.sources, r.refused.Load(), r.refusals, r.releases, len(r.prov.Killed()), wTotal/a, unitsUnder(l.cancelled, "")/a, l.cancels, float64(l.calls)/a)
	b.Logf("cancelled transactions by caller: %s", topCounts(l.cancelledBy, 12))
	r.logQueue(b, a)
}

// topCounts is m's n largest counts, largest first, on one line (a
// benchmark's log keeps only its first lines).
func topCounts(m map[string]int, n int) string {
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int { return cmp.Or(m[b]-m[a], strings.Compare(a, b)) })
	var lines []string
	for _, k := range keys[:min(n, len(keys))] {
		lines = append(lines, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(lines, "; ")
}

// ownKinds are the kinds of key of one tenant (its slot count, its waiter
// places), one user (its slot count), or one thread or sandbox (its
// binding, record, reservation, owner index entries): each bounds the
// acquires of its own tenant, user or thread, however many others the
// deployment serves.
var ownKinds = []string{"pk=TEN#", "pk=USR#", "pk=WTR#", "pk=THR#", "pk=SBX#", "pk=RES#", "gsi2pk=OW#"}

// sharedKeys is m without the keys of ownKinds: the keys every tenant's
// acquires share (capacity and paused buckets, the wait queue, the state
// index), which bound the deployment.
func sharedKeys(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, u := range m {
		if !slices.ContainsFunc(ownKinds, func(kind string) bool { return strings.HasPrefix(k, kind) }) {
			out[k] = u
		}
	}
	return out
}

// tenantCeiling is the acquires a second of the busiest tenant's own
// (its acquires against its slot count's units) when its slot count
// throttles: what one tenant sustains, whatever the others do. The
// caller holds r.load.mu.
func (r *hotRig) tenantCeiling() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	ceiling := math.Inf(1)
	for tenant, n := range r.byTenant {
		key := "pk=TEN#hot#" + tenant
		w, rd := r.load.write[key], r.load.read[key]
		if w > 0 {
			ceiling = min(ceiling, partitionWriteUnits*float64(n)/w)
		}
		if rd > 0 {
			ceiling = min(ceiling, partitionReadUnits*float64(n)/rd)
		}
	}
	if math.IsInf(ceiling, 1) {
		return 0
	}
	return ceiling
}

// topKeys formats the n keys of m with the most units: their units per
// acquire (of a) and share of all.
func topKeys(m map[string]float64, n int, a float64) string {
	_, _, total := hottest(m)
	top := slices.SortedFunc(maps.Keys(m), func(x, y string) int { return cmp.Or(cmp.Compare(m[y], m[x]), strings.Compare(x, y)) })
	parts := make([]string, 0, n)
	for _, k := range top[:min(n, len(top))] {
		parts = append(parts, fmt.Sprintf("%s %.2f (%.1f%%)", k, m[k]/a, 100*m[k]/total))
	}
	return strings.Join(parts, ", ")
}

// byCall formats the units of each call in m per waited acquire (of w).
func byCall(m map[string]float64, w float64) string {
	parts := make([]string, 0, len(m))
	for _, call := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.1f", call, m[call]/w))
	}
	return strings.Join(parts, ", ")
}

// logQueue logs the wait queue's tickets and its keys' units (WQ#: the
// queue's shards, all together; WTR#: the waiter places, all together)
// per acquire (of a) and per waited acquire (ticket queued), and the
// waited acquires a second the queue's busiest shard sustains. The caller
// holds r.load.mu.
func (r *hotRig) logQueue(b *testing.B, a float64) {
	w := float64(r.waits.enqueued.Load())
	line := fmt.Sprintf("wait queue: %.0f tickets queued, %d served, %d gave up", w, r.waits.served.Load(), r.waits.gaveUp.Load())
	for _, kind := range []string{"pk=WQ#", "pk=WTR#"} {
		wu, ru := unitsUnder(r.load.write, kind), unitsUnder(r.load.read, kind)
		line += fmt.Sprintf("; %s write %.3f, read %.3f per acquire", kind, wu/a, ru/a)
		if w > 0 {
			line += fmt.Sprintf(", %.2f (%.2f in cancelled transactions) and %.2f per waited acquire",
				wu/w, unitsUnder(r.load.cancelled, kind)/w, ru/w)
		}
	}
	if wq, rq := topUnder(r.load.write, "pk=WQ#"), topUnder(r.load.read, "pk=WQ#"); w > 0 && wq > 0 {
		byW, byR := partitionWriteUnits*w/wq, partitionReadUnits*w/max(rq, 1)
		line += "; its reads per waited acquire by call: " + byCall(r.load.queueReads, w)
		line += fmt.Sprintf("; the queue's busiest shard sustains about %.0f waited acquires/s (%.0f by its writes, %.0f by its reads)",
			min(byW, byR), byW, byR)
	}
	b.Log(line)
}
