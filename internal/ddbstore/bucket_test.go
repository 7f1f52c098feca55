package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// countingAPI counts the DynamoDB calls made through it, the
// running-slot buckets (CAP# keys) its BatchGetItems read, and the
// transactions that set a ledger's limits.
type countingAPI struct {
	*dynamodb.Client
	calls     atomic.Int64
	capKeys   atomic.Int64
	limitSets atomic.Int64
}

func (c *countingAPI) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	for _, it := range in.TransactItems {
		// Only a setting of the limits writes a bucket's spread.
		if it.Update != nil && slices.Contains(slices.Collect(maps.Values(it.Update.ExpressionAttributeNames)), "spread") {
			c.limitSets.Add(1)
			break
		}
	}
	return c.Client.TransactWriteItems(ctx, in, o...)
}

func (c *countingAPI) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	c.calls.Add(1)
	return c.Client.GetItem(ctx, in, o...)
}

func (c *countingAPI) Query(ctx context.Context, in *dynamodb.QueryInput, o ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	c.calls.Add(1)
	return c.Client.Query(ctx, in, o...)
}

func (c *countingAPI) ExecuteStatement(ctx context.Context, in *dynamodb.ExecuteStatementInput, o ...func(*dynamodb.Options)) (*dynamodb.ExecuteStatementOutput, error) {
	c.calls.Add(1)
	return c.Client.ExecuteStatement(ctx, in, o...)
}

func (c *countingAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	c.calls.Add(1)
	for _, ka := range in.RequestItems {
		for _, k := range ka.Keys {
			if pk, ok := k["pk"].(*types.AttributeValueMemberS); ok && strings.HasPrefix(pk.Value, "CAP#") {
				c.capKeys.Add(1)
			}
		}
	}
	return c.Client.BatchGetItem(ctx, in, o...)
}

