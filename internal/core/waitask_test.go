package core_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// waitSettings: one slot, the wait policy, a long wait.
func waitSettings(s *core.Settings) {
	s.Replicas, s.Policy, s.AcquireTimeout, s.MaxWaitersPerTenant = 1, core.PolicyWait, time.Hour, 10
	s.PauseAfter = core.PauseNever
}

// ask is one AcquireOrWait of k continuing ticket.
func ask(t *testing.T, e *core.Engine, k core.ThreadKey, ticket string) (core.AcquireResult, error) {
	t.Helper()
	return e.AcquireOrWait(context.Background(), core.AcquireRequest{Key: k, Ticket: ticket})
}

// TestWaitingAnswersAtOnceWithATicket: a full deployment under the wait
// policy answers an acquire with its place in the queue, without holding
// the call; asking again with the ticket keeps the place, and once the
// slot frees the ask is served.
func TestWaitingAnswersAtOnceWithATicket(t *testing.T) {
	h := newHarness(t, waitSettings)
	holder := h.acquire(t, tenantKey("x", "hold"), core.SourceCreated)
	k := tenantKey("a", "w1")
	res, err := ask(t, h.eng, k, "")
	if err != nil || res.Waiting == nil || res.Waiting.Ticket == "" {
		t.Fatalf("first ask = %+v, %v; want a waiting answer with a ticket", res, err)
	}
	if res.Waiting.RetryAfter <= 0 || !res.Waiting.Until.After(h.clock.now()) {
		t.Errorf("waiting %+v: want a retry time and a future end", res.Waiting)
	}
	again, err := ask(t, h.eng, k, res.Waiting.Ticket)
	if err != nil || again.Waiting == nil || again.Waiting.Ticket != res.Waiting.Ticket {
		t.Fatalf("second ask = %+v, %v; want the same place", again, err)
	}
	if c := h.capacity(t); c.Used != 1 {
		t.Errorf("capacity while waiting = %+v, want the holder's one slot", c)
	}
	if _, err := h.eng.Release(context.Background(), "x", holder.SandboxID); err != nil {
		t.Fatal(err)
	}
	// The holder is parked warm; the waiter's turn evicts it for itself.
	served, err := ask(t, h.eng, k, res.Waiting.Ticket)
	if err != nil || served.Waiting != nil || served.Source != core.SourceCreated {
		t.Fatalf("ask after the free = %+v, %v; want served, created", served, err)
	}
}

func TestWaitTicketValidation(t *testing.T) {
	h := newHarness(t, waitSettings)
	h.acquire(t, tenantKey("x", "hold"), core.SourceCreated)
	res, err := ask(t, h.eng, tenantKey("a", "w1"), "")
	if err != nil || res.Waiting == nil {
		t.Fatalf("ask = %+v, %v", res, err)
	}
	for name, tc := range map[string]struct {
		key    core.ThreadKey
		ticket string
	}{
		"garbage":         {tenantKey("a", "w1"), "not a ticket"},
		"another thread":  {tenantKey("a", "w2"), res.Waiting.Ticket},
		"another tenant":  {tenantKey("b", "w1"), res.Waiting.Ticket},
		"too long":        {tenantKey("a", "w1"), string(make([]byte, 2000))},
		"truncated":       {tenantKey("a", "w1"), res.Waiting.Ticket[:len(res.Waiting.Ticket)/2]},
		"altered padding": {tenantKey("a", "w1"), res.Waiting.Ticket + "=="},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ask(t, h.eng, tc.key, tc.ticket)
			var ve *core.ValidationError
			if !errors.As(err, &ve) || ve.Field != "ticket" {
				t.Errorf("ask = %v, want a validation error on the ticket", err)
			}
		})
	}
	if c := h.capacity(t); c.Used != 1 {
		t.Errorf("capacity after refused asks = %+v, want unchanged", c)
	}
}

