package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

var rt0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

func recStore(t *testing.T) *ddbstore.Store {
	t.Helper()
	client := testenv.DynamoClient(t)
	table := testenv.UniqueName(t, "recstore")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ddbstore.CreateTable(ctx, client, table); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	return ddbstore.New(client, table, "test")
}

func recKey(n int) core.ThreadKey {
	return core.ThreadKey{Tenant: "acme", User: "u1", Thread: fmt.Sprintf("t%d", n)}
}

func warmRecord(id string, key core.ThreadKey) core.Record {
	return core.Record{SandboxID: id, ThreadKey: key, State: core.StateWarm, Backend: "e2b", CreatedAt: rt0, UpdatedAt: rt0, ParkedAt: rt0}
}

// used returns the slots the buckets count and the slot-holding entries
// of the state index.
func used(t *testing.T, s *ddbstore.Store) (int, int) {
	t.Helper()
	st, err := s.Capacity(context.Background())
	if err != nil {
		t.Fatalf("Capacity: %v", err)
	}
	n, err := s.CountStates(context.Background(), core.StateCreating, core.StateActive, core.StateReleasing, core.StateWarm,
		core.StateDestroying)
	if err != nil {
		t.Fatalf("CountStates: %v", err)
	}
	counted := 0
	for _, c := range n {
		counted += c
	}
	return st.Used, counted
}

func TestAdoptTakesASlotOrConsumesTheReservation(t *testing.T) {
	t.Parallel()
	s := recStore(t)
	ctx := context.Background()
	if _, err := s.Adopt(ctx, core.Adoption{Record: warmRecord("sb1", recKey(1)), Bind: true}); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if u, c := used(t, s); u != 1 || c != 1 {
		t.Errorf("after adopt: used %d counted %d, want 1 1", u, c)
	}
	if _, err := s.Adopt(ctx, core.Adoption{Record: warmRecord("sb1", recKey(1))}); !errors.Is(err, core.ErrConflict) {
		t.Errorf("second Adopt = %v, want ErrConflict", err)
	}
	// A crashed create's reservation becomes the record's slot.
	if err := s.Reserve(ctx, core.Reservation{Token: "res-2", ThreadKey: recKey(2), Limit: 10, Now: rt0, ExpiresAt: rt0.Add(time.Minute)}); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	from := core.Binding{ThreadKey: recKey(2), Reservation: "res-2"}
	if _, err := s.Adopt(ctx, core.Adoption{Record: warmRecord("sb2", recKey(2)), Reservation: "res-2", Bind: true, From: from, FromBound: true}); err != nil {
		t.Fatalf("Adopt with reservation: %v", err)
	}
	if u, c := used(t, s); u != 2 || c != 2 {
		t.Errorf("after consuming the reservation: used %d counted %d, want 2 2", u, c)
	}
	look, err := s.LookupMany(ctx, []string{"sb1", "sb2"}, []core.ThreadKey{recKey(1), recKey(2)}, []string{"res-2"})
	if err != nil {
		t.Fatalf("LookupMany: %v", err)
	}
	if len(look.Records) != 2 || look.Bindings[recKey(2)].SandboxID != "sb2" || len(look.Reservations) != 0 {
		t.Errorf("lookup = %+v; want 2 records, t2 bound to sb2, no reservation", look)
	}
	// A duplicate is adopted (to be killed) only while the binding names the canonical.
	tomb := warmRecord("sb3", recKey(1))
	tomb.State = core.StateDestroying
	if _, err := s.Adopt(ctx, core.Adoption{Record: tomb, Canonical: "other"}); !errors.Is(err, core.ErrConflict) {
		t.Errorf("Adopt with a stale canonical = %v, want ErrConflict", err)
	}
	if _, err := s.Get(ctx, "sb3"); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("refused adoption wrote a record: %v", err)
	}
	if _, err := s.Adopt(ctx, core.Adoption{Record: tomb, Canonical: "sb1"}); err != nil {
		t.Errorf("Adopt duplicate: %v", err)
	}
}

