package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// costEngine builds an engine of deployment "test" with limit slots (reject
// policy) on a fresh table, its DynamoDB calls through mw and its store
// wrapped by wrap (when not nil).
func costEngine(t *testing.T, table string, limit int, mw func(*middleware.Stack) error, wrap func(core.Store) core.Store) (*core.Engine, *coretest.FakeProvider, *clock) {
	t.Helper()
	client := dynamodb.New(testenv.DynamoClient(t).Options(), func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, mw) })
	table = freshTable(t, client, table)
	s := core.DefaultSettings()
	s.Deployment, s.Replicas, s.Policy = "test", limit, core.PolicyReject
	var store core.Store = ddbstore.New(client, table, s.Deployment)
	if wrap != nil {
		store = wrap(store)
	}
	clk := &clock{}
	prov := coretest.NewFakeProvider()
	eng, err := core.New(s, store, prov, &fakeSyncer{}, core.WithClock(clk.now), core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return eng, prov, clk
}

// reserveSpy records the reservations made through a real store.
type reserveSpy struct {
	core.Store
	mu   sync.Mutex
	seen []core.Reservation
}

func (s *reserveSpy) Reserve(ctx context.Context, r core.Reservation) error {
	s.mu.Lock()
	s.seen = append(s.seen, r)
	s.mu.Unlock()
	return s.Store.Reserve(ctx, r)
}

// An acquire that evicts reads the warm pool's candidates once (no scan of
// every index shard of two states for dead sandboxes: that check runs only
// when nothing may be evicted), and reserves twice: refused, then after
// the eviction.
func TestEvictionSkipsTheDeadSlotScan(t *testing.T) {
	const limit = 16
	counter := &callCounter{}
	var store *reserveSpy
	eng, prov, clk := costEngine(t, "evictcost", limit, counter.middleware, func(s core.Store) core.Store {
		store = &reserveSpy{Store: s}
		return store
	})
	ctx := context.Background()
	parked := map[string]core.Record{}
	for i := range limit {
		res, err := eng.Acquire(ctx, key(fmt.Sprint("w", i)))
		if err != nil {
			t.Fatalf("Acquire w%d: %v", i, err)
		}
		if _, err := eng.Release(ctx, "acme", res.Record.SandboxID); err != nil {
			t.Fatalf("Release w%d: %v", i, err)
		}
		parked[res.Record.SandboxID] = res.Record
		clk.advance(time.Second)
	}
	counter.reset()
	store.mu.Lock()
	store.seen = nil
	store.mu.Unlock()
	if _, err := eng.Acquire(ctx, key("new")); err != nil {
		t.Fatalf("Acquire of a new thread in a full deployment: %v", err)
	}
	queries := 0
	for _, op := range counter.opNames() {
		if op == "Query" {
			queries++
		}
	}
	if queries > ddbstore.IndexShards {
		t.Errorf("the evicting acquire made %d index queries, want at most %d (one read of the warm pool)", queries, ddbstore.IndexShards)
	}
	var evicted []string
	for id := range parked {
		if !prov.Alive(id) {
			evicted = append(evicted, id)
		}
	}
	if len(evicted) != 1 {
		t.Fatalf("evicted %v, want one warm sandbox", evicted)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if n := len(store.seen); n != 2 {
		t.Fatalf("reservations = %d, want 2 (refused, then after the eviction)", n)
	}
}

// A tenant at its fair share evicts only its own warm sandboxes from a
// large pool too: when the sampled quarter of the pool holds none of its
// own, the pool's exact order is read, and another tenant's older warm
// sandboxes are never taken.
func TestSampledEvictionKeepsTheFairShareRule(t *testing.T) {
	const limit = 40 // two tenants: a fair share of 20
	h := newHarness(t, func(s *core.Settings) { s.Replicas = limit; s.Policy = core.PolicyReject })
	ctx := context.Background()
	park := func(rec core.Record) {
		t.Helper()
		if _, err := h.eng.Release(ctx, rec.Tenant, rec.SandboxID); err != nil {
			t.Fatalf("Release %s: %v", rec.SandboxID, err)
		}
		h.clock.advance(time.Second)
	}
	var others []core.Record
	for i := range 20 { // parked first: the least recently parked of the pool
		rec := h.acquire(t, tenantKey("other", fmt.Sprint("o", i)), core.SourceCreated)
		park(rec)
		others = append(others, rec)
	}
	var hogWarm []core.Record
	for i := range 20 { // 20 slots, at its fair share
		rec := h.acquire(t, tenantKey("hog", fmt.Sprint("h", i)), core.SourceCreated)
		if i >= 17 {
			park(rec)
			hogWarm = append(hogWarm, rec)
		}
	}
	// Full. Each acquire of hog evicts one of its own warm sandboxes.
	for i := range hogWarm {
		h.acquire(t, tenantKey("hog", fmt.Sprint("new", i)), core.SourceCreated)
	}
	for _, rec := range hogWarm {
		if h.prov.Alive(rec.SandboxID) {
			t.Errorf("hog's warm %s was not evicted", rec.SandboxID)
		}
	}
	for _, rec := range others {
		if !h.prov.Alive(rec.SandboxID) {
			t.Errorf("hog, at its fair share, evicted other's warm %s", rec.SandboxID)
		}
	}
	var ce *core.CapacityError
	if _, err := h.eng.Acquire(ctx, tenantKey("hog", "one-more")); !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
		t.Errorf("hog's next acquire = %v, want a capacity refusal (only another tenant's warm sandboxes are left)", err)
	}
}

// activeReads counts the active state's index entries that Query calls
// return.
type activeReads struct{ n atomic.Int64 }

func (a *activeReads) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("countActiveReads",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			out, md, err := next.HandleInitialize(ctx, in)
			q, isQuery := in.Parameters.(*dynamodb.QueryInput)
			res, ok := out.Result.(*dynamodb.QueryOutput)
			if err != nil || !isQuery || !ok || aws.ToString(q.IndexName) != ddbstore.IndexGSI1 {
				return out, md, err
			}
			for _, v := range q.ExpressionAttributeValues {
				if s, ok := v.(*types.AttributeValueMemberS); ok && strings.Contains(s.Value+"#", "#"+string(core.StateActive)+"#") {
					a.n.Add(int64(len(res.Items)))
				}
			}
			return out, md, err
		}), middleware.After)
}

// A refusal with nothing to evict looks for sandboxes past their end among
// a bounded sample of the active records, not the whole active index, so
// what it reads does not grow with the fleet.
func TestDeadSlotCheckReadsASampleOfTheActive(t *testing.T) {
	t.Parallel()
	const limit = 200
	reads := &activeReads{}
	eng, _, _ := costEngine(t, "deadsample", limit, reads.middleware, nil)
	ctx := context.Background()
	for i := range limit {
		if _, err := eng.Acquire(ctx, key(fmt.Sprint("a", i))); err != nil {
			t.Fatalf("Acquire a%d: %v", i, err)
		}
	}
	reads.n.Store(0)
	var ce *core.CapacityError
	if _, err := eng.Acquire(ctx, key("new")); !errors.As(err, &ce) {
		t.Fatalf("Acquire in a deployment full of sandboxes in use = %v, want a capacity refusal", err)
	}
	if got := reads.n.Load(); got == 0 || got > limit/2 {
		t.Errorf("the refusal read %d active index entries, want some and at most %d of the %d (a sample)", got, limit/2, limit)
	}
}
