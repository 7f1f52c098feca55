package core_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"regexp"
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

	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/pkg/ddbstore"
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
// state index, "gsi1pk=...", or of the owner index, "gsi2pk=..."), the write and read units the broker's calls
// would consume for items under 1 KB (writes) and 4 KB (reads), through an
// Initialize-step middleware (one record per logical call; writeTxn's
// retries of a cancelled transaction are calls of their own).
type keyLoad struct {
	mu    sync.Mutex
	write map[string]float64
	read  map[string]float64
}

func newKeyLoad() *keyLoad {
	return &keyLoad{write: map[string]float64{}, read: map[string]float64{}}
}

func (l *keyLoad) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("recordKeys",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			l.record(in.Parameters)
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
}

func (l *keyLoad) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.write)
	clear(l.read)
}

func pkOf(key map[string]types.AttributeValue) string {
	if pk, ok := key[ddbstore.AttrPK].(*types.AttributeValueMemberS); ok {
		return "pk=" + pk.Value
	}
	return "pk=?"
}

// setClause finds "#name = :value" pairs of an update expression.
var setClause = regexp.MustCompile(`(#\w+)\s*=\s*(:\w+)`)

// indexKeys are the index partition keys an update or put writes: its
// gsi1pk (the state index) and gsi2pk (the owner index), each as
// "<attribute>=<value>".
func indexKeys(expr *string, names map[string]string, values map[string]types.AttributeValue, item map[string]types.AttributeValue) []string {
	var keys []string
	for _, attr := range []string{ddbstore.AttrGSI1PK, ddbstore.AttrGSI2PK} {
		if v, ok := item[attr].(*types.AttributeValueMemberS); ok {
			keys = append(keys, attr+"="+v.Value)
		}
		if expr == nil {
			continue
		}
		for _, m := range setClause.FindAllStringSubmatch(*expr, -1) {
			if names[m[1]] == attr {
				if v, ok := values[m[2]].(*types.AttributeValueMemberS); ok {
					keys = append(keys, attr+"="+v.Value)
				}
			}
		}
	}
	return keys
}

