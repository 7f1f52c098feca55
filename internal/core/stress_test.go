package core_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
	"github.com/sandbox-broker/sandbox-broker/internal/faults"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/internal/standin"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// faultyProvider wraps a real provider with injected faults and checks
// invariant 3 on every kill: the broker kills a sandbox only while its
// record is a tombstone (destroy claim held) or when no record exists yet
// (cleanup of its own failed create).
type faultyProvider struct {
	core.Provider
	t       *testing.T
	store   *ddbstore.Store
	faults  atomic.Bool
	mu      sync.Mutex
	rng     *rand.Rand
	created map[string]core.ThreadKey // every sandbox the broker created
	kills   atomic.Int32
	lost    atomic.Int32 // ambiguous creates injected
	pauser  core.Pauser  // the wrapped provider's
	pauses  atomic.Int32 // pauses and resumes passed through unharmed
	resumes atomic.Int32
}

func (f *faultyProvider) roll(pct int) bool {
	if !f.faults.Load() {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.IntN(100) < pct
}

func (f *faultyProvider) Create(ctx context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	ref, err := f.Provider.Create(ctx, spec)
	if err == nil {
		f.mu.Lock()
		f.created[ref.ID] = core.ThreadKey{Tenant: spec.Metadata[core.MetaTenant], User: spec.Metadata[core.MetaUser], Thread: spec.Metadata[core.MetaThread]}
		f.mu.Unlock()
		if f.roll(5) {
			f.lost.Add(1)
			return core.SandboxRef{}, &core.ProviderError{Op: "create", Message: "injected timeout after create", Ambiguous: true}
		}
	}
	return ref, err
}

func (f *faultyProvider) Kill(ctx context.Context, id string) error {
	if rec, err := f.store.Get(context.Background(), id); err == nil && rec.State != core.StateDestroying {
		f.t.Errorf("invariant 3: kill of %s while its record is %s (no destroy claim)", id, rec.State)
	}
	if f.roll(10) {
		return errors.New("injected kill failure")
	}
	f.kills.Add(1)
	return f.Provider.Kill(ctx, id)
}

func (f *faultyProvider) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if f.roll(3) {
		return errors.New("injected reconnect failure")
	}
	return f.Provider.SetTimeout(ctx, id, d)
}

// Capabilities routes pause and resume through the fault layer.
func (f *faultyProvider) Capabilities() core.Capabilities {
	c := f.Provider.Capabilities()
	if c.Pause != nil {
		f.pauser = c.Pause
		c.Pause = f
	}
	return c
}

// Pause fails now and then: unsent, or applied with its reply lost.
func (f *faultyProvider) Pause(ctx context.Context, id string) error {
	lost := &core.ProviderError{Op: "pause", Message: "injected timeout", Ambiguous: true}
	switch {
	case f.roll(4):
		return lost
	case f.roll(4):
		if err := f.pauser.Pause(ctx, id); err != nil {
			return err
		}
		return lost
	}
	f.pauses.Add(1)
	return f.pauser.Pause(ctx, id)
}

// Resume fails now and then: unsent, refused, or applied with its reply lost.
func (f *faultyProvider) Resume(ctx context.Context, id string, d time.Duration) error {
	lost := &core.ProviderError{Op: "resume", Message: "injected timeout", Ambiguous: true}
	switch {
	case f.roll(3):
		return lost
	case f.roll(2):
		return &core.ProviderError{Op: "resume", StatusCode: 409, Message: "injected refusal"}
	case f.roll(3):
		if err := f.pauser.Resume(ctx, id, d); err != nil {
			return err
		}
		return lost
	}
	f.resumes.Add(1)
	return f.pauser.Resume(ctx, id, d)
}

// stressRig is what the stress tests share: the local sandbox host behind
// an E2B client, a fresh table with a clean store (the checks' view), and
// a DynamoDB client for the engine whose calls go through a fault layer.
type stressRig struct {
	client    *e2b.Client
	table     string
	store     *ddbstore.Store
	faultyDB  *dynamodb.Client
	ddbFaults *faults.Transport
	// fault is the rule to arm on ddbFaults: a few calls fail unsent, or
	// are applied and their reply lost or cut.
	fault func(faults.Request) (faults.Kind, bool)
}

