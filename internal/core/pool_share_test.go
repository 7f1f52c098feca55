package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// A tenant at its fair share does not claim pool members: it creates, and
// the member left is another tenant's to claim. Six slots, four members
// and a second tenant holding one slot make acme's share three.
func TestPoolClaimsBoundedByFairShare(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 6; s.Policy = core.PolicyReject },
		core.WithPool(core.PoolSettings{Size: 4, MaxAge: 10 * time.Minute, Parked: core.PoolParkedRunning}))
	zeta := func(thread string) core.ThreadKey { return core.ThreadKey{Tenant: "zeta", User: "zed", Thread: thread} }
	h.acquire(t, zeta("z1"), core.SourceCreated)
	h.refill(t, 4)
	for _, thread := range []string{"t1", "t2", "t3"} {
		h.acquire(t, key(thread), core.SourcePool)
	}
	h.acquire(t, key("t4"), core.SourceCreated)
	if n := len(h.members(t)); n != 1 {
		t.Fatalf("pool members after acme's four acquires = %d; want 1 left for the others", n)
	}
	h.acquire(t, zeta("z2"), core.SourcePool)
}

// The share bounds concurrent claims too: the claim itself carries it, so
// acquires that all read the tenant below its share at their lookup claim
// no more members than the share.
func TestPoolClaimsBoundedByFairShareAtOnce(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 6; s.Policy = core.PolicyReject },
		core.WithPool(core.PoolSettings{Size: 4, MaxAge: 10 * time.Minute, Parked: core.PoolParkedRunning}))
	h.acquire(t, core.ThreadKey{Tenant: "zeta", User: "zed", Thread: "z1"}, core.SourceCreated)
	h.refill(t, 4)
	type out struct {
		src core.Source
		err error
	}
	results := make(chan out, 4)
	for i := range 4 {
		go func() {
			res, err := h.eng.Acquire(context.Background(), key("c"+string(rune('0'+i))))
			results <- out{res.Source, err}
		}()
	}
	claimed := 0
	for range 4 {
		r := <-results
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		if r.src == core.SourcePool {
			claimed++
		}
	}
	if claimed > 3 {
		t.Errorf("acme claimed %d members at once; its share is 3", claimed)
	}
}
