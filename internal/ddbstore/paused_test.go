package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// pausedAt makes key's sandbox id paused (warm, its pause claimed and
// settled at t0, its running slot freed).
func pausedAt(t *testing.T, s *ddbstore.Store, key core.ThreadKey, id string) {
	t.Helper()
	ctx := context.Background()
	warmAt(t, s, key, id)
	rec, err := s.ClaimPause(ctx, pauseClaim(id, "p", t0), 5)
	if err != nil {
		t.Fatalf("ClaimPause: %v", err)
	}
	if _, err := s.SettlePause(ctx, rec, t0); err != nil {
		t.Fatalf("SettlePause: %v", err)
	}
}

// warmAt makes a fresh active record for key and parks it warm at t0.
func warmAt(t *testing.T, s *ddbstore.Store, key core.ThreadKey, id string) core.Record {
	t.Helper()
	rec := activeRecord(t, s, key, id)
	warm, err := s.Apply(context.Background(), core.Update{SandboxID: id, Fence: rec.Fence, State: core.StateWarm, Now: t0, ParkedAt: t0,
		ExpiresAt: t0.Add(30 * time.Minute)})
	if err != nil {
		t.Fatalf("park %s: %v", id, err)
	}
	return warm
}

// slots reads the running slots (the capacity buckets), the running slots
// the records hold (the state index), the paused slots, the tenant's
// count as Lookup sees it, and the tenant's paused count.
type slotCounts struct{ ledger, counted, paused, tenant, tenantPaused int }

func countSlots(t *testing.T, s *ddbstore.Store, key core.ThreadKey) slotCounts {
	t.Helper()
	ctx := context.Background()
	st, err := s.Capacity(ctx)
	if err != nil {
		t.Fatalf("Capacity: %v", err)
	}
	counted := 0
	for _, state := range []core.State{core.StateCreating, core.StateActive, core.StateReleasing, core.StateWarm,
		core.StatePausing, core.StatePaused, core.StateResuming, core.StateDestroying} {
		if err := s.ScanState(ctx, state, func(r core.Record) bool {
			if r.Slots.Running() {
				counted++
			}
			return true
		}); err != nil {
			t.Fatalf("ScanState: %v", err)
		}
	}
	paused, err := s.PausedUsed(ctx)
	if err != nil {
		t.Fatalf("PausedUsed: %v", err)
	}
	look, err := s.Lookup(ctx, key, 10)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	held, err := s.TenantsPaused(ctx, []string{key.Tenant})
	if err != nil {
		t.Fatalf("TenantsPaused: %v", err)
	}
	return slotCounts{ledger: st.Used, counted: counted, paused: paused, tenant: look.TenantUsed, tenantPaused: held[key.Tenant]}
}

func pauseClaim(id, owner string, now time.Time) core.Claim {
	return core.Claim{SandboxID: id, Tenant: "acme", Owner: owner, Now: now, LeaseUntil: now.Add(time.Minute)}
}

