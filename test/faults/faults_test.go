// Package faults_test runs the engine over the real local components (the
// repository's sandbox host driven through the E2B client, DynamoDB Local,
// versitygw) with a fault layer in front of each of them, and injects one
// fault at each step of acquire, release, pause-parking (the pause of
// an idle warm sandbox or at release, the resume of a paused one) and the pre-warmed
// pool (members parked running and paused: refill, pause, claim, resume),
// fair waiting (queueing, the grant, its take, and the give-back of a
// slow waiter's place), evictions (the take of the evicted sandbox's
// slot, and the eviction of a user's own warm sandbox for its quota),
// renewal (its write and its provider call), the copy of
// outputs a release deferred (the next pass's copy, and the timer move
// that keeps an expiring sandbox running for them), and a provider's
// killed webhook (webhook_test.go). After at most two reconcile passes the broker's invariants
// must hold: no record in a transitional state, running and paused slots
// used equal to the running and paused sandboxes (running ones within the
// limit), no sandbox handed out that does not answer (a
// paused one does not), and every file written before a release in S3 with the
// right bytes or named in the release's result as deferred.
package faults_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
	"github.com/sandbox-broker/sandbox-broker/internal/faults"
	"github.com/sandbox-broker/sandbox-broker/internal/outputsync"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/internal/standin"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// invocationTime is each acquire's and release's deadline (a short
// Lambda timeout keeps the stall cases fast; the budgets scale with it).
const invocationTime = 8 * time.Second

const apiKey = "faults-key"

// limit is every case's deployment's running slots (SANDBOX_REPLICAS).
const limit = 4

// offsetClock is real time shifted by what the test advanced.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// stack is one case's broker: an engine whose provider, store and S3
// clients go through fault layers, and clean clients to check with.
type stack struct {
	t          *testing.T
	deployment string
	eng        *core.Engine
	clock      *offsetClock
	prov, ddb  *faults.Transport // provider (control plane and envd), DynamoDB
	held       *faults.Transport // under ddb: holds DynamoDB calls (faults.Hold) while ddb faults others
	s3         *faults.Transport
	clean      *e2b.Client
	store      *ddbstore.Store // clean
	faulty     *ddbstore.Store // the engine's: through the fault layers
	s3c        *s3.Client      // clean
	bucket     string
	pool       bool             // the engine keeps a pool of one member
	db         *dynamodb.Client // clean, for the writes a case sets up by hand
	table      string
	// enqueued hears each ticket the engine queues (wait policy).
	enqueued chan core.WaitNote
}

// poolMode is a case's pool: none, or one member parked running or
// paused.
type poolMode int

const (
	noPool poolMode = iota
	runningPool
	pausedPool
)

// stackConfig is what a case's stack differs in.
type stackConfig struct {
	pool       poolMode
	maxPerUser int // SANDBOX_MAX_PER_USER (0: none)
	// acquireTimeout and waiterPlaces are SANDBOX_ACQUIRE_TIMEOUT_SECONDS
	// (0: 3 s) and SANDBOX_MAX_WAITERS_PER_TENANT (0: the default).
	acquireTimeout time.Duration
	waiterPlaces   int
	maxPaused      int // SANDBOX_MAX_PAUSED (0: the default)
	// pauseAtRelease pauses a sandbox at its release
	// (SANDBOX_PAUSE_AFTER_SECONDS=0) rather than when idle.
	pauseAtRelease bool
	// policy is SANDBOX_OVERFLOW_POLICY ("": the default, wait).
	policy core.OverflowPolicy
}

// newStack builds a case's stack over the shared sandbox host, DynamoDB
// Local and versitygw, with its own table, bucket and deployment, as cfg
// says.
// startHost starts a local sandbox host for t's stacks, closed when t
// and its subtests are done.
func startHost(t *testing.T) *sandboxhost.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	host, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: apiKey, RootDir: t.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	t.Cleanup(func() { _ = host.Close() })
	return host
}

