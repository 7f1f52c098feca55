package ddbstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// toggle moves a record away from the state about to be read.
const toggle core.State = "toggle"

// boundaryDB passes every call to DynamoDB Local and, when a query of the
// state index turns to a state other than the last one queried, runs
// atState with that state first; the queries of that state wait for it.
// A tally reads the states one after another, so atState runs between
// the reads of two states.
type boundaryDB struct {
	ddbstore.API
	atState func(core.State)

	mu   sync.Mutex
	last core.State
}

func (b *boundaryDB) Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	if st, ok := queriedState(in); ok {
		b.mu.Lock()
		if st != b.last {
			b.last = st
			b.atState(st)
		}
		b.mu.Unlock()
	}
	return b.API.Query(ctx, in, opts...)
}

// Scan runs atState with scanned after each page of a Scan.
func (b *boundaryDB) Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error) {
	out, err := b.API.Scan(ctx, in, opts...)
	b.mu.Lock()
	b.last = scanned
	b.atState(scanned)
	b.mu.Unlock()
	return out, err
}

// scanned is what boundaryDB's atState gets after a page of a Scan.
const scanned core.State = "scanned"

// queriedState is the state whose index key a query of the state index
// reads ("ST#<deployment>#<state>[#<n>]").
func queriedState(in *dynamodb.QueryInput) (core.State, bool) {
	if aws.ToString(in.IndexName) != ddbstore.IndexGSI1 {
		return "", false
	}
	for _, v := range in.ExpressionAttributeValues {
		if s, ok := v.(*types.AttributeValueMemberS); ok && strings.HasPrefix(s.Value, "ST#") {
			if parts := strings.Split(s.Value, "#"); len(parts) >= 3 {
				return core.State(parts[2]), true
			}
		}
	}
	return "", false
}

// moveRecord moves record id to state to (its count with it) unless it
// is there, and reports whether it moved; it may run on any goroutine.
func moveRecord(t *testing.T, s *ddbstore.Store, id string, to core.State) bool {
	ctx := context.Background()
	rec, err := s.Get(ctx, id)
	if err != nil {
		t.Errorf("Get: %v", err)
		return false
	}
	if rec.State == to {
		return false
	}
	if _, err := s.Apply(ctx, core.Update{SandboxID: id, Fence: rec.Fence, State: to, Now: rec.UpdatedAt.Add(time.Second), Slot: rec.Slot}); err != nil {
		t.Errorf("move %s to %s: %v", id, to, err)
		return false
	}
	return true
}

// A record that moves between two states while the counter repair reads
// the index, every time it reads, is still counted once: moving to a
// state read later (it shows twice) it does not raise its tenant's, its
// user's or its bucket's count, and moving back to a state read already
// (it shows nowhere in that read) it does not lower them, which would let
// the tenant past its quota and the deployment past its limit. The counts
// are right from the start, so no repair may write.
func TestRepairCountersCountsAHolderMovingDuringTheTallyOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// to is the state to move the record to when a read turns to a
		// state (none: leave it; toggle: active to releasing and back).
		to map[core.State]core.State
	}{
		{"moving on to a state read later", map[core.State]core.State{
			core.StateCreating: core.StateActive, core.StateReleasing: core.StateReleasing}},
		{"moving back to a state read already", map[core.State]core.State{
			core.StateCreating: core.StateReleasing, core.StateReleasing: core.StateActive}},
		// Away from each state just before it is read, whatever the order
		// of the reads.
		{"moving back and forth at every read", map[core.State]core.State{
			core.StateActive: toggle, core.StateReleasing: toggle}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, table := newTable(t)
			plain := ddbstore.New(client, table, "test")
			ctx := context.Background()
			key := thread(1)
			activeRecord(t, plain, key, "sbx1")
			moves := 0
			move := func(to core.State) {
				if moveRecord(t, plain, "sbx1", to) {
					moves++
				}
			}
			db := &boundaryDB{API: client, atState: func(st core.State) {
				to, ok := tc.to[st]
				switch {
				case !ok:
				case to == toggle && st == core.StateActive:
					move(core.StateReleasing)
				case to == toggle:
					move(core.StateActive)
				default:
					move(to)
				}
			}}
			s := ddbstore.New(db, table, "test")
			for pass := range 4 {
				rep, err := s.RepairCounters(ctx, 100)
				if err != nil {
					t.Fatalf("repair %d: %v", pass, err)
				}
				if rep.Slots != 0 || rep.Counters != 0 {
					t.Errorf("repair %d corrected used slots by %d and %d other counters; want none (the counts are right)",
						pass, rep.Slots, rep.Counters)
				}
			}
			if moves < 4 {
				t.Fatalf("the record moved %d times during the repairs, want at least 4", moves)
			}
			c := countSlots(t, plain, key)
			if c.ledger != 1 || c.tenant != 1 {
				t.Errorf("used slots %d, tenant's count %d; want 1 and 1", c.ledger, c.tenant)
			}
		})
	}
}

