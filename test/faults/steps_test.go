package faults_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/faults"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// step is one step of acquire or release where a fault is injected: the
// dependency it goes through and the requests that make it.
type step struct {
	name  string
	layer func(st *stack) *faults.Transport
	match faults.Match
	// run drives the step on a fresh thread with the fault armed around
	// the one call that makes the step (arm, call, disarm), and returns
	// the files written before a release and the release's answer.
	run func(st *stack, thread string, arm func(), disarm func()) (map[string][]byte, core.ReleaseResult, bool)
}

func provLayer(st *stack) *faults.Transport { return st.prov }
func ddbLayer(st *stack) *faults.Transport  { return st.ddb }
func s3Layer(st *stack) *faults.Transport   { return st.s3 }

// acquireStep prepares the thread with prep (faults off), then acquires
// under the fault.
func acquireStep(prep func(st *stack, thread string)) func(*stack, string, func(), func()) (map[string][]byte, core.ReleaseResult, bool) {
	return func(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
		if prep != nil {
			prep(st, thread)
		}
		arm()
		st.acquire(thread)
		disarm()
		return nil, core.ReleaseResult{}, false
	}
}

// releaseStep acquires the thread, writes files, then releases under the
// fault (draining first when the step is the kill of a release).
func releaseStep(drain bool) func(*stack, string, func(), func()) (map[string][]byte, core.ReleaseResult, bool) {
	return func(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
		res, ok := st.acquire(thread)
		if !ok {
			st.t.Fatalf("setup acquire failed")
		}
		files := map[string][]byte{"a.txt": st.write(res.Record, "a.txt"), "b.txt": st.write(res.Record, "b.txt")}
		if drain {
			if err := st.eng.SetDraining(context.Background(), true); err != nil {
				st.t.Fatal(err)
			}
			defer func() { _ = st.eng.SetDraining(context.Background(), false) }()
		}
		arm()
		rel, answered := st.release(res.Record.SandboxID)
		disarm()
		return files, rel, answered
	}
}

// renewStep acquires the thread, then, a minute later, renews its
// sandbox for two hours under the fault. Whatever the renewal answered,
// after one reconcile pass the provider's timer must end after the
// record's end (reconcile moves a timer that a renewal left short).
func renewStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	res, ok := st.acquire(thread)
	if !ok {
		st.t.Fatalf("setup acquire failed")
	}
	id := res.Record.SandboxID
	st.clock.advance(time.Minute)
	ctx, cancel := invocation()
	arm()
	got, err := st.eng.Renew(ctx, "acme", id, 2*time.Hour)
	disarm()
	cancel()
	st.t.Logf("renew under the fault: %+v, %v", got, err)
	st.reconcile()
	st.timerCoversEnd(id)
	return nil, core.ReleaseResult{}, false
}

// timerCoversEnd: the provider's timer of active sandbox id ends after the
// record's end. The provider's clock is real time, the engine's runs
// ahead by what the case advanced.
func (st *stack) timerCoversEnd(id string) {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := st.store.Get(ctx, id)
	if err != nil || rec.State != core.StateActive {
		st.t.Fatalf("record of %s = %+v, %v; want it active", id, rec, err)
	}
	info, err := st.clean.Info(ctx, id)
	if err != nil {
		st.t.Fatalf("info %s: %v", id, err)
	}
	ends := info.EndAt.Add(time.Duration(st.clock.off.Load()))
	if ends.Before(rec.ExpiresAt) {
		st.t.Errorf("provider timer of %s ends %s, before its record's end %s", id, ends, rec.ExpiresAt)
	}
}

// warm leaves the thread with a warm sandbox.
func warm(st *stack, thread string) {
	res, ok := st.acquire(thread)
	if !ok {
		st.t.Fatalf("setup acquire failed")
	}
	if _, ok := st.release(res.Record.SandboxID); !ok {
		st.t.Fatalf("setup release failed")
	}
}

// fill fills the deployment with active sandboxes of other threads than
// thread's, and returns their records.
func fill(st *stack, thread string) []core.Record {
	var holders []core.Record
	for i := range limit {
		res, ok := st.acquire(fmt.Sprintf("%s-h%d", thread, i))
		if !ok {
			st.t.Fatalf("setup acquire failed")
		}
		holders = append(holders, res.Record)
	}
	return holders
}