// newStressRig starts the rig of a stress test of deployment, its faults
// drawn from seed.
func newStressRig(t *testing.T, deployment string, seed uint64) *stressRig {
	t.Helper()
	srv, err := sandboxhost.Start(context.Background(), sandboxhost.Options{APIKey: "stress-key", RootDir: t.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	client, err := e2b.New(e2b.Options{APIURL: srv.APIURL, SandboxURL: srv.EnvdURL, APIKey: "stress-key"})
	if err != nil {
		t.Fatalf("e2b.New: %v", err)
	}
	ddb := testenv.DynamoClient(t)
	table := freshTable(t, ddb, deployment)
	r := &stressRig{client: client, table: table, store: ddbstore.New(ddb, table, deployment), ddbFaults: &faults.Transport{Next: standin.Loopback}}
	r.faultyDB = dynamodb.New(ddb.Options(), func(o *dynamodb.Options) { o.HTTPClient = &http.Client{Transport: r.ddbFaults} })
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed+1))
	r.fault = func(faults.Request) (faults.Kind, bool) {
		mu.Lock()
		defer mu.Unlock()
		switch n := rng.IntN(1000); {
		case n < 10:
			return faults.Fail, true
		case n < 20:
			return faults.Lost, true
		case n < 25:
			return faults.Cut, true
		}
		return "", false
	}
	return r
}

// reconcileSchedule runs eng's reconcile every 300 ms until the returned
// function is called (which waits for the pass in flight).
func reconcileSchedule(eng *core.Engine) (stop func()) {
	return every(300*time.Millisecond, func() { _, _ = eng.Reconcile(context.Background()) })
}

// live lists the deployment's sandboxes at the provider, running and
// paused.
func (f *faultyProvider) live(t *testing.T, deployment string) (running, paused []core.SandboxInfo) {
	infos, err := f.Provider.List(context.Background(), core.ListFilter{Metadata: map[string]string{core.MetaDeployment: deployment},
		States: []string{core.SandboxRunning, core.SandboxPaused}})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, in := range infos {
		if in.State == core.SandboxPaused {
			paused = append(paused, in)
		} else {
			running = append(running, in)
		}
	}
	return running, paused
}

