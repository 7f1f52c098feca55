package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// PagedLister lists one page of the provider inventory. cursor "" starts
// at the beginning; next "" means there are no more pages. E2B pages with
// nextToken / X-Next-Token (internal/e2b implements it). A provider offers
// it as Capabilities.Pager; without it the inventory is listed in full with
// Provider.List and paged in memory.
type PagedLister interface {
	ListPage(ctx context.Context, f ListFilter, cursor string, limit int) (page []SandboxInfo, next string, err error)
}

// reconcileConfig returns the engine's reconcile configuration, creating
// the default on first use (options run in New, before any concurrency).
func (e *Engine) reconcileConfig() *reconcileConfig {
	if e.rc == nil {
		e.rc = &reconcileConfig{settings: DefaultReconcileSettings()}
	}
	return e.rc
}

// liveStates are the record states of a sandbox that may be in use
// (paused ones included: the thread's next acquire resumes them).
var liveStates = []State{StateActive, StateReleasing, StateWarm, StatePausing, StatePaused, StateResuming,
	StatePooled, StateClaiming}

// pass is one reconcile pass in progress.
type pass struct {
	e        *Engine
	rs       ReconcileSettings
	rst      ReconcileStore
	owner    string
	start    time.Time
	deadline time.Time
	// stopAt is when the invocation must wind down (wall clock): its
	// context's deadline less ReconcileReserve; zero without a deadline.
	stopAt time.Time
	st     ReconcileStats
	seen   []SeenSandbox
	// cursor is the inventory cursor as this pass leaves it (saved once,
	// at the end).
	cursor ReconcileCursor
}

