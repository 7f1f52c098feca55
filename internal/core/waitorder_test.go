package core_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// waitOrder is what the multi-tenant stress test's store watch sees of the
// wait queue: every ticket an EnterWait queued (with the engine's clock
// before the call and after it returned), what its waiter's polls read
// of it, and every dispatch's grants (with the clock before the call and
// after it returned). From these it checks the fairness rule docs/architecture.md
// states (see check), using only what the calls proved: a reply lost to
// a fault hides a ticket or a grant, which can only leave a case
// unchecked, never make one fail.
type waitOrder struct {
	mu         sync.Mutex
	grantFor   time.Duration
	tickets    map[string]*ticketLog // by ticket id
	dispatches []dispatchLog
}

// ticketLog is one queued ticket.
type ticketLog struct {
	t              core.Ticket
	called, queued time.Time     // EnterWait called, and returned with t
	note           *acquireNote  // the acquire that queued it (nil: not an agent's)
	sights         []ticketSight // its polls
	leaveFailed    bool          // a LeaveWait of it failed: its place may still be held
}

// ticketSight is one poll of a ticket that read it in the queue.
type ticketSight struct {
	at      time.Time // the poll was called
	granted bool
	issued  time.Time // granted: when the grant was made (its Until less the grant's term)
	until   time.Time // granted: when the grant lapses
}

// dispatchLog is one dispatch's grants.
type dispatchLog struct {
	now, done time.Time
	granted   []core.Ticket
}

func newWaitOrder() *waitOrder { return &waitOrder{tickets: map[string]*ticketLog{}} }

// reset forgets everything seen (between the stress test's phases).
func (o *waitOrder) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	clear(o.tickets)
	o.dispatches = nil
}

func (o *waitOrder) queued(t core.Ticket, called, queued time.Time, note *acquireNote) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tickets[t.ID] = &ticketLog{t: t, called: called, queued: queued, note: note}
}

func (o *waitOrder) polled(t core.Ticket, at time.Time, st core.TicketState) {
	if st.Gone || st.Draining {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	tl := o.tickets[t.ID]
	if tl == nil {
		return
	}
	s := ticketSight{at: at, granted: st.Granted}
	if st.Granted {
		s.until = st.Grant.Until // issued is set by check, once a dispatch told the grant's term
	}
	tl.sights = append(tl.sights, s)
}

func (o *waitOrder) left(t core.Ticket, err error) {
	if err == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if tl := o.tickets[t.ID]; tl != nil {
		tl.leaveFailed = true
	}
}

func (o *waitOrder) dispatched(d core.Dispatch, done time.Time, res core.DispatchResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.grantFor = d.GrantFor
	if len(res.Granted) > 0 {
		o.dispatches = append(o.dispatches, dispatchLog{now: d.Now, done: done, granted: res.Granted})
	}
}

// waitingThrough reports whether w provably waited, without a grant and
// live, from before `from` to after `to`: queued before from, lapsing
// after to, and read after to still waiting, or granted by a grant made
// after to (a ticket is granted at most once: a grant it loses deletes
// it).
func (w *ticketLog) waitingThrough(from, to time.Time) bool {
	if !w.queued.Before(from) || !w.t.Until.After(to) {
		return false
	}
	for _, s := range w.sights {
		if s.at.After(to) && (!s.granted || s.issued.After(to)) {
			return true
		}
	}
	return false
}

// liveThrough is waitingThrough, also counting a ticket read after to
// holding a grant that had not lapsed by to (a live granted ticket).
func (w *ticketLog) liveThrough(from, to time.Time) bool {
	if w.waitingThrough(from, to) {
		return true
	}
	if !w.queued.Before(from) || !w.t.Until.After(to) {
		return false
	}
	for _, s := range w.sights {
		if s.at.After(to) && s.granted && s.until.After(to) {
			return true
		}
	}
	return false
}

// inQueueThrough reports whether w's ticket, and so its waiter place,
// was provably in the queue from before `from` to after `to`: queued
// before from, lapsing after to, and read in the queue (waiting or
// granted) after to. A place leaves only with its ticket, or lapses.
func (w *ticketLog) inQueueThrough(from, to time.Time) bool {
	if !w.queued.Before(from) || !w.t.Until.After(to) {
		return false
	}
	for _, s := range w.sights {
		if s.at.After(to) {
			return true
		}
	}
	return false
}

// orderCounts is how much of the rule a check exercised.
type orderCounts struct {
	grants    int // grants checked
	contested int // of them, made while a later ticket provably waited too
	rounds    int // tickets queued while another of their tenant's provably held a place
	newcomers int // tickets queued while none of their tenant's held one (complete checks only)
}

func (n *orderCounts) add(m orderCounts) {
	n.grants += m.grants
	n.contested += m.contested
	n.rounds += m.rounds
	n.newcomers += m.newcomers
}

// check returns the breaches of the fairness rule docs/architecture.md states:
//
//   - Grants follow the queue's order: a dispatch that granted ticket T
//     left no ticket with a smaller key waiting, ungranted and live,
//     from before the dispatch to after it.
//   - A tenant's further waiter joins a later round: a ticket queued
//     while another ticket of its tenant held a place (provably, from
//     before its EnterWait to after it) has a larger round.
//   - With complete, a tenant's first waiter joins the head's round: a
//     ticket queued when every other ticket of its tenant queued before
//     its EnterWait returned had ended with its acquire has a round no
//     larger than that of any ticket live in the queue throughout its
//     EnterWait. Only where every call's outcome is known (complete: no
//     faults) is "no place held" proved.
func (o *waitOrder) check(complete bool) ([]string, orderCounts) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, tl := range o.tickets {
		for i := range tl.sights {
			if s := &tl.sights[i]; s.granted {
				s.issued = s.until.Add(-o.grantFor)
			}
		}
	}
	var n orderCounts
	bad := o.checkGrants(&n)
	return append(bad, o.checkRounds(complete, &n)...), n
}

