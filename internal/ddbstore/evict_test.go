package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// opCounter counts a client's DynamoDB calls by operation (an
// Initialize-step middleware), and runs the hook set for an operation
// once, after its first call from then on returns.
type opCounter struct {
	mu    sync.Mutex
	ops   map[string]int
	after map[string]func()
}

func (c *opCounter) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("countOps",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			op := awsmiddleware.GetOperationName(ctx)
			if op != "" {
				c.mu.Lock()
				c.ops[op]++
				c.mu.Unlock()
			}
			out, md, err := next.HandleInitialize(ctx, in)
			c.mu.Lock()
			hook := c.after[op]
			delete(c.after, op)
			c.mu.Unlock()
			if hook != nil {
				hook()
			}
			return out, md, err
		}), middleware.After)
}

// counts returns the calls by operation since the last call, and resets.
func (c *opCounter) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.ops
	c.ops = map[string]int{}
	return out
}

// countedStore is a store over a fresh table whose calls c counts.
// racedStores returns two stores on one fresh table: s, whose calls are
// counted (with hooks run after them), and peer, which races it.
func racedStores(t *testing.T) (s, peer *ddbstore.Store, calls *opCounter) {
	t.Helper()
	base, table := newTable(t)
	calls = &opCounter{ops: map[string]int{}, after: map[string]func(){}}
	s = ddbstore.New(dynamodb.New(base.Options(), func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, calls.middleware) }),
		table, "test")
	return s, ddbstore.New(base, table, "test"), calls
}

func countedStore(t *testing.T) (*ddbstore.Store, *opCounter) {
	t.Helper()
	base, table := newTable(t)
	c := &opCounter{ops: map[string]int{}, after: map[string]func(){}}
	client := dynamodb.New(base.Options(), func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, c.middleware) })
	return ddbstore.New(client, table, "test"), c
}