// end ends holder's sandbox at the provider and frees its slot (clean
// store, no dispatch): only a waiter's own turn, or the test, grants it.
func (st *stack) end(holder core.Record) {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st.clean.Kill(ctx, holder.SandboxID); err != nil {
		st.t.Fatalf("kill holder: %v", err)
	}
	rec, err := st.store.Get(ctx, holder.SandboxID)
	if err == nil {
		err = st.store.Free(ctx, rec, st.clock.now())
	}
	if err != nil {
		st.t.Fatalf("free holder: %v", err)
	}
}

// waitStep fills the deployment, then acquires for the thread under the
// fault: the acquire queues a ticket; once it waits, one holder's sandbox
// ends and its slot is freed (without a dispatch), so the waiter's own
// turn grants the slot to itself, and its reservation takes the grant.
func waitStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	holders := fill(st, thread)
	arm()
	done := make(chan struct{})
	go func() {
		defer close(done)
		st.acquire(thread)
	}()
	select {
	case <-st.enqueued:
	case <-done: // the fault refused the queueing
	}
	// The slot is freed either way: the thread's acquire after the case
	// needs one.
	st.end(holders[0])
	<-done
	disarm()
	return nil, core.ReleaseResult{}, false
}

// Timings of the slow waiter's step (slowWaiterStep): a wait that
// outlasts the engine's grant term, in an invocation long enough for it.
const (
	waitStepTimeout      = 10 * time.Second
	grantTerm            = 5 * time.Second
	slowWaitTimeout      = 20 * time.Second
	slowWaiterInvocation = 40 * time.Second
)

// slowWaiterStep fills the deployment (its tenant has one waiter place),
// then acquires for the thread while the engine's reads of its ticket
// are held: a waiter too slow to see its grant. It queues; a holder's
// slot is freed and granted to it; the grant lapses unseen, a dispatch
// frees the slot and another acquire takes it. Then, under the fault,
// the waiter's poll finds the ticket gone and gives back its place (the
// step's write) before it looks again: it queues anew, and a second
// holder's slot freed is granted to it by its own turn; or, its place
// not given back, it is refused too_many_waiters, the place lapsing at
// the end of the first wait.
func slowWaiterStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	holders := fill(st, thread)
	st.held.Arm(faults.Hold, faults.BodyContains(faults.DynamoDB("GetItem"), `"WQ#`))
	done, finished := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(finished)
		_, err := st.acquireWithin(thread, slowWaiterInvocation)
		done <- err
	}()
	st.t.Cleanup(func() { // a setup failure still lets the waiter end before the case does
		st.held.Disarm()
		<-finished
	})
	var first core.WaitNote
	select {
	case first = <-st.enqueued:
	case err := <-done:
		st.t.Fatalf("setup: the waiter returned %v before it queued", err)
	}
	st.lapseGrant(holders[0], core.Ticket{ID: first.Ticket, Tenant: first.Tenant, Key: first.SortKey})
	if _, ok := st.acquire(thread + "-h4"); !ok { // the deployment full again
		st.t.Fatalf("setup acquire failed")
	}
	arm()
	st.held.Disarm() // the waiter's poll goes on: its ticket is gone
	var err error
	select {
	case err = <-done:
		st.end(holders[1]) // the thread's acquire after the case needs a slot
	case <-st.enqueued:
		st.end(holders[1])
		err = <-done
	}
	disarm()
	st.checkSlowWaiter(err, first)
	return nil, core.ReleaseResult{}, false
}

// lapseGrant frees holder's slot and grants it to the ticket (a dispatch,
// or the waiter's own turn), then lets the grant lapse and a dispatch
// pass it on: nobody else waits, so the slot is freed.
func (st *stack) lapseGrant(holder core.Record, ticket core.Ticket) {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st.end(holder)
	dispatch := func() {
		if _, err := st.store.Dispatch(ctx, core.Dispatch{Now: st.clock.now(), Limit: limit, Freed: core.NoSlotRef, Scan: true,
			GrantFor: grantTerm}); err != nil {
			st.t.Fatalf("setup dispatch: %v", err)
		}
	}
	dispatch()
	if ts, err := st.store.PollTicket(ctx, ticket); err != nil || !ts.Granted {
		st.t.Fatalf("setup: ticket after the free's dispatch = %+v, %v; want granted", ts, err)
	}
	st.clock.advance(grantTerm + time.Second)
	dispatch()
	if ts, err := st.store.PollTicket(ctx, ticket); err != nil || !ts.Gone {
		st.t.Fatalf("setup: ticket after its grant lapsed = %+v, %v; want gone (the grant passed on)", ts, err)
	}
}