// TestWaitEndsWithACapacityRefusal: an ask past the wait's end is refused
// for capacity and gives its place back.
func TestWaitEndsWithACapacityRefusal(t *testing.T) {
	h := newHarness(t, func(s *core.Settings) { waitSettings(s); s.AcquireTimeout = time.Minute })
	h.acquire(t, tenantKey("x", "hold"), core.SourceCreated)
	k := tenantKey("a", "w1")
	res, err := ask(t, h.eng, k, "")
	if err != nil || res.Waiting == nil {
		t.Fatalf("ask = %+v, %v", res, err)
	}
	h.clock.advance(2 * time.Minute)
	_, err = ask(t, h.eng, k, res.Waiting.Ticket)
	var ce *core.CapacityError
	if !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
		t.Fatalf("ask past the wait's end = %v, want a capacity refusal", err)
	}
	// Its place is free again: a new wait of the tenant finds one.
	if res, err := ask(t, h.eng, tenantKey("a", "w2"), ""); err != nil || res.Waiting == nil {
		t.Errorf("a new wait = %+v, %v; want queued", res, err)
	}
}

// waiter is one thread asking as an HTTP client does: with its ticket,
// until it is served.
type waiter struct {
	key    core.ThreadKey
	ticket string
	rec    core.Record
	done   bool
}

// TestAnotherTenantIsServedWithinTwoHandOffs: with one slot, tenant a
// holds it and queues six waiters; tenant b queues one a second later.
// Waiting holds no call, so b's acquire reaches the queue at once, and it
// is served first or second, whether the asks arrive one at a time (a
// function limited to one concurrent invocation) or all at once.
func TestAnotherTenantIsServedWithinTwoHandOffs(t *testing.T) {
	for _, concurrent := range []bool{false, true} {
		t.Run(fmt.Sprint("concurrent=", concurrent), func(t *testing.T) {
			h := newHarness(t, waitSettings)
			ctx := context.Background()
			holder := h.acquire(t, tenantKey("a", "hold"), core.SourceCreated)
			var ws []*waiter
			queue := func(tenant, thread string) {
				w := &waiter{key: tenantKey(tenant, thread)}
				res, err := ask(t, h.eng, w.key, "")
				if err != nil || res.Waiting == nil {
					t.Fatalf("%s queues: %+v, %v", thread, res, err)
				}
				w.ticket = res.Waiting.Ticket
				ws = append(ws, w)
			}
			for i := range 6 {
				queue("a", fmt.Sprint("a", i+1))
				h.clock.advance(10 * time.Millisecond)
			}
			h.clock.advance(time.Second)
			queue("b", "b1")
			if _, err := h.eng.Release(ctx, "a", holder.SandboxID); err != nil {
				t.Fatal(err)
			}
			var served []string
			for round := 0; len(served) < 2 && round < 20; round++ {
				h.clock.advance(time.Second)
				var mu sync.Mutex
				var wg sync.WaitGroup
				for _, w := range ws {
					if w.done {
						continue
					}
					step := func() {
						res, err := ask(t, h.eng, w.key, w.ticket)
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err != nil:
							t.Errorf("%s: %v", w.key.Thread, err)
						case res.Waiting != nil:
							w.ticket = res.Waiting.Ticket
						default:
							w.done, w.rec = true, res.Record
							served = append(served, w.key.Thread)
						}
					}
					if !concurrent {
						step()
						continue
					}
					wg.Add(1)
					go func() { defer wg.Done(); step() }()
				}
				wg.Wait()
				for _, w := range ws {
					if w.done && w.rec.SandboxID != "" {
						if _, err := h.eng.Release(ctx, w.key.Tenant, w.rec.SandboxID); err != nil {
							t.Fatalf("Release %s: %v", w.key.Thread, err)
						}
						w.rec = core.Record{}
					}
				}
			}
			if len(served) < 2 || (served[0] != "b1" && served[1] != "b1") {
				t.Errorf("served %v: want b1 among the first two", served)
			}
		})
	}
}
