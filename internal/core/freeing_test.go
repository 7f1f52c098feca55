package core_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/memstore"
	"github.com/sandbox-broker/sandbox-broker/internal/storetest"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// peerFreesOnRefusal is a store on which a peer (a webhook, reconcile)
// finishes destroying tomb, freeing its slot, right after the second
// reservation it refuses for capacity (an acquire that answers the first
// refusal never sees the slot freed); with no tomb, the peer never does.
type peerFreesOnRefusal struct {
	storetest.Store
	mu       sync.Mutex
	tomb     *core.Record
	refusals int
	freed    bool
}

func (s *peerFreesOnRefusal) Reserve(ctx context.Context, r core.Reservation) error {
	err := s.Store.Reserve(ctx, r)
	var ce *core.CapacityError
	if !errors.As(err, &ce) {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refusals++; s.refusals >= 2 && s.tomb != nil && !s.freed {
		s.freed = true
		if ferr := s.Store.Free(ctx, *s.tomb, r.Now); ferr != nil {
			return ferr
		}
	}
	return err
}

// TestAcquireWaitsForAPeerFreeingTheThreadsSandbox: the provider ended
// the thread's only sandbox and a peer holds its lease, destroying it,
// when the thread acquires in a deployment of one slot (policy reject:
// under wait the refusal queues, and the peer's free serves the queue).
// The create is refused while the ended sandbox still holds the slot;
// the acquire waits for the peer's free and creates, rather than answer
// 429.
func TestAcquireWaitsForAPeerFreeingTheThreadsSandbox(t *testing.T) {
	store := &peerFreesOnRefusal{Store: memstore.New()}
	h := wire(t, &harness{store: store, prov: coretest.NewFakeProvider()}, func(s *core.Settings) { s.Replicas, s.Policy = 1, core.PolicyReject })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	now := h.clock.now()
	tomb, err := store.Claim(ctx, core.Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []core.State{core.StateActive},
		To: core.StateDestroying, Owner: "webhook", Now: now, LeaseUntil: now.Add(time.Minute)})
	if err != nil {
		t.Fatalf("peer's claim: %v", err)
	}
	if err := h.prov.Kill(ctx, rec.SandboxID); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	store.tomb = &tomb
	store.mu.Unlock()
	res := h.acquire(t, key("t1"), core.SourceCreated)
	if res.SandboxID == rec.SandboxID {
		t.Errorf("acquire handed back the ended sandbox %s", rec.SandboxID)
	}
	if !store.freed {
		t.Errorf("fewer than two reservations were refused while the ended sandbox held the slot: the case was not exercised")
	}
}

// TestAcquireRefusesWhenThePeerNeverFrees: the same, but the peer never
// frees the slot (its kill hangs): the acquire answers the capacity
// refusal once its time is out, never a lease conflict.
func TestAcquireRefusesWhenThePeerNeverFrees(t *testing.T) {
	store := &peerFreesOnRefusal{Store: memstore.New()}
	h := wire(t, &harness{store: store, prov: coretest.NewFakeProvider()}, func(s *core.Settings) { s.Replicas, s.Policy = 1, core.PolicyReject })
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	now := h.clock.now()
	if _, err := store.Claim(context.Background(), core.Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []core.State{core.StateActive},
		To: core.StateDestroying, Owner: "webhook", Now: now, LeaseUntil: now.Add(time.Hour)}); err != nil {
		t.Fatalf("peer's claim: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := h.eng.Acquire(ctx, key("t1"))
	var ce *core.CapacityError
	if !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity || errors.Is(err, core.ErrLeaseHeld) {
		t.Errorf("Acquire while the peer holds the slot = %v, want the capacity refusal", err)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.refusals < 2 {
		t.Errorf("%d refusals, want the acquire to have looked again", store.refusals)
	}
}
