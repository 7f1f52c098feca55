package core_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/memstore"
	"github.com/sandbox-broker/sandbox-broker/internal/storetest"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// slotSpy counts the frees of a store and its reservations that take a
// tombstone's slot over; with queueUnreadable set, its wait queue cannot
// be read.
type slotSpy struct {
	storetest.Store
	mu               sync.Mutex
	frees, handovers []string
	queueUnreadable  atomic.Bool
}

func (s *slotSpy) AnyWaiting(ctx context.Context, now time.Time) (bool, error) {
	if s.queueUnreadable.Load() {
		return false, fmt.Errorf("read wait queue: %w", core.ErrStoreUnavailable)
	}
	return s.Store.AnyWaiting(ctx, now)
}

func (s *slotSpy) Free(ctx context.Context, rec core.Record, now time.Time) error {
	s.mu.Lock()
	s.frees = append(s.frees, rec.SandboxID)
	s.mu.Unlock()
	return s.Store.Free(ctx, rec, now)
}

func (s *slotSpy) Reserve(ctx context.Context, r core.Reservation) error {
	if r.Handover != nil {
		s.mu.Lock()
		s.handovers = append(s.handovers, r.Handover.SandboxID)
		s.mu.Unlock()
	}
	return s.Store.Reserve(ctx, r)
}

func (s *slotSpy) counts() (frees, handovers []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.frees), slices.Clone(s.handovers)
}