// checkSlowWaiter checks the slow waiter's outcome (err) against its
// tenant's one waiter place: served, the place was given back (else it
// could not have queued anew) and its second ticket's take gave back the
// second; refused too_many_waiters, the give-back failed and the first
// ticket's place is held until the end of the wait it was taken for.
// Any other outcome is a failure. No slot is held above the limit.
func (st *stack) checkSlowWaiter(err error, first core.WaitNote) {
	st.t.Helper()
	var ce *core.CapacityError
	refused := errors.As(err, &ce) && ce.Reason == api.RefusalTooManyWaiters
	if err != nil && !refused {
		st.t.Errorf("slow waiter = %v; want it served, or refused too_many_waiters (its place not given back)", err)
	}
	if free := st.placeFree(); free == refused {
		st.t.Errorf("waiter place free = %v after the slow waiter (err %v); want %v", free, err, !refused)
	}
	if refused {
		st.clock.advance(first.Enqueued.Add(slowWaitTimeout + 2*time.Second).Sub(st.clock.now()))
		if !st.placeFree() {
			st.t.Errorf("waiter place still held after the end of the wait it was taken for")
		}
	}
	st.withinLimit()
}

// placeFree reports whether the tenant's one waiter place is free: a
// probe ticket queues (and leaves at once) or is refused too_many_waiters.
func (st *stack) placeFree() bool {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := st.clock.now()
	t, err := st.store.EnterWait(ctx, core.Waiter{Tenant: "acme", Ticket: testenv.UniqueName(st.t, "probe"), Max: 1,
		Now: now, Until: now.Add(time.Minute)})
	var ce *core.CapacityError
	if errors.As(err, &ce) && ce.Reason == api.RefusalTooManyWaiters {
		return false
	}
	if err != nil {
		st.t.Fatalf("probe the waiter place: %v", err)
	}
	if err := st.store.LeaveWait(ctx, t, now, grantTerm); err != nil {
		st.t.Fatalf("probe the waiter place: leave: %v", err)
	}
	return true
}

// quotaStep leaves the user (whose quota is one slot) with a warm sandbox
// of another thread, then acquires for the thread under the fault: the
// reservation is refused for the user's quota, so the acquire lists the
// user's own warm sandboxes, evicts the one (claim, tombstone, kill,
// free) and reserves again.
func quotaStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	warm(st, thread+"-warm")
	arm()
	st.acquire(thread)
	disarm()
	return nil, core.ReleaseResult{}, false
}

// evictStep fills the deployment with the thread's warm sandbox of
// another thread and active ones, then acquires for the thread under the
// fault: the reservation is refused for capacity, so the acquire evicts
// the warm sandbox (claim, tombstone, kill) and takes its slot over.
func evictStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	warm(st, thread+"-warm")
	for i := range limit - 1 {
		if _, ok := st.acquire(fmt.Sprintf("%s-h%d", thread, i)); !ok {
			st.t.Fatalf("setup acquire failed")
		}
	}
	arm()
	st.acquire(thread)
	disarm()
	return nil, core.ReleaseResult{}, false
}

// limitSteps are the writes that set a ledger's limits, each the first
// take of its ledger in a fresh deployment: the running slots' (the first
// acquire), the paused slots' (the first pause) and the pool places' (the
// first refill). Each is one transaction over the ledger's buckets,
// conditional on their revisions; whatever became of it, the take reads
// the buckets again or fails, and a later take sets them.
var limitSteps = []step{
	{"acquire/running-limits", ddbLayer, limitsWrite("CAP#", "shards"), acquireStep(nil)},
	{"reconcile/paused-limits", ddbLayer, faults.BodyLacks(limitsWrite("PAU#", "lim_of"), `"S":"pausing"`), pauseStep},
	{"pool/place-limit", ddbLayer, faults.BodyLacks(limitsWrite("POOL#", "lim_of"), `"S":"creating"`), refillStep},
}

