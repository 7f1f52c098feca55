package core_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// TestStressPoolUnderFaults runs concurrent workers whose acquires are
// mostly a thread's first (claims of pool members), with members parked
// paused and running, refills kicked by every claim and the reconcile
// schedule running, under the faults of TestStressInvariantsUnderFaults
// (the provider's creates, kills, timeouts, pauses and resumes, DynamoDB
// calls failed or applied with their reply lost, invocations abandoned
// mid-step). Throughout: no sandbox is ever handed to two threads, and
// the deployment never runs more sandboxes than its limit nor keeps more
// paused than its paused limit. After the faults stop, reconcile converges:
// the running and paused slots held equal the running and paused
// sandboxes, and the pool's place count equals the members it holds.
func TestStressPoolUnderFaults(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stress test: skipped in -short mode")
	}
	for _, parked := range []core.PoolParking{core.PoolParkedPaused, core.PoolParkedRunning} {
		t.Run(string(parked), func(t *testing.T) { stressPool(t, parked) })
	}
}

func stressPool(t *testing.T, parked core.PoolParking) {
	// A refill takes only free running slots (a member runs until it is
	// bootstrapped, and a running one keeps its slot): the workers leave
	// some free, or the pool would never be refilled.
	const (
		limit       = 14
		workers     = 10
		pausedLimit = 5
		poolSize    = 4
		threads     = 120 // most acquires are a thread's first
		opsEach     = 8
	)
	ctx := context.Background()
	rig := newStressRig(t, "poolstress", 5)
	client, store, ddbFaults := rig.client, rig.store, rig.ddbFaults
	prov := &faultyProvider{Provider: client, t: t, store: store, rng: rand.New(rand.NewPCG(7, 8)), created: map[string]core.ThreadKey{}}
	clk := &clock{}
	s := core.DefaultSettings()
	s.Deployment = "poolstress"
	s.Replicas = limit
	s.Policy = core.PolicyWait
	s.AcquireTimeout = 1500 * time.Millisecond
	s.LeaseDuration = 3 * time.Second
	s.MaxPaused = pausedLimit
	rs := core.DefaultReconcileSettings()
	rs.Grace = time.Second
	// Every claim kicks a refill, run beside the workers (waited for at
	// the end), as an asynchronous invocation would be.
	var eng *core.Engine
	var refills sync.WaitGroup
	kick := func(context.Context) error {
		refills.Go(func() { _, _ = eng.RefillPool(ctx) })
		return nil
	}
	eng, err := core.New(s, ddbstore.New(rig.faultyDB, rig.table, "poolstress"), prov, &fakeSyncer{}, core.WithClock(clk.now),
		core.WithReconcileSettings(rs), core.WithPool(core.PoolSettings{Size: poolSize, MaxAge: time.Hour, Parked: parked}),
		core.WithPoolRefill(kick))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	// The pool starts full (faults off); the faults start with the workers.
	ddbFaults.Disarm()
	if st, err := eng.RefillPool(ctx); err != nil || st.Created != poolSize {
		t.Fatalf("RefillPool = %+v, %v; want %d members", st, err, poolSize)
	}
	ddbFaults.ArmFunc(rig.fault)
	prov.faults.Store(true)

	// handedTo is the thread each sandbox was first handed to.
	var handedMu sync.Mutex
	handedTo := map[string]core.ThreadKey{}
	handOut := func(res core.AcquireResult, k core.ThreadKey) {
		handedMu.Lock()
		defer handedMu.Unlock()
		if prev, ok := handedTo[res.Record.SandboxID]; ok && prev != k {
			t.Errorf("sandbox %s (%s) handed to %s, and before to %s", res.Record.SandboxID, res.Source, k, prev)
		}
		handedTo[res.Record.SandboxID] = k
	}
	checkLimits := func(step string) {
		running, paused := prov.live(t, "poolstress")
		if len(running) > limit {
			t.Errorf("%s: %d running sandboxes, limit %d", step, len(running), limit)
		}
		if len(paused) > pausedLimit {
			t.Errorf("%s: %d paused sandboxes, paused limit %d", step, len(paused), pausedLimit)
		}
	}

	stopReconcile := reconcileSchedule(eng)

	var wg sync.WaitGroup
	var acquired, claimed atomic.Int32
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			var held string
			for op := range opsEach {
				if held != "" {
					_, _ = eng.Release(ctx, "acme", held)
					held = ""
				}
				n := rng.IntN(threads)
				k := core.ThreadKey{Tenant: "acme", User: fmt.Sprintf("u%d", n%30), Thread: fmt.Sprintf("t%d", n)}
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				if rng.IntN(100) < 5 { // an invocation abandoned mid-step
					actx, cancel = context.WithTimeout(ctx, time.Duration(1+rng.IntN(40))*time.Millisecond)
				}
				res, err := eng.Acquire(actx, k)
				cancel()
				var ce *core.CapacityError
				switch {
				case err == nil:
					acquired.Add(1)
					if res.Source == core.SourcePool {
						claimed.Add(1)
					}
					held = res.Record.SandboxID
					handOut(res, k)
				case errors.As(err, &ce):
				}
				if op%2 == 0 {
					checkLimits(fmt.Sprintf("worker %d op %d", w, op))
				}
			}
			if held != "" {
				_, _ = eng.Release(ctx, "acme", held)
			}
		})
	}
	wg.Wait()
	refills.Wait()
	stopReconcile()
	checkLimits("after workers")
	t.Logf("acquired %d, from the pool %d; injected ambiguous creates %d, kills %d, pauses %d, resumes %d; DynamoDB calls hit %d",
		acquired.Load(), claimed.Load(), prov.lost.Load(), prov.kills.Load(), prov.pauses.Load(), prov.resumes.Load(), ddbFaults.Hits())
	if claimed.Load() == 0 {
		t.Fatal("no acquire claimed a pool member: the test exercised nothing")
	}

	prov.faults.Store(false)
	ddbFaults.Disarm()
	var (
		st                        core.CapacityStatus
		running, paused           []core.SandboxInfo
		places, placesHeld, total int
	)
	for pass := range 8 {
		clk.advance(5 * time.Minute)
		if _, err := eng.Reconcile(ctx); err != nil {
			t.Logf("reconcile pass %d: %v", pass, err)
		}
		if st, err = eng.Capacity(ctx); err != nil {
			t.Fatalf("Capacity: %v", err)
		}
		running, paused = prov.live(t, "poolstress")
		_, pool, err := store.CountHolders(ctx)
		if err != nil {
			t.Fatalf("CountHolders: %v", err)
		}
		places, placesHeld = pool.Used, pool.Counted
		members, err := store.PoolMembers(ctx, 100)
		if err != nil {
			t.Fatalf("PoolMembers: %v", err)
		}
		total = len(members)
		if st.Used == len(running) && st.Paused == len(paused) && st.Tombstones == 0 && st.Reserved == 0 && st.Transitioning == 0 &&
			places == placesHeld && places == total {
			break
		}
	}
	if st.Used != len(running) || st.Paused != len(paused) {
		t.Errorf("after reconcile: running slots %d for %d running sandboxes, paused slots %d for %d paused ones",
			st.Used, len(running), st.Paused, len(paused))
	}
	if places != placesHeld || places != total {
		t.Errorf("after reconcile: pool place count %d, places held %d, members %d; want all equal", places, placesHeld, total)
	}
	if total > poolSize {
		t.Errorf("after reconcile: %d members, more than the pool's %d", total, poolSize)
	}
	checkLimits("after reconcile")
}
