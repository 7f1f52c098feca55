package ddbstore_test

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

// TestWaiterPlacesBoundConcurrentWaiters: of many concurrent waiters of
// one tenant exactly Max get a place, each a different one, the others
// are refused too_many_waiters; another tenant has places of its own; a
// place given back, or lapsed (its waiter died), is taken again.
func TestWaiterPlacesBoundConcurrentWaiters(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	const max, n = 3, 16
	until := t0.Add(time.Minute)
	var mu sync.Mutex
	places := map[int]core.Ticket{}
	refused := 0
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := core.Waiter{Tenant: "hog", Ticket: fmt.Sprint("w", i), Max: max, Now: t0, Until: until}
			tk, err := s.EnterWait(ctx, w)
			var ce *core.CapacityError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				if other, dup := places[tk.Place]; dup {
					t.Errorf("place %d given to %s and %s", tk.Place, other.ID, w.Ticket)
				}
				places[tk.Place] = tk
			case errors.As(err, &ce) && ce.Reason == api.RefusalTooManyWaiters:
				refused++
			default:
				t.Errorf("EnterWait(%s): %v", w.Ticket, err)
			}
		}()
	}
	wg.Wait()
	if len(places) != max || refused != n-max {
		t.Fatalf("%d places taken, %d refused; want %d and %d", len(places), refused, max, n-max)
	}
	if _, err := s.EnterWait(ctx, core.Waiter{Tenant: "acme", Ticket: "a", Max: max, Now: t0, Until: until}); err != nil {
		t.Errorf("another tenant's waiter: %v", err)
	}
	// Given back: the place is free again.
	if err := s.LeaveWait(ctx, places[0], t0, time.Second); err != nil {
		t.Fatal(err)
	}
	if tk, err := s.EnterWait(ctx, core.Waiter{Tenant: "hog", Ticket: "again", Max: max, Now: t0, Until: until}); err != nil || tk.Place != 0 {
		t.Errorf("after a leave: place %d, %v; want place 0", tk.Place, err)
	}
	// A stale leave (the place lapsed and was retaken) leaves it alone.
	if err := s.LeaveWait(ctx, places[0], t0, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnterWait(ctx, core.Waiter{Tenant: "hog", Ticket: "x", Max: max, Now: t0, Until: until}); err == nil {
		t.Error("a stale leave freed another waiter's place")
	}
	// Waiters that died: once their Until passed their places are free.
	later := until.Add(time.Millisecond)
	for i := range max {
		if _, err := s.EnterWait(ctx, core.Waiter{Tenant: "hog", Ticket: fmt.Sprint("late", i), Max: max, Now: later, Until: later.Add(time.Minute)}); err != nil {
			t.Errorf("late waiter %d after the others lapsed: %v", i, err)
		}
	}
}