func TestLookupManyBatchesBeyondOneCall(t *testing.T) {
	t.Parallel()
	s := recStore(t)
	ctx := context.Background()
	var ids []string
	var keys []core.ThreadKey
	for i := range 120 {
		id := fmt.Sprintf("sb%03d", i)
		if _, err := s.Adopt(ctx, core.Adoption{Record: warmRecord(id, recKey(i)), Bind: true}); err != nil {
			t.Fatalf("Adopt: %v", err)
		}
		ids, keys = append(ids, id), append(keys, recKey(i))
	}
	look, err := s.LookupMany(ctx, append(ids, "missing"), keys, []string{"no-such-token"})
	if err != nil {
		t.Fatalf("LookupMany: %v", err)
	}
	if len(look.Records) != 120 || len(look.Bindings) != 120 {
		t.Errorf("got %d records %d bindings, want 120 each", len(look.Records), len(look.Bindings))
	}
}

func TestRebindAndClaimDuplicateFollowTheBinding(t *testing.T) {
	t.Parallel()
	s := recStore(t)
	ctx := context.Background()
	k := recKey(1)
	for _, id := range []string{"a", "b"} {
		if _, err := s.Adopt(ctx, core.Adoption{Record: warmRecord(id, k)}); err != nil {
			t.Fatalf("Adopt: %v", err)
		}
	}
	if err := s.Rebind(ctx, k, "a", core.Binding{}, false); err != nil {
		t.Fatalf("Rebind: %v", err)
	}
	if err := s.Rebind(ctx, k, "b", core.Binding{}, false); !errors.Is(err, core.ErrConflict) {
		t.Errorf("Rebind over an existing binding = %v, want ErrConflict", err)
	}
	now := rt0.Add(time.Minute)
	claim := func(id, canonical, owner string) error {
		_, err := s.ClaimDuplicate(ctx, core.Claim{SandboxID: id, Tenant: "acme", From: []core.State{core.StateWarm},
			To: core.StateDestroying, Owner: owner, Now: now, LeaseUntil: now.Add(time.Minute)}, k, canonical)
		return err
	}
	if err := claim("b", "zzz", "me"); !errors.Is(err, core.ErrConflict) {
		t.Errorf("claim with a stale canonical = %v, want ErrConflict", err)
	}
	if err := claim("b", "a", "me"); err != nil {
		t.Fatalf("ClaimDuplicate: %v", err)
	}
	if rec, _ := s.Get(ctx, "b"); rec.State != core.StateDestroying || rec.LeaseOwner != "me" {
		t.Errorf("claimed record = %+v, want destroying leased by me", rec)
	}
	if err := claim("b", "a", "peer"); !errors.Is(err, core.ErrConflict) {
		t.Errorf("second claim = %v, want ErrConflict", err)
	}
	if err := s.Rebind(ctx, k, "b", core.Binding{ThreadKey: k, SandboxID: "a"}, true); !errors.Is(err, core.ErrConflict) {
		t.Errorf("Rebind to a destroying record = %v, want ErrConflict", err)
	}
}

func TestFirstSeenKeepsTheFirstSighting(t *testing.T) {
	t.Parallel()
	s := recStore(t)
	ctx := context.Background()
	for i, now := range []time.Time{rt0, rt0.Add(time.Hour)} {
		got, err := s.FirstSeen(ctx, "sb1", now)
		if err != nil || !got.Equal(rt0) {
			t.Errorf("FirstSeen #%d = %s, %v; want %s", i+1, got, err, rt0)
		}
	}
}

func TestCursorIsComparedAndSwapped(t *testing.T) {
	t.Parallel()
	s := recStore(t)
	ctx := context.Background()
	c, err := s.Cursor(ctx)
	if err != nil || c != (core.ReconcileCursor{}) {
		t.Fatalf("Cursor = %+v, %v; want zero", c, err)
	}
	c.Cycle, c.CycleStart, c.Token, c.Pass = "cy1", rt0, "tok", 1
	if err := s.SaveCursor(ctx, c); err != nil {
		t.Fatalf("SaveCursor: %v", err)
	}
	if err := s.SaveCursor(ctx, c); !errors.Is(err, core.ErrConflict) {
		t.Errorf("SaveCursor at a stale version = %v, want ErrConflict", err)
	}
	got, err := s.Cursor(ctx)
	c.Version = 1
	if err != nil || got != c {
		t.Errorf("Cursor = %+v, %v; want %+v", got, err, c)
	}
}