// Reconcile runs one bounded pass: retries tombstones (with
// back-off), copies the outputs releases deferred, takes back active
// sandboxes whose lease ended without renewal (outputs first), expires
// warm sandboxes idle past the idle timeout (all of them while draining), walks the
// provider inventory of this deployment from where the last pass stopped
// (adopting, deferring or killing), settles crashed creates and dead
// records once a walk completes, and repairs the capacity ledger. It
// extends a sandbox's life only on purpose, with Provider.SetTimeout: a
// warm sandbox whose outputs are not all stored (holdForOutputs), and an
// active one whose timer would end before its end (keepTimer); its other
// provider calls are reads (List, Info, Locate, Capabilities.Discover)
// and Kill, and warm sandboxes and ended leases are synced through envd
// before they are destroyed. Stats are logged as one JSON line that is also a CloudWatch
// embedded-metric-format record.
//
// Errors: invalid ReconcileSettings; store or provider failures (the stats
// say what was done before).
func (e *Engine) Reconcile(ctx context.Context) (ReconcileStats, error) {
	cfg := e.reconcileConfig()
	if err := cfg.settings.Validate(); err != nil {
		return ReconcileStats{}, fmt.Errorf("reconcile settings: %w", err)
	}
	ctx, flush := e.withPublisher(ctx) // a stalled event bus costs the pass one bound, at its end
	defer flush()
	start := e.now()
	p := &pass{e: e, rs: cfg.settings, rst: e.inventoryStore(), owner: newOwner(), start: start, deadline: start.Add(cfg.settings.MaxDuration)}
	if dl, ok := ctx.Deadline(); ok {
		p.stopAt = dl.Add(-ReconcileReserve)
	}
	var errs []error
	draining := false
	if look, err := e.store.Lookup(ctx, ThreadKey{}, e.s.Limit()); err == nil {
		draining = look.Draining
	} else {
		// Expiry then runs as if not draining; the pass reports the error.
		errs = append(errs, fmt.Errorf("read ledger: %w", err))
	}
	if err := p.tombstones(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := p.releases(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := p.owedOutputs(ctx, draining); err != nil {
		errs = append(errs, err)
	}
	due, ended, serr := p.activeDue(ctx)
	if serr != nil {
		errs = append(errs, serr)
	}
	p.warnExpiring(ctx, due)
	p.takeBackEnded(ctx, ended)
	if err := p.expireWarm(ctx, draining); err != nil {
		errs = append(errs, err)
	}
	if err := p.parkPaused(ctx, draining); err != nil {
		errs = append(errs, err)
	}
	if err := p.pool(ctx, draining); err != nil {
		errs = append(errs, err)
	}
	if err := p.reconcileStore(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := p.waitQueue(ctx); err != nil {
		errs = append(errs, err)
	}
	e.emitCapacity(ctx)
	p.st.Duration = e.now().Sub(start)
	err := errors.Join(errs...)
	if err != nil {
		p.st.Errors++
	}
	p.emit(ctx, err)
	return p.st, err
}

// reconcileBatch bounds the tombstones and idle warm records one pass handles.
const reconcileBatch = 100

// tombstones retries kills whose lease lapsed, each after a back-off that
// doubles with the attempts reconcile made (LeaseDuration << attempts,
// at most MaxBackoff), measured from the last attempt.
func (p *pass) tombstones(ctx context.Context) error {
	e := p.e
	tombs, err := e.store.Tombstones(ctx, reconcileBatch)
	if err != nil {
		return fmt.Errorf("list tombstones: %w", err)
	}
	e.emitTombstoneAge(ctx, tombs)
	for _, rec := range tombs {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			break
		}
		now := e.now()
		wait := e.s.LeaseDuration << min(rec.KillAttempts, 20)
		if wait > p.rs.MaxBackoff || wait <= 0 {
			wait = p.rs.MaxBackoff
		}
		if now.Before(rec.UpdatedAt.Add(wait)) {
			continue // backing off
		}
		claimed, ok := p.leaseOf(ctx, rec, "claim tombstone") // usually a peer holds its lease
		if !ok {
			continue
		}
		p.st.TombstonesRetried++
		tomb, err := e.applyRecord(ctx, Update{SandboxID: claimed.SandboxID, Fence: claimed.Fence, State: StateDestroying,
			KeepLease: true, Now: e.now(), KillAttempt: true, Slot: claimed.Slot})
		if err != nil {
			p.fail(ctx, "count kill attempt", claimed.SandboxID, err)
			continue
		}
		p.destroy(ctx, tomb, EventReasonKillRetried, &p.st.Killed)
	}
	return nil
}

// releases finishes the releases whose invocation died midway: records
// left releasing after their lease lapsed are claimed, their outputs
// synced, then parked warm (or destroyed, as a release would).
func (p *pass) releases(ctx context.Context) error {
	e := p.e
	stale, err := p.lapsed(ctx, StateReleasing)
	if err != nil {
		return err
	}
	for _, rec := range stale {
		if p.timeUp() {
			break
		}
		claimed, err := p.claim(ctx, rec, StateReleasing, StateReleasing)
		if err != nil {
			p.skip(ctx, "claim interrupted release", rec.SandboxID, err) // usually a peer took it over (a retried release, an acquire)
			continue
		}
		e.log.InfoContext(ctx, "reconcile: finishing an interrupted release", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
		if _, err := e.finishRelease(ctx, claimed, false, ReleaseOptions{}); err != nil {
			p.st.Errors++
			e.log.WarnContext(ctx, "reconcile: finishing a release failed", "sandbox_id", rec.SandboxID, "err", err)
			continue
		}
		p.st.ReleasesTakenOver++
	}
	return nil
}

// ReconcileReserve is the time a pass keeps, before its invocation's
// deadline, for what it must still write (the sandbox it is on, the
// cursor, its stats): the walk, the tombstone retries and the expiries
// stop starting new work past it, and a sync before expiry ends by it.
const ReconcileReserve = 10 * time.Second

// outOfTime reports that the invocation's remaining time is spent (see
// ReconcileReserve); the walk also stops at its own budget (timeUp).
func (p *pass) outOfTime() bool { return !p.stopAt.IsZero() && !time.Now().Before(p.stopAt) }

// expireWarm destroys warm sandboxes parked longer than the idle timeout
// less Settings.ExpiryLead, while the provider still runs them (every warm
// sandbox while draining), syncing their outputs first. It
// holds a lease on the warm record while it syncs, and destroys the
// sandbox only when every output is in S3 (or the provider already ended
// it): an incomplete or failed sync leaves it warm, counted Deferred, its
// provider's timer moved for the next pass (holdForOutputs), up to
// MaxOutputsWait past its idle timeout; past that it is destroyed anyway,
// counted OutputsAbandoned. Syncs end by the invocation's stop time.
func (p *pass) expireWarm(ctx context.Context, draining bool) error {
	e := p.e
	before, reason := p.expiryCutoff(draining), EventReasonIdleExpired
	if draining {
		reason = EventReasonDraining
	}
	idle, err := e.store.WarmParkedBefore(ctx, before, reconcileBatch)
	if err != nil {
		return fmt.Errorf("list idle warm sandboxes: %w", err)
	}
	for _, rec := range idle {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			break
		}
		claimed, ok := p.leaseOf(ctx, rec, "claim idle warm sandbox") // usually a peer took it (reclaim or another pass)
		if !ok {
			continue
		}
		complete, gone := p.syncParked(ctx, claimed, "expiry")
		if !complete && !gone {
			if !p.holdForOutputs(ctx, claimed) {
				p.st.Deferred++ // back to plain warm, still idle: the next pass retries
				continue
			}
			p.abandonOutputs(ctx, claimed, "kept running for them as long as allowed, or ended by the provider")
		}
		tomb, err := e.applyRecord(ctx, Update{SandboxID: claimed.SandboxID, Fence: claimed.Fence, State: StateDestroying,
			KeepLease: true, Now: e.now(), Slot: claimed.Slot})
		if err != nil {
			p.st.Errors++
			continue
		}
		tomb.PrevState = StateWarm // the state it left: the claim only took a lease
		ended := reason
		if gone {
			ended = e.endedReason(claimed, StateWarm) // the provider ended it first
		}
		p.destroy(ctx, tomb, ended, &p.st.Expired)
	}
	return nil
}

// syncParked copies a parked sandbox's outputs to S3 before it is
// destroyed or paused (what names the step, for logs): complete when every
// output is in S3, gone when the provider already ended the sandbox
// (nothing left to copy). The sync ends by the invocation's stop time.
func (p *pass) syncParked(ctx context.Context, rec Record, what string) (complete, gone bool) {
	e := p.e
	if e.sync == nil {
		return true, false
	}
	ctx, cancel := p.workContext(ctx)
	defer cancel()
	// Envd reads only: they do not extend the sandbox's life. A sandbox
	// the provider already ended answers ErrSandboxGone.
	res, err := e.sync.Sync(ctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
	switch {
	case errors.Is(err, ErrSandboxGone):
		return false, true
	case err != nil:
		e.log.WarnContext(ctx, "reconcile: sync before "+what+" failed; left for the next pass", "sandbox_id", rec.SandboxID, "err", err)
		return false, false
	case !res.Complete:
		e.log.WarnContext(ctx, "reconcile: sync before "+what+" incomplete; left for the next pass", "sandbox_id", rec.SandboxID, "deferred", len(res.Deferred))
		return false, false
	}
	return true, false
}

func (p *pass) timeUp() bool { return !p.e.now().Before(p.deadline) || p.outOfTime() }

// leaseOf takes a lease of the pass on rec, still in its state and
// unleased; false when it could not (skipped, as what).
func (p *pass) leaseOf(ctx context.Context, rec Record, what string) (Record, bool) {
	claimed, err := p.claim(ctx, rec, "", rec.State)
	if err != nil {
		p.skip(ctx, what, rec.SandboxID, err)
		return Record{}, false
	}
	return claimed, true
}

// claim moves rec from one of from into to ("" keeps its state) under a
// lease of the pass (Store.Claim).
func (p *pass) claim(ctx context.Context, rec Record, to State, from ...State) (Record, error) {
	now := p.e.now()
	return p.e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: from, To: to,
		Owner: p.owner, Now: now, LeaseUntil: now.Add(p.e.s.LeaseDuration)})
}

// lapsed lists up to reconcileBatch records in states whose lease lapsed:
// work an invocation that died left behind.
func (p *pass) lapsed(ctx context.Context, states ...State) ([]Record, error) {
	now := p.e.now()
	var stale []Record
	for _, st := range states {
		err := p.rst.ScanState(ctx, st, func(r Record) bool {
			if !r.LeaseExpiresAt.After(now) {
				stale = append(stale, r)
			}
			return len(stale) < reconcileBatch
		})
		if err != nil {
			return nil, fmt.Errorf("scan %s records: %w", st, err)
		}
	}
	return stale, nil
}

// destroy destroys a sandbox the pass holds the destroy claim on, for
// reason (one of EventReasons), counting it in done, or in Errors when
// the kill is not confirmed.
func (p *pass) destroy(ctx context.Context, claimed Record, reason string, done *int) {
	if p.e.destroyClaimed(ctx, claimed, reason) {
		*done++
	} else {
		p.st.Errors++
	}
}

// skip accounts for an item the pass leaves alone because a write or read
// about it failed. Contention (a peer holds or moved the record, or settled
// it first) is expected and not an error; anything else is logged once
// here and counted in Errors, never dropped.
func (p *pass) skip(ctx context.Context, what, id string, err error) {
	if errors.Is(err, ErrLeaseHeld) || errors.Is(err, ErrConflict) || errors.Is(err, ErrStaleFence) || errors.Is(err, ErrNotFound) {
		return
	}
	p.fail(ctx, what, id, err)
}

// fail logs a failed step of the pass and counts it in Errors.
func (p *pass) fail(ctx context.Context, what, id string, err error) {
	p.st.Errors++
	p.e.log.WarnContext(ctx, "reconcile: "+what+" failed", "sandbox_id", id, "err", err)
}

// reconcileStore runs the inventory walk and the ledger repair, then saves
// the cursor (one conditional write; a concurrent pass that saved first
// wins and this pass's position is dropped).
func (p *pass) reconcileStore(ctx context.Context) error {
	cur, err := p.rst.Cursor(ctx)
	if err != nil {
		return fmt.Errorf("read reconcile cursor: %w", err)
	}
	p.cursor = cur
	errs := []error{p.inventory(ctx)}
	if !p.timeUp() || p.st.InventoryComplete {
		errs = append(errs, p.ledger(ctx))
	}
	if err := p.rst.SaveCursor(ctx, p.cursor); err != nil && !errors.Is(err, ErrConflict) {
		errs = append(errs, fmt.Errorf("save reconcile cursor: %w", err))
	}
	return errors.Join(errs...)
}

// ledger repairs the counters kept with the slots (RepairCounters): the
// running and paused slots held, the users' and tenants' slot counts,
// the limits' split and the fair-share tenant sets.
func (p *pass) ledger(ctx context.Context) error {
	// The repair may read the whole table (its exact count): it ends by
	// the stop time, leaving the reserve for the cursor's save.
	wctx, cancel := p.workContext(ctx)
	defer cancel()
	rep, err := p.e.store.RepairCounters(wctx, p.e.s.Limit())
	p.st.LedgerRepaired = rep.Slots
	if rep.Slots != 0 || rep.PausedSlots != 0 || rep.Counters != 0 || rep.Rebalanced {
		p.e.log.WarnContext(ctx, "reconcile: slot counters repaired", "slots", rep.Slots, "paused_slots", rep.PausedSlots,
			"counters", rep.Counters, "rebalanced", rep.Rebalanced)
	}
	if perr := p.poolLedger(ctx, rep.Pool); perr != nil {
		err = errors.Join(err, perr)
	}
	if len(rep.TenantsDropped) > 0 {
		p.e.log.InfoContext(ctx, "reconcile: idle tenants dropped from the fair-share set", "tenants", rep.TenantsDropped)
	}
	if err != nil {
		return fmt.Errorf("repair counters: %w", err)
	}
	return nil
}

// waitQueue serves the wait queue as a backstop of the dispatches that
// follow frees and the waiters' own turns: lapsed tickets are removed,
// lapsed grants passed on or freed, and the room there is (a slot freed
// by a repair, a raised limit) granted to the first waiters.
func (p *pass) waitQueue(ctx context.Context) error {
	res, err := p.e.store.Dispatch(ctx, Dispatch{Now: p.e.now(), Limit: p.e.s.Limit(), Freed: NoSlotRef, Scan: true,
		GrantFor: grantFor})
	if err != nil {
		return fmt.Errorf("serve the wait queue: %w", err)
	}
	if len(res.Granted) > 0 || res.Cleaned > 0 {
		p.e.log.InfoContext(ctx, "reconcile: wait queue served", "granted", len(res.Granted), "cleaned", res.Cleaned, "head", res.Head)
	}
	return nil
}