// limitsWrite matches a transaction on a ledger's buckets (keys starting
// with prefix) that names attribute attr.
func limitsWrite(prefix, attr string) faults.Match {
	return faults.BodyContains(faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"`+prefix), `"`+attr+`"`)
}

// handoverWrite matches a reservation that takes over an evicted
// sandbox's slot: one transaction writing the tombstone gone and the
// reservation.
var handoverWrite = faults.BodyContains(faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"creating"`), `"S":"gone"`)

// steps are the steps of acquire (reuse, reclaim, create, bootstrap,
// restore, resume), release (sync, park, kill) and reconcile's pause, each
// at the dependency call that makes it, and the DynamoDB writes that
// settle reuse, create, kill, pause and resume. A step whose requests the rule never hits fails the case.
var steps = []step{
	{"acquire/reuse", provLayer, faults.BodyContains(faults.PathSuffix("POST", "/process.Process/Start"), `"-c","true"`),
		acquireStep(func(st *stack, thread string) { st.acquire(thread) })},
	{"acquire/reclaim", provLayer, faults.PathSuffix("POST", "/timeout"), acquireStep(warm)},
	{"acquire/create", provLayer, faults.PathSuffix("POST", "/v2/sandboxes"), acquireStep(nil)},
	{"acquire/bootstrap", provLayer, faults.BodyContains(faults.PathSuffix("POST", "/process.Process/Start"), "BOOTSTRAP_OK"), acquireStep(nil)},
	{"acquire/restore", s3Layer, faults.PathContains("GET", "/outputs/"), acquireStep(func(st *stack, thread string) {
		// Earlier outputs in S3, and no sandbox left: the acquire creates
		// and restores.
		res, ok := st.acquire(thread)
		if !ok {
			st.t.Fatalf("setup acquire failed")
		}
		st.write(res.Record, "earlier.txt")
		if err := st.eng.SetDraining(context.Background(), true); err != nil {
			st.t.Fatal(err)
		}
		if rel, ok := st.release(res.Record.SandboxID); !ok || rel.State != "destroyed" {
			st.t.Fatalf("setup release = %+v", rel)
		}
		if err := st.eng.SetDraining(context.Background(), false); err != nil {
			st.t.Fatal(err)
		}
	})},
	// The state writes of those steps, in DynamoDB.
	{"acquire/reuse-claim", ddbLayer, faults.DynamoDB("UpdateItem"),
		acquireStep(func(st *stack, thread string) { st.acquire(thread) })},
	// An acquire in a full deployment that evicts another thread's warm
	// sandbox: the reservation that takes over the slot its kill left.
	{"acquire/evict-handover", ddbLayer, handoverWrite, evictStep},
	// The same under the wait policy: the read of the wait queue that
	// finds nobody waiting (failed, the slot is freed for the queue
	// instead), then the reservation taking the slot over. The second
	// never hits unless DynamoDB Local answers an empty queue's read
	// whole (no NextToken).
	{"acquire/evict-queue-read", ddbLayer, faults.DynamoDB("ExecuteStatement"), evictStep},
	{"acquire/evict-handover-wait", ddbLayer, handoverWrite, evictStep},
	{"acquire/create-finalize", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"active"`), acquireStep(nil)},
	{"release/kill-free", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"gone"`), releaseStep(true)},
	// The free's dispatch under the wait policy: its one-statement read
	// of the queue (failed, the queue is read shard by shard).
	{"release/free-dispatch-read", ddbLayer, faults.DynamoDB("ExecuteStatement"), releaseStep(true)},
	// The provider entirely unreachable during a release (control plane
	// and every sandbox's envd): the outputs cannot even be listed.
	{"release/provider-outage", provLayer, func(faults.Request) bool { return true }, releaseStep(false)},
	{"release/sync", s3Layer, faults.PathContains("PUT", "/outputs/"), releaseStep(false)},
	{"release/drain-read", ddbLayer, faults.BodyContains(faults.DynamoDB("GetItem"), `draining`), releaseStep(false)},
	{"release/park", ddbLayer, faults.BodyContains(faults.DynamoDB("UpdateItem"), `"S":"warm"`), releaseStep(false)},
	// The sync's record of the thread's stored bytes (the tenant's
	// storage cap): before its uploads and at its end.
	{"release/record-stored", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `OUT#`), releaseStep(false)},
	{"release/kill", provLayer, faults.PathContains("DELETE", "/sandboxes/"), releaseStep(true)},
	// Pause-parking: the pause of an idle warm sandbox (reconcile) and
	// the resume of a paused one (acquire), at the provider and in the
	// DynamoDB transactions that take and settle their slots.
	{"reconcile/pause", provLayer, faults.PathSuffix("POST", "/pause"), pauseStep},
	{"reconcile/pause-claim", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"pausing"`), pauseStep},
	{"reconcile/pause-settle", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"paused"`), pauseStep},
	{"acquire/resume", provLayer, faults.PathSuffix("POST", "/connect"), acquireStep(paused)},
	{"acquire/resume-claim", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"resuming"`), acquireStep(paused)},
	{"acquire/resume-settle", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"active"`), acquireStep(paused)},
	// Fair waiting: the transaction that queues a waiter's ticket (with
	// its place), the one that grants it a slot held in trust, and the
	// reservation that takes the grant over.
	{"wait/enqueue", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `qkey`), waitStep},
	// The turn's strongly consistent read of its ticket before it grants
	// itself the room it read.
	{"wait/turn-read", ddbLayer, faults.BodyContains(faults.BodyContains(faults.DynamoDB("GetItem"), `"ConsistentRead":true`), `WQ#`), waitStep},
	{"wait/grant", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `grant_until`), waitStep},
	{"wait/take-grant", ddbLayer, faults.BodyContains(faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"creating"`),
		`"S":"granted"`), waitStep},
	// Renewal: its conditional write on the record (the only write
	// naming the tenant and the active state) and its provider call.
	{"renew/write", ddbLayer, faults.BodyContains(faults.BodyContains(faults.DynamoDB("UpdateItem"), `"S":"acme"`), `"S":"active"`), renewStep},
	{"renew/timer", provLayer, faults.PathSuffix("POST", "/timeout"), renewStep},
	// Outputs a release left deferred: the copy of the next pass, and
	// the timer move that keeps an expiring sandbox running for them.
	{"reconcile/owed-copy", s3Layer, outputsPut, owedCopyStep},
	{"reconcile/hold-timer", provLayer, faults.PathSuffix("POST", "/timeout"), holdTimerStep},
	// A lease that ended without renewal: the pass's copy of its
	// outputs, its tombstone's write and the kill.
	{"reconcile/lease-end-copy", s3Layer, outputsPut, leaseEndStep},
	{"reconcile/lease-end-tombstone", ddbLayer, faults.BodyContains(faults.DynamoDB("UpdateItem"), `"S":"destroying"`), leaseEndStep},
	{"reconcile/lease-end-kill", provLayer, faults.PathContains("DELETE", "/sandboxes/"), leaseEndStep},
}

// leaseEndStep acquires the thread and writes files, lets its lease end
// without renewal on the engine's clock (the provider's timer, in real
// time, still runs), then runs the pass that takes the sandbox back
// under the fault. Once the passes that follow are done, every file is
// in S3.
func leaseEndStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	res, ok := st.acquire(thread)
	if !ok {
		st.t.Fatalf("setup acquire failed")
	}
	files := map[string][]byte{"a.txt": st.write(res.Record, "a.txt"), "b.txt": st.write(res.Record, "b.txt")}
	st.clock.advance(core.DefaultSettings().ActiveTimeout + time.Second)
	arm()
	st.reconcile()
	disarm()
	return files, core.ReleaseResult{}, false
}

// outputsPut matches the upload of a thread's output file to S3 (not
// the sync's manifest, under the broker's own prefix).
var outputsPut = faults.PathContains("PUT", "/outputs/acme/")

// releaseOwing acquires the thread, writes files, then releases it while
// S3 refuses every upload: the sandbox is parked warm, its outputs owed.
// It returns the files, which the case checks are all in S3 once the
// passes that follow are done (faults off).
func releaseOwing(st *stack, thread string) map[string][]byte {
	res, ok := st.acquire(thread)
	if !ok {
		st.t.Fatalf("setup acquire failed")
	}
	files := map[string][]byte{"a.txt": st.write(res.Record, "a.txt"), "b.txt": st.write(res.Record, "b.txt")}
	st.s3.Arm(faults.Fail, outputsPut)
	rel, ok := st.release(res.Record.SandboxID)
	st.s3.Disarm()
	if !ok || rel.State != string(core.StateWarm) || rel.Sync == nil || rel.Sync.Complete {
		st.t.Fatalf("setup release = %+v, %v; want parked warm with its outputs deferred", rel, ok)
	}
	return files
}

// owedCopyStep runs the pass that copies the owed outputs under the
// fault.
func owedCopyStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	files := releaseOwing(st, thread)
	arm()
	st.reconcile()
	disarm()
	return files, core.ReleaseResult{}, false
}

// holdTimerStep leaves the thread's sandbox owing outputs past its idle
// time less the expiry lead, S3 still refusing uploads, and runs the pass
// whose expiry keeps it running (the provider's timer moved) under the
// fault.
func holdTimerStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	files := releaseOwing(st, thread)
	st.clock.advance(core.DefaultSettings().IdleTimeout)
	st.s3.Arm(faults.Fail, outputsPut)
	arm()
	st.reconcile()
	disarm()
	st.s3.Disarm()
	return files, core.ReleaseResult{}, false
}

// pauseAtReleaseSteps are the steps of a release that pauses its sandbox
// (a stack pausing at release): the claim from releasing straight to
// pausing, with the deployment draining too (the claim's paused bucket
// refuses it: the release destroys the sandbox), the provider's pause,
// and the settle that frees the running slot.
var pauseAtReleaseSteps = []step{
	{"release/pause-claim", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"pausing"`), releaseStep(false)},
	{"release/pause-claim-draining", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"pausing"`), releaseStep(true)},
	{"release/pause", provLayer, faults.PathSuffix("POST", "/pause"), releaseStep(false)},
	{"release/pause-settle", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"paused"`), releaseStep(false)},
}

