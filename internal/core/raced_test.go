package core_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// racedStore is the store whose next losses reservations lose their
// races: refused for capacity with room left (CapacityError.Raced), as a
// take refused after peers took every slot it tried.
type racedStore struct {
	*ddbstore.Store
	losses atomic.Int32
}

func (s *racedStore) Reserve(ctx context.Context, r core.Reservation) error {
	if s.losses.Add(-1) >= 0 {
		// Its read counted the warm sandbox: an eviction would look.
		return &core.CapacityError{Reason: api.RefusalCapacity, Raced: true, Status: core.CapacityStatus{Limit: r.Limit, Used: 1, Warm: 1}}
	}
	return s.Store.Reserve(ctx, r)
}

// TestARaceLostIsNotAFullDeployment: an acquire whose reservation lost
// its races for the room there was neither answers a capacity refusal
// nor evicts a warm sandbox for it: it tries again, whatever the policy.
func TestARaceLostIsNotAFullDeployment(t *testing.T) {
	for _, policy := range []core.OverflowPolicy{core.PolicyReject, core.PolicyWait} {
		t.Run(string(policy), func(t *testing.T) {
			client := testenv.DynamoClient(t)
			table := freshTable(t, client, "raced")
			s := core.DefaultSettings()
			s.Deployment, s.Replicas, s.Policy = "test", 2, policy
			store := &racedStore{Store: ddbstore.New(client, table, s.Deployment)}
			c := &clock{}
			eng, err := core.New(s, store, coretest.NewFakeProvider(), &fakeSyncer{}, core.WithClock(c.now))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			res, err := eng.Acquire(ctx, key("t1"))
			if err != nil {
				t.Fatalf("Acquire(t1): %v", err)
			}
			if _, err := eng.Release(ctx, "acme", res.Record.SandboxID); err != nil {
				t.Fatalf("Release(t1): %v", err)
			}
			store.losses.Store(2)
			if res, err := eng.Acquire(ctx, key("t2")); err != nil || res.Source != core.SourceCreated {
				t.Fatalf("Acquire(t2) after two lost races = %s, %v; want created", res.Source, err)
			}
			got, err := store.Get(ctx, res.Record.SandboxID)
			if err != nil || got.State != core.StateWarm {
				t.Errorf("t1's sandbox = %s, %v; want it still warm (nothing evicted for a lost race)", got.State, err)
			}
			if policy != core.PolicyReject {
				return
			}
			// Races lost every time: a few tries, then the refusal.
			store.losses.Store(100)
			_, err = eng.Acquire(ctx, key("t3"))
			var ce *core.CapacityError
			if !errors.As(err, &ce) || !ce.Raced {
				t.Errorf("Acquire(t3) losing every race = %v, want its last refusal", err)
			}
			if tries := 100 - store.losses.Load(); tries > 5 {
				t.Errorf("Acquire(t3) tried %d reservations, want a few", tries)
			}
		})
	}
}
