package core_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// callCounter counts DynamoDB operations (logical calls, not SDK retries)
// through an Initialize-step middleware, and the capacity units DynamoDB
// reports they consumed (ReturnConsumedCapacity TOTAL, set on every call
// that takes it), in thousandths of a unit.
type callCounter struct {
	n, rcuMilli, wcuMilli atomic.Int64
	mu                    sync.Mutex
	ops                   []string // operation names, in order (since reset)
}

func (c *callCounter) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("countCalls",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			op := awsmiddleware.GetOperationName(ctx)
			if op == "" {
				return next.HandleInitialize(ctx, in)
			}
			c.n.Add(1)
			c.mu.Lock()
			c.ops = append(c.ops, op)
			c.mu.Unlock()
			askConsumed(in.Parameters)
			out, md, err := next.HandleInitialize(ctx, in)
			c.addConsumed(in.Parameters, out.Result, err)
			return out, md, err
		}), middleware.After)
}

// reset zeroes the counts.
func (c *callCounter) reset() {
	c.n.Store(0)
	c.rcuMilli.Store(0)
	c.wcuMilli.Store(0)
	c.mu.Lock()
	c.ops = nil
	c.mu.Unlock()
}

// opNames returns the operations since the last reset, in order.
func (c *callCounter) opNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.ops)
}

// askConsumed sets ReturnConsumedCapacity TOTAL on a call's input.
func askConsumed(params any) {
	total := types.ReturnConsumedCapacityTotal
	switch in := params.(type) {
	case *dynamodb.GetItemInput:
		in.ReturnConsumedCapacity = total
	case *dynamodb.BatchGetItemInput:
		in.ReturnConsumedCapacity = total
	case *dynamodb.QueryInput:
		in.ReturnConsumedCapacity = total
	case *dynamodb.PutItemInput:
		in.ReturnConsumedCapacity = total
	case *dynamodb.UpdateItemInput:
		in.ReturnConsumedCapacity = total
	case *dynamodb.DeleteItemInput:
		in.ReturnConsumedCapacity = total
	case *dynamodb.TransactWriteItemsInput:
		in.ReturnConsumedCapacity = total
	case *dynamodb.TransactGetItemsInput:
		in.ReturnConsumedCapacity = total
	}
}

// addConsumed adds the capacity a call's output reports. A failed write
// (a condition check failure, a cancelled transaction) reports none, though
// DynamoDB charges it: it is counted at one write unit per item it names
// (two in a transaction), the least an item under 1 KB costs.
func (c *callCounter) addConsumed(params, result any, err error) {
	if err != nil {
		switch in := params.(type) {
		case *dynamodb.PutItemInput, *dynamodb.UpdateItemInput, *dynamodb.DeleteItemInput:
			c.wcuMilli.Add(1000)
		case *dynamodb.TransactWriteItemsInput:
			c.wcuMilli.Add(int64(2000 * len(in.TransactItems)))
		}
		return
	}
	var ccs []types.ConsumedCapacity
	switch out := result.(type) {
	case *dynamodb.GetItemOutput:
		ccs = append(ccs, deref(out.ConsumedCapacity))
	case *dynamodb.BatchGetItemOutput:
		ccs = out.ConsumedCapacity
	case *dynamodb.QueryOutput:
		ccs = append(ccs, deref(out.ConsumedCapacity))
	case *dynamodb.PutItemOutput:
		ccs = append(ccs, deref(out.ConsumedCapacity))
	case *dynamodb.UpdateItemOutput:
		ccs = append(ccs, deref(out.ConsumedCapacity))
	case *dynamodb.DeleteItemOutput:
		ccs = append(ccs, deref(out.ConsumedCapacity))
	case *dynamodb.TransactWriteItemsOutput:
		ccs = out.ConsumedCapacity
	case *dynamodb.TransactGetItemsOutput:
		ccs = out.ConsumedCapacity
	case *dynamodb.ScanOutput:
		ccs = append(ccs, deref(out.ConsumedCapacity))
	}
	c.rcuMilli.Add(unreportedReadMilli(params, result, ccs))
	write := false
	switch params.(type) {
	case *dynamodb.PutItemInput, *dynamodb.UpdateItemInput, *dynamodb.DeleteItemInput, *dynamodb.TransactWriteItemsInput:
		write = true
	}
	for _, cc := range ccs {
		if os.Getenv("SBX_BENCH_DEBUG") != "" {
			fmt.Printf("%T cu=%v r=%v w=%v\n", params, aws.ToFloat64(cc.CapacityUnits), aws.ToFloat64(cc.ReadCapacityUnits), aws.ToFloat64(cc.WriteCapacityUnits))
		}
		switch {
		case cc.ReadCapacityUnits != nil || cc.WriteCapacityUnits != nil:
			c.rcuMilli.Add(int64(aws.ToFloat64(cc.ReadCapacityUnits) * 1000))
			c.wcuMilli.Add(int64(aws.ToFloat64(cc.WriteCapacityUnits) * 1000))
		case write:
			c.wcuMilli.Add(int64(aws.ToFloat64(cc.CapacityUnits) * 1000))
		default:
			c.rcuMilli.Add(int64(aws.ToFloat64(cc.CapacityUnits) * 1000))
		}
	}
}

