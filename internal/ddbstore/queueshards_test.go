package ddbstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// queuePartitions counts the stored tickets by partition key.
func (f *queueFixture) queuePartitions() map[string]int {
	f.t.Helper()
	out, err := f.client.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(f.table), ConsistentRead: aws.Bool(true),
		FilterExpression:          aws.String("begins_with(pk, :wq)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":wq": &types.AttributeValueMemberS{Value: "WQ#test"}}})
	if err != nil {
		f.t.Fatal(err)
	}
	pks := map[string]int{}
	for _, it := range out.Items {
		pks[it["pk"].(*types.AttributeValueMemberS).Value]++
	}
	return pks
}

// idsInShard returns n ticket ids with prefix that hash to shard (in
// shard mode), or to any other shard.
func idsInShard(prefix string, n, shard int, in bool) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprintf("%s%03d", prefix, i)
		if (ddbstore.QueueShardOf(id) == shard) == in {
			out = append(out, id)
		}
	}
	return out
}

// TestShardedQueueServesInFairOrder: tickets spread over the queue's
// shards (and many of the first ones in one shard, so that the merge reads
// further pages of it) are granted one freed slot at a time in exactly
// their (round, arrival) order, by frees' short eventually consistent
// reads and by full ones alike.
func TestShardedQueueServesInFairOrder(t *testing.T) {
	t.Parallel()
	crowded := idsInShard("c", 14, 3, true)
	others := idsInShard("o", 14, 3, false)
	tests := []struct {
		name string
		// order is the ticket ids in arrival order.
		order []string
		scan  bool
	}{
		{name: "crowded shard first, free dispatch", order: append(slices.Clone(crowded), others...)},
		{name: "interleaved, free dispatch", order: interleave(crowded, others)},
		{name: "crowded shard first, scan dispatch", order: append(slices.Clone(crowded), others...), scan: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newQueueFixture(t, 1)
			recs := f.fill(1)
			held := map[string]core.Ticket{}
			for i, id := range tc.order {
				held[id] = f.enter("tenant-"+id, id, t0.Add(time.Duration(i)*time.Millisecond))
			}
			pks := f.queuePartitions()
			if len(pks) < ddbstore.QueueShards/2 || pks["WQ#test"] != 0 {
				t.Fatalf("tickets by partition %v: want them over the shards, none in WQ#test", pks)
			}
			now := t0.Add(10 * time.Second)
			bucket := f.free(recs[0])
			var got []string
			for range tc.order {
				d := core.Dispatch{Now: now, Freed: bucket}
				if tc.scan {
					d = core.Dispatch{Now: now, Freed: core.NoSlotRef, Scan: true}
				}
				res := f.dispatch(d)
				if len(res.Granted) != 1 {
					t.Fatalf("after %v: granted %v, want one", got, ids(res.Granted))
				}
				got = append(got, res.Granted[0].ID)
				bucket = f.takeAndFree(held[res.Granted[0].ID], now)
			}
			if !slices.Equal(got, tc.order) {
				t.Errorf("service order\n got %v\nwant %v", got, tc.order)
			}
			if pks := f.queuePartitions(); len(pks) != 0 {
				t.Errorf("tickets left %v, want none", pks)
			}
		})
	}
}

func interleave(a, b []string) []string {
	var out []string
	for i := range max(len(a), len(b)) {
		if i < len(a) {
			out = append(out, a[i])
		}
		if i < len(b) {
			out = append(out, b[i])
		}
	}
	return out
}

// TestWaiterTurnReadsItsShardFirst: a waiter's turn that finds a live
// ticket ahead of its own in its shard stops there (removing the lapsed
// tickets it passed, leaving other shards unread); a waiter first in its
// shard reads the whole head, and the queue's head reads the buckets.
func TestWaiterTurnReadsItsShardFirst(t *testing.T) {
	t.Parallel()
	same := idsInShard("s", 3, 5, true) // lapsed, ahead, behind: all in shard 5
	other := idsInShard("o", 2, 5, false)
	f := newQueueFixture(t, 1)
	f.fill(1)
	enter := func(id string, at, until time.Time) core.Ticket {
		tk, err := f.s.EnterWait(context.Background(), core.Waiter{Tenant: "tenant-" + id, Ticket: id, Max: 10, Now: at, Until: until})
		if err != nil {
			t.Fatalf("EnterWait %s: %v", id, err)
		}
		return tk
	}
	lapsedOther := enter(other[0], t0, t0.Add(time.Second))
	lapsedSame := enter(same[0], t0.Add(time.Millisecond), t0.Add(time.Second))
	head := enter(other[1], t0.Add(2*time.Millisecond), t0.Add(time.Minute))
	ahead := enter(same[1], t0.Add(3*time.Millisecond), t0.Add(time.Minute))
	behind := enter(same[2], t0.Add(4*time.Millisecond), t0.Add(time.Minute))
	now := t0.Add(2 * time.Second)

	turn := func(self core.Ticket) core.DispatchResult {
		return f.dispatch(core.Dispatch{Now: now, Freed: core.NoSlotRef, Self: self.ID})
	}
	res := turn(behind)
	if res.Head != ahead.ID || res.Read || res.Cleaned != 1 || len(res.Granted) != 0 {
		t.Errorf("behind's turn: head %q read %v cleaned %d granted %v; want %q, no buckets read, 1 cleaned (its shard's), none",
			res.Head, res.Read, res.Cleaned, ids(res.Granted), ahead.ID)
	}
	if ts := f.poll(lapsedSame); !ts.Gone {
		t.Errorf("the lapsed ticket in behind's shard = %+v, want removed", ts)
	}
	if ts := f.poll(lapsedOther); ts.Gone {
		t.Errorf("the lapsed ticket in another shard was removed by a turn that should have read one shard")
	}
	res = turn(ahead)
	if res.Head != head.ID || res.Read || res.Cleaned != 1 {
		t.Errorf("ahead's turn: head %q read %v cleaned %d; want %q (the whole head read), no buckets read, 1 cleaned",
			res.Head, res.Read, res.Cleaned, head.ID)
	}
	res = turn(head)
	if res.Head != head.ID || !res.Read || res.Status.Used != 1 {
		t.Errorf("the head's turn: head %q read %v used %d; want itself, the buckets read, 1 used", res.Head, res.Read, res.Status.Used)
	}
}

