package ddbstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// TestOwnWarm: the owner index lists a user's (a tenant's) warm records
// only, least recently parked first: not its records in use, not those
// taken back, paused or freed, not another user's whose id its own id
// begins with, not another tenant's; a pause given up lists the record
// again, under its park time.
func TestOwnWarm(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	park := func(k core.ThreadKey, id string, at time.Duration) core.Record {
		t.Helper()
		rec := activeRecord(t, s, k, id)
		parked := t0.Add(at)
		if _, err := s.Apply(ctx, core.Update{SandboxID: id, Fence: rec.Fence, State: core.StateWarm, Now: parked,
			ParkedAt: parked, Owner: k}); err != nil {
			t.Fatalf("park %s: %v", id, err)
		}
		rec, err := s.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	key := func(tenant, user, thread string) core.ThreadKey {
		return core.ThreadKey{Tenant: tenant, User: user, Thread: thread}
	}
	park(key("acme", "alice", "a1"), "sb-a1", 3*time.Second)
	park(key("acme", "alice", "a2"), "sb-a2", time.Second)
	park(key("acme", "al", "x"), "sb-x", 0)
	park(key("acme", "bob", "b1"), "sb-b1", 2*time.Second)
	park(key("globex", "alice", "g1"), "sb-g1", -time.Second)
	activeRecord(t, s, key("acme", "alice", "a3"), "sb-a3")

	// Taken back by its thread: no longer listed.
	park(key("acme", "alice", "a4"), "sb-a4", -2*time.Second)
	if _, err := s.Claim(ctx, core.Claim{SandboxID: "sb-a4", Tenant: "acme", From: []core.State{core.StateWarm},
		To: core.StateActive, Owner: "o", Now: t0}); err != nil {
		t.Fatalf("reclaim: %v", err)
	}
	// Evicted and freed.
	park(key("acme", "bob", "b2"), "sb-b2", -3*time.Second)
	evicted, err := s.Claim(ctx, core.Claim{SandboxID: "sb-b2", Tenant: "acme", From: []core.State{core.StateWarm},
		To: core.StateDestroying, Owner: "o", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	if err != nil {
		t.Fatalf("evict claim: %v", err)
	}
	if err := s.Free(ctx, evicted, t0); err != nil {
		t.Fatalf("free: %v", err)
	}
	// Paused: not listed (a paused sandbox holds no slot of its quota).
	park(key("acme", "carol", "c1"), "sb-c1", -4*time.Second)
	claimC := core.Claim{SandboxID: "sb-c1", Tenant: "acme", To: core.StatePausing, Owner: "o", Now: t0, LeaseUntil: t0.Add(time.Minute)}
	pausing, err := s.ClaimPause(ctx, claimC, 5)
	if err != nil {
		t.Fatalf("claim pause: %v", err)
	}
	if _, err := s.SettlePause(ctx, pausing, t0); err != nil {
		t.Fatalf("settle pause: %v", err)
	}
	// A pause given up: warm again, listed under its park time.
	park(key("acme", "dave", "d1"), "sb-d1", 4*time.Second)
	claimD := claimC
	claimD.SandboxID = "sb-d1"
	pausing, err = s.ClaimPause(ctx, claimD, 5)
	if err != nil {
		t.Fatalf("claim pause: %v", err)
	}
	if mid, err := s.OwnWarm(ctx, "acme", "dave", 5); err != nil || len(mid) != 0 {
		t.Errorf("OwnWarm(acme, dave) while pausing = %v, %v; want none", mid, err)
	}
	if _, err := s.AbortPause(ctx, pausing, t0); err != nil {
		t.Fatalf("abort pause: %v", err)
	}

	cases := []struct {
		tenant, user string
		limit        int
		want         []string
	}{
		{"acme", "alice", 5, []string{"sb-a2", "sb-a1"}},
		{"acme", "alice", 1, []string{"sb-a2"}},
		{"acme", "al", 5, []string{"sb-x"}},
		{"acme", "bob", 5, []string{"sb-b1"}},
		{"acme", "carol", 5, nil},
		{"acme", "dave", 5, []string{"sb-d1"}},
		{"acme", "", 10, []string{"sb-x", "sb-a2", "sb-b1", "sb-a1", "sb-d1"}},
		{"acme", "", 2, []string{"sb-x", "sb-a2"}},
		{"globex", "", 10, []string{"sb-g1"}},
		{"globex", "alice", 10, []string{"sb-g1"}},
		{"initech", "", 10, nil},
	}
	for _, c := range cases {
		recs, err := s.OwnWarm(ctx, c.tenant, c.user, c.limit)
		if err != nil {
			t.Fatalf("OwnWarm(%s, %q, %d): %v", c.tenant, c.user, c.limit, err)
		}
		var got []string
		for _, r := range recs {
			got = append(got, r.SandboxID)
			full, err := s.Get(ctx, r.SandboxID)
			if err != nil {
				t.Fatal(err)
			}
			if r.ThreadKey != full.ThreadKey || r.State != core.StateWarm || full.State != core.StateWarm || !r.ParkedAt.Equal(full.ParkedAt) {
				t.Errorf("OwnWarm(%s, %q) entry %s = thread %s state %s parked %v, record says %s %s %v",
					c.tenant, c.user, r.SandboxID, r.ThreadKey, r.State, r.ParkedAt, full.ThreadKey, full.State, full.ParkedAt)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("OwnWarm(%s, %q, %d) = %v, want %v", c.tenant, c.user, c.limit, got, c.want)
		}
	}
}

// TestOwnWarmSpreadsTenants: one tenant's warm records go under several
// owner index keys (by user), so its parks do not all write one index
// partition, while each user's stay under one.
func TestOwnWarmSpreadsTenants(t *testing.T) {
	t.Parallel()
	shards := map[int]bool{}
	for _, u := range []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8", "u9"} {
		shards[ddbstore.OwnerShard(u)] = true
	}
	if len(shards) < 4 {
		t.Errorf("ten users fall in %d owner index shards, want them spread", len(shards))
	}
}