func newStack(t *testing.T, host *sandboxhost.Server, cfg stackConfig) *stack {
	t.Helper()
	held := &faults.Transport{Next: standin.Loopback}
	st := &stack{t: t, deployment: testenv.UniqueName(t, "f"), clock: &offsetClock{},
		prov: &faults.Transport{Next: standin.Loopback}, ddb: &faults.Transport{Next: held}, held: held, s3: &faults.Transport{Next: standin.Loopback},
		enqueued: make(chan core.WaitNote, 16)}
	var err error
	st.clean, err = e2b.New(e2b.Options{APIURL: host.APIURL, SandboxURL: host.EnvdURL, APIKey: apiKey})
	if err != nil {
		t.Fatal(err)
	}
	prov, err := e2b.New(e2b.Options{APIURL: host.APIURL, SandboxURL: host.EnvdURL, APIKey: apiKey,
		HTTPClient: &http.Client{Transport: st.prov}})
	if err != nil {
		t.Fatal(err)
	}
	db := testenv.DynamoClient(t)
	table := testenv.UniqueName(t, "faults")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ddbstore.CreateTable(ctx, db, table); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	st.store, st.db, st.table = ddbstore.New(db, table, st.deployment, ddbstore.WithLimit(limit)), db, table
	faultyDB := dynamodb.New(db.Options(), func(o *dynamodb.Options) { o.HTTPClient = &http.Client{Transport: st.ddb} })
	st.s3c = testenv.S3Client(t)
	st.bucket = testenv.Bucket(t, st.s3c)
	faultyS3 := s3.New(st.s3c.Options(), func(o *s3.Options) { o.HTTPClient = &http.Client{Transport: st.s3} })
	logger := slog.New(slog.NewJSONHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	st.faulty = ddbstore.New(faultyDB, table, st.deployment, ddbstore.WithLimit(limit))
	syncer, err := outputsync.New(prov, faultyS3, outputsync.Options{Bucket: st.bucket, Prefix: "outputs", Logger: logger,
		Ledger: st.faulty})
	if err != nil {
		t.Fatal(err)
	}
	s := core.DefaultSettings()
	s.Deployment = st.deployment
	s.Replicas = limit
	s.AcquireTimeout = 3 * time.Second
	if cfg.acquireTimeout > 0 {
		s.AcquireTimeout = cfg.acquireTimeout
	}
	if cfg.waiterPlaces > 0 {
		s.MaxWaitersPerTenant = cfg.waiterPlaces
	}
	s.MaxPerUser = cfg.maxPerUser
	s.MaxPaused = cfg.maxPaused
	if cfg.pauseAtRelease {
		s.PauseAfter = 0
	}
	if cfg.policy != "" {
		s.Policy = cfg.policy
	}
	rs := core.DefaultReconcileSettings()
	rs.Grace = 0
	opts := []core.Option{core.WithClock(st.clock.now), core.WithLogger(logger), core.WithReconcileSettings(rs),
		core.WithWaitObserver(func(n core.WaitNote) {
			if n.Event == core.WaitEnqueued {
				select {
				case st.enqueued <- n:
				default:
				}
			}
		})}
	switch cfg.pool {
	case runningPool:
		opts = append(opts, core.WithPool(core.PoolSettings{Size: 1, MaxAge: 24 * time.Hour, Parked: core.PoolParkedRunning}))
	case pausedPool:
		opts = append(opts, core.WithPool(core.PoolSettings{Size: 1, MaxAge: 24 * time.Hour, Parked: core.PoolParkedPaused}))
	}
	st.pool = cfg.pool != noPool
	st.eng, err = core.New(s, st.faulty, prov, syncer, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, sb := range st.live(ctx) {
			_ = st.clean.Kill(ctx, sb)
		}
	})
	return st
}

// invocation is a ctx with a Lambda-like deadline.
func invocation() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), invocationTime)
}

// live lists the deployment's sandboxes at the provider (clean client),
// running and paused.
func (st *stack) live(ctx context.Context) []string {
	running, paused := st.liveByState(ctx)
	return append(running, paused...)
}

// liveByState lists the deployment's running and paused sandboxes.
func (st *stack) liveByState(ctx context.Context) (running, paused []string) {
	st.t.Helper()
	infos, err := st.clean.List(ctx, core.ListFilter{Metadata: map[string]string{core.MetaDeployment: st.deployment},
		States: []string{core.SandboxRunning, core.SandboxPaused}})
	if err != nil {
		st.t.Fatalf("list sandboxes: %v", err)
	}
	for _, in := range infos {
		if in.State == core.SandboxPaused {
			paused = append(paused, in.ID)
		} else {
			running = append(running, in.ID)
		}
	}
	return running, paused
}

// pausedByTenant counts the deployment's paused sandboxes by the tenant
// their metadata names.
func (st *stack) pausedByTenant(ctx context.Context) map[string]int {
	st.t.Helper()
	infos, err := st.clean.List(ctx, core.ListFilter{Metadata: map[string]string{core.MetaDeployment: st.deployment},
		States: []string{core.SandboxPaused}})
	if err != nil {
		st.t.Fatalf("list paused sandboxes: %v", err)
	}
	n := map[string]int{}
	for _, in := range infos {
		n[in.Metadata[core.MetaTenant]]++
	}
	return n
}

// acquire acquires for thread and checks that a sandbox handed out
// answers (through the clean client). ok is false when acquire failed.
func (st *stack) acquire(thread string) (core.AcquireResult, bool) {
	st.t.Helper()
	res, err := st.acquireWithin(thread, invocationTime)
	return res, err == nil
}