// unreportedReadMilli is what DynamoDB bills for a read that DynamoDB
// Local reports no units for: a query or scan that finds nothing, and each
// key a GetItem or BatchGetItem finds absent. DynamoDB bills those at the
// least a read costs: half a unit, one when strongly consistent.
func unreportedReadMilli(params, result any, reported []types.ConsumedCapacity) int64 {
	least := func(consistent *bool) int64 {
		if aws.ToBool(consistent) {
			return 1000
		}
		return 500
	}
	none := true
	for _, cc := range reported {
		if aws.ToFloat64(cc.CapacityUnits) > 0 || aws.ToFloat64(cc.ReadCapacityUnits) > 0 {
			none = false
		}
	}
	switch in := params.(type) {
	case *dynamodb.QueryInput:
		if none {
			return least(in.ConsistentRead)
		}
	case *dynamodb.ScanInput:
		if none {
			return least(in.ConsistentRead)
		}
	case *dynamodb.GetItemInput:
		if out, ok := result.(*dynamodb.GetItemOutput); ok && out.Item == nil {
			return least(in.ConsistentRead)
		}
	case *dynamodb.BatchGetItemInput:
		out, _ := result.(*dynamodb.BatchGetItemOutput)
		var milli int64
		for table, ka := range in.RequestItems {
			found := 0
			if out != nil {
				found = len(out.Responses[table]) + len(out.UnprocessedKeys[table].Keys)
			}
			milli += int64(max(len(ka.Keys)-found, 0)) * least(ka.ConsistentRead)
		}
		return milli
	}
	return 0
}

func deref[T any](p *T) T {
	if p == nil {
		var z T
		return z
	}
	return *p
}

// report reports calls, read and write units per op over ops operations.
func (c *callCounter) report(b *testing.B, calls, rcuMilli, wcuMilli int64, ops int) {
	b.ReportMetric(float64(calls)/float64(ops), "ddb-calls/op")
	b.ReportMetric(float64(rcuMilli)/1000/float64(ops), "rcu/op")
	b.ReportMetric(float64(wcuMilli)/1000/float64(ops), "wcu/op")
}

// benchEngine builds an engine over a fresh DynamoDB Local table whose
// client counts calls, with the zero-latency fake provider, so figures are
// the broker's own cost.
func benchEngine(b *testing.B, mutate func(*core.Settings), opts ...core.Option) (*core.Engine, *callCounter, *dynamodb.Client, string) {
	b.Helper()
	return benchEngineWith(b, coretest.NewFakeProvider(), mutate, opts...)
}

