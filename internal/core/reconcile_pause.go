package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// parkPaused is the pass's pause-parking work, for providers that can
// pause: it pauses the records an invocation left pausing or resuming
// (their lease lapsed), pauses warm sandboxes idle for
// Settings.PauseAfter (none while draining), and destroys paused
// sandboxes past Settings.PausedTTL (all of them while draining). Nothing
// here resumes a paused sandbox or extends its life: a paused sandbox is
// only ever killed.
func (p *pass) parkPaused(ctx context.Context, draining bool) error {
	if p.e.pauseStore() == nil {
		return nil
	}
	var errs []error
	errs = append(errs, p.finishPauses(ctx))
	if !draining && p.e.pauseParking() {
		errs = append(errs, p.pauseIdle(ctx))
	}
	errs = append(errs, p.expirePaused(ctx, draining))
	return errors.Join(errs...)
}

// finishPauses pauses the records left pausing or resuming after their
// lease lapsed: the provider's pause is idempotent, and both states hold
// a running and a paused slot, so the pause settles either.
func (p *pass) finishPauses(ctx context.Context) error {
	e := p.e
	stale, err := p.lapsed(ctx, StatePausing, StateResuming)
	if err != nil {
		return err
	}
	ctx, cancel := p.workContext(ctx)
	defer cancel()
	for _, rec := range stale {
		if p.timeUp() {
			p.st.BudgetExhausted = true
			break
		}
		claimed, err := p.claim(ctx, rec, StatePausing, StatePausing, StateResuming)
		if err != nil {
			p.skip(ctx, "claim interrupted pause", rec.SandboxID, err) // usually the thread's acquire took it
			continue
		}
		e.log.InfoContext(ctx, "reconcile: finishing an interrupted pause or resume", "sandbox_id", rec.SandboxID, "was", rec.State)
		if p.count(e.finishPause(ctx, claimed)) {
			p.st.PausesFinished++
		}
	}
	return nil
}

// pauseIdle pauses warm sandboxes parked longer than Settings.PauseAfter,
// oldest first, copying their outputs first: a paused sandbox cannot be
// read, and it may be destroyed (evicted, or past its TTL) without being
// resumed. A copy that is incomplete (or failed) leaves it warm, counted
// Deferred; idle expiry copies and ends it as for any warm sandbox.
func (p *pass) pauseIdle(ctx context.Context) error {
	e := p.e
	idle, err := e.store.WarmParkedBefore(ctx, p.start.Add(-e.s.PauseAfter+time.Millisecond), reconcileBatch)
	if err != nil {
		return fmt.Errorf("list idle warm sandboxes to pause: %w", err)
	}
	ctx, cancel := p.workContext(ctx)
	defer cancel()
	for _, rec := range idle {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			break
		}
		check := func(r Record) (ok, gone bool) { return p.syncParked(ctx, r, "pause") }
		if p.count(e.pauseWarm(ctx, rec, p.owner, check)) {
			p.st.Paused++
		}
	}
	return nil
}

// workContext is ctx ending at the invocation's stop time (see
// ReconcileReserve), so a provider call never eats the time the pass
// keeps for its writes (the settling writes have their own, see settle).
func (p *pass) workContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if p.stopAt.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, p.stopAt)
}

// count accounts for one pause attempt: true when the sandbox was paused;
// a deferral counts Deferred, a gone sandbox Dead.
func (p *pass) count(r pauseResult) bool {
	switch r {
	case pauseDeferred:
		p.st.Deferred++
	case pauseDestroyed:
		p.st.Dead++
	}
	return r == pauseDone
}

// expirePaused destroys paused sandboxes paused longer than
// Settings.PausedTTL (every paused sandbox while draining). Their outputs
// were copied before they were paused; a kill that fails leaves a
// tombstone holding the paused slot.
func (p *pass) expirePaused(ctx context.Context, draining bool) error {
	e := p.e
	before := p.start.Add(-e.s.PausedTTL)
	if draining {
		before = p.start.Add(time.Millisecond)
	}
	old, err := e.pauseStore().PausedParkedBefore(ctx, before, reconcileBatch)
	if err != nil {
		return fmt.Errorf("list expired paused sandboxes: %w", err)
	}
	for _, rec := range old {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			break
		}
		claimed, err := p.claim(ctx, rec, StateDestroying, StatePaused)
		if err != nil {
			p.skip(ctx, "claim expired paused sandbox", rec.SandboxID, err) // usually resumed meanwhile
			continue
		}
		claimed = keepPause(claimed, rec)
		e.log.InfoContext(ctx, "reconcile: destroying a paused sandbox past its TTL", "sandbox_id", rec.SandboxID, "paused_at", rec.ParkedAt, "draining", draining)
		reason := EventReasonIdleExpired
		if draining {
			reason = EventReasonDraining
		}
		p.destroy(ctx, claimed, reason, &p.st.PausedExpired)
	}
	return nil
}

// repairCount repairs a count kept with its holders as ledger repairs the
// running slots: it is set to the holders counted only when this pass
// sees the same count, revision and holders as the previous pass (noted,
// kept in the cursor), with a compare-and-swap on the revision (the count
// alone could have moved and come back between the passes).
func (p *pass) repairCount(ctx context.Context, what string, noted *NotedCount, seen HolderCount,
	repair func(ctx context.Context, revision int64, counted int) error) error {
	used, rev, counted := seen.Used, seen.Revision, seen.Counted
	if n := *noted; n.Noted && n.Revision == rev && n.Used == used && n.Counted == counted && used != counted {
		if err := repair(ctx, rev, counted); err != nil {
			if !errors.Is(err, ErrConflict) {
				return fmt.Errorf("repair %s: %w", what, err)
			}
		} else {
			p.e.log.WarnContext(ctx, "reconcile: "+what+" repaired", "used_was", used, "used", counted)
			used, rev = counted, rev+1
		}
	}
	*noted = NotedCount{Used: used, Counted: counted, Revision: rev, Noted: true}
	return nil
}
