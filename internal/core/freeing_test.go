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
)

// peerFreesOnRefusal is a store on which a peer (a webhook, reconcile)
// finishes destroying a record, freeing its slot, right after the second
// reservation it refuses for capacity: an acquire that answers the first
// refusal never sees the slot freed.
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if errors.As(err, &ce) && s.tomb != nil && !s.freed {
		if s.refusals++; s.refusals < 2 {
			return err
		}
		s.freed = true
		if ferr := s.Store.Free(ctx, *s.tomb, r.Now); ferr != nil {
			return ferr
		}
	}
	return err
}

// TestAcquireWaitsForAPeerFreeingTheThreadsSandbox: the provider ended
// the thread's only sandbox and a peer holds its lease, destroying it,
// when the thread acquires in a deployment of one slot. The create is
// refused while the ended sandbox still holds the slot; the acquire waits
// for the peer's free and creates, rather than answer 429.
func TestAcquireWaitsForAPeerFreeingTheThreadsSandbox(t *testing.T) {
	store := &peerFreesOnRefusal{Store: memstore.New()}
	h := wire(t, &harness{store: store, prov: coretest.NewFakeProvider()}, func(s *core.Settings) { s.Replicas = 1 })
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