// A user's or tenant's slot count that drifted is corrected by the second
// repair that sees the same difference at the same revision; one that a
// take and a free moved and brought back to the count the first repair
// read is not (the take's count, seen by the first repair's tally, may
// since have been freed by another), until a repair sees it unchanged.
func TestSlotCountRepairNeedsTheSameRevisionTwice(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	ctx := context.Background()
	key := thread(1)
	activeRecord(t, s, key, "sbx1")
	for _, pk := range []string{"TEN#test#acme", "USR#test#acme#u1"} {
		if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
			Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: "R"}},
			UpdateExpression:          aws.String("SET used = :n"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "3"}}}); err != nil {
			t.Fatal(err) // drift, as a bug would leave it
		}
	}
	takeAndFree := func() {
		t.Helper()
		k := thread(2)
		if err := s.Reserve(ctx, core.Reservation{Token: "res-2", ThreadKey: k, Limit: 100, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
			t.Fatalf("Reserve: %v", err)
		}
		if err := s.FreeReservation(ctx, "res-2", k); err != nil {
			t.Fatalf("FreeReservation: %v", err)
		}
	}
	for _, step := range []struct {
		name       string
		before     func()
		wantFixed  int
		wantTenant int
	}{
		{"first sighting", func() {}, 0, 3},
		{"moved and came back", takeAndFree, 0, 3},
		{"seen again unchanged", func() {}, 2, 1},
	} {
		step.before()
		rep, err := s.RepairCounters(ctx, 100)
		if err != nil {
			t.Fatalf("%s: RepairCounters: %v", step.name, err)
		}
		if c := countSlots(t, s, key); rep.Counters != step.wantFixed || c.tenant != step.wantTenant {
			t.Errorf("%s: %d counters corrected, the tenant's count %d; want %d, %d",
				step.name, rep.Counters, c.tenant, step.wantFixed, step.wantTenant)
		}
	}
}

// A pool member being paused while the counter repair reads the index
// (it moves back, from pooled to pausing, a state read already) is missed
// by the tally. Reconcile repairs the pool place count on two passes'
// equal figures, so the repair reports the exact count's figure whenever
// it sees a difference the second time: no two passes in a row report the
// same missing figure, and the count is never corrected to a tally that
// missed the member (the pool would refill one too many).
func TestRepairCountersReportsAPoolMemberMovingDuringTheTally(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	plain := ddbstore.New(client, table, "test")
	ctx := context.Background()
	pooledMember(t, plain, "m1", 5)
	moves := 0
	db := &boundaryDB{API: client, atState: func(st core.State) {
		rec, err := plain.Get(ctx, "m1")
		if err != nil {
			t.Errorf("Get: %v", err)
			return
		}
		switch {
		case st == core.StateResuming && rec.State == core.StatePooled:
			_, err = plain.ClaimPoolPause(ctx, core.Claim{SandboxID: "m1", Owner: "refill", Now: t0, LeaseUntil: t0.Add(time.Minute)}, 5)
		case st == core.StateCreating && rec.State == core.StatePausing:
			_, err = plain.AbortPoolPause(ctx, rec, t0)
		default:
			return
		}
		if err != nil {
			t.Errorf("move m1 from %s: %v", rec.State, err)
		}
		moves++
	}}
	s := ddbstore.New(db, table, "test")
	var last core.HolderCount
	for pass := range 6 {
		rep, err := s.RepairCounters(ctx, 100)
		if err != nil || rep.Pool == nil {
			t.Fatalf("repair %d: %v, pool places %v", pass, err, rep.Pool)
		}
		if p := *rep.Pool; p == last && p.Used != p.Counted {
			t.Errorf("repair %d reported the pool places %+v twice: reconcile would correct them to %d, want 1", pass, p, p.Counted)
		}
		last = *rep.Pool
	}
	if moves < 4 {
		t.Fatalf("the member moved %d times during the repairs, want at least 4", moves)
	}
}

