package core_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

func userKey(tenant, user, thread string) core.ThreadKey {
	return core.ThreadKey{Tenant: tenant, User: user, Thread: thread}
}

// A quota refusal (user_quota, tenant_quota) evicts the caller's own warm
// sandboxes first: the user's least recently parked one for its user
// quota, the tenant's (any of its users') for its tenant quota, never
// another tenant's and never one in use. It refuses only when every
// counted slot is held by a sandbox in use, and at once under the wait
// policy (a quota is not waited for).
func TestQuotaEvictsOwnWarm(t *testing.T) {
	type held struct {
		key  core.ThreadKey
		warm bool // released (parked warm) after all were acquired, in this order
	}
	cases := []struct {
		name               string
		maxUser, maxTenant int
		held               []held
		next               core.ThreadKey
		wantReason         api.RefusalReason // "": the acquire succeeds
		wantEvicted        []int             // indexes into held
	}{
		{
			name: "user at quota, all warm: its least recently parked evicted", maxUser: 2,
			held: []held{{userKey("acme", "alice", "a"), true}, {userKey("acme", "alice", "b"), true}},
			next: userKey("acme", "alice", "c"), wantEvicted: []int{0},
		},
		{
			name: "user at quota, one in use: only the warm one evicted", maxUser: 2,
			held: []held{{userKey("acme", "alice", "a"), false}, {userKey("acme", "alice", "b"), true}},
			next: userKey("acme", "alice", "c"), wantEvicted: []int{1},
		},
		{
			name: "user at quota, all in use: refused", maxUser: 2,
			held: []held{{userKey("acme", "alice", "a"), false}, {userKey("acme", "alice", "b"), false}},
			next: userKey("acme", "alice", "c"), wantReason: api.RefusalUserQuota,
		},
		{
			name: "user quota: another user's warm sandbox is not the user's to evict", maxUser: 1,
			held: []held{{userKey("acme", "bob", "x"), true}, {userKey("acme", "alice", "a"), false}},
			next: userKey("acme", "alice", "c"), wantReason: api.RefusalUserQuota,
		},
		{
			name: "user and tenant quota: the user's own evicted, not the tenant's older one", maxUser: 2, maxTenant: 3,
			held: []held{{userKey("acme", "bob", "x"), true}, {userKey("acme", "alice", "a"), true}, {userKey("acme", "alice", "b"), true}},
			next: userKey("acme", "alice", "c"), wantEvicted: []int{1},
		},
		{
			name: "tenant at quota, all warm: the tenant's least recently parked evicted", maxTenant: 2,
			held: []held{{userKey("acme", "alice", "a"), true}, {userKey("acme", "bob", "b"), true}},
			next: userKey("acme", "carol", "c"), wantEvicted: []int{0},
		},
		{
			name: "tenant at quota: another user's warm sandbox of the tenant evicted", maxTenant: 2,
			held: []held{{userKey("acme", "alice", "a"), false}, {userKey("acme", "bob", "b"), true}},
			next: userKey("acme", "alice", "c"), wantEvicted: []int{1},
		},
		{
			name: "tenant at quota, all in use: refused", maxTenant: 2,
			held: []held{{userKey("acme", "alice", "a"), false}, {userKey("acme", "bob", "b"), false}},
			next: userKey("acme", "carol", "c"), wantReason: api.RefusalTenantQuota,
		},
		{
			name: "tenant quota never evicts another tenant's warm sandbox", maxTenant: 1,
			held: []held{{userKey("globex", "gina", "g"), true}, {userKey("acme", "alice", "a"), false}},
			next: userKey("acme", "alice", "c"), wantReason: api.RefusalTenantQuota,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var queued atomic.Int32
			h := newHarness(t, func(s *core.Settings) {
				s.Replicas, s.MaxPerUser, s.MaxPerTenant = 10, c.maxUser, c.maxTenant
				s.Policy = core.PolicyWait
			}, core.WithWaitObserver(func(core.WaitNote) { queued.Add(1) }))
			ctx := context.Background()
			recs := make([]core.Record, len(c.held))
			for i, hd := range c.held {
				recs[i] = h.acquire(t, hd.key, core.SourceCreated)
			}
			for i, hd := range c.held {
				if !hd.warm {
					continue
				}
				if _, err := h.eng.Release(ctx, recs[i].Tenant, recs[i].SandboxID); err != nil {
					t.Fatalf("Release(%s): %v", hd.key, err)
				}
				h.clock.advance(time.Second) // distinct park times: the LRU order is defined
			}

			res, err := h.eng.Acquire(ctx, c.next)
			if c.wantReason == "" {
				if err != nil {
					t.Fatalf("Acquire(%s) = %v, want a sandbox", c.next, err)
				}
				if res.Source != core.SourceCreated {
					t.Errorf("Acquire(%s) source = %s, want %s", c.next, res.Source, core.SourceCreated)
				}
			} else {
				var ce *core.CapacityError
				if !errors.As(err, &ce) || ce.Reason != c.wantReason {
					t.Fatalf("Acquire(%s) = %v, want 429 %s", c.next, err, c.wantReason)
				}
			}
			if n := queued.Load(); n != 0 {
				t.Errorf("%d wait-queue notes, want none: a quota refusal does not wait", n)
			}
			for i, rec := range recs {
				evicted := false
				for _, j := range c.wantEvicted {
					evicted = evicted || i == j
				}
				if got := h.prov.Alive(rec.SandboxID); got == evicted {
					t.Errorf("held[%d] (%s, warm %v) alive = %v, want %v", i, c.held[i].key, c.held[i].warm, got, !evicted)
				}
				if !evicted {
					continue
				}
				stored, err := h.store.Get(ctx, rec.SandboxID)
				if err != nil || stored.State != core.StateGone {
					t.Errorf("held[%d] evicted: stored state = %s (%v), want %s (its slot freed)", i, stored.State, err, core.StateGone)
				}
			}
		})
	}
}