// benchEngineWith is benchEngine over prov.
func benchEngineWith(b *testing.B, prov core.Provider, mutate func(*core.Settings), opts ...core.Option) (*core.Engine, *callCounter, *dynamodb.Client, string) {
	b.Helper()
	base := testenv.DynamoClient(b)
	counter := &callCounter{}
	client := dynamodb.New(base.Options(), func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, counter.middleware) })
	table := freshTable(b, client, "bench")
	s := core.DefaultSettings()
	s.Deployment = "bench"
	s.Replicas = 100000
	s.Policy = core.PolicyReject
	if mutate != nil {
		mutate(&s)
	}
	eng, err := core.New(s, ddbstore.New(client, table, s.Deployment, ddbstore.WithLimit(s.Limit())), prov, &fakeSyncer{},
		append([]core.Option{core.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		b.Fatalf("core.New: %v", err)
	}
	return eng, counter, client, table
}

func mustAcquire(b *testing.B, eng *core.Engine, k core.ThreadKey, want core.Source) core.Record {
	res, err := eng.Acquire(context.Background(), k)
	if err != nil {
		b.Fatalf("Acquire: %v", err)
	}
	if res.Source != want {
		b.Fatalf("source %s, want %s", res.Source, want)
	}
	return res.Record
}

// measure runs op b.N times, prepare (not counted) before each, and
// reports per op the DynamoDB calls, the read and write units DynamoDB
// reported (rcu/op, wcu/op) and the op's mean latency (op-ms).
func measure(b *testing.B, c *callCounter, prepare, op func(i int)) {
	b.Helper()
	var calls, rcu, wcu int64
	var spent time.Duration
	b.ResetTimer()
	for i := range b.N {
		if prepare != nil {
			prepare(i)
		}
		c.reset()
		t0 := time.Now()
		op(i)
		spent += time.Since(t0)
		calls += c.n.Load()
		rcu += c.rcuMilli.Load()
		wcu += c.wcuMilli.Load()
	}
	c.report(b, calls, rcu, wcu, b.N)
	b.ReportMetric(float64(spent.Microseconds())/1000/float64(b.N), "op-ms")
	if testing.Verbose() {
		b.Logf("calls of the last op: %v", c.opNames())
	}
}

// BenchmarkAcquireDynamoDBCalls reports DynamoDB calls per acquire path
// and per release (metric "ddb-calls/op"), with the capacity units
// DynamoDB Local reports and the latency, against DynamoDB Local.
func BenchmarkAcquireDynamoDBCalls(b *testing.B) {
	ctx := context.Background()
	release := func(b *testing.B, eng *core.Engine, id string) {
		if _, err := eng.Release(ctx, "acme", id); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("reuse", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil)
		mustAcquire(b, eng, key("t"), core.SourceCreated)
		measure(b, c, nil, func(int) { mustAcquire(b, eng, key("t"), core.SourceReused) })
	})
	b.Run("reclaim", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil)
		rec := mustAcquire(b, eng, key("t"), core.SourceCreated)
		measure(b, c, func(int) { release(b, eng, rec.SandboxID) },
			func(int) { mustAcquire(b, eng, key("t"), core.SourceReclaimed) })
	})
	b.Run("resume", func(b *testing.B) {
		prov := coretest.NewFakeProvider()
		prov.Pausable = true
		eng, c, _, _ := benchEngineWith(b, prov, func(s *core.Settings) { s.PauseAfter = 0 })
		rec := mustAcquire(b, eng, key("t"), core.SourceCreated)
		measure(b, c, func(int) {
			if res, err := eng.Release(ctx, "acme", rec.SandboxID); err != nil || res.State != "paused" {
				b.Fatalf("Release = %+v, %v; want paused", res, err)
			}
		}, func(int) { mustAcquire(b, eng, key("t"), core.SourceResumed) })
	})
	b.Run("release", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil)
		rec := mustAcquire(b, eng, key("t"), core.SourceCreated)
		measure(b, c, func(i int) {
			if i > 0 {
				mustAcquire(b, eng, key("t"), core.SourceReclaimed)
			}
		}, func(int) { release(b, eng, rec.SandboxID) })
	})
	b.Run("create", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil)
		measure(b, c, nil, func(i int) { mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourceCreated) })
	})
	b.Run("create-empty-pool", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil, core.WithPool(core.PoolSettings{Size: 1, MaxAge: time.Hour}))
		measure(b, c, nil, func(i int) { mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourceCreated) })
	})
	// A pool of one member: as sparse as a pool gets.
	for _, parked := range []core.PoolParking{core.PoolParkedRunning, core.PoolParkedPaused} {
		b.Run("pool-claim-"+string(parked), func(b *testing.B) {
			prov := coretest.NewFakeProvider()
			prov.Pausable = true
			eng, c, _, _ := benchEngineWith(b, prov, nil, core.WithPool(core.PoolSettings{Size: 1, MaxAge: time.Hour, Parked: parked}))
			measure(b, c, func(int) {
				if st, err := eng.RefillPool(ctx); err != nil || st.Created != 1 {
					b.Fatalf("RefillPool = %+v, %v", st, err)
				}
			}, func(i int) { mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourcePool) })
		})
	}
	b.Run("evict-then-create", func(b *testing.B) {
		// One warm sandbox, the only one to evict.
		eng, c, _, _ := benchEngine(b, func(s *core.Settings) { s.Replicas = 1 })
		prev := mustAcquire(b, eng, key("t-first"), core.SourceCreated)
		measure(b, c, func(int) { release(b, eng, prev.SandboxID) },
			func(i int) { prev = mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourceCreated) })
	})
	b.Run("evict-then-create-warm64", func(b *testing.B) {
		// A full deployment of 64 warm sandboxes: each acquire of a new
		// thread evicts one, and its sandbox is released (parked) after.
		// Also reports the evicted sandbox's rank in the pool's park order
		// (1 = the least recently parked).
		const pool = 64
		eng, c, client, table := benchEngine(b, func(s *core.Settings) { s.Replicas = pool })
		store := ddbstore.New(client, table, "bench", ddbstore.WithLimit(pool))
		for i := range pool {
			release(b, eng, mustAcquire(b, eng, key(fmt.Sprint("w", i)), core.SourceCreated).SandboxID)
		}
		var prev core.Record
		var order []string // warm ids, least recently parked first, before the op
		ranks := 0
		measure(b, c, func(i int) {
			if i > 0 {
				release(b, eng, prev.SandboxID)
			}
			warm, err := store.WarmParkedBefore(ctx, time.Now().Add(time.Hour), pool+1)
			if err != nil {
				b.Fatal(err)
			}
			now := map[string]bool{}
			for _, r := range warm {
				now[r.SandboxID] = true
			}
			for r, id := range order {
				if !now[id] {
					ranks += r + 1
					break
				}
			}
			order = order[:0]
			for _, r := range warm {
				order = append(order, r.SandboxID)
			}
		}, func(i int) { prev = mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourceCreated) })
		if b.N > 1 {
			b.ReportMetric(float64(ranks)/float64(b.N-1), "evicted-rank")
		}
	})
	b.Run("quota-evict-then-create", func(b *testing.B) {
		// The user's quota of one slot held by its own warm sandbox, in a
		// deployment with room: each acquire of a new thread is refused
		// for the quota, evicts it and creates.
		eng, c, _, _ := benchEngine(b, func(s *core.Settings) { s.MaxPerUser = 1 })
		prev := mustAcquire(b, eng, key("t-first"), core.SourceCreated)
		measure(b, c, func(int) { release(b, eng, prev.SandboxID) },
			func(i int) { prev = mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourceCreated) })
	})
	b.Run("evict-then-create-wait-policy", func(b *testing.B) {
		// The same under the wait policy: one read of the wait queue
		// finds nobody waiting, so the reservation takes the slot over
		// as under reject.
		eng, c, _, _ := benchEngine(b, func(s *core.Settings) { s.Replicas, s.Policy = 1, core.PolicyWait })
		prev := mustAcquire(b, eng, key("t-first"), core.SourceCreated)
		measure(b, c, func(int) { release(b, eng, prev.SandboxID) },
			func(i int) { prev = mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourceCreated) })
	})
}