func TestPauseAndResumeMoveTheSlots(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	key := thread(1)
	warmAt(t, s, key, "sbx1")
	steps := []struct {
		name  string
		do    func(rec core.Record) (core.Record, error)
		state core.State
		want  slotCounts
		slots core.Slots
	}{
		{"claim pause", func(core.Record) (core.Record, error) {
			return s.ClaimPause(ctx, pauseClaim("sbx1", "p", t0.Add(time.Minute)), 5)
		}, core.StatePausing, slotCounts{ledger: 1, counted: 1, paused: 1, tenant: 1, tenantPaused: 1}, core.Slots{Paused: true, TenantPaused: true}},
		{"settle pause", func(r core.Record) (core.Record, error) {
			return s.SettlePause(ctx, r, t0.Add(2*time.Minute))
		}, core.StatePaused, slotCounts{ledger: 0, counted: 0, paused: 1, tenant: 0, tenantPaused: 1}, core.Slots{NoRunning: true, Paused: true, TenantPaused: true}},
		{"claim resume", func(core.Record) (core.Record, error) {
			return s.ClaimResume(ctx, core.ResumeClaim{Claim: pauseClaim("sbx1", "r", t0.Add(time.Hour)), Key: key, Limit: 1})
		}, core.StateResuming, slotCounts{ledger: 1, counted: 1, paused: 1, tenant: 1, tenantPaused: 1}, core.Slots{Paused: true, TenantPaused: true}},
		{"settle resume", func(r core.Record) (core.Record, error) {
			r.PausedFor = 58 * time.Minute
			return s.SettleResume(ctx, r, t0.Add(time.Hour), t0.Add(2*time.Hour))
		}, core.StateActive, slotCounts{ledger: 1, counted: 1, paused: 0, tenant: 1}, core.Slots{}},
	}
	var rec core.Record
	for _, st := range steps {
		got, err := st.do(rec)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		stored, err := s.Get(ctx, "sbx1")
		if err != nil {
			t.Fatalf("%s: Get: %v", st.name, err)
		}
		if stored.State != st.state || stored.Slots != st.slots || stored.Fence != got.Fence {
			t.Errorf("%s: stored %s slots %+v fence %d, want %s slots %+v fence %d (as returned)",
				st.name, stored.State, stored.Slots, stored.Fence, st.state, st.slots, got.Fence)
		}
		if st.state == core.StatePaused && (!stored.ExpiresAt.IsZero() || !got.ExpiresAt.IsZero()) {
			t.Errorf("%s: expires at %s (returned %s), want none: the provider does not end a paused sandbox", st.name, stored.ExpiresAt, got.ExpiresAt)
		}
		if c := countSlots(t, s, key); c != st.want {
			t.Errorf("%s: slots %+v, want %+v", st.name, c, st.want)
		}
		rec = got
	}
	stored, _ := s.Get(ctx, "sbx1")
	if stored.PausedFor != 58*time.Minute || !stored.ParkedAt.IsZero() || !stored.ExpiresAt.Equal(t0.Add(2*time.Hour)) || stored.LeaseOwner != "" {
		t.Errorf("resumed record = paused for %s, parked %s, expires %s, lease %q; want 58m, none, %s, none",
			stored.PausedFor, stored.ParkedAt, stored.ExpiresAt, stored.LeaseOwner, t0.Add(2*time.Hour))
	}
}

func TestPausedRecordsAreFiledByPauseTime(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for i, id := range []string{"sbx1", "sbx2"} {
		warmAt(t, s, thread(i), id)
		rec, err := s.ClaimPause(ctx, pauseClaim(id, "p", t0), 5)
		if err != nil {
			t.Fatalf("ClaimPause %s: %v", id, err)
		}
		if _, err := s.SettlePause(ctx, rec, t0.Add(time.Duration(10-i)*time.Minute)); err != nil {
			t.Fatalf("SettlePause %s: %v", id, err)
		}
	}
	tests := []struct {
		before time.Time
		want   []string
	}{
		{t0.Add(9 * time.Minute), nil},
		{t0.Add(10 * time.Minute), []string{"sbx2"}},
		{t0.Add(11 * time.Minute), []string{"sbx2", "sbx1"}},
	}
	for _, tc := range tests {
		recs, err := s.PausedParkedBefore(ctx, tc.before, 10)
		if err != nil {
			t.Fatalf("PausedParkedBefore: %v", err)
		}
		var got []string
		for _, r := range recs {
			got = append(got, r.SandboxID)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("PausedParkedBefore(%s) = %v, want %v (oldest first)", tc.before.Sub(t0), got, tc.want)
		}
	}
	if warm, _ := s.WarmParkedBefore(ctx, t0.Add(time.Hour), 10); len(warm) != 0 {
		t.Errorf("WarmParkedBefore = %v, want no paused record among the warm", warm)
	}
}