// acquireWithin is acquire in an invocation of d, returning its error.
func (st *stack) acquireWithin(thread string, d time.Duration) (core.AcquireResult, error) {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res, err := st.eng.Acquire(ctx, core.ThreadKey{Tenant: "acme", User: "alice", Thread: thread})
	if err != nil {
		st.t.Logf("acquire %s: %v", thread, err)
		return res, err
	}
	if dl, _ := ctx.Deadline(); time.Now().After(dl) {
		st.t.Errorf("acquire %s answered after its deadline", thread)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	out, err := st.clean.Run(cctx, res.Record.Ref(), core.Command{Script: "true", Timeout: 5 * time.Second})
	if err != nil || out.ExitCode != 0 {
		st.t.Errorf("acquire %s handed out %s (%s), which does not answer: %v", thread, res.Record.SandboxID, res.Source, err)
	}
	return res, nil
}

// write puts a file with random bytes under outputs/ in the sandbox.
func (st *stack) write(rec core.Record, name string) []byte {
	st.t.Helper()
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	data := []byte(hex.EncodeToString(b))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := st.clean.Run(ctx, rec.Ref(), core.Command{Script: `mkdir -p outputs && printf '%s' "$DATA" > "outputs/$NAME"`,
		Env: map[string]string{"DATA": string(data), "NAME": name}, Cwd: "/home/user"})
	if err != nil || out.ExitCode != 0 {
		st.t.Fatalf("write %s: %v (exit %d)", name, err, out.ExitCode)
	}
	return data
}

// release releases id; ok is false when the release failed.
func (st *stack) release(id string) (core.ReleaseResult, bool) {
	st.t.Helper()
	ctx, cancel := invocation()
	defer cancel()
	res, err := st.eng.Release(ctx, "acme", id)
	if dl, _ := ctx.Deadline(); time.Now().After(dl) {
		st.t.Errorf("release %s answered after its deadline", id)
	}
	if err != nil {
		st.t.Logf("release %s: %v", id, err)
		return res, false
	}
	return res, true
}

// settle runs at most two reconcile passes, once every lease, reservation
// and tombstone back-off of the case has lapsed on the engine's clock.
func (st *stack) settle() {
	st.t.Helper()
	st.clock.advance(10 * time.Minute)
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := st.eng.Reconcile(ctx)
		cancel()
		if err != nil {
			st.t.Logf("reconcile: %v", err)
		}
		st.clock.advance(10 * time.Minute)
	}
}

// withinLimit: no more running slots used, nor running sandboxes, than
// the limit.
func (st *stack) withinLimit() {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	capa, err := st.store.Capacity(ctx)
	if err != nil {
		st.t.Fatalf("capacity: %v", err)
	}
	running, _ := st.liveByState(ctx)
	if capa.Used > limit || len(running) > limit {
		st.t.Errorf("used slots = %d, running sandboxes = %d (%v); want at most the limit, %d", capa.Used, len(running), running, limit)
	}
}

// checkInvariants: no transitional record, running slots used == running
// sandboxes (within the limit), paused slots used == paused sandboxes.
func (st *stack) checkInvariants() {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := st.store.CountStates(ctx, core.StateCreating, core.StateReleasing, core.StateClaiming,
		core.StatePausing, core.StateResuming, core.StateDestroying)
	if err != nil {
		st.t.Fatalf("count states: %v", err)
	}
	for state, c := range n {
		if c != 0 {
			st.t.Errorf("%d records still %s after two reconcile passes", c, state)
		}
	}
	capa, err := st.store.Capacity(ctx)
	if err != nil {
		st.t.Fatalf("capacity: %v", err)
	}
	running, paused := st.liveByState(ctx)
	if capa.Used != len(running) {
		st.t.Errorf("used slots = %d, running sandboxes = %d (%v)", capa.Used, len(running), running)
	}
	if capa.Paused != len(paused) {
		st.t.Errorf("paused slots = %d, paused sandboxes = %d (%v)", capa.Paused, len(paused), paused)
	}
	if !st.pool {
		// Every paused sandbox is a tenant's: the tenants' paused counts
		// add up to the paused slots.
		held, err := st.store.TenantsPaused(ctx, []string{"acme", rival})
		if err != nil {
			st.t.Fatalf("tenants' paused counts: %v", err)
		}
		if held["acme"]+held[rival] != capa.Paused {
			st.t.Errorf("tenants' paused counts = %v, paused slots = %d; want them to add up", held, capa.Paused)
		}
		// And each tenant's count is its own paused sandboxes.
		if mine := st.pausedByTenant(ctx); held["acme"] != mine["acme"] || held[rival] != mine[rival] {
			st.t.Errorf("tenants' paused counts = %v, paused sandboxes by tenant = %v", held, mine)
		}
	}
	st.withinLimit()
}

