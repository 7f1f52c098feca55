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

	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/pkg/ddbstore"
)

// callCounter counts DynamoDB operations (logical calls, not SDK retries)
// through an Initialize-step middleware.
type callCounter struct{ n atomic.Int64 }

func (c *callCounter) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("countCalls",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if awsmiddleware.GetOperationName(ctx) != "" {
				c.n.Add(1)
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
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
	eng, err := core.New(s, ddbstore.New(client, table, s.Deployment), prov, &fakeSyncer{},
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

// BenchmarkAcquireDynamoDBCalls reports DynamoDB calls per acquire path
// and per release (metric "ddb-calls/op"), against DynamoDB Local.
func BenchmarkAcquireDynamoDBCalls(b *testing.B) {
	ctx := context.Background()
	b.Run("reuse", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil)
		mustAcquire(b, eng, key("t"), core.SourceCreated)
		c.n.Store(0)
		b.ResetTimer()
		for range b.N {
			mustAcquire(b, eng, key("t"), core.SourceReused)
		}
		b.ReportMetric(float64(c.n.Load())/float64(b.N), "ddb-calls/op")
	})
	b.Run("reclaim", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil)
		rec := mustAcquire(b, eng, key("t"), core.SourceCreated)
		var calls int64
		b.ResetTimer()
		for range b.N {
			if _, err := eng.Release(ctx, "acme", rec.SandboxID); err != nil {
				b.Fatal(err)
			}
			c.n.Store(0)
			mustAcquire(b, eng, key("t"), core.SourceReclaimed)
			calls += c.n.Load()
		}
		b.ReportMetric(float64(calls)/float64(b.N), "ddb-calls/op")
	})
	b.Run("resume", func(b *testing.B) {
		prov := coretest.NewFakeProvider()
		prov.Pausable = true
		eng, c, _, _ := benchEngineWith(b, prov, func(s *core.Settings) { s.PauseAfter = 0 })
		rec := mustAcquire(b, eng, key("t"), core.SourceCreated)
		var calls int64
		b.ResetTimer()
		for range b.N {
			if res, err := eng.Release(ctx, "acme", rec.SandboxID); err != nil || res.State != "paused" {
				b.Fatalf("Release = %+v, %v; want paused", res, err)
			}
			c.n.Store(0)
			mustAcquire(b, eng, key("t"), core.SourceResumed)
			calls += c.n.Load()
		}
		b.ReportMetric(float64(calls)/float64(b.N), "ddb-calls/op")
	})
	b.Run("release", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil)
		rec := mustAcquire(b, eng, key("t"), core.SourceCreated)
		var calls int64
		b.ResetTimer()
		for range b.N {
			c.n.Store(0)
			if _, err := eng.Release(ctx, "acme", rec.SandboxID); err != nil {
				b.Fatal(err)
			}
			calls += c.n.Load()
			mustAcquire(b, eng, key("t"), core.SourceReclaimed)
		}
		b.ReportMetric(float64(calls)/float64(b.N), "ddb-calls/op")
	})
	b.Run("create", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil)
		c.n.Store(0)
		b.ResetTimer()
		for i := range b.N {
			mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourceCreated)
		}
		b.ReportMetric(float64(c.n.Load())/float64(b.N), "ddb-calls/op")
	})
	b.Run("pool-claim", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, nil, core.WithPool(core.PoolSettings{Size: 1, MaxAge: time.Hour}))
		var calls int64
		b.ResetTimer()
		for i := range b.N {
			if st, err := eng.RefillPool(ctx); err != nil || st.Created != 1 {
				b.Fatalf("RefillPool = %+v, %v", st, err)
			}
			c.n.Store(0)
			mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourcePool)
			calls += c.n.Load()
		}
		b.ReportMetric(float64(calls)/float64(b.N), "ddb-calls/op")
	})
	b.Run("evict-then-create", func(b *testing.B) {
		eng, c, _, _ := benchEngine(b, func(s *core.Settings) { s.Replicas = 1 })
		prev := mustAcquire(b, eng, key("t-first"), core.SourceCreated)
		var calls int64
		b.ResetTimer()
		for i := range b.N {
			if _, err := eng.Release(ctx, "acme", prev.SandboxID); err != nil {
				b.Fatal(err)
			}
			c.n.Store(0)
			prev = mustAcquire(b, eng, key(fmt.Sprint("t", i)), core.SourceCreated)
			calls += c.n.Load()
		}
		b.ReportMetric(float64(calls)/float64(b.N), "ddb-calls/op")
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