// parkWarm makes n warm records, the i-th parked at t0 + i s, and returns
// their ids in park order.
func parkWarm(t *testing.T, s *ddbstore.Store, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("sbx%03d", i)
		rec := activeRecord(t, s, thread(i), id)
		parked := t0.Add(time.Duration(i) * time.Second)
		if _, err := s.Apply(ctx, core.Update{SandboxID: id, Fence: rec.Fence, State: core.StateWarm, Now: parked, ParkedAt: parked}); err != nil {
			t.Fatalf("Apply warm %s: %v", id, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// TestSample: a large warm pool is sampled in one index query per sampled
// shard, and the answer is exactly the least recently parked records of the
// shards it drew from, oldest first; a small pool (fewer than four entries in the
// sampled shards) is read whole and answered in the pool's exact order,
// so a lone warm record is always found.
func TestSample(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		warm  int
		exact bool // the answer is the whole pool's order
	}{
		{"empty", 0, true},
		{"one", 1, true},
		{"three", 3, true},
		{"large", 96, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const limit = 10
			s, calls := countedStore(t)
			ids := parkWarm(t, s, tc.warm)
			for range 5 {
				calls.counts()
				got, err := s.Sample(context.Background(), core.StateWarm, limit)
				if err != nil {
					t.Fatalf("Sample: %v", err)
				}
				var gotIDs []string
				shards := map[int]bool{}
				for _, r := range got {
					gotIDs = append(gotIDs, r.SandboxID)
					shards[ddbstore.ShardOf(r.SandboxID, ddbstore.IndexShards)] = true
				}
				queries := calls.counts()["Query"]
				if tc.exact {
					if want := ids[:min(len(ids), limit)]; !slices.Equal(gotIDs, want) && len(want)+len(gotIDs) > 0 {
						t.Errorf("Sample = %v, want the pool's order %v", gotIDs, want)
					}
					if want := ddbstore.IndexShards; queries != want {
						t.Errorf("queries = %d, want %d (every shard)", queries, want)
					}
					continue
				}
				// The oldest of the shards drawn from, in park order.
				var want []string
				for _, id := range ids {
					if shards[ddbstore.ShardOf(id, ddbstore.IndexShards)] && len(want) < limit {
						want = append(want, id)
					}
				}
				if !slices.Equal(gotIDs, want) {
					t.Errorf("Sample = %v, want the least recently parked of its shards %v", gotIDs, want)
				}
				if want := ddbstore.SampleShards; len(shards) > want || queries != want {
					t.Errorf("Sample drew from %d shards in %d queries, want at most %d shards in %d queries", len(shards), queries, want, want)
				}
			}
		})
	}
}

// TestReserveReadsTheBucketsOnce: a reservation whose home bucket is full
// reads every bucket once and tries the one the read shows with room;
// when a peer took that slot in between, it is refused for capacity
// without reading the buckets again.
func TestReserveReadsTheBucketsOnce(t *testing.T) {
	t.Parallel()
	const limit = 8 // eight buckets of one slot
	s, peer, calls := racedStores(t)
	ctx := context.Background()
	reserve := func(st *ddbstore.Store, token string, k core.ThreadKey) error {
		return st.Reserve(ctx, core.Reservation{Token: token, ThreadKey: k, Limit: limit, Now: t0, ExpiresAt: t0.Add(time.Minute)})
	}
	open := map[int]bool{}
	for b := range limit {
		open[b] = true
	}
	for i := 0; len(open) > 1; i++ {
		if b := ddbstore.ThreadHome(thread(i), limit); open[b] {
			if err := reserve(peer, fmt.Sprintf("res-%d", i), thread(i)); err != nil {
				t.Fatalf("fill: Reserve for %v: %v", thread(i), err)
			}
			delete(open, b)
		}
	}
	var last int
	for b := range open {
		last = b
	}
	var key, peerKey core.ThreadKey
	for i := 100; key == (core.ThreadKey{}) || peerKey == (core.ThreadKey{}); i++ {
		switch home := ddbstore.ThreadHome(thread(i), limit); {
		case home != last && key == (core.ThreadKey{}):
			key = thread(i)
		case home == last && peerKey == (core.ThreadKey{}):
			peerKey = thread(i)
		}
	}
	calls.counts()
	calls.after["BatchGetItem"] = func() {
		if err := reserve(peer, "res-peer", peerKey); err != nil {
			t.Errorf("the peer's Reserve in bucket %d: %v", last, err)
		}
	}
	err := reserve(s, "res-new", key)
	var ce *core.CapacityError
	if !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
		t.Fatalf("Reserve = %v, want a capacity refusal (the one open bucket taken by the peer)", err)
	}
	if ce.Status.Used != limit {
		t.Errorf("refusal's used = %d, want %d: the slot the peer took since the read counted (its take found the bucket full)",
			ce.Status.Used, limit)
	}
	if got, want := calls.counts(), map[string]int{"TransactWriteItems": 2, "BatchGetItem": 1}; !maps.Equal(got, want) {
		t.Errorf("Reserve made %v, want %v: its home bucket, one read of the buckets, a take in the one it showed open (refused)", got, want)
	}
}