// contendedThreads is how many threads the contended benchmark's callers
// pick from (SBX_BENCH_THREADS): few threads measure same-thread lease
// waits, many measure slot contention and eviction.
var contendedThreads = func() int {
	if n, err := strconv.Atoi(os.Getenv("SBX_BENCH_THREADS")); err == nil && n > 0 {
		return n
	}
	return 64
}()

// BenchmarkAcquireContended: 64 concurrent callers, a limit of 8, each
// acquiring one of contendedThreads threads and releasing it; reports
// acquires/s and p50/p99 latency of successful acquires, and the refusal
// share.
func BenchmarkAcquireContended(b *testing.B) {
	eng, calls, _, _ := benchEngine(b, func(s *core.Settings) { s.Replicas = 8; s.Policy = core.PolicyReject })
	calls.n.Store(0)
	ctx := context.Background()
	var mu sync.Mutex
	var lat []time.Duration
	var refused atomic.Int64
	b.SetParallelism(max(1, 64/max(1, testingGOMAXPROCS())))
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
		for pb.Next() {
			k := key(fmt.Sprint("t", rng.IntN(contendedThreads)))
			t0 := time.Now()
			res, err := eng.Acquire(ctx, k)
			d := time.Since(t0)
			if err != nil {
				refused.Add(1)
				continue
			}
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
			_, _ = eng.Release(ctx, "acme", res.Record.SandboxID)
		}
	})
	elapsed := time.Since(start)
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "acquires/s")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(refused.Load())/float64(b.N), "refused/op")
	b.ReportMetric(float64(calls.n.Load())/float64(b.N), "ddb-calls/acquire+release")
}

