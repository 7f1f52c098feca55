package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// newStore creates a fresh table on DynamoDB Local and a store over it.
func newStore(t *testing.T) *ddbstore.Store {
	t.Helper()
	client, table := newTable(t)
	return ddbstore.New(client, table, "test")
}

// newTable creates a fresh table on DynamoDB Local.
func newTable(t *testing.T) (*dynamodb.Client, string) {
	t.Helper()
	client := testenv.DynamoClient(t)
	table := testenv.UniqueName(t, "store")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ddbstore.CreateTable(ctx, client, table); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	return client, table
}

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

func thread(n int) core.ThreadKey {
	return core.ThreadKey{Tenant: "acme", User: "u1", Thread: fmt.Sprintf("t%d", n)}
}

// counted is s's capacity after a counter repair for limit: the counts
// by state as of that repair (Capacity reads what the last one kept).
func counted(t *testing.T, s *ddbstore.Store, limit int) (core.CapacityStatus, error) {
	t.Helper()
	if _, err := s.RepairCounters(context.Background(), limit); err != nil {
		t.Fatalf("RepairCounters: %v", err)
	}
	return s.Capacity(context.Background())
}

// activeRecord reserves a slot for key and finalizes it as sandbox id.
func activeRecord(t *testing.T, s *ddbstore.Store, key core.ThreadKey, id string) core.Record {
	t.Helper()
	ctx := context.Background()
	token := "res-" + id
	if err := s.Reserve(ctx, core.Reservation{Token: token, ThreadKey: key, Limit: 100, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	rec, err := s.Finalize(ctx, token, core.Record{SandboxID: id, ThreadKey: key, State: core.StateActive, Backend: "e2b",
		Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: "tok"}, CreatedAt: t0, UpdatedAt: t0})
	if err != nil {
		t.Fatalf("Finalize: %v", err)
	}
	return rec
}

func TestReserveFinalizeBindsThread(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	key := thread(1)
	rec := activeRecord(t, s, key, "sbx1")
	look, err := s.Lookup(ctx, key, 100)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if b := look.Binding; !look.Bound || b.SandboxID != "sbx1" || b.Reservation != "" {
		t.Errorf("binding = %+v, want sandbox sbx1 and no reservation", look)
	}
	if st, err := counted(t, s, 100); err != nil || st.Used != 1 || st.Active != 1 || look.Draining {
		t.Errorf("capacity = %+v, %v, draining %v; want used 1, active 1, not draining", st, err, look.Draining)
	}
	got, err := s.Get(ctx, "sbx1")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.State != core.StateActive || got.Tenant != "acme" || got.Fence != rec.Fence || got.Endpoint != rec.Endpoint {
		t.Errorf("Get = %+v, want active acme record with fence %d", got, rec.Fence)
	}
	st, err := counted(t, s, 100)
	if err != nil {
		t.Fatalf("Capacity: %v", err)
	}
	if st.Used != 1 || st.Active != 1 || st.Reserved != 0 {
		t.Errorf("capacity = %+v, want used 1, active 1, reserved 0", st)
	}
}

func TestReserveRefusesSecondBindingForThread(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	key := thread(1)
	activeRecord(t, s, key, "sbx1")
	err := s.Reserve(ctx, core.Reservation{Token: "res-2", ThreadKey: key, Limit: 100, Now: t0, ExpiresAt: t0.Add(time.Minute)})
	if !errors.Is(err, core.ErrThreadBound) {
		t.Fatalf("second Reserve = %v, want ErrThreadBound", err)
	}
	// Replacing works only when naming the sandbox the binding holds.
	err = s.Reserve(ctx, core.Reservation{Token: "res-3", ThreadKey: key, Limit: 100, Now: t0, ReplaceSandboxID: "other"})
	if !errors.Is(err, core.ErrThreadBound) {
		t.Fatalf("Reserve replacing wrong id = %v, want ErrThreadBound", err)
	}
	if err := s.Reserve(ctx, core.Reservation{Token: "res-4", ThreadKey: key, Limit: 100, Now: t0, ReplaceSandboxID: "sbx1"}); err != nil {
		t.Fatalf("Reserve replacing sbx1: %v", err)
	}
	st, _ := counted(t, s, 100)
	if st.Used != 2 || st.Reserved != 1 {
		t.Errorf("capacity = %+v, want used 2 (old record keeps its slot), reserved 1", st)
	}
}

// TestReserveNeverExceedsLimitUnderConcurrency is invariant 1 for the store:
// many goroutines reserving for distinct threads get exactly limit slots.
func TestReserveNeverExceedsLimitUnderConcurrency(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	const limit, workers = 5, 40
	var ok, full atomic.Int32
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Reserve(ctx, core.Reservation{Token: fmt.Sprintf("res-%d", i), ThreadKey: thread(i), Limit: limit, Now: t0, ExpiresAt: t0.Add(time.Minute)})
			var ce *core.CapacityError
			switch {
			case err == nil:
				ok.Add(1)
			case errors.As(err, &ce):
				full.Add(1)
			default:
				t.Errorf("Reserve %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != limit || full.Load() != workers-limit {
		t.Errorf("reserved %d, refused %d; want %d and %d", ok.Load(), full.Load(), limit, workers-limit)
	}
	st, _ := counted(t, s, limit)
	if st.Used != limit || st.Reserved != limit {
		t.Errorf("capacity = %+v, want used and reserved %d", st, limit)
	}
}

// TestClaimHasOneWinner: concurrent claims of one warm record; exactly one
// takes the lease, the others see ErrLeaseHeld or ErrConflict.
func TestClaimHasOneWinner(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	for iter := range 5 {
		id := fmt.Sprintf("sbx%d", iter)
		rec := activeRecord(t, s, thread(iter), id)
		rec, err := s.Apply(ctx, core.Update{SandboxID: id, Fence: rec.Fence, State: core.StateWarm, Now: t0, ParkedAt: t0})
		if err != nil {
			t.Fatalf("park: %v", err)
		}
		var wins atomic.Int32
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.Claim(ctx, core.Claim{SandboxID: id, Tenant: "acme", From: []core.State{core.StateWarm, core.StateActive},
					To: core.StateActive, Owner: fmt.Sprintf("w%d", w), Now: t0, LeaseUntil: t0.Add(time.Minute)})
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, core.ErrLeaseHeld), errors.Is(err, core.ErrConflict):
				default:
					t.Errorf("Claim: %v", err)
				}
			}()
		}
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("iteration %d: %d claims won, want exactly 1", iter, wins.Load())
		}
	}
}