// Concurrent acquires of one user (or one tenant) at its quota, with some
// of its slots warm: each warm sandbox is evicted at most once, the
// sandbox in use never, and no more sandboxes run for the user (tenant)
// than its quota allows, whatever the interleaving.
func TestQuotaEvictionConcurrent(t *testing.T) {
	cases := []struct {
		name               string
		maxUser, maxTenant int
		users              []string // the users of the held sandboxes and of the new acquires, in turn
		reason             api.RefusalReason
	}{
		{name: "one user", maxUser: 3, users: []string{"alice"}, reason: api.RefusalUserQuota},
		{name: "one tenant, three users", maxTenant: 3, users: []string{"alice", "bob", "carol"}, reason: api.RefusalTenantQuota},
	}
	const acquirers = 8
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, func(s *core.Settings) {
				s.Replicas, s.MaxPerUser, s.MaxPerTenant = 20, c.maxUser, c.maxTenant
				s.Policy = core.PolicyReject
			})
			ctx := context.Background()
			user := func(i int) string { return c.users[i%len(c.users)] }
			inUse := h.acquire(t, userKey("acme", user(0), "held-0"), core.SourceCreated)
			var warm []core.Record
			for i := 1; i < 3; i++ {
				rec := h.acquire(t, userKey("acme", user(i), fmt.Sprintf("held-%d", i)), core.SourceCreated)
				if _, err := h.eng.Release(ctx, rec.Tenant, rec.SandboxID); err != nil {
					t.Fatalf("Release: %v", err)
				}
				h.clock.advance(time.Second)
				warm = append(warm, rec)
			}

			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				got     []core.Record
				refused int
			)
			start := make(chan struct{})
			for i := range acquirers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					res, err := h.eng.Acquire(ctx, userKey("acme", user(i), fmt.Sprintf("new-%d", i)))
					mu.Lock()
					defer mu.Unlock()
					var ce *core.CapacityError
					switch {
					case err == nil:
						got = append(got, res.Record)
					case errors.As(err, &ce) && ce.Reason == c.reason:
						refused++
					default:
						t.Errorf("Acquire: %v, want a sandbox or 429 %s", err, c.reason)
					}
				}()
			}
			close(start)
			wg.Wait()

			if len(got) != len(warm) || refused != acquirers-len(warm) {
				t.Errorf("%d acquires got a sandbox and %d were refused, want %d and %d (one per warm sandbox evicted)",
					len(got), refused, len(warm), acquirers-len(warm))
			}
			if !h.prov.Alive(inUse.SandboxID) {
				t.Error("the sandbox in use was evicted")
			}
			for _, rec := range warm {
				if h.prov.Alive(rec.SandboxID) {
					t.Errorf("warm %s alive, want evicted for a new thread", rec.SandboxID)
				}
			}
			for _, rec := range got {
				if !h.prov.Alive(rec.SandboxID) {
					t.Errorf("sandbox %s handed out, then evicted", rec.SandboxID)
				}
			}
			if n, quota := h.prov.Live(), max(c.maxUser, c.maxTenant); n > quota {
				t.Errorf("%d sandboxes run for the quota of %d", n, quota)
			}
		})
	}
}