// checkGrants checks that every dispatch granted in queue order.
func (o *waitOrder) checkGrants(n *orderCounts) []string {
	var bad []string
	for _, d := range o.dispatches {
		for _, g := range d.granted {
			n.grants++
			contested := false
			for _, w := range o.tickets {
				switch {
				case w.t.ID == g.ID || !w.waitingThrough(d.now, d.done):
				case w.t.Key < g.Key:
					bad = append(bad, fmt.Sprintf("dispatch at %s granted %s (key %s) while %s (key %s) waited ahead of it",
						d.now.Format(time.RFC3339Nano), g.ID, g.Key, w.t.ID, w.t.Key))
				default:
					contested = true
				}
			}
			if contested {
				n.contested++
			}
		}
	}
	return bad
}

// checkRounds checks every ticket's round against its tenant's other
// tickets and, for a tenant's first waiter (complete only), the queue's.
func (o *waitOrder) checkRounds(complete bool, n *orderCounts) []string {
	var bad []string
	for _, t := range o.tickets {
		alone := complete
		for _, w := range o.tickets {
			if w == t || w.t.Tenant != t.t.Tenant {
				continue
			}
			if w.inQueueThrough(t.called, t.queued) {
				alone = false
				n.rounds++
				if t.t.Round <= w.t.Round {
					bad = append(bad, fmt.Sprintf("%s's ticket %s joined round %d while its ticket %s held a place in round %d",
						t.t.Tenant, t.t.ID, t.t.Round, w.t.ID, w.t.Round))
				}
			}
			if alone && w.called.Before(t.queued) && !w.ended(t.called) {
				alone = false
			}
		}
		if !alone {
			continue
		}
		n.newcomers++
		for _, w := range o.tickets {
			if w != t && w.liveThrough(t.called, t.queued) && t.t.Round > w.t.Round {
				bad = append(bad, fmt.Sprintf("%s's first waiter %s joined round %d behind %s's live ticket %s in round %d",
					t.t.Tenant, t.t.ID, t.t.Round, w.t.Tenant, w.t.ID, w.t.Round))
			}
		}
	}
	return bad
}

// report runs check for a stress test's phase, reports every breach as an
// error and how much was checked in the log, forgets what it saw and
// returns the counts.
func (o *waitOrder) report(t *testing.T, step string, complete bool) orderCounts {
	t.Helper()
	bad, n := o.check(complete)
	for _, b := range bad {
		t.Errorf("%s: wait order: %s", step, b)
	}
	t.Logf("%s: wait order: %d grants checked (%d with a later waiter behind), %d tickets queued behind their tenant's own, %d first waiters of their tenant",
		step, n.grants, n.contested, n.rounds, n.newcomers)
	o.reset()
	return n
}

// ended reports whether w's acquire had returned before at, every
// LeaveWait of it succeeding: its place was then given back.
func (w *ticketLog) ended(at time.Time) bool {
	if w.note == nil || w.leaveFailed {
		return false
	}
	w.note.mu.Lock()
	defer w.note.mu.Unlock()
	return !w.note.returned.IsZero() && w.note.returned.Before(at)
}