// TestATakeRetriesItsLostRacesInTheStore: a reservation whose home is
// full reads the buckets once and tries the emptiest the read shows with
// room; when peers took that slot meanwhile, it tries the next, and is
// refused for capacity only when every bucket the read showed open was
// taken, without reading the buckets again.
func TestATakeRetriesItsLostRacesInTheStore(t *testing.T) {
	t.Parallel()
	const limit = 8 // eight buckets of one slot
	const openA, openB, full = 0, 4, 2
	for _, tc := range []struct {
		name  string
		taken []int // the open buckets peers take after the read
		ok    bool
		txns  int
	}{
		{"one taken", []int{openA}, true, 0}, // 2 or 3: which open bucket it tries first is random
		{"both taken", []int{openA, openB}, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, peer, calls := racedStores(t)
			ctx := context.Background()
			reserve := func(st *ddbstore.Store, token string, k core.ThreadKey) error {
				return st.Reserve(ctx, core.Reservation{Token: token, ThreadKey: k, Limit: limit, Now: t0, ExpiresAt: t0.Add(time.Minute)})
			}
			for b := range limit {
				if b != openA && b != openB {
					if err := reserve(peer, fmt.Sprint("res-", b), threadIn(t, "filler", b, limit)); err != nil {
						t.Fatalf("fill bucket %d: %v", b, err)
					}
				}
			}
			calls.counts()
			raced := false
			calls.after["BatchGetItem"] = func() { // the take's read of the buckets: peers take open slots
				if raced {
					return
				}
				raced = true
				for _, b := range tc.taken {
					if err := reserve(peer, fmt.Sprint("res-peer-", b), threadIn(t, "peer", b, limit)); err != nil {
						t.Errorf("the peer's Reserve in bucket %d: %v", b, err)
					}
				}
			}
			err := reserve(s, "res-new", threadIn(t, "u1", full, limit))
			got := calls.counts()
			if tc.ok {
				if err != nil {
					t.Fatalf("Reserve = %v, want the slot left open", err)
				}
				if got["BatchGetItem"] != 1 || got["TransactWriteItems"] < 2 || got["TransactWriteItems"] > 3 {
					t.Errorf("Reserve made %v, want one read of the buckets and 2 or 3 transactions", got)
				}
				return
			}
			var ce *core.CapacityError
			if !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
				t.Fatalf("Reserve = %v, want a capacity refusal (both open slots taken by peers)", err)
			}
			if ce.Status.Used != limit {
				t.Errorf("refusal's used = %d, want %d: the slots peers took since the read counted", ce.Status.Used, limit)
			}
			if want := map[string]int{"BatchGetItem": 1, "TransactWriteItems": tc.txns}; !maps.Equal(got, want) {
				t.Errorf("Reserve made %v, want %v: its home, one read, a take in each bucket the read showed open", got, want)
			}
		})
	}
}

// TestATakeWhoseHomeIsFullTakesFromTheRead: a reservation whose home
// bucket is full reads every bucket once and takes the slot the read
// shows.
func TestATakeWhoseHomeIsFullTakesFromTheRead(t *testing.T) {
	t.Parallel()
	const limit = 8 // eight buckets of one slot
	s, calls := countedStore(t)
	ctx := context.Background()
	reserve := func(token string, k core.ThreadKey) error {
		return s.Reserve(ctx, core.Reservation{Token: token, ThreadKey: k, Limit: limit, Now: t0, ExpiresAt: t0.Add(time.Minute)})
	}
	// Every bucket but one full.
	const open, full = 0, 1
	for b := range limit {
		if b != open {
			if err := reserve(fmt.Sprint("res-", b), threadIn(t, "filler", b, limit)); err != nil {
				t.Fatalf("fill bucket %d: %v", b, err)
			}
		}
	}
	calls.counts()
	if err := reserve("res-new", threadIn(t, "u1", full, limit)); err != nil {
		t.Fatalf("Reserve with its home full: %v", err)
	}
	if got, want := calls.counts(), map[string]int{"BatchGetItem": 1, "TransactWriteItems": 2}; !maps.Equal(got, want) {
		t.Errorf("Reserve made %v, want %v: its home's take (refused), one read of the buckets, one take in the open one", got, want)
	}
	st, err := s.Capacity(ctx)
	if err != nil {
		t.Fatalf("Capacity: %v", err)
	}
	if st.Used != limit {
		t.Errorf("used = %d, want %d: every bucket full", st.Used, limit)
	}
}

// threadIn returns a thread of user whose home bucket under limit is b.
func threadIn(t *testing.T, user string, b, limit int) core.ThreadKey {
	t.Helper()
	for i := range 100000 {
		if k := (core.ThreadKey{Tenant: "acme", User: user, Thread: fmt.Sprint("t", i)}); ddbstore.ThreadHome(k, limit) == b {
			return k
		}
	}
	t.Fatalf("no thread has home bucket %d", b)
	return core.ThreadKey{}
}