func TestSeenRoundTripsLargeInventories(t *testing.T) {
	t.Parallel()
	s := recStore(t)
	ctx := context.Background()
	var seen []core.SeenSandbox
	for i := range 4500 {
		sb := core.SeenSandbox{ID: fmt.Sprintf("sb%05d", i)}
		if i%3 == 0 {
			sb.Reservation = "res-" + sb.ID
		}
		seen = append(seen, sb)
	}
	if err := s.SaveSeen(ctx, "cy1", "000001-a", seen[:3000]); err != nil {
		t.Fatalf("SaveSeen: %v", err)
	}
	if err := s.SaveSeen(ctx, "cy1", "000002-b", seen[3000:]); err != nil {
		t.Fatalf("SaveSeen: %v", err)
	}
	if err := s.SaveSeen(ctx, "cy2", "000001-a", seen[:1]); err != nil {
		t.Fatalf("SaveSeen: %v", err)
	}
	got, err := s.Seen(ctx, "cy1")
	if err != nil || len(got) != len(seen) {
		t.Fatalf("Seen = %d entries, %v; want %d", len(got), err, len(seen))
	}
	for i := range seen {
		if got[i] != seen[i] {
			t.Fatalf("entry %d = %+v, want %+v", i, got[i], seen[i])
		}
	}
}

// TestRepairCountersNeedsTheSameDifferenceTwice: a drifted bucket is
// corrected only when two consecutive repairs see the same difference and
// the bucket unchanged in between, and never over a concurrent write.
func TestRepairCountersNeedsTheSameDifferenceTwice(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	ctx := context.Background()
	if _, err := s.Adopt(ctx, core.Adoption{Record: warmRecord("sb1", recKey(1))}); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	rec, err := s.Get(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	bucket := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "CAP#test"}, "sk": &types.AttributeValueMemberS{Value: "R"}}
	if rec.Slot.Ref != 0 {
		bucket["pk"] = &types.AttributeValueMemberS{Value: fmt.Sprintf("CAP#test#%d", rec.Slot.Ref)}
	}
	touch := func(expr string, v int) {
		t.Helper()
		if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: bucket,
			UpdateExpression:          aws.String(expr),
			ExpressionAttributeValues: map[string]types.AttributeValue{":v": &types.AttributeValueMemberN{Value: fmt.Sprint(v)}}}); err != nil {
			t.Fatal(err)
		}
	}
	touch("SET used = :v ADD revision :v", 7) // drift
	for i, want := range []int{0, 0, -6, 0} {
		if i == 1 {
			touch("ADD revision :v", 1) // a write between the passes: no repair on this evidence
		}
		rep, err := s.RepairCounters(ctx, 100)
		if err != nil {
			t.Fatalf("repair %d: %v", i, err)
		}
		if rep.Slots != want {
			t.Errorf("repair %d corrected used by %d, want %d", i, rep.Slots, want)
		}
	}
	if u, counted := used(t, s); u != 1 || counted != 1 {
		t.Errorf("used %d, counted %d; want 1 and 1", u, counted)
	}
	if st, _ := counted(t, s, 100); st.Warm != 1 {
		t.Errorf("warm = %d, want 1", st.Warm)
	}
}

// A paused record holds a paused slot and no running one, even as an
// older version may have stored it (without its slot marks): the counter
// repair counts it among the paused slots' holders, and never as a
// running slot.
func TestRepairCountersCountsAPausedRecordAsAPausedSlotOnly(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	ctx := context.Background()
	warmAt(t, s, thread(1), "sbx1")
	rec, err := s.ClaimPause(ctx, pauseClaim("sbx1", "p", t0), 5)
	if err != nil {
		t.Fatalf("ClaimPause: %v", err)
	}
	if _, err := s.SettlePause(ctx, rec, t0); err != nil {
		t.Fatalf("SettlePause: %v", err)
	}
	if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
		Key:              map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "SBX#sbx1"}, "sk": &types.AttributeValueMemberS{Value: "R"}},
		UpdateExpression: aws.String("REMOVE no_running_slot, paused_slot")}); err != nil {
		t.Fatal(err)
	}
	for pass := range 3 {
		rep, err := s.RepairCounters(ctx, 10)
		if err != nil {
			t.Fatalf("repair %d: %v", pass, err)
		}
		if rep.Slots != 0 || rep.PausedSlots != 0 {
			t.Errorf("repair %d: slots corrected by %d, paused slots corrected by %d; want 0, 0",
				pass, rep.Slots, rep.PausedSlots)
		}
	}
	if paused, _, err := s.CountHolders(ctx); err != nil || paused.Used != 1 || paused.Counted != 1 {
		t.Errorf("paused slots %+v, %v; want 1 held by 1 record", paused, err)
	}
	if u, counted := used(t, s); u != 0 || counted != 0 {
		t.Errorf("running slots used %d, counted %d; want 0 and 0", u, counted)
	}
}