// slowWaiterSteps are the steps of a waiter too slow to see its grant (a
// stack whose waits outlast a grant's term, with one waiter place a
// tenant): giving back the place of the ticket it finds gone, in a
// transaction of that place alone (every other write of a place also
// writes a ticket in the queue).
var slowWaiterSteps = []step{
	{"wait/give-back-place", ddbLayer, faults.BodyLacks(faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"WTR#`),
		`"WQ#`), slowWaiterStep},
}

// quotaSteps are the steps of an acquire refused for its user's quota
// (a stack whose users hold one slot each) that evicts the user's own
// warm sandbox: the query of the owner index and the eviction's claim.
var quotaSteps = []step{
	{"quota/list-own", ddbLayer, faults.BodyContains(faults.DynamoDB("Query"), `"gsi2"`), quotaStep},
	{"quota/evict-claim", ddbLayer, faults.BodyContains(faults.DynamoDB("UpdateItem"), `"S":"destroying"`), quotaStep},
	{"quota/handover", ddbLayer, handoverWrite, quotaStep},
}

// poolSteps are the steps of the pre-warmed pool (a stack with a pool of
// one running member): the claim's write (applied then lost among its
// faults), the check of the claimed member (a member that does not
// answer: discarded, then a create), and a refill's create (failed,
// stalled, or applied with its reply lost: a pool sandbox no record
// names).
var poolSteps = []step{
	{"pool/claim-write", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"claiming"`), claimStep},
	{"pool/member-check", provLayer, memberCheck, claimStep},
	{"pool/refill-create", provLayer, faults.PathSuffix("POST", "/v2/sandboxes"), refillStep},
}

// memberCheck matches the claim's probe of a pool member: a command
// printing the member's marker.
var memberCheck = faults.BodyContains(faults.PathSuffix("POST", "/process.Process/Start"), ".sbx-pool-member")

// pausedPoolSteps are the steps of a pool of one member parked paused:
// the refill's pause of its member (the paused slot's claim, the
// provider's pause, the settle that frees the running slot), and the
// claim of a paused member (the write that takes its running slot, the
// provider's resume, the marker check, the activation that frees its
// paused slot).
var pausedPoolSteps = []step{
	{"pool-paused/pause-claim", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"pausing"`), refillStep},
	{"pool-paused/pause", provLayer, faults.PathSuffix("POST", "/pause"), refillStep},
	// The settle: back to pooled, the running slot's count moving down.
	{"pool-paused/pause-settle", ddbLayer, faults.BodyContains(faults.BodyContains(faults.DynamoDB("TransactWriteItems"),
		`"S":"pooled"`), `"N":"-1"`), refillStep},
	{"pool-paused/claim-write", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"claiming"`), claimStep},
	{"pool-paused/resume", provLayer, faults.PathSuffix("POST", "/connect"), claimStep},
	{"pool-paused/member-check", provLayer, memberCheck, claimStep},
	{"pool-paused/activate", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"active"`), claimStep},
}

