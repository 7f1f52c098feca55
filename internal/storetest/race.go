package storetest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// racers is how many goroutines race in each race case.
const racers = 16

// race runs fn(i) for i in [0, racers) at once and waits for them.
func race(fn func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i)
		}()
	}
	close(start)
	wg.Wait()
}

// testRaceLedger: goroutines reserving for distinct threads never hold
// more than the limit, and fill it (a refusal while the ledger shows room
// is a lost race, tried again).
func testRaceLedger(f *fixture) {
	const limit = 5
	var won atomic.Int32
	var mu sync.Mutex
	var errs []error
	race(func(i int) {
		k := key(fmt.Sprintf("t%d", i%3), "u1", i)
		for attempt := 0; attempt < 20; attempt++ {
			err := f.reserve(k, fmt.Sprintf("res-%d", i), limit)
			if err == nil {
				won.Add(1)
				return
			}
			st, cerr := f.s.Capacity(f.ctx)
			if refusal(err) != api.RefusalCapacity || cerr != nil || st.Used >= limit {
				if refusal(err) != api.RefusalCapacity {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
				return
			}
		}
	})
	if len(errs) > 0 {
		f.t.Errorf("reservations failed other than for capacity: %v", errs)
	}
	if won.Load() != limit {
		f.t.Errorf("%d reservations won; want exactly %d", won.Load(), limit)
	}
	f.wantUsed(limit, 0)
}

// testRaceBinding: goroutines reserving for one thread: exactly one binds
// it, the others find it bound, and one slot is held.
func testRaceBinding(f *fixture) {
	k := key("acme", "u1", 1)
	var won, bound atomic.Int32
	race(func(i int) {
		switch err := f.reserve(k, fmt.Sprintf("res-%d", i), big); {
		case err == nil:
			won.Add(1)
		case errors.Is(err, core.ErrThreadBound):
			bound.Add(1)
		default:
			f.t.Errorf("Reserve %d: %v", i, err)
		}
	})
	if won.Load() != 1 || bound.Load() != racers-1 {
		f.t.Errorf("won %d, found bound %d; want 1 and %d", won.Load(), bound.Load(), racers-1)
	}
	f.wantUsed(1, 0)
}

// testRaceTicket: goroutines taking one ticket's grant for distinct
// threads, while its waiter leaves: the slot goes to exactly one holder
// (a take, or the leave passing it on to nobody: freed).
func testRaceTicket(f *fixture) {
	const limit = 1
	keys := f.fill(limit)
	a1 := f.enter("a", "a1", 2, t0)
	if err := f.s.FreeReservation(f.ctx, tok(0), keys[0]); err != nil {
		f.t.Fatalf("FreeReservation: %v", err)
	}
	if res := f.dispatch(t0.Add(time.Second), limit); len(res.Granted) != 1 {
		f.t.Fatalf("dispatch granted %v; want a1", ids(res.Granted))
	}
	g := f.poll(a1).Grant
	var won atomic.Int32
	race(func(i int) {
		if i == 0 {
			if err := f.s.LeaveWait(f.ctx, a1, t0.Add(2*time.Second), grantFor); err != nil {
				f.t.Errorf("LeaveWait: %v", err)
			}
			return
		}
		err := f.s.Reserve(f.ctx, core.Reservation{Token: fmt.Sprintf("res-%d", i), ThreadKey: key("a", "u1", i), Limit: limit,
			Now: t0.Add(2 * time.Second), ExpiresAt: t0.Add(time.Minute), Grant: &g})
		switch {
		case err == nil:
			won.Add(1)
		case !errors.Is(err, core.ErrGrantLost):
			f.t.Errorf("Reserve %d with the grant: %v", i, err)
		}
	})
	st := f.capacity()
	if won.Load() > 1 || st.Used != int(won.Load()) || st.Granted != 0 {
		f.t.Errorf("%d takes won, capacity %+v; want at most one, holding the only slot used", won.Load(), st)
	}
	if s := f.poll(a1); !s.Gone {
		f.t.Errorf("a1 = %+v; want gone", s)
	}
}

// testRaceClaim: goroutines claiming one warm record: exactly one takes
// it, the others find it taken (a conflict, or the winner's lease).
func testRaceClaim(f *fixture) {
	f.warm(key("acme", "u1", 1), "sbx1")
	var won atomic.Int32
	race(func(i int) {
		_, err := f.s.Claim(f.ctx, lease("sbx1", "acme", fmt.Sprintf("o%d", i), t0, core.StateActive, core.StateWarm))
		switch {
		case err == nil:
			won.Add(1)
		case !errors.Is(err, core.ErrConflict) && !errors.Is(err, core.ErrLeaseHeld):
			f.t.Errorf("Claim %d: %v", i, err)
		}
	})
	if won.Load() != 1 {
		f.t.Errorf("%d claims won; want exactly 1", won.Load())
	}
}