// BenchmarkConditionalUpdateItem is the floor the acquire figures compare
// with: one conditional UpdateItem returning ALL_NEW on DynamoDB Local.
func BenchmarkConditionalUpdateItem(b *testing.B) {
	_, _, client, table := benchEngine(b, nil)
	ctx := context.Background()
	k := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "BENCH"}, "sk": &types.AttributeValueMemberS{Value: "R"}}
	b.ResetTimer()
	for range b.N {
		_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: k,
			UpdateExpression:          aws.String("ADD fence :one"),
			ConditionExpression:       aws.String("attribute_not_exists(fence) OR fence >= :zero"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}, ":zero": &types.AttributeValueMemberN{Value: "0"}},
			ReturnValues:              types.ReturnValueAllNew})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIdleReconcilePass reports the DynamoDB calls and capacity units
// of one reconcile pass over a deployment with no sandbox (what an idle
// deployment pays at every scheduled pass), at the default limit and at
// limits of 100 and 1,000 slots, whose state index has more keys.
func BenchmarkIdleReconcilePass(b *testing.B) {
	ctx := context.Background()
	for _, limit := range []int{core.DefaultSettings().Replicas, 100, 1000} {
		b.Run(fmt.Sprint("limit-", limit), func(b *testing.B) {
			eng, c, _, _ := benchEngine(b, func(s *core.Settings) { s.Replicas = limit })
			pass := func(int) {
				if _, err := eng.Reconcile(ctx); err != nil {
					b.Fatal(err)
				}
			}
			pass(0) // the first pass sets the ledgers' limits
			measure(b, c, nil, pass)
		})
	}
}