// A reservation finalized while a tally reads the index shows twice, as
// the reservation (read first) and as its record (read later): it holds
// one place, and the tally counts one.
func TestTallyCountsAReservationFinalizedDuringItOnce(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	plain := ddbstore.New(client, table, "test")
	ctx := context.Background()
	if err := plain.ReservePool(ctx, core.PoolReservation{Token: "res-m1", Limit: 100, Size: 5, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
		t.Fatalf("ReservePool: %v", err)
	}
	finalized := false
	db := &boundaryDB{API: client, atState: func(st core.State) {
		if st != core.StateActive || finalized {
			return
		}
		finalized = true
		if _, err := plain.FinalizePool(ctx, "res-m1", core.Record{SandboxID: "m1", Backend: "e2b", ReservationToken: "res-m1",
			Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: "tok"}, CreatedAt: t0, UpdatedAt: t0}); err != nil {
			t.Errorf("FinalizePool: %v", err)
		}
	}}
	_, pool, err := ddbstore.New(db, table, "test").CountHolders(ctx)
	if err != nil {
		t.Fatalf("CountHolders: %v", err)
	}
	if !finalized || pool.Used != 1 || pool.Counted != 1 {
		t.Errorf("finalized during the tally %v, pool places %+v; want true, 1 held by 1 holder", finalized, pool)
	}
}

// A user's or tenant's slot count that no holder names (they hold nothing
// now, yet the count says they do) is found by the repair's sweep of the
// table, one part a pass, and corrected like any other: within one round
// of the sweep and the two passes a correction needs.
func TestRepairCountersFindsCountsNoHolderNames(t *testing.T) {
	t.Parallel()
	const parts = 4
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	ddbstore.SetSweepSegments(s, parts)
	ctx := context.Background()
	stray := []string{"USR#test#acme#u9", "TEN#test#ghost"}
	for _, pk := range stray {
		if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
			Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: "R"}},
			UpdateExpression:          aws.String("SET used = :n"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "2"}}}); err != nil {
			t.Fatal(err)
		}
	}
	fixed := 0
	for pass := range parts + 2 {
		rep, err := s.RepairCounters(ctx, 100)
		if err != nil {
			t.Fatalf("repair %d: %v", pass, err)
		}
		fixed += rep.Counters
	}
	for _, pk := range stray {
		out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
			Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: "R"}}})
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := out.Item["used"].(*types.AttributeValueMemberN); n == nil || n.Value != "0" {
			t.Errorf("%s used = %v after %d passes, want 0", pk, out.Item["used"], parts+2)
		}
	}
	if fixed != len(stray) {
		t.Errorf("%d counters corrected, want %d", fixed, len(stray))
	}
}