// staleReads makes every eventually consistent GetItem find nothing, as a
// read that missed a just-written item does in AWS (DynamoDB Local's
// reads are always current), and counts the GetItems by consistency.
type staleReads struct {
	mu                 sync.Mutex
	eventual, strongly int
}

func (r *staleReads) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("staleReads",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			get, ok := in.Parameters.(*dynamodb.GetItemInput)
			if !ok {
				return next.HandleInitialize(ctx, in)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if !aws.ToBool(get.ConsistentRead) {
				r.eventual++
				return middleware.InitializeOutput{Result: &dynamodb.GetItemOutput{}}, middleware.Metadata{}, nil
			}
			r.strongly++
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
}

// TestPollConfirmsGoneWithAConsistentRead: a poll reads eventually
// consistent, and a read that finds no ticket is checked with a strongly
// consistent one, so a missed fresh ticket is not taken for gone; a
// ticket really gone is reported gone.
func TestPollConfirmsGoneWithAConsistentRead(t *testing.T) {
	t.Parallel()
	base, table := newTable(t)
	r := &staleReads{}
	client := dynamodb.New(base.Options(), func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, r.middleware) })
	s := ddbstore.New(client, table, "test")
	ctx := context.Background()
	tk, err := s.EnterWait(ctx, core.Waiter{Tenant: "a", Ticket: "fresh", Max: 10, Now: t0, Until: t0.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		before   func() error
		wantGone bool
	}{
		{name: "fresh ticket missed by the eventual read", before: func() error { return nil }},
		{name: "ticket gone", before: func() error { return s.LeaveWait(ctx, tk, t0, time.Second) }, wantGone: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.before(); err != nil {
				t.Fatal(err)
			}
			r.mu.Lock()
			r.eventual, r.strongly = 0, 0
			r.mu.Unlock()
			ts, err := s.PollTicket(ctx, tk)
			if err != nil {
				t.Fatal(err)
			}
			if ts.Gone != tc.wantGone || ts.Granted {
				t.Errorf("poll = %+v, want gone %v, not granted", ts, tc.wantGone)
			}
			if r.eventual != 1 || r.strongly != 1 {
				t.Errorf("reads: %d eventual, %d strongly consistent; want 1 and 1", r.eventual, r.strongly)
			}
		})
	}
}

// statementFails makes the wait queue's one-statement read fail (a role
// without dynamodb:PartiQLSelect).
type statementFails struct{ *countingAPI }

func (statementFails) ExecuteStatement(context.Context, *dynamodb.ExecuteStatementInput, ...func(*dynamodb.Options)) (*dynamodb.ExecuteStatementOutput, error) {
	return nil, &smithy.GenericAPIError{Code: "AccessDeniedException", Message: "not authorized to perform: dynamodb:PartiQLSelect"}
}

// TestFreeDispatchReadsAShortQueueInOneCall: a free's dispatch reads the
// queue in one call when it holds at most 16 tickets (none, or 16
// waiting: the first is granted the freed slot); a longer queue is then
// read shard by shard (one call a shard more), and so is any queue when
// the one-statement read fails. Each serves the queue's first ticket.
func TestFreeDispatchReadsAShortQueueInOneCall(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		tickets   int
		failing   bool
		wantReads int64
	}{
		{"empty", 0, false, 1},
		{"16 waiting", 16, false, 1},
		{"17 waiting", 17, false, 1 + ddbstore.QueueShards},
		{"16 waiting, the statement refused", 16, true, ddbstore.QueueShards},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, table := newTable(t)
			counting := &countingAPI{Client: client}
			var api ddbstore.API = counting
			if c.failing {
				api = statementFails{counting}
			}
			var logged bytes.Buffer
			s := ddbstore.New(api, table, "test", ddbstore.WithLogger(slog.New(slog.NewJSONHandler(&logged, nil))))
			f := &queueFixture{t: t, s: s, client: client, table: table, limit: 1}
			slot := f.free(f.fill(1)[0])
			var first string
			for i := range c.tickets {
				tk := f.enter(fmt.Sprint("tenant-", i), fmt.Sprintf("w%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
				if i == 0 {
					first = tk.ID
				}
			}
			counting.calls.Store(0)
			res := f.dispatch(core.Dispatch{Now: t0.Add(time.Second), Freed: slot})
			if n := counting.calls.Load(); n != c.wantReads {
				t.Errorf("the dispatch made %d reads, want %d", n, c.wantReads)
			}
			if c.tickets == 0 && (len(res.Granted) != 0 || res.Head != "") {
				t.Errorf("dispatch of an empty queue = %+v", res)
			}
			if c.tickets > 0 && (len(res.Granted) != 1 || res.Granted[0].ID != first) {
				t.Errorf("dispatch = %+v; want %s, the first ticket, granted", res, first)
			}
			// A refused statement is recovered from, so it is logged: a
			// role without the grant would otherwise cost a call per free
			// without a trace.
			if warned := strings.Contains(logged.String(), `"level":"WARN"`); warned != c.failing {
				t.Errorf("logged %q; want a warning: %v", logged.String(), c.failing)
			}
		})
	}
}