func TestClaimPauseRefusals(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	warmAt(t, s, thread(1), "sbx1")
	warmAt(t, s, thread(2), "sbx2")
	active := activeRecord(t, s, thread(3), "sbx3")
	if _, err := s.ClaimPause(ctx, pauseClaim("sbx1", "p", t0), 1); err != nil {
		t.Fatalf("ClaimPause sbx1: %v", err)
	}
	tests := []struct {
		name  string
		claim core.Claim
		limit int
		want  error
	}{
		{"paused slots full", pauseClaim("sbx2", "p", t0), 1, core.ErrPausedFull},
		{"active is never paused", pauseClaim("sbx3", "p", t0), 5, core.ErrConflict},
		{"leased by a peer", pauseClaim("sbx1", "q", t0), 5, core.ErrConflict},
		{"another tenant's", core.Claim{SandboxID: "sbx2", Tenant: "other", Owner: "p", Now: t0, LeaseUntil: t0.Add(time.Minute)}, 5, core.ErrNotFound},
		{"unknown", pauseClaim("nope", "p", t0), 5, core.ErrNotFound},
	}
	for _, tc := range tests {
		if _, err := s.ClaimPause(ctx, tc.claim, tc.limit); !errors.Is(err, tc.want) {
			t.Errorf("%s: ClaimPause = %v, want %v", tc.name, err, tc.want)
		}
	}
	if c := countSlots(t, s, thread(1)); c.paused != 1 || c.ledger != 3 {
		t.Errorf("slots after refusals = %+v, want 1 paused, 3 running (nothing written)", c)
	}
	if got, _ := s.Get(ctx, "sbx3"); got.State != core.StateActive || got.Fence != active.Fence {
		t.Errorf("active record after refused pause = %s fence %d, want untouched", got.State, got.Fence)
	}
}

func TestAbortPauseReturnsToWarmParkedWhenItWas(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	warmAt(t, s, thread(1), "sbx1")
	rec, err := s.ClaimPause(ctx, pauseClaim("sbx1", "p", t0.Add(time.Hour)), 5)
	if err != nil {
		t.Fatalf("ClaimPause: %v", err)
	}
	if _, err := s.AbortPause(ctx, core.Record{SandboxID: "sbx1", Fence: rec.Fence - 1, ParkedAt: rec.ParkedAt}, t0); !errors.Is(err, core.ErrStaleFence) {
		t.Errorf("AbortPause with a stale fence = %v, want ErrStaleFence", err)
	}
	if _, err := s.AbortPause(ctx, rec, t0.Add(time.Hour)); err != nil {
		t.Fatalf("AbortPause: %v", err)
	}
	idle, err := s.WarmParkedBefore(ctx, t0.Add(time.Second), 10)
	if err != nil || len(idle) != 1 || !idle[0].ParkedAt.Equal(t0) || idle[0].Slots != (core.Slots{}) || idle[0].LeaseOwner != "" {
		t.Fatalf("warm after abort = %+v, %v; want sbx1 parked at %s, running slot only, no lease", idle, err, t0)
	}
	if c := countSlots(t, s, thread(1)); c != (slotCounts{ledger: 1, counted: 1, paused: 0, tenant: 1}) {
		t.Errorf("slots after abort = %+v, want the running slot only", c)
	}
}

func TestClaimResumeTakesARunningSlotLikeAReservation(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	key := thread(1)
	pausedAt(t, s, key, "sbx1")
	activeRecord(t, s, thread(2), "sbx2") // holds the one running slot
	resume := func(limit, perUser int, user string) error {
		k := key
		k.User = user
		_, err := s.ClaimResume(ctx, core.ResumeClaim{Claim: pauseClaim("sbx1", "r", t0), Key: k, Limit: limit, MaxPerUser: perUser})
		return err
	}
	var ce *core.CapacityError
	if err := resume(1, 0, key.User); !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity || ce.Status.Used != 1 {
		t.Errorf("ClaimResume at the limit = %v, want a capacity refusal with used 1", err)
	}
	if err := resume(5, 1, key.User); !errors.As(err, &ce) || ce.Reason != api.RefusalUserQuota {
		t.Errorf("ClaimResume at the user's quota = %v, want a user_quota refusal", err)
	}
	if err := resume(5, 0, "someone-else"); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("ClaimResume for another user = %v, want ErrNotFound", err)
	}
	if err := s.SetDraining(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := resume(5, 0, key.User); !errors.As(err, &ce) || ce.Reason != api.RefusalDraining {
		t.Errorf("ClaimResume while draining = %v, want a draining refusal", err)
	}
	if got, _ := s.Get(ctx, "sbx1"); got.State != core.StatePaused || got.LeaseOwner != "" {
		t.Errorf("record after refused resumes = %s lease %q, want paused, no lease", got.State, got.LeaseOwner)
	}
	if c := countSlots(t, s, key); c != (slotCounts{ledger: 1, counted: 1, paused: 1, tenant: 1, tenantPaused: 1}) {
		t.Errorf("slots after refused resumes = %+v, want unchanged", c)
	}
}