// pausedFallbackSteps are the steps of a pause whose home paused bucket
// is full (SANDBOX_MAX_PAUSED 2: two paused buckets of one slot each, the
// home one counted full by hand, a count reconcile's repair takes back):
// the read of every paused bucket (eventually consistent, unlike the
// repair's) and the take in the other bucket.
var pausedFallbackSteps = []step{
	{name: "reconcile/pause-fallback-read", layer: ddbLayer, run: pauseFallbackStep,
		match: faults.BodyLacks(faults.BodyContains(faults.DynamoDB("BatchGetItem"), `"S":"PAU#`), `"ConsistentRead":true`)},
	{name: "reconcile/pause-fallback-take", layer: ddbLayer, run: pauseFallbackStep, match: fallbackTake},
}

// pausedShareSteps are the steps of a pause that finds every paused slot
// held (SANDBOX_MAX_PAUSED 2), both by another tenant's sandboxes: the
// read of the two tenants' paused counts (eventually consistent, unlike
// the counter repair's) and the claim of the other tenant's least
// recently paused sandbox, which checks both counts.
var pausedShareSteps = []step{
	{name: "reconcile/pause-share-read", layer: ddbLayer, run: pauseShareStep,
		match: faults.BodyLacks(faults.BodyContains(faults.DynamoDB("BatchGetItem"), `"S":"TPA#`), `"ConsistentRead":true`)},
	{name: "reconcile/pause-share-evict", layer: ddbLayer, run: pauseShareStep,
		match: faults.BodyContains(faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"TPA#`), `"S":"destroying"`)},
}

// rival is the tenant whose paused sandboxes fill the paused slots of
// the pausedShareSteps.
const rival = "rival"

// pauseShareStep fills the paused slots with two paused sandboxes of the
// rival tenant, then runs the reconcile pass that pauses the thread's
// warm sandbox under the fault: the thread's tenant holds none, so the
// pause evicts the rival's least recently paused one.
func pauseShareStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	for i := range 2 {
		k := core.ThreadKey{Tenant: rival, User: "bob", Thread: fmt.Sprintf("%s-%d", thread, i)}
		ctx, cancel := invocation()
		res, err := st.eng.Acquire(ctx, k)
		cancel()
		if err != nil {
			st.t.Fatalf("setup acquire for %s: %v", k, err)
		}
		ctx, cancel = invocation()
		_, err = st.eng.Release(ctx, rival, res.Record.SandboxID)
		cancel()
		if err != nil {
			st.t.Fatalf("setup release for %s: %v", k, err)
		}
	}
	st.pauseIdle(2, "the rival's two")
	return pauseStep(st, thread, arm, disarm)
}

// fullPaused maps a fallback case's deployment to the key of the paused
// bucket it counted full.
var fullPaused sync.Map

// fallbackTake matches a pause's transaction that takes its paused slot
// in another bucket than the one its case counted full.
func fallbackTake(r faults.Request) bool {
	if !faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"pausing"`)(r) {
		return false
	}
	found := false
	fullPaused.Range(func(dep, full any) bool {
		found = bytes.Contains(r.Body, []byte(`"S":"PAU#`+dep.(string))) && !bytes.Contains(r.Body, []byte(`"S":"`+full.(string)+`"`))
		return !found
	})
	return found
}