// A bucket's per-state counts are corrected only while no count of it
// moves: a record that leaves its state after the repair read the counts
// and comes back after the confirmation leaves the counts as read, yet a
// correction to what the tally saw in between would be wrong.
func TestPerStateCountRepairWaitsForTheBucketToHoldStill(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	plain := ddbstore.New(client, table, "test")
	ctx := context.Background()
	activeRecord(t, plain, thread(1), "sbx1")
	move := func(to core.State) { moveRecord(t, plain, "sbx1", to) }
	// Read active, tallied and confirmed releasing, active again when
	// the correction is written (after the last part of the Scan).
	pages := 0
	db := &boundaryDB{API: client, atState: func(st core.State) {
		switch st {
		case core.StateCreating:
			move(core.StateReleasing)
			pages = 0
		case scanned:
			if pages++; pages == ddbstore.RecordScanSegments {
				move(core.StateActive)
			}
		}
	}}
	s := ddbstore.New(db, table, "test")
	for pass := range 4 {
		move(core.StateActive)
		rep, err := s.RepairCounters(ctx, 100)
		if err != nil {
			t.Fatalf("repair %d: %v", pass, err)
		}
		if rep.Counters != 0 {
			t.Errorf("repair %d corrected %d counters, want none (the counts were right whenever read)", pass, rep.Counters)
		}
	}
	move(core.StateActive)
	if st, err := counted(t, plain, 100); err != nil || st.Active != 1 {
		t.Errorf("capacity %+v, %v; want 1 active", st, err)
	}
}

// Pool members and refills hold no user's or tenant's slot: the repair
// leaves them as they are, so a claim of a member as listed before the repair still
// succeeds, and a refill between two passes does not keep a real drift
// from being corrected.
func TestRepairCountersLeavesPoolMembersAlone(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	ctx := context.Background()
	activeRecord(t, s, thread(1), "sbx1")
	listed := pooledMember(t, s, "m0", 10)
	if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "TEN#test#acme"}, "sk": &types.AttributeValueMemberS{Value: "R"}},
		UpdateExpression:          aws.String("SET used = :n"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "5"}}}); err != nil {
		t.Fatal(err) // drift: the tenant holds one slot
	}
	for pass := range 3 {
		pooledMember(t, s, fmt.Sprint("m", pass+1), 10) // a refill between every two passes
		if _, err := s.RepairCounters(ctx, 100); err != nil {
			t.Fatalf("repair %d: %v", pass, err)
		}
	}
	if c := countSlots(t, s, thread(1)); c.tenant != 1 {
		t.Errorf("the tenant's count is %d after three passes, want 1 (the drift corrected)", c.tenant)
	}
	claim := core.PoolClaim{Member: listed, ThreadKey: thread(2), Owner: "a", Now: t0, LeaseUntil: t0.Add(time.Minute)}
	if _, err := s.ClaimPoolMember(ctx, claim); err != nil {
		t.Errorf("claim of the member as listed before the repairs: %v, want it claimed", err)
	}
}

// scanFailDB fails every Scan while fail is set.
type scanFailDB struct {
	ddbstore.API
	fail bool
}

func (d *scanFailDB) Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error) {
	if d.fail {
		return nil, context.DeadlineExceeded
	}
	return d.API.Scan(ctx, in, opts...)
}

// A pass whose exact count fails (its Scan errs, or runs out of time)
// corrects nothing and keeps what it noted, so the next pass corrects the
// drift.
func TestRepairCountersWhoseExactCountFailsCorrectsNothing(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	db := &scanFailDB{API: client}
	s := ddbstore.New(db, table, "test")
	ctx := context.Background()
	activeRecord(t, s, thread(1), "sbx1")
	if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "TEN#test#acme"}, "sk": &types.AttributeValueMemberS{Value: "R"}},
		UpdateExpression:          aws.String("SET used = :n"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "3"}}}); err != nil {
		t.Fatal(err) // drift: one slot is held
	}
	for _, step := range []struct {
		name       string
		fail, err  bool
		wantTenant int
	}{
		{"first sighting", false, false, 3},
		{"the exact count fails", true, true, 3},
		{"seen again, counted", false, false, 1},
	} {
		db.fail = step.fail
		_, err := s.RepairCounters(ctx, 100)
		if (err != nil) != step.err {
			t.Errorf("%s: RepairCounters = %v, want an error %v", step.name, err, step.err)
		}
		if c := countSlots(t, s, thread(1)); c.tenant != step.wantTenant {
			t.Errorf("%s: the tenant's count is %d, want %d", step.name, c.tenant, step.wantTenant)
		}
	}
}