func TestFreeReturnsExactlyTheSlotsTheRecordHolds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// to brings a warm sbx1 into the state it is destroyed from.
		to func(t *testing.T, s *ddbstore.Store, warm core.Record) core.Record
	}{
		{"warm", func(_ *testing.T, _ *ddbstore.Store, warm core.Record) core.Record { return warm }},
		{"pausing", func(t *testing.T, s *ddbstore.Store, _ core.Record) core.Record {
			rec, err := s.ClaimPause(context.Background(), pauseClaim("sbx1", "p", t0), 5)
			if err != nil {
				t.Fatalf("ClaimPause: %v", err)
			}
			return rec
		}},
		{"paused", func(t *testing.T, s *ddbstore.Store, _ core.Record) core.Record {
			rec, err := s.ClaimPause(context.Background(), pauseClaim("sbx1", "p", t0), 5)
			if err != nil {
				t.Fatalf("ClaimPause: %v", err)
			}
			rec, err = s.SettlePause(context.Background(), rec, t0)
			if err != nil {
				t.Fatalf("SettlePause: %v", err)
			}
			return rec
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			key := thread(1)
			activeRecord(t, s, thread(2), "other") // one running slot that stays
			rec := tc.to(t, s, warmAt(t, s, key, "sbx1"))
			tomb, err := s.Claim(ctx, core.Claim{SandboxID: "sbx1", Tenant: "acme", From: []core.State{rec.State},
				To: core.StateDestroying, Owner: "p", Now: t0, LeaseUntil: t0.Add(time.Minute)}) // the pauser discards it
			if err != nil {
				t.Fatalf("claim for destroy: %v", err)
			}
			if tomb.Slots != rec.Slots {
				t.Errorf("tombstone slots = %+v, want the %s record's %+v", tomb.Slots, tc.name, rec.Slots)
			}
			before := countSlots(t, s, key)
			if before.ledger != before.counted {
				t.Errorf("with a %s tombstone: ledger %d, counted %d; want equal (the repair must agree)", tc.name, before.ledger, before.counted)
			}
			if err := s.Free(ctx, tomb, t0); err != nil {
				t.Fatalf("Free: %v", err)
			}
			if c := countSlots(t, s, key); c != (slotCounts{ledger: 1, counted: 1, paused: 0, tenant: 1}) {
				t.Errorf("after freeing a %s tombstone: %+v, want only the other sandbox's running slot", tc.name, c)
			}
		})
	}
}

func TestPausedSlotsNeverExceedTheLimitUnderConcurrency(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	const n, limit = 12, 4
	for i := range n {
		warmAt(t, s, thread(i), fmt.Sprintf("sbx%d", i))
	}
	var wg sync.WaitGroup
	results := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, results[i] = s.ClaimPause(ctx, pauseClaim(fmt.Sprintf("sbx%d", i), fmt.Sprint("p", i), t0), limit)
		}()
	}
	wg.Wait()
	won := 0
	for i, err := range results {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, core.ErrPausedFull) && !errors.Is(err, core.ErrStoreUnavailable):
			t.Errorf("ClaimPause sbx%d = %v, want nil, ErrPausedFull or contention", i, err)
		}
	}
	c := countSlots(t, s, thread(0))
	if won > limit || c.paused != won {
		t.Errorf("%d pauses claimed, paused count %d; want at most %d, and the count equal to the claims", won, c.paused, limit)
	}
}