// reconcile runs one reconcile pass (with a deadline that leaves it time
// to work past ReconcileReserve).
func (st *stack) reconcile() {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), core.ReconcileReserve+15*time.Second)
	defer cancel()
	if _, err := st.eng.Reconcile(ctx); err != nil {
		st.t.Logf("reconcile: %v", err)
	}
}

// idle advances the clock past the pause delay of a warm sandbox.
func (st *stack) idle() { st.clock.advance(core.DefaultSettings().PauseAfter + time.Second) }

// pauseStep leaves the thread with a warm sandbox idle past the pause
// delay, then runs the reconcile pass that pauses it under the fault.
func pauseStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	warm(st, thread)
	st.idle()
	arm()
	st.reconcile()
	disarm()
	return nil, core.ReleaseResult{}, false
}

// pauseIdle runs the reconcile pass that pauses the idle warm sandboxes
// (faults off) and checks that want sandboxes (whose) are then paused.
func (st *stack) pauseIdle(want int, whose string) {
	st.t.Helper()
	st.idle()
	st.reconcile()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, p := st.liveByState(ctx); len(p) != want {
		st.t.Fatalf("setup: paused sandboxes %v, want %s", p, whose)
	}
}

// paused leaves the thread with a paused sandbox.
func paused(st *stack, thread string) {
	warm(st, thread)
	st.pauseIdle(1, "the thread's")
	if !st.pool {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The pool's places are its members: no reservation or tombstone
	// of a refill is left.
	members, err := st.store.PoolMembers(ctx, 100)
	if err != nil {
		st.t.Fatalf("pool members: %v", err)
	}
	if places, err := st.store.PoolCount(ctx); err != nil || places != len(members) {
		st.t.Errorf("pool places = %d (%v), members = %d", places, err, len(members))
	}
}

// refill fills the pool (faults off).
func (st *stack) refill() {
	st.t.Helper()
	ctx, cancel := invocation()
	defer cancel()
	if ps, err := st.eng.RefillPool(ctx); err != nil || ps.Created != 1 {
		st.t.Fatalf("setup refill = %+v, %v; want one member", ps, err)
	}
}

// claimStep fills the pool, then acquires for a new thread (a claim)
// under the fault.
func claimStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	st.refill()
	return acquireStep(nil)(st, thread, arm, disarm)
}

// refillStep refills the pool under the fault.
func refillStep(st *stack, _ string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	ctx, cancel := invocation()
	defer cancel()
	arm()
	ps, err := st.eng.RefillPool(ctx)
	disarm()
	st.t.Logf("refill under the fault: %+v, %v", ps, err)
	return nil, core.ReleaseResult{}, false
}

// checkOutputs: every file written before the release is in S3 with its
// bytes, or the release's result names it as deferred.
func (st *stack) checkOutputs(thread string, files map[string][]byte, res core.ReleaseResult, answered bool) {
	st.t.Helper()
	deferred := map[string]bool{}
	if answered && res.Sync != nil {
		for _, d := range res.Sync.Deferred {
			deferred[d.Path] = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, want := range files {
		key := fmt.Sprintf("outputs/acme/alice/%s/outputs/%s", thread, name)
		obj, err := st.s3c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(st.bucket), Key: aws.String(key)})
		if err == nil {
			got, rerr := io.ReadAll(obj.Body)
			_ = obj.Body.Close()
			if rerr == nil && bytes.Equal(got, want) {
				continue
			}
		}
		if deferred["outputs/"+name] {
			continue
		}
		st.t.Errorf("outputs/%s is neither in S3 with its bytes (%v) nor named as deferred (%+v)", name, err, res.Sync)
	}
	st.checkStored(ctx, thread)
}

// checkStored checks the storage ledger against S3: the bytes recorded
// for the thread are never fewer than its objects take (a pass that died
// leaves more, until the thread's next pass), and the tenant's total
// counts them.
func (st *stack) checkStored(ctx context.Context, thread string) {
	st.t.Helper()
	prefix := fmt.Sprintf("outputs/acme/alice/%s/", thread)
	var inS3 int64
	pages := s3.NewListObjectsV2Paginator(st.s3c, &s3.ListObjectsV2Input{Bucket: aws.String(st.bucket), Prefix: aws.String(prefix)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			st.t.Fatalf("list %s: %v", prefix, err)
		}
		for _, o := range page.Contents {
			inS3 += aws.ToInt64(o.Size)
		}
	}
	got, err := st.store.StoredBytes(ctx, core.ThreadKey{Tenant: "acme", User: "alice", Thread: thread})
	if err != nil {
		st.t.Fatalf("StoredBytes: %v", err)
	}
	if got.Thread < inS3 || got.Tenant < got.Thread {
		st.t.Errorf("ledger %+v for a thread whose objects take %d bytes: want at least those, counted in the tenant's total", got, inS3)
	}
}