func TestClaimClassifiesRefusals(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	rec := activeRecord(t, s, thread(1), "sbx1")
	claim := func(tenant string, from core.State, owner string, now time.Time) error {
		_, err := s.Claim(ctx, core.Claim{SandboxID: "sbx1", Tenant: tenant, From: []core.State{from}, To: core.StateReleasing,
			Owner: owner, Now: now, LeaseUntil: now.Add(time.Minute)})
		return err
	}
	if err := claim("other", core.StateActive, "a", t0); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("foreign tenant claim = %v, want ErrNotFound", err)
	}
	if err := claim("acme", core.StateWarm, "a", t0); !errors.Is(err, core.ErrConflict) {
		t.Errorf("wrong state claim = %v, want ErrConflict", err)
	}
	if _, err := s.Claim(ctx, core.Claim{SandboxID: "nope", Tenant: "acme", From: []core.State{core.StateActive}, Owner: "a", Now: t0}); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("missing record claim = %v, want ErrNotFound", err)
	}
	if err := claim("acme", core.StateActive, "a", t0); err != nil {
		t.Fatalf("claim: %v", err)
	}
	// Peer lease is live: refused; once it lapses a peer may take over.
	if _, err := s.Claim(ctx, core.Claim{SandboxID: "sbx1", Tenant: "acme", From: []core.State{core.StateReleasing}, Owner: "b", Now: t0.Add(30 * time.Second), LeaseUntil: t0.Add(2 * time.Minute)}); !errors.Is(err, core.ErrLeaseHeld) {
		t.Errorf("claim under live lease = %v, want ErrLeaseHeld", err)
	}
	got, err := s.Claim(ctx, core.Claim{SandboxID: "sbx1", Tenant: "acme", From: []core.State{core.StateReleasing}, Owner: "b", Now: t0.Add(2 * time.Minute), LeaseUntil: t0.Add(3 * time.Minute)})
	if err != nil {
		t.Fatalf("claim after lease lapsed: %v", err)
	}
	if got.LeaseOwner != "b" || got.Fence != rec.Fence+2 {
		t.Errorf("after takeover lease=%q fence=%d, want b and %d", got.LeaseOwner, got.Fence, rec.Fence+2)
	}
	// The first owner's fence is stale now.
	if _, err := s.Apply(ctx, core.Update{SandboxID: "sbx1", Fence: rec.Fence + 1, State: core.StateWarm, Now: t0, ParkedAt: t0}); !errors.Is(err, core.ErrStaleFence) {
		t.Errorf("apply with stale fence = %v, want ErrStaleFence", err)
	}
}