// A paused bucket that drifted from its holders is repaired by the second
// counter repair that sees the same difference at the same revision; one
// that moved and came back to the count the first repair read is not (its
// revision moved: every take and free moves it), until a repair sees it
// unchanged again.
func TestPausedBucketRepairNeedsTheSameRevisionTwice(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	ctx := context.Background()
	warmAt(t, s, thread(1), "sbx1")
	// takeAndFree takes sbx1's paused slot (no limit: always its home
	// bucket) and gives it up, returning the bucket.
	takeAndFree := func() int {
		t.Helper()
		rec, err := s.ClaimPause(ctx, pauseClaim("sbx1", "p", t0.Add(time.Hour)), 0)
		if err != nil {
			t.Fatalf("ClaimPause: %v", err)
		}
		if _, err := s.AbortPause(ctx, rec, t0.Add(time.Hour)); err != nil {
			t.Fatalf("AbortPause: %v", err)
		}
		return int(rec.Slots.PausedRef)
	}
	b := takeAndFree()
	if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: ddbstore.PausedPK("test", b)}, "sk": &types.AttributeValueMemberS{Value: "R"}},
		UpdateExpression:          aws.String("ADD used :n, revision :one"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "3"}, ":one": &types.AttributeValueMemberN{Value: "1"}}}); err != nil {
		t.Fatal(err) // drift, as a bug would leave it
	}
	for _, step := range []struct {
		name       string
		before     func()
		wantFix    int
		wantPaused int
	}{
		{"first sighting", func() {}, 0, 3},
		{"moved and came back", func() { takeAndFree() }, 0, 3},
		{"seen again unchanged", func() {}, -3, 0},
	} {
		step.before()
		rep, err := s.RepairCounters(ctx, 10)
		if err != nil {
			t.Fatalf("%s: RepairCounters: %v", step.name, err)
		}
		n, err := s.PausedUsed(ctx)
		if err != nil {
			t.Fatalf("%s: PausedUsed: %v", step.name, err)
		}
		if rep.PausedSlots != step.wantFix || n != step.wantPaused {
			t.Errorf("%s: paused slots corrected by %d, %d held; want %d, %d", step.name, rep.PausedSlots, n, step.wantFix, step.wantPaused)
		}
	}
}

// The paused slots are spread over the paused buckets, each within its
// share of the limit, and a pause is refused only when every bucket with
// a share is full: filling the limit one pause at a time takes every
// slot, and the first pause past it is refused.
func TestPausedSlotsFillEveryBucketBeforeRefusing(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 5, ddbstore.PausedBuckets + 8} {
		t.Run(fmt.Sprint("limit ", limit), func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			buckets := map[int]int{}
			for i := range limit + 1 {
				id := fmt.Sprintf("sbx%d", i)
				warmAt(t, s, thread(i), id)
				rec, err := s.ClaimPause(ctx, pauseClaim(id, "p", t0.Add(time.Hour)), limit)
				switch {
				case i < limit && err != nil:
					t.Fatalf("pause %d of %d: %v, want a paused slot", i+1, limit, err)
				case i == limit && !errors.Is(err, core.ErrPausedFull):
					t.Fatalf("pause past the limit = %v, want ErrPausedFull", err)
				case err == nil:
					buckets[int(rec.Slots.PausedRef)]++
				}
			}
			if n, err := s.PausedUsed(ctx); err != nil || n != limit {
				t.Errorf("paused slots held = %d, %v; want %d", n, err, limit)
			}
			if got, want := len(buckets), min(limit, ddbstore.PausedBuckets); got != want {
				t.Errorf("the paused slots are in %d buckets (%v), want %d", got, buckets, want)
			}
		})
	}
}