// evictionHarness is a deployment of one slot under policy, its store
// spied on, whose only slot is held by the warm sandbox it returns.
func evictionHarness(t *testing.T, policy core.OverflowPolicy, opts ...core.Option) (*harness, *slotSpy, *memstore.Store, *eventLog, core.Record) {
	t.Helper()
	mem := memstore.New()
	spy := &slotSpy{Store: mem}
	events := &eventLog{}
	h := wire(t, &harness{store: spy, prov: coretest.NewFakeProvider()}, func(s *core.Settings) {
		s.Replicas, s.Policy, s.AcquireTimeout = 1, policy, time.Second
	}, append([]core.Option{core.WithEventSink(events)}, opts...)...)
	warm := h.acquire(t, key("t1"), core.SourceCreated)
	if _, err := h.eng.Release(context.Background(), "acme", warm.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	return h, spy, mem, events, warm
}

// failFirstHandover makes the first reservation that takes a slot over
// fail with f; it reports whether it did.
func failFirstHandover(mem *memstore.Store, spy *slotSpy, f memstore.Fault) *atomic.Bool {
	var failed atomic.Bool
	mem.Fail(func(op string) memstore.Fault {
		if _, handed := spy.counts(); op == "Reserve" && len(handed) == 1 && failed.CompareAndSwap(false, true) {
			return f
		}
		return memstore.Fault{}
	})
	return &failed
}

// An acquire that evicts a warm sandbox in a full deployment takes the
// slot its kill left over in the reservation itself: the evicted sandbox
// is never freed on its own, and its end is published as an eviction's.
// Under the wait policy too, when nobody waits (see
// TestEvictionFreesTheSlotWhenSomeoneMayWait).
func TestEvictionHandsTheSlotToTheNewSandbox(t *testing.T) {
	for _, c := range []struct {
		policy                core.OverflowPolicy
		wantFrees, wantHanded int
	}{{core.PolicyReject, 0, 1}, {core.PolicyBurst, 0, 1}, {core.PolicyWait, 0, 1}} {
		t.Run(string(c.policy), func(t *testing.T) {
			h, spy, _, events, warm := evictionHarness(t, c.policy)
			h.acquire(t, key("t2"), core.SourceCreated)
			frees, handed := spy.counts()
			if len(frees) != c.wantFrees || len(handed) != c.wantHanded {
				t.Errorf("frees %v, handovers %v; want %d and %d", frees, handed, c.wantFrees, c.wantHanded)
			}
			if h.prov.Alive(warm.SandboxID) {
				t.Errorf("the warm sandbox %s was not killed", warm.SandboxID)
			}
			got := events.seen(warm.SandboxID)
			for _, want := range []string{"evicted warm->destroying capacity", "destroyed warm->gone capacity"} {
				if !slices.Contains(got, want) {
					t.Errorf("events of the evicted sandbox = %v; want %q among them", got, want)
				}
			}
			if st := h.capacity(t); st.Used != 1 {
				t.Errorf("capacity = %+v; want the one slot used", st)
			}
		})
	}
}

// Under the wait policy a slot an eviction makes goes to the head of the
// wait queue when a ticket may wait there: a ticket waits, and the slot
// is freed and granted to it while the acquire that evicted queues
// behind it; or the queue cannot be read, and the slot is freed (nobody
// waits, so the acquire takes it again).
func TestEvictionFreesTheSlotWhenSomeoneMayWait(t *testing.T) {
	for _, readFails := range []bool{false, true} {
		name := map[bool]string{false: "a ticket waits", true: "the queue read fails"}[readFails]
		t.Run(name, func(t *testing.T) {
			var logs bytes.Buffer
			h, spy, mem, _, warm := evictionHarness(t, core.PolicyWait, core.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
			now := h.clock.now()
			var ticket core.Ticket
			if readFails {
				spy.queueUnreadable.Store(true)
			} else {
				var err error
				ticket, err = mem.EnterWait(context.Background(), core.Waiter{Tenant: "other", Ticket: "w1", Max: 1, Now: now, Until: now.Add(time.Minute)})
				if err != nil {
					t.Fatalf("EnterWait: %v", err)
				}
			}
			res, err := h.eng.AcquireOrWait(context.Background(), core.AcquireRequest{Key: key("t2")})
			frees, handed := spy.counts()
			if !slices.Contains(frees, warm.SandboxID) || len(handed) != 0 {
				t.Errorf("frees %v, handovers %v; want the evicted %s freed, none handed over", frees, handed, warm.SandboxID)
			}
			if logged := strings.Contains(logs.String(), "reading the wait queue failed"); logged != readFails {
				t.Errorf("the failed queue read logged: %v, want %v", logged, readFails)
			}
			if readFails {
				if err != nil || res.Waiting != nil {
					t.Errorf("acquire = %+v, %v; want a sandbox (nobody waits)", res, err)
				}
				return
			}
			if err != nil || res.Waiting == nil {
				t.Errorf("acquire = %+v, %v; want it queued behind w1", res, err)
			}
			if st, err := mem.PollTicket(context.Background(), ticket); err != nil || !st.Granted {
				t.Errorf("w1 = %+v, %v; want the freed slot granted to it", st, err)
			}
		})
	}
}

// A handover the store certainly refused (a peer moved the binding or
// the tombstone, a lowered limit) leaves the tombstone holding the slot
// unless a peer freed it: the acquire frees it as an eviction does and
// takes a slot as usual.
func TestRefusedHandoverFreesTheTombstone(t *testing.T) {
	for _, refusal := range []error{core.ErrConflict, core.ErrStaleFence} {
		t.Run(refusal.Error(), func(t *testing.T) {
			h, spy, mem, events, warm := evictionHarness(t, core.PolicyReject)
			refused := failFirstHandover(mem, spy, memstore.Fault{Err: refusal})
			h.acquire(t, key("t2"), core.SourceCreated)
			if !refused.Load() {
				t.Fatal("no handover was tried")
			}
			if frees, _ := spy.counts(); !slices.Contains(frees, warm.SandboxID) {
				t.Errorf("frees %v; want the tombstone %s freed", frees, warm.SandboxID)
			}
			if got := events.seen(warm.SandboxID); !slices.Contains(got, "destroyed warm->gone capacity") {
				t.Errorf("events of the evicted sandbox = %v; want it destroyed", got)
			}
			if st := h.capacity(t); st.Used != 1 || st.Tombstones != 0 {
				t.Errorf("capacity = %+v; want one slot used, no tombstone", st)
			}
		})
	}
}

// A handover whose reply was lost may have applied: the acquire fails
// closed (the store could not say), and nothing leaks: the slot is
// counted once, and once the reservation's time is out reconcile settles
// it and the thread's next acquire creates.
func TestHandoverWithItsReplyLost(t *testing.T) {
	h, spy, mem, _, warm := evictionHarness(t, core.PolicyReject)
	failFirstHandover(mem, spy, memstore.Fault{Err: core.ErrStoreUnavailable, Applied: true})
	ctx := context.Background()
	var ce *core.CapacityError
	if _, err := h.eng.Acquire(ctx, key("t2")); !errors.As(err, &ce) || ce.Reason != api.RefusalCapacityBackend {
		t.Fatalf("Acquire = %v; want a refusal for the store's outage", err)
	}
	if rec, err := h.store.Get(ctx, warm.SandboxID); err != nil || rec.State != core.StateGone {
		t.Errorf("tombstone = %+v, %v; want gone (the handover applied)", rec, err)
	}
	if st := h.capacity(t); st.Used != 1 {
		t.Errorf("capacity = %+v; want the slot counted once", st)
	}
	h.clock.advance(time.Hour)
	if _, err := h.eng.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	h.acquire(t, key("t2"), core.SourceCreated)
	if st := h.capacity(t); st.Used != 1 {
		t.Errorf("capacity after the retry = %+v; want one slot used", st)
	}
}