func TestFreeReleasesSlotOnceAndIndexesFollowState(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	rec := activeRecord(t, s, thread(1), "sbx1")
	warm, err := s.Apply(ctx, core.Update{SandboxID: "sbx1", Fence: rec.Fence, State: core.StateWarm, Now: t0, ParkedAt: t0})
	if err != nil {
		t.Fatalf("park: %v", err)
	}
	idle, err := s.WarmParkedBefore(ctx, t0.Add(time.Second), 10)
	if err != nil || len(idle) != 1 || idle[0].SandboxID != "sbx1" {
		t.Fatalf("WarmParkedBefore = %v, %v; want [sbx1]", idle, err)
	}
	if idle, _ := s.WarmParkedBefore(ctx, t0, 10); len(idle) != 0 {
		t.Errorf("WarmParkedBefore(park time) = %v, want none", idle)
	}
	tomb, err := s.Apply(ctx, core.Update{SandboxID: "sbx1", Fence: warm.Fence, State: core.StateDestroying, KeepLease: true, Now: t0, KillAttempt: true})
	if err != nil {
		t.Fatalf("tombstone: %v", err)
	}
	if tombs, _ := s.Tombstones(ctx, 10); len(tombs) != 1 || tombs[0].KillAttempts != 1 || !tombs[0].DestroyingSince.Equal(t0) {
		t.Errorf("Tombstones = %+v, want sbx1 with 1 kill attempt, destroying since %s", tombs, t0)
	}
	// A kill retry keeps the first tombstoning time.
	tomb, err = s.Claim(ctx, core.Claim{SandboxID: "sbx1", Tenant: "acme", From: []core.State{core.StateDestroying},
		To: core.StateDestroying, Owner: "retrier", Now: t0.Add(time.Hour), LeaseUntil: t0.Add(2 * time.Hour)})
	if err != nil || !tomb.DestroyingSince.Equal(t0) {
		t.Errorf("retry claim = %+v, %v; want destroying since %s kept", tomb.DestroyingSince, err, t0)
	}
	if err := s.Free(ctx, tomb, t0); err != nil {
		t.Fatalf("Free: %v", err)
	}
	if err := s.Free(ctx, tomb, t0); !errors.Is(err, core.ErrStaleFence) {
		t.Errorf("second Free = %v, want ErrStaleFence (slot must not be freed twice)", err)
	}
	st, _ := counted(t, s, 100)
	if st.Used != 0 || st.Warm != 0 || st.Transitioning != 0 || st.Tombstones != 0 {
		t.Errorf("capacity after free = %+v, want all zero", st)
	}
	got, _ := s.Get(ctx, "sbx1")
	if got.State != core.StateGone || got.Endpoint.AccessToken != "" {
		t.Errorf("record after free = %+v, want gone without token", got)
	}
}