func (l *keyLoad) record(params any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := func(units float64, key string, gsis []string) {
		l.write[key] += units
		for _, gsi := range gsis {
			l.write[gsi]++ // an index write is a plain write of the index entry
		}
	}
	switch in := params.(type) {
	case *dynamodb.UpdateItemInput:
		w(1, pkOf(in.Key), indexKeys(in.UpdateExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, nil))
	case *dynamodb.PutItemInput:
		w(1, pkOf(in.Item), indexKeys(nil, nil, nil, in.Item))
	case *dynamodb.DeleteItemInput:
		w(1, pkOf(in.Key), nil)
	case *dynamodb.TransactWriteItemsInput:
		for _, it := range in.TransactItems {
			switch {
			case it.Update != nil:
				w(txnWriteFactor, pkOf(it.Update.Key), indexKeys(it.Update.UpdateExpression, it.Update.ExpressionAttributeNames, it.Update.ExpressionAttributeValues, nil))
			case it.Put != nil:
				w(txnWriteFactor, pkOf(it.Put.Item), indexKeys(nil, nil, nil, it.Put.Item))
			case it.Delete != nil:
				w(txnWriteFactor, pkOf(it.Delete.Key), nil)
			case it.ConditionCheck != nil:
				w(txnWriteFactor, pkOf(it.ConditionCheck.Key), nil)
			}
		}
	case *dynamodb.GetItemInput:
		l.read[pkOf(in.Key)] += readUnits(in.ConsistentRead)
	case *dynamodb.BatchGetItemInput:
		for _, ka := range in.RequestItems {
			for _, k := range ka.Keys {
				l.read[pkOf(k)] += readUnits(ka.ConsistentRead)
			}
		}
	case *dynamodb.QueryInput:
		// The partition key is the one equality of the key condition
		// naming a partition key attribute (a sort key condition may
		// name a string too).
		for _, m := range setClause.FindAllStringSubmatch(aws.ToString(in.KeyConditionExpression), -1) {
			attr := in.ExpressionAttributeNames[m[1]]
			v, ok := in.ExpressionAttributeValues[m[2]].(*types.AttributeValueMemberS)
			if !ok || (attr != ddbstore.AttrPK && attr != ddbstore.AttrGSI1PK && attr != ddbstore.AttrGSI2PK) {
				continue
			}
			if in.IndexName != nil { // index reads are eventually consistent
				l.read[attr+"="+v.Value] += readUnits(nil)
			} else {
				l.read[attr+"="+v.Value] += readUnits(in.ConsistentRead)
			}
		}
	}
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

// BenchmarkHotKeys drives a mixed load through the real store on DynamoDB
// Local: 16 tenants' threads acquire (reuse, reclaim, create, with
// evictions), release, are refused (a full deployment, a tenant quota)
// and wait (a quarter of the callers use the wait policy), 32 callers at
// once on a limit of 256 slots. It records every call's partition keys
// and reports the hottest write key's share of all write units, and, from
// the hottest write and read keys' units per acquire and DynamoDB's
// documented per-partition limits (1,000 write units/s, 3,000 read
// units/s, transactional writes at twice the units), the acquires per
// second one deployment can sustain before its hottest partition
// throttles. Two loads:
//
//   - steady: the deployment starts full of warm sandboxes; each tenant's
//     agents mostly come back to their 8 busy threads (reuse, reclaim),
//     and one acquire in eight picks any of the tenant's threads (a
//     create, evicting the least recently parked warm sandbox, when the
//     thread has none);
//   - saturated: every acquire picks any of 288 threads for 256 slots
//     (creates and evictions throughout, refusals when every slot is
//     held), and a hog tenant runs past its quota of 24.
func BenchmarkHotKeys(b *testing.B) {
	b.Run("steady", func(b *testing.B) { hotKeys(b, false) })
	b.Run("saturated", func(b *testing.B) { hotKeys(b, true) })
}

func hotKeys(b *testing.B, saturated bool) {
	base := testenv.DynamoClient(b)
	load := newKeyLoad()
	client := dynamodb.New(base.Options(), func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, load.middleware) })
	table := freshTable(b, client, "hotkeys")
	store := ddbstore.New(client, table, "hot")
	prov := coretest.NewFakeProvider() // one provider: sandbox ids are unique
	engine := func(policy core.OverflowPolicy) *core.Engine {
		s := core.DefaultSettings()
		s.Deployment, s.Replicas, s.Policy, s.MaxPerTenant = "hot", 256, policy, 24
		s.AcquireTimeout, s.MaxWaitersPerTenant = 300*time.Millisecond, 2
		eng, err := core.New(s, store, prov, &fakeSyncer{}, core.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			b.Fatal(err)
		}
		return eng
	}
	rejecting, waiting := engine(core.PolicyReject), engine(core.PolicyWait)
	// Fifteen tenants with 16 threads each and a hog with 48 (past its
	// quota of 24: refused tenant_quota): 288 threads for 256 slots.
	const tenants, threadsPerTenant, hogThreads = 16, 16, 48
	pick := func(rng *rand.Rand) core.ThreadKey {
		n := rng.IntN(tenants)
		tenant, threads := fmt.Sprint("tenant", n), threadsPerTenant
		if n == 0 {
			tenant, threads = "hog", hogThreads
		}
		thread := rng.IntN(threads)
		if !saturated && rng.IntN(8) != 0 {
			thread = rng.IntN(8) // a busy thread
		}
		return core.ThreadKey{Tenant: tenant, User: fmt.Sprint("u", thread%3), Thread: fmt.Sprint("t", thread)}
	}
	ctx := context.Background()
	if !saturated {
		// Full of warm sandboxes, as a busy deployment is.
		for n := range 256 {
			k := core.ThreadKey{Tenant: fmt.Sprint("tenant", 1+n%(tenants-1)), User: "old", Thread: fmt.Sprint("o", n)}
			res, err := rejecting.Acquire(ctx, k)
			if err != nil {
				b.Fatalf("fill: %v", err)
			}
			if _, err := rejecting.Release(ctx, k.Tenant, res.Record.SandboxID); err != nil {
				b.Fatalf("fill: %v", err)
			}
		}
	}
	var acquires, refused atomic.Int64
	var mu sync.Mutex
	sources := map[core.Source]int{}
	refusals := map[string]int{}
	load.reset()
	b.SetParallelism(max(1, 32/max(1, testingGOMAXPROCS())))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
		for pb.Next() {
			eng := rejecting
			if rng.IntN(4) == 0 {
				eng = waiting
			}
			k := pick(rng)
			res, err := eng.Acquire(ctx, k)
			if err != nil {
				refused.Add(1)
				reason := "error"
				var ce *core.CapacityError
				if errors.As(err, &ce) {
					reason = string(ce.Reason)
				}
				mu.Lock()
				refusals[reason]++
				mu.Unlock()
				continue
			}
			acquires.Add(1)
			reused := false
			if rng.IntN(3) == 0 { // a second turn before release: a reuse
				if _, err := eng.Acquire(ctx, k); err == nil {
					reused = true
					acquires.Add(1)
				}
			}
			mu.Lock()
			sources[res.Source]++
			if reused {
				sources[core.SourceReused]++
			}
			mu.Unlock()
			_, _ = eng.Release(ctx, k.Tenant, res.Record.SandboxID)
		}
	})
	b.StopTimer()
	a := float64(acquires.Load())
	if a == 0 {
		b.Fatal("no acquire succeeded")
	}
	load.mu.Lock()
	defer load.mu.Unlock()
	wKey, wTop, wTotal := hottest(load.write)
	rKey, rTop, _ := hottest(load.read)
	predicted := min(partitionWriteUnits*a/wTop, partitionReadUnits*a/max(rTop, 1))
	b.ReportMetric(wTop/wTotal, "hottest-write-share")
	b.ReportMetric(predicted, "predicted-acquires/s")
	b.ReportMetric(float64(refused.Load())/float64(b.N), "refused/op")
	top := slices.SortedFunc(maps.Keys(load.write), func(x, y string) int { return cmp.Compare(load.write[y], load.write[x]) })
	for i, k := range top[:min(6, len(top))] {
		b.Logf("write #%d %-40s %6.0f units (%.1f%%, %.2f per acquire)", i+1, k, load.write[k], 100*load.write[k]/wTotal, load.write[k]/a)
	}
	byKind := map[string]float64{}
	for k, u := range load.write {
		kind, _, _ := strings.Cut(k, "#")
		byKind[kind] += u / a
	}
	b.Logf("write units per acquire by key kind: %v", byKind)
	b.Logf("hottest read %s: %.2f units per acquire; acquires %d (sources %v), refused %d (%v); hottest write %s %.2f units per acquire; %.1f write units per acquire in all",
		rKey, rTop/a, acquires.Load(), sources, refused.Load(), refusals, wKey, wTop/a, wTotal/a)
}