// TestAResumeIsCountedActiveFromItsClaim: the claim that takes a paused
// sandbox's running slot counts it active in its bucket, so that the
// settle that activates it writes no capacity bucket.
func TestAResumeIsCountedActiveFromItsClaim(t *testing.T) {
	t.Parallel()
	base, table := newTable(t)
	var txnBodies []string
	var mu sync.Mutex
	s := ddbstore.New(dynamodb.New(base.Options(), func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
			return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("txnKeys",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					if tx, ok := in.Parameters.(*dynamodb.TransactWriteItemsInput); ok {
						var keys []string
						for _, it := range tx.TransactItems {
							keys = append(keys, ddbstore.ItemPK(it))
						}
						mu.Lock()
						txnBodies = append(txnBodies, strings.Join(keys, " "))
						mu.Unlock()
					}
					return next.HandleInitialize(ctx, in)
				}), middleware.After)
		})
	}), table, "test")
	plain := ddbstore.New(base, table, "test") // the counts' reads and writes, outside txnBodies
	ctx := context.Background()
	key := thread(1)
	pausedAt(t, s, key, "sbx1")
	claimed, err := s.ClaimResume(ctx, core.ResumeClaim{Claim: pauseClaim("sbx1", "r", t0.Add(time.Hour)), Key: key, Limit: 5})
	if err != nil {
		t.Fatalf("ClaimResume: %v", err)
	}
	if st, err := counted(t, plain, 5); err != nil || st.Active != 1 || st.Transitioning != 0 || st.Used != 1 {
		t.Errorf("capacity after the resume claim = %+v, %v; want one slot, counted active", st, err)
	}
	mu.Lock()
	txnBodies = nil
	mu.Unlock()
	if _, err := s.SettleResume(ctx, claimed, t0, t0.Add(time.Hour)); err != nil {
		t.Fatalf("SettleResume: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(txnBodies) != 1 || strings.Contains(txnBodies[0], "CAP#") {
		t.Errorf("the settle's transactions wrote %q, want one that writes no capacity bucket", txnBodies)
	}
	if st, err := counted(t, plain, 5); err != nil || st.Active != 1 || st.Transitioning != 0 || st.Used != 1 {
		t.Errorf("capacity after the settle = %+v, %v; want one slot, counted active", st, err)
	}
}