// pauseFallbackStep is pauseStep with the home paused bucket of the
// thread's warm sandbox counted full first, so that the pause takes its
// slot in the other bucket.
func pauseFallbackStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	warm(st, thread)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	live := st.live(ctx)
	if len(live) != 1 {
		st.t.Fatalf("setup: live sandboxes %v, want the thread's one", live)
	}
	full := pausedHomePK(st.deployment, live[0])
	fullPaused.Store(st.deployment, full)
	add := "ADD used :one"
	if _, err := st.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: &st.table, UpdateExpression: &add,
		Key: map[string]types.AttributeValue{ddbstore.AttrPK: &types.AttributeValueMemberS{Value: full},
			ddbstore.AttrSK: &types.AttributeValueMemberS{Value: "R"}},
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}}}); err != nil {
		st.t.Fatalf("setup: count %s full: %v", full, err)
	}
	st.idle()
	arm()
	st.reconcile()
	disarm()
	return nil, core.ReleaseResult{}, false
}

// pausedHomePK is the key of the paused bucket a pause of sandbox id
// tries first under SANDBOX_MAX_PAUSED 2: the store's hash of the id
// (FNV-1a) over the two buckets with a share. Were the store to pick
// otherwise, the fallback cases would fail: their rules would never hit.
func pausedHomePK(deployment, id string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	if h.Sum32()%2 == 0 {
		return "PAU#" + deployment
	}
	return "PAU#" + deployment + "#1"
}

