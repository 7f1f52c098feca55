package core_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// slotHolders returns the sandbox ids of records holding slots and the
// number of reservations, from the store's state index.
func (h *recHarness) slotHolders(t *testing.T) (ids []string, reservations int) {
	t.Helper()
	ctx := context.Background()
	for _, st := range []core.State{core.StateActive, core.StateReleasing, core.StateWarm, core.StateDestroying} {
		if err := h.store.ScanState(ctx, st, func(r core.Record) bool { ids = append(ids, r.SandboxID); return true }); err != nil {
			t.Fatalf("ScanState(%s): %v", st, err)
		}
	}
	if err := h.store.ScanState(ctx, core.StateCreating, func(core.Record) bool { reservations++; return true }); err != nil {
		t.Fatalf("ScanState(creating): %v", err)
	}
	sort.Strings(ids)
	return ids, reservations
}

func (h *recHarness) liveIDs() []string {
	var ids []string
	for _, in := range must(h.fake.ListPage(context.Background(), core.ListFilter{}, "", 1<<20)) {
		ids = append(ids, in.ID)
	}
	sort.Strings(ids)
	return ids
}

func must(v []core.SandboxInfo, _ string, err error) []core.SandboxInfo {
	if err != nil {
		panic(err)
	}
	return v
}

// TestReconcileConverges: random faults (out-of-band kills, duplicate
// creates, creates abandoned after the provider made the sandbox, reclaims
// abandoned holding a lease, uncertain kills, provider outages during
// passes) while agents acquire and release
// and reconcile passes run; then faults stop. Within a bounded number of
// passes the live sandboxes are exactly the records holding slots, the
// ledger counts exactly those, and no sandbox an agent was using (and that
// was alive) was ever killed.
func TestReconcileConverges(t *testing.T) {
	h := newRecHarness(t, func(s *core.Settings, rs *core.ReconcileSettings) {
		s.Replicas = 40
		s.LeaseDuration = 10 * time.Second
		rs.Grace = 2 * time.Second
		rs.MaxItems = 7 // several passes per walk
		rs.PageSize = 3
	})
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("SBX_SEED"), 10, 64); err == nil {
		seed = s // reproduce a logged run
	}
	t.Logf("seed %d", seed)
	ctx := context.Background()

	var mu sync.Mutex
	inUse := map[string]bool{} // handed to an agent, not yet released
	var violations []string
	h.prov.set(func(p *faultProvider) {
		p.onKill = func(id string) {
			mu.Lock()
			defer mu.Unlock()
			if inUse[id] && h.fake.Alive(id) {
				violations = append(violations, id)
			}
		}
	})

	const workers, steps = 4, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			eng := h.engine(t)
			held := map[string]string{} // thread -> sandbox
			for range steps {
				thread := fmt.Sprintf("w%dt%d", w, rng.IntN(3))
				switch op := rng.IntN(10); {
				case op < 4: // acquire
					if _, ok := held[thread]; ok {
						continue
					}
					if rng.IntN(6) == 0 {
						h.prov.set(func(p *faultProvider) { p.createLost = true })
					}
					res, err := eng.Acquire(ctx, key(thread))
					h.prov.set(func(p *faultProvider) { p.createLost = false })
					if err == nil {
						mu.Lock()
						inUse[res.Record.SandboxID] = true
						mu.Unlock()
						held[thread] = res.Record.SandboxID
					}
				case op < 7: // release
					id, ok := held[thread]
					if !ok {
						continue
					}
					mu.Lock()
					delete(inUse, id)
					mu.Unlock()
					delete(held, thread)
					_, _ = eng.Release(ctx, "acme", id)
				case op < 8 && rng.IntN(2) == 0: // out-of-band kill of any live sandbox
					if ids := h.liveIDs(); len(ids) > 0 {
						h.fake.Drop(ids[rng.IntN(len(ids))])
					}
				case op < 8: // an invocation abandoned halfway through reclaiming a warm sandbox
					var warm []core.Record
					_ = h.store.ScanState(ctx, core.StateWarm, func(r core.Record) bool { warm = append(warm, r); return true })
					if len(warm) > 0 {
						r := warm[rng.IntN(len(warm))]
						now := h.clock.now()
						_, _ = h.store.Claim(ctx, core.Claim{SandboxID: r.SandboxID, Tenant: r.Tenant, From: []core.State{core.StateWarm},
							To: core.StateActive, Owner: "ghost", Now: now, LeaseUntil: now.Add(h.s.LeaseDuration)})
					}
				case op < 9: // a duplicate made behind the broker's back
					_, _ = h.fake.Create(ctx, core.CreateSpec{Metadata: h.threadMeta(thread, 0)})
				default: // a reconcile pass under a provider or kill outage
					fault := rng.IntN(3)
					h.prov.set(func(p *faultProvider) {
						if fault == 0 {
							p.listErr = fmt.Errorf("provider outage")
						}
					})
					if fault == 1 {
						h.fake.Set(func(f *coretest.FakeProvider) { f.KillErr = fmt.Errorf("kill timeout") })
					}
					_, _ = eng.Reconcile(ctx)
					h.prov.set(func(p *faultProvider) { p.listErr = nil })
					h.fake.Set(func(f *coretest.FakeProvider) { f.KillErr = nil })
				}
			}
			for _, id := range held { // agents finish their runs
				mu.Lock()
				delete(inUse, id)
				mu.Unlock()
				_, _ = eng.Release(ctx, "acme", id)
			}
		})
	}
	wg.Wait()

	// Faults stopped: passes (time moving past leases and grace) converge.
	const maxPasses = 20
	converged := false
	var last string
	for pass := 1; pass <= maxPasses && !converged; pass++ {
		h.clock.advance(h.s.LeaseDuration + h.rs.Grace + time.Second)
		if _, err := h.eng.Reconcile(ctx); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		holders, reservations := h.slotHolders(t)
		live := h.liveIDs()
		used := h.used(t)
		last = fmt.Sprintf("live %v, slot holders %v, reservations %d, used %d", live, holders, reservations, used)
		converged = strings.Join(live, ",") == strings.Join(holders, ",") && reservations == 0 && used == len(holders)
		if converged {
			t.Logf("converged after %d passes: %d live sandboxes", pass, len(live))
		}
	}
	if !converged {
		t.Errorf("not converged after %d passes: %s", maxPasses, last)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Errorf("sandboxes in use and alive were killed: %v", violations)
	}
}