// releasing makes a fresh active record for key and claims it releasing
// for owner "rel", as a release does.
func releasing(t *testing.T, s *ddbstore.Store, key core.ThreadKey, id string) core.Record {
	t.Helper()
	activeRecord(t, s, key, id)
	rec, err := s.Claim(context.Background(), core.Claim{SandboxID: id, Tenant: key.Tenant, From: []core.State{core.StateActive},
		To: core.StateReleasing, Owner: "rel", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	if err != nil {
		t.Fatalf("claim for release: %v", err)
	}
	return rec
}

func TestAPauseAtReleaseMovesTheCapacityBucketOnce(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	key := thread(1)
	rec := releasing(t, s, key, "sbx1")
	at := t0.Add(time.Second)
	claim := func(id string, fence int64) (core.Record, error) {
		return s.ClaimReleasePause(ctx, core.ReleasePause{Claim: core.Claim{SandboxID: id, Tenant: key.Tenant, Owner: "rel",
			Now: at, LeaseUntil: at.Add(time.Minute)}, Fence: fence, ExpiresAt: at.Add(30 * time.Minute), Limit: 5})
	}
	capacity := func(step string, want core.CapacityStatus) {
		t.Helper()
		st, err := counted(t, s, 5)
		if err != nil {
			t.Fatalf("%s: Capacity: %v", step, err)
		}
		if got := (core.CapacityStatus{Used: st.Used, Active: st.Active, Warm: st.Warm, Transitioning: st.Transitioning, Paused: st.Paused}); got != want {
			t.Errorf("%s: capacity %+v, want %+v", step, got, want)
		}
	}
	refusals := []struct {
		name  string
		fence int64
		drain bool
		want  error
	}{
		{"another fence", rec.Fence - 1, false, core.ErrLeaseHeld},
		{"draining", rec.Fence, true, core.ErrDraining},
	}
	for _, tc := range refusals {
		if tc.drain {
			if err := s.SetDraining(ctx, true); err != nil {
				t.Fatalf("SetDraining: %v", err)
			}
		}
		if _, err := claim("sbx1", tc.fence); !errors.Is(err, tc.want) {
			t.Errorf("%s: ClaimReleasePause = %v, want %v", tc.name, err, tc.want)
		}
		if got, _ := s.Get(ctx, "sbx1"); got.State != core.StateReleasing || got.Fence != rec.Fence {
			t.Errorf("%s: record %s fence %d, want releasing fence %d: nothing written", tc.name, got.State, got.Fence, rec.Fence)
		}
		capacity(tc.name, core.CapacityStatus{Used: 1, Transitioning: 1})
		if err := s.SetDraining(ctx, false); err != nil {
			t.Fatalf("SetDraining(false): %v", err)
		}
	}
	pausing, err := claim("sbx1", rec.Fence)
	if err != nil {
		t.Fatalf("ClaimReleasePause: %v", err)
	}
	if pausing.State != core.StatePausing || pausing.LeaseOwner != "rel" || !pausing.ParkedAt.Equal(at) || !pausing.ExpiresAt.Equal(at.Add(30*time.Minute)) {
		t.Errorf("claimed = %s lease %q parked %s expires %s; want pausing, rel's, parked %s, expiring %s",
			pausing.State, pausing.LeaseOwner, pausing.ParkedAt, pausing.ExpiresAt, at, at.Add(30*time.Minute))
	}
	// It holds its running slot until its pause settles or is given up.
	capacity("claimed", core.CapacityStatus{Used: 1, Transitioning: 1, Paused: 1})
	if _, err := s.AbortPause(ctx, pausing, at.Add(time.Second)); err != nil {
		t.Fatalf("AbortPause: %v", err)
	}
	capacity("given up", core.CapacityStatus{Used: 1, Warm: 1})
	if got, _ := s.Get(ctx, "sbx1"); got.State != core.StateWarm || !got.ParkedAt.Equal(at) {
		t.Errorf("given up: record %s parked %s, want warm, parked %s", got.State, got.ParkedAt, at)
	}

	rec2 := releasing(t, s, thread(2), "sbx2")
	p2, err := claim("sbx2", rec2.Fence)
	if err != nil {
		t.Fatalf("ClaimReleasePause(sbx2): %v", err)
	}
	if _, err := s.SettlePause(ctx, p2, at.Add(time.Second)); err != nil {
		t.Fatalf("SettlePause(sbx2): %v", err)
	}
	capacity("sbx2 paused", core.CapacityStatus{Used: 1, Warm: 1, Paused: 1})
}

// A paused count drifted over the limit (a count a repair is yet to
// correct) is left alone by the pauses it refuses: its limits are already
// as they would be set, so no pause rewrites them (which would move the
// revisions the repair compares), and the second repair corrects it.
func TestRefusedPausesLeaveADriftedCountToTheRepair(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	ctx := context.Background()
	const limit = 1
	warmAt(t, s, thread(1), "sbx1")
	rec, err := s.ClaimPause(ctx, pauseClaim("sbx1", "p", t0.Add(time.Hour)), limit)
	if err != nil {
		t.Fatalf("ClaimPause: %v", err)
	}
	if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: ddbstore.PausedPK("test", int(rec.Slots.PausedRef))}, "sk": &types.AttributeValueMemberS{Value: "R"}},
		UpdateExpression:          aws.String("ADD used :n, revision :one"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "5"}, ":one": &types.AttributeValueMemberN{Value: "1"}}}); err != nil {
		t.Fatal(err) // drift, as a bug would leave it
	}
	warmAt(t, s, thread(2), "sbx2")
	for pass := range 2 {
		if _, err := s.ClaimPause(ctx, pauseClaim("sbx2", "p", t0.Add(time.Hour)), limit); !errors.Is(err, core.ErrPausedFull) {
			t.Fatalf("pass %d: a pause past the drifted count = %v, want ErrPausedFull", pass, err)
		}
		if _, err := s.RepairCounters(ctx, 10); err != nil {
			t.Fatalf("pass %d: RepairCounters: %v", pass, err)
		}
	}
	if n, err := s.PausedUsed(ctx); err != nil || n != 1 {
		t.Errorf("paused slots held after two repairs = %d, %v; want 1 (the drift corrected)", n, err)
	}
}