func TestOneFaultAtEachStep(t *testing.T) {
	// Subtests run after this function returns: the host lives until
	// they are done.
	host := startHost(t)
	pairs := 0
	configs := map[string]stackConfig{}
	for _, sp := range poolSteps {
		configs[sp.name] = stackConfig{pool: runningPool}
	}
	for _, sp := range pausedPoolSteps {
		configs[sp.name] = stackConfig{pool: pausedPool}
	}
	for _, sp := range quotaSteps {
		configs[sp.name] = stackConfig{maxPerUser: 1}
	}
	// The handovers under reject (the wait policy's are
	// acquire/evict-handover-wait, with nobody waiting).
	configs["acquire/evict-handover"] = stackConfig{policy: core.PolicyReject}
	configs["quota/handover"] = stackConfig{maxPerUser: 1, policy: core.PolicyReject}
	for _, sp := range steps {
		if strings.HasPrefix(sp.name, "wait/") {
			// A waiter asks again once a second: a wait of a few asks
			// still serves it on a loaded machine.
			configs[sp.name] = stackConfig{acquireTimeout: waitStepTimeout}
		}
	}
	for _, sp := range slowWaiterSteps {
		configs[sp.name] = stackConfig{acquireTimeout: slowWaitTimeout, waiterPlaces: 1}
	}
	for _, sp := range slices.Concat(pausedFallbackSteps, pausedShareSteps) {
		configs[sp.name] = stackConfig{maxPaused: 2}
	}
	for _, sp := range pauseAtReleaseSteps {
		configs[sp.name] = stackConfig{pauseAtRelease: true}
	}
	configs["pool/place-limit"] = stackConfig{pool: runningPool}
	for _, sp := range slices.Concat(steps, slowWaiterSteps, poolSteps, pausedPoolSteps, quotaSteps, pausedFallbackSteps, pausedShareSteps,
		pauseAtReleaseSteps, webhookSteps, limitSteps) {
		cfg := configs[sp.name]
		for _, kind := range faults.Kinds() {
			pairs++
			t.Run(sp.name+"/"+string(kind), func(t *testing.T) {
				t.Parallel()
				st := newStack(t, host, cfg)
				layer := sp.layer(st)
				hits := 0
				thread := "t-" + strings.NewReplacer("/", "-").Replace(sp.name)
				files, rel, answered := sp.run(st, thread, func() { layer.Arm(kind, sp.match) }, func() { hits = layer.Disarm() })
				if hits == 0 {
					t.Fatalf("the fault never hit: the step %s made no matching request", sp.name)
				}
				st.settle()
				st.checkInvariants()
				if files != nil {
					st.checkOutputs(thread, files, rel, answered)
				}
				// The thread works again once the fault is gone.
				if _, ok := st.acquire(thread); !ok {
					t.Errorf("acquire after the fault and two reconcile passes failed")
				}
				st.checkInvariants()
			})
		}
	}
	t.Logf("(step, fault) pairs covered: %d", pairs)
}