// TestStressInvariantsUnderFaults runs 64 workers doing mixed acquire and
// release over 40 threads against DynamoDB Local and the local sandbox
// host, with injected faults (ambiguous creates, failed kills and
// reconnects, pauses and resumes failed or applied with their reply lost,
// sandboxes killed out of band, invocations abandoned mid-step, DynamoDB
// calls failed or applied with their reply lost). Every release pauses
// (SANDBOX_PAUSE_AFTER_SECONDS=0) into a few paused slots, so pauses,
// resumes and paused evictions interleave with everything else. After
// every step: never more running sandboxes than the limit nor more paused
// ones than the paused limit (invariant 1, both kinds of slot) and never
// two active records for one thread (invariant 2); every kill is checked
// for a destroy claim (invariant 3), every sandbox acquire hands out for
// running (invariant 11). After faults stop, reconcile passes make the
// running and paused slots held equal the running and paused sandboxes
// (invariant 4: uncertain kills kept their slots until confirmed).
func TestStressInvariantsUnderFaults(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stress test: skipped in -short mode")
	}
	const (
		limit       = 8
		pausedLimit = 12
		workers     = 64
		threads     = 40
		opsEach     = 12
	)
	ctx := context.Background()
	rig := newStressRig(t, "stress", 3)
	client, store, faultyDB, ddbFaults := rig.client, rig.store, rig.faultyDB, rig.ddbFaults
	table := rig.table
	ddbFaults.ArmFunc(rig.fault)
	prov := &faultyProvider{Provider: client, t: t, store: store, rng: rand.New(rand.NewPCG(1, 2)), created: map[string]core.ThreadKey{}}
	prov.faults.Store(true)
	clk := &clock{}
	s := core.DefaultSettings()
	s.Deployment = "stress"
	s.Replicas = limit
	s.Policy = core.PolicyWait
	s.AcquireTimeout = 1500 * time.Millisecond
	s.LeaseDuration = 3 * time.Second // leases lapse during the run, so takeovers happen
	s.PauseAfter = 0
	s.MaxPaused = pausedLimit
	rs := core.DefaultReconcileSettings()
	rs.Grace = time.Second
	eng, err := core.New(s, ddbstore.New(faultyDB, table, "stress", ddbstore.WithLimit(s.Limit())), prov, &fakeSyncer{}, core.WithClock(clk.now), core.WithReconcileSettings(rs))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}

	checkInvariants := func(step string) {
		running, paused := prov.live(t, "stress")
		if len(running) > limit {
			t.Errorf("%s: invariant 1: %d running sandboxes, limit %d", step, len(running), limit)
		}
		if len(paused) > pausedLimit {
			t.Errorf("%s: invariant 1: %d paused sandboxes, paused limit %d", step, len(paused), pausedLimit)
		}
		prov.mu.Lock()
		byThread := map[core.ThreadKey][]string{}
		for id, k := range prov.created {
			byThread[k] = append(byThread[k], id)
		}
		prov.mu.Unlock()
		for k, ids := range byThread {
			active := 0
			for _, id := range ids {
				if rec, err := store.Get(ctx, id); err == nil && rec.State == core.StateActive {
					active++
				}
			}
			if active > 1 {
				t.Errorf("%s: invariant 2: thread %s has %d active records", step, k, active)
			}
		}
	}

	// Invariant 11: what acquire hands out runs. The provider is read
	// first; a paused answer is a violation if the record did not move
	// since the acquire (no release or pause could explain it).
	checkHandedOutRunning := func(rec core.Record) {
		info, err := client.Info(ctx, rec.SandboxID)
		if err != nil || info.State != core.SandboxPaused {
			return
		}
		if now, err := store.Get(ctx, rec.SandboxID); err == nil && now.Fence == rec.Fence && now.State == core.StateActive {
			t.Errorf("invariant 11: %s handed out active while the provider holds it paused", rec.SandboxID)
		}
	}

	// The scheduled reconcile runs throughout, as in production.
	stopReconcile := reconcileSchedule(eng)

	var wg sync.WaitGroup
	var acquired, refused atomic.Int32
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var held string // the sandbox this worker's agent is using
			for op := range opsEach {
				if held != "" {
					if rng.IntN(100) < 10 { // killed behind the broker's back
						_ = client.Kill(ctx, held)
					} else {
						_, _ = eng.Release(ctx, "acme", held)
					}
					held = ""
				}
				n := rng.IntN(threads) // each thread has its user: threads come back, to their paused sandbox
				k := core.ThreadKey{Tenant: "acme", User: fmt.Sprintf("u%d", n%20), Thread: fmt.Sprintf("t%d", n)}
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				if rng.IntN(100) < 4 { // an invocation abandoned mid-step
					actx, cancel = context.WithTimeout(ctx, time.Duration(1+rng.IntN(30))*time.Millisecond)
				}
				res, err := eng.Acquire(actx, k)
				cancel()
				var ce *core.CapacityError
				switch {
				case err == nil:
					acquired.Add(1)
					held = res.Record.SandboxID
					checkHandedOutRunning(res.Record)
				case errors.As(err, &ce):
					refused.Add(1)
				}
				if op%4 == 0 {
					checkInvariants(fmt.Sprintf("worker %d op %d", w, op))
				}
			}
			if held != "" {
				_, _ = eng.Release(ctx, "acme", held)
			}
		}()
	}
	wg.Wait()
	stopReconcile()
	checkInvariants("after workers")
	t.Logf("acquired %d, refused %d, injected ambiguous creates %d, kills %d, pauses %d, resumes %d", acquired.Load(), refused.Load(),
		prov.lost.Load(), prov.kills.Load(), prov.pauses.Load(), prov.resumes.Load())
	if acquired.Load() == 0 || prov.pauses.Load() == 0 || prov.resumes.Load() == 0 {
		t.Fatal("no acquire, pause or resume succeeded: the stress test exercised nothing")
	}

	t.Logf("DynamoDB calls hit by faults: %d", ddbFaults.Hits())

	// Faults stop; reconcile passes (with the clock past leases, grace and
	// reservation expiry) must converge: slots used == live sandboxes.
	prov.faults.Store(false)
	ddbFaults.Disarm()
	var used, running, pausedUsed, paused int
	for pass := range 8 {
		clk.advance(5 * time.Minute)
		if _, err := eng.Reconcile(ctx); err != nil {
			t.Logf("reconcile pass %d: %v", pass, err)
		}
		st, err := eng.Capacity(ctx)
		if err != nil {
			t.Fatalf("Capacity: %v", err)
		}
		r, p := prov.live(t, "stress")
		used, running, pausedUsed, paused = st.Used, len(r), st.Paused, len(p)
		if used == running && pausedUsed == paused && st.Tombstones == 0 && st.Reserved == 0 && st.Transitioning == 0 {
			break
		}
	}
	if used != running || pausedUsed != paused {
		t.Errorf("after faults stopped and reconcile ran: running slots %d for %d running sandboxes, paused slots %d for %d paused ones",
			used, running, pausedUsed, paused)
	}
	checkInvariants("after reconcile")
}