func TestFreeReservationReturnsSlot(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	key := thread(1)
	if err := s.Reserve(ctx, core.Reservation{Token: "res-1", ThreadKey: key, Limit: 1, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	var ce *core.CapacityError
	if err := s.Reserve(ctx, core.Reservation{Token: "res-2", ThreadKey: thread(2), Limit: 1, Now: t0}); !errors.As(err, &ce) || ce.Status.Used != 1 {
		t.Fatalf("Reserve over limit = %v, want CapacityError with used 1", err)
	}
	if err := s.FreeReservation(ctx, "res-1", key); err != nil {
		t.Fatalf("FreeReservation: %v", err)
	}
	if look, err := s.Lookup(ctx, key, 1); err != nil || look.Bound {
		t.Errorf("binding after free = %+v, %v; want none", look, err)
	}
	if err := s.FreeReservation(ctx, "res-1", key); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("second FreeReservation = %v, want ErrNotFound", err)
	}
	if err := s.Reserve(ctx, core.Reservation{Token: "res-2", ThreadKey: thread(2), Limit: 1, Now: t0}); err != nil {
		t.Errorf("Reserve after free: %v", err)
	}
}

func TestFinalizeRefusedAfterReservationTakeover(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	key := thread(1)
	if err := s.Reserve(ctx, core.Reservation{Token: "res-old", ThreadKey: key, Limit: 10, Now: t0, ExpiresAt: t0.Add(time.Second)}); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	if err := s.Reserve(ctx, core.Reservation{Token: "res-new", ThreadKey: key, Limit: 10, Now: t0.Add(time.Minute), ReplaceReservation: "res-old"}); err != nil {
		t.Fatalf("takeover Reserve: %v", err)
	}
	_, err := s.Finalize(ctx, "res-old", core.Record{SandboxID: "late", ThreadKey: key, State: core.StateActive, CreatedAt: t0, UpdatedAt: t0})
	if !errors.Is(err, core.ErrConflict) {
		t.Fatalf("Finalize of superseded reservation = %v, want ErrConflict", err)
	}
	if _, err := s.Get(ctx, "late"); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("record of refused finalize = %v, want ErrNotFound", err)
	}
}

func TestDrainingRefusesReservations(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	rec := activeRecord(t, s, thread(1), "sbx1")
	if err := s.SetDraining(ctx, true); err != nil {
		t.Fatalf("SetDraining: %v", err)
	}
	var ce *core.CapacityError
	err := s.Reserve(ctx, core.Reservation{Token: "res-2", ThreadKey: thread(2), Limit: 10, Now: t0})
	if !errors.As(err, &ce) || ce.Reason != "draining" {
		t.Fatalf("Reserve while draining = %v, want CapacityError reason draining", err)
	}
	if draining, err := s.Draining(ctx); err != nil || !draining {
		t.Errorf("Draining = %v, %v; want true", draining, err)
	}
	for n := range 20 { // every thread's lookup reads one of the buckets
		if look, _ := s.Lookup(ctx, thread(n), 10); !look.Draining {
			t.Errorf("lookup of %s = %+v, want draining", thread(n), look)
		}
	}
	if err := s.SetDraining(ctx, false); err != nil {
		t.Fatalf("undrain: %v", err)
	}
	if _, err := s.Apply(ctx, core.Update{SandboxID: "sbx1", Fence: rec.Fence, State: core.StateWarm, Now: t0, ParkedAt: t0}); err != nil {
		t.Errorf("park after undrain: %v", err)
	}
	if err := s.Reserve(ctx, core.Reservation{Token: "res-3", ThreadKey: thread(2), Limit: 10, Now: t0}); err != nil {
		t.Errorf("Reserve after undrain: %v", err)
	}
}

// TestPerUserQuotaMovesWithTheSlot: SANDBOX_MAX_PER_USER is enforced in the
// same transaction as the deployment slot, and freeing returns both.
func TestPerUserQuotaMovesWithTheSlot(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	alice := func(n int) core.ThreadKey {
		return core.ThreadKey{Tenant: "acme", User: "alice", Thread: fmt.Sprint("t", n)}
	}
	bob := core.ThreadKey{Tenant: "acme", User: "bob", Thread: "t1"}
	res := func(tok string, k core.ThreadKey) error {
		return s.Reserve(ctx, core.Reservation{Token: tok, ThreadKey: k, Limit: 10, MaxPerUser: 2, Now: t0, ExpiresAt: t0.Add(time.Minute)})
	}
	for i := range 2 {
		if err := res(fmt.Sprint("a", i), alice(i)); err != nil {
			t.Fatalf("Reserve alice %d: %v", i, err)
		}
	}
	var ce *core.CapacityError
	if err := res("a2", alice(2)); !errors.As(err, &ce) || ce.Reason != "user_quota" {
		t.Fatalf("third Reserve for alice = %v, want user_quota", err)
	}
	if err := res("b0", bob); err != nil {
		t.Fatalf("Reserve for bob: %v", err)
	}
	if st, _ := s.Capacity(ctx); st.Used != 3 {
		t.Errorf("used = %d, want 3 (the refused reservation took nothing)", st.Used)
	}
	if err := s.FreeReservation(ctx, "a0", alice(0)); err != nil {
		t.Fatalf("FreeReservation: %v", err)
	}
	if err := res("a3", alice(3)); err != nil {
		t.Errorf("Reserve after alice freed one: %v", err)
	}
}