// TestCapacityCostsTheSameCallsWhateverTheFleet: the capacity figures
// come from the counters kept with the slots (one BatchGetItem of the
// buckets, one of the paused buckets) and the counts by state the last
// counter repair kept (one GetItem): three calls whatever the fleet's
// size. The counts by state agree with the records as of that repair;
// the slots spread over the buckets.
func TestCapacityCostsTheSameCallsWhateverTheFleet(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	api := &countingAPI{Client: client}
	s := ddbstore.New(api, table, "test")
	ctx := context.Background()
	for _, fleet := range []int{1, 24} {
		for i := range fleet {
			activeRecord(t, s, thread(fleet*100+i), fmt.Sprintf("sbx-%d-%d", fleet, i))
		}
		want := map[int]int{1: 1, 24: 25}[fleet]
		api.calls.Store(0)
		st, err := s.Capacity(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := api.calls.Load(); n != 3 {
			t.Errorf("Capacity with %d records made %d calls, want 3", fleet, n)
		}
		if st.Used != want || st.Active != map[int]int{1: 0, 24: 1}[fleet] {
			t.Errorf("capacity before the repair counts = %+v, want used %d and the last count's active", st, want)
		}
		if _, err := s.RepairCounters(ctx, 100); err != nil {
			t.Fatal(err)
		}
		api.calls.Store(0)
		if st, err = s.Capacity(ctx); err != nil {
			t.Fatal(err)
		}
		if n := api.calls.Load(); n != 3 {
			t.Errorf("Capacity with %d records after a repair made %d calls, want 3", fleet, n)
		}
		if st.Used != want || st.Active != want || st.CountedAt.IsZero() {
			t.Errorf("capacity after the repair = %+v, want used and active %d, and when they were counted", st, want)
		}
	}
	out, err := client.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table),
		FilterExpression:          aws.String("begins_with(pk, :cap) AND used > :zero"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":cap": &types.AttributeValueMemberS{Value: "CAP#"}, ":zero": &types.AttributeValueMemberN{Value: "0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Items) < 25/2 {
		t.Errorf("25 slots held in %d of the %d buckets, want them spread", len(out.Items), ddbstore.CapacityBuckets)
	}
}

// TestALedgerReadReadsTheBucketsInUse: under a limit of 4, a refused
// reservation and a capacity read read the 4 running-slot buckets with a
// share of it, not all 64; once the limit is lowered to 4 from 16, with a
// slot held in each of 16 buckets, they read those 16 and count every
// slot.
func TestALedgerReadReadsTheBucketsInUse(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	api := &countingAPI{Client: client}
	ctx := context.Background()
	for _, c := range []struct {
		before, limit, want int
	}{{0, 4, 4}, {16, 4, 16}} {
		reserve := func(s *ddbstore.Store, n, limit int) error {
			n += 1000 * c.before // a thread of this case's own
			return s.Reserve(ctx, core.Reservation{Token: fmt.Sprint("res-", n), ThreadKey: thread(n), Limit: limit, Now: t0, ExpiresAt: t0.Add(time.Minute)})
		}
		s := ddbstore.New(api, table, fmt.Sprint("d", c.before), ddbstore.WithLimit(c.limit))
		held := max(c.before, c.limit)
		for i := range held {
			if err := reserve(s, i, max(c.before, c.limit)); err != nil {
				t.Fatal(err)
			}
		}
		if err := reserve(s, 100, c.limit); err == nil {
			t.Fatalf("a reservation past the limit succeeded")
		}
		api.capKeys.Store(0)
		var ce *core.CapacityError
		if err := reserve(s, 101, c.limit); !errors.As(err, &ce) || ce.Status.Used != held {
			t.Errorf("refusal = %v, want one naming %d used", err, held)
		}
		st, err := s.Capacity(ctx)
		if err != nil || st.Used != held {
			t.Errorf("Capacity = %+v, %v; want %d used", st, err, held)
		}
		if n := api.capKeys.Load(); n != int64(2*c.want) {
			t.Errorf("limit %d after %d: a refusal and a capacity read read %d buckets, want %d each", c.limit, c.before, n, c.want)
		}
	}
}

// TestATakeLeavesAnUnevenSplitAlone: a take that reads the buckets
// rewrites their limits only when a bucket holds more than its limit,
// not because the split is uneven (as a rebalance after an adoption
// leaves it): limits 2 and 0 in the two buckets with a share of 2, both
// empty, give a take homed in the second bucket the first one's slot,
// with no rewrite of the 64 buckets.
func TestATakeLeavesAnUnevenSplitAlone(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	api := &countingAPI{Client: client}
	ctx := context.Background()
	s := ddbstore.New(api, table, "test", ddbstore.WithLimit(2))
	reserve := func(n int) error {
		return s.Reserve(ctx, core.Reservation{Token: fmt.Sprint("res-", n), ThreadKey: thread(n), Limit: 2, Now: t0, ExpiresAt: t0.Add(time.Minute)})
	}
	if err := reserve(0); err != nil { // sets the limits: 1 and 1
		t.Fatal(err)
	}
	if err := s.FreeReservation(ctx, "res-0", thread(0)); err != nil {
		t.Fatal(err)
	}
	for b, lim := range []int{2, 0} {
		pk := "CAP#test"
		if b > 0 {
			pk += fmt.Sprint("#", b)
		}
		if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
			Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: "R"}},
			UpdateExpression:          aws.String("SET lim = :l"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":l": &types.AttributeValueMemberN{Value: fmt.Sprint(lim)}}}); err != nil {
			t.Fatal(err)
		}
	}
	n := 1
	for ddbstore.ThreadHome(thread(n), 2) != 1 {
		n++
	}
	api.limitSets.Store(0)
	if err := reserve(n); err != nil {
		t.Fatalf("a take homed in the bucket of limit 0: %v, want the other bucket's slot", err)
	}
	if got := api.limitSets.Load(); got != 0 {
		t.Errorf("the take rewrote the limits %d times, want none", got)
	}
}

// TestLoweredLimitHoldsAcrossBuckets: slots taken under one limit, spread
// over the buckets, count against a lower limit at once (the buckets'
// limits are reset for it), and a freed slot is taken again only below it.
func TestLoweredLimitHoldsAcrossBuckets(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for i := range 12 {
		if err := s.Reserve(ctx, core.Reservation{Token: fmt.Sprint("res-", i), ThreadKey: thread(i), Limit: 100, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	reserve := func(n int) error {
		return s.Reserve(ctx, core.Reservation{Token: fmt.Sprint("res-", n), ThreadKey: thread(n), Limit: 10, Now: t0, ExpiresAt: t0.Add(time.Minute)})
	}
	var ce *core.CapacityError
	if err := reserve(100); !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity || ce.Status.Used != 12 {
		t.Fatalf("Reserve under limit 10 with 12 held = %v, want a capacity refusal naming used 12", err)
	}
	for i := range 3 {
		if err := s.FreeReservation(ctx, fmt.Sprint("res-", i), thread(i)); err != nil {
			t.Fatal(err)
		}
	}
	ok := 0
	for n := 101; n < 110; n++ {
		if reserve(n) == nil {
			ok++
		}
	}
	if st, _ := s.Capacity(ctx); ok != 1 || st.Used != 10 {
		t.Errorf("after freeing to 9 of limit 10: %d reserved, used %d; want 1 and 10", ok, st.Used)
	}
}