// TestStressWaitOrderUnderFaults keeps the wait queue busy: five tenants
// (one with eight agents, three with two, one with one) share three
// running slots under
// the wait policy, each agent acquiring one of its threads, using it
// briefly and releasing it, which pauses the sandbox (pause at release)
// and so frees its running slot for the queue's next waiter (a returning
// thread resumes its paused sandbox, waiting likewise). A first phase
// injects DynamoDB and provider faults and abandons some acquires
// mid-step, a second runs without; after each the queue's order is
// checked (waitOrder.check), and reconcile must converge: the slots
// counted equal the records and reservations holding them, every running
// sandbox is a live record's, and no waiter place is held.
func TestStressWaitOrderUnderFaults(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stress test: skipped in -short mode")
	}
	const limit = 3
	const deployment = "waitorder"
	r := &waitOrderRun{t: t, clk: &clock{}, failed: map[string]int{}, tenants: []stressTenant{
		{name: "hog", agents: 8, threads: 2, hostile: true},
		{name: "acme", agents: 2, threads: 2},
		{name: "globex", agents: 2, threads: 2},
		{name: "initech", agents: 2, threads: 2},
		// One agent: each of its waiters is its tenant's first, so the
		// rule for a tenant's first waiter is checked however busy the
		// others keep their queues.
		{name: "solo", agents: 1, threads: 2},
	}}
	rig := newStressRig(t, deployment, 21)
	rig.ddbFaults.ArmFunc(rig.fault)
	ddb := testenv.DynamoClient(t)
	prov := &faultyProvider{Provider: rig.client, t: t, store: rig.store, rng: rand.New(rand.NewPCG(7, 8)), created: map[string]core.ThreadKey{}}
	prov.faults.Store(true)
	s := core.DefaultSettings()
	s.Deployment, s.Replicas, s.Policy = deployment, limit, core.PolicyWait
	s.MaxWaitersPerTenant = 3
	s.AcquireTimeout, s.LeaseDuration = 8*time.Second, 3*time.Second
	s.PauseAfter, s.MaxPaused = 0, 12
	rs := core.DefaultReconcileSettings()
	rs.Grace = time.Second
	watch := newTenantWatch(t, ddbstore.New(rig.faultyDB, rig.table, deployment), rig.store, s, r.clk,
		func() map[string]int { return readCounters(t, ddb, rig.table, deployment, r.tenants).tenantUsed })
	var err error
	if r.eng, err = core.New(s, watch, prov, &fakeSyncer{}, core.WithClock(r.clk.now), core.WithReconcileSettings(rs)); err != nil {
		t.Fatalf("core.New: %v", err)
	}
	converge := func(step string) {
		var why []string
		for range 10 {
			r.clk.advance(5 * time.Minute)
			_, _ = r.eng.Reconcile(context.Background())
			if why = converged(t, readLedger(t, ddb, rig.table, deployment), prov, deployment, r.clk.now()); len(why) == 0 {
				return
			}
		}
		t.Errorf("%s: reconcile did not converge: %s", step, strings.Join(why, "; "))
	}

	var total orderCounts
	stopReconcile := reconcileSchedule(r.eng)
	r.phase("faulty phase", 4, true, 1)
	rig.ddbFaults.Disarm()
	prov.faults.Store(false)
	stopReconcile()
	total.add(watch.order.report(t, "faulty phase", false))
	converge("after the faulty phase")

	r.phase("clean phase", 3, false, 2)
	total.add(watch.order.report(t, "clean phase", true))
	converge("after the clean phase")
	if total.grants == 0 || total.contested == 0 || total.rounds == 0 || total.newcomers == 0 {
		t.Errorf("wait order: checked %+v: some rule was not exercised", total)
	}
}

// waitOrderRun is TestStressWaitOrderUnderFaults' agents: each acquires
// one of its threads, uses it briefly and releases it.
type waitOrderRun struct {
	t       *testing.T
	eng     *core.Engine
	clk     *clock
	tenants []stressTenant

	served atomic.Int32
	mu     sync.Mutex
	failed map[string]int // failed acquires by reason
}

// phase runs every agent for ops acquires and logs what they got.
func (r *waitOrderRun) phase(step string, ops int, faulty bool, seed uint64) {
	var wg sync.WaitGroup
	for _, tn := range r.tenants {
		for a := range tn.agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.agent(tn, a, ops, faulty, seed)
			}()
		}
	}
	wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t.Logf("%s: %d served, failed acquires %v", step, r.served.Swap(0), r.failed)
	clear(r.failed)
}

func (r *waitOrderRun) agent(tn stressTenant, a, ops int, faulty bool, seed uint64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, uint64(a)))
	for range ops {
		k := core.ThreadKey{Tenant: tn.name, User: agentUser(tn.name, a), Thread: fmt.Sprintf("a%d-t%d", a, rng.IntN(tn.threads))}
		res, err := agentAcquire(ctx, r.eng, r.clk, rng, k, faulty)
		if err != nil {
			r.mu.Lock()
			r.failed[errKind(err)]++
			r.mu.Unlock()
			continue
		}
		r.served.Add(1)
		time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond) // the turn
		_, _ = r.eng.Release(ctx, tn.name, res.Record.SandboxID)
	}
}
