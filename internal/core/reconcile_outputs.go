package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MaxOutputsWait bounds how long past its idle timeout a warm sandbox
// whose outputs are not all stored is kept running for them. Reconcile
// moves its provider's timer, pass after pass, until the copy completes;
// past this bound it destroys the sandbox anyway and reports the loss
// (ReconcileStats.OutputsAbandoned).
const MaxOutputsWait = time.Hour

// outputsTimer is how far ahead reconcile moves the timer of a sandbox it
// keeps for its outputs; it moves it again once less than half is left,
// so a pass every minute or two always finds the sandbox running.
const outputsTimer = 10 * time.Minute

// expiryCutoff is the park time before which a warm sandbox is due to
// expire (expireWarm): every warm sandbox while draining.
func (p *pass) expiryCutoff(draining bool) time.Time {
	if draining {
		return p.start.Add(time.Millisecond)
	}
	return p.start.Add(-(p.e.s.IdleTimeout - p.e.s.ExpiryLead()))
}

// owedOutputs copies at once the outputs releases left deferred
// (OwedOutputsStore.NoteOutputsOwed), not only when the sandbox's idle time
// is nearly over. Each noted warm sandbox is leased and synced: a
// complete copy drops the note, an incomplete one keeps it and the
// sandbox running (holdForOutputs). A noted sandbox that is no longer
// warm is dropped: its thread took it back (its next release copies
// again) or it ended. One due to expire is left to expireWarm.
func (p *pass) owedOutputs(ctx context.Context, draining bool) error {
	e := p.e
	ids, err := e.store.OutputsOwed(ctx, reconcileBatch)
	if err != nil {
		return fmt.Errorf("list owed outputs: %w", err)
	}
	due := p.expiryCutoff(draining)
	for _, id := range ids {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			break
		}
		rec, err := e.store.Get(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound), err == nil && rec.State != StateWarm:
			p.forgetOwed(ctx, id)
		case err != nil:
			p.fail(ctx, "read a record owing outputs", id, err)
		case rec.ParkedAt.Before(due):
			// expireWarm copies and ends it.
		default:
			p.copyOwed(ctx, rec)
		}
	}
	return nil
}

// copyOwed copies the outputs of rec (warm, noted as owing outputs) under
// a lease of the pass.
func (p *pass) copyOwed(ctx context.Context, rec Record) {
	e := p.e
	claimed, ok := p.leaseOf(ctx, rec, "claim warm sandbox owing outputs") // usually its thread took it back
	if !ok {
		return
	}
	complete, gone := p.syncParked(ctx, claimed, "storing owed outputs")
	switch {
	case complete:
		p.st.OutputsStored++
		p.forgetOwed(ctx, rec.SandboxID)
		e.unlease(ctx, claimed)
		return
	case !gone:
		p.st.Deferred++
		if gone = p.holdForOutputs(ctx, claimed); !gone {
			return
		}
	}
	p.abandonOutputs(ctx, claimed, "the provider ended it, or the wait for them passed its bound")
	reason := EventReasonIdleExpired // kept running for its outputs as long as allowed
	if gone, _ := e.confirmedGone(ctx, claimed.SandboxID); gone {
		reason = e.endedReason(claimed, StateWarm)
	}
	p.destroy(ctx, claimed, reason, &p.st.Killed)
	p.forgetOwed(ctx, rec.SandboxID)
}

// holdForOutputs keeps rec (warm, leased by the pass, its outputs not all
// stored) running for the next pass: its provider's timer is moved
// outputsTimer ahead when less than half of that is left, never past
// MaxOutputsWait after its idle timeout (plus the expiry lead, so that
// the pass that finds the bound passed still finds it running). The
// record, with its new end, leaves the pass's lease. It reports gone when
// the provider no longer has the sandbox, or when the bound passed (the
// caller destroys it then; the record stays leased).
func (p *pass) holdForOutputs(ctx context.Context, rec Record) (gone bool) {
	e := p.e
	now := e.now()
	bound := rec.ParkedAt.Add(e.s.IdleTimeout + MaxOutputsWait)
	if !now.Before(bound) {
		return true
	}
	end := rec.ExpiresAt
	if !end.IsZero() && !end.Before(now.Add(outputsTimer/2)) {
		e.unlease(ctx, rec)
		return false
	}
	end = now.Add(outputsTimer)
	if last := bound.Add(e.s.ExpiryLead()); last.Before(end) {
		end = last
	}
	cctx, cancel, ok := e.leaseCall(ctx, rec)
	if !ok {
		// A peer may hold it by now: moving the timer could cut its run.
		p.fail(ctx, "keep a sandbox running for its outputs", rec.SandboxID, errors.New("too little lease left to move its timer"))
		return false
	}
	err := e.prov.SetTimeout(cctx, rec.SandboxID, end.Sub(now))
	cancel()
	switch {
	case errors.Is(err, ErrSandboxGone):
		return true
	case err != nil:
		// Maybe applied: the record keeps its older end, the earlier one.
		p.fail(ctx, "keep a sandbox running for its outputs", rec.SandboxID, err)
		e.unlease(ctx, rec)
		return false
	}
	p.st.TimersExtended++
	sctx, scancel := settle(ctx)
	defer scancel()
	if _, err := e.store.Apply(sctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateWarm, ParkedAt: rec.ParkedAt,
		Now: e.now(), ExpiresAt: end, Slot: rec.Slot, Owner: rec.ThreadKey}); err != nil {
		e.log.WarnContext(ctx, "a warm sandbox's later end not recorded; its lease lapses", "sandbox_id", rec.SandboxID, "err", err)
	}
	return false
}

// abandonOutputs reports a sandbox destroyed before its outputs were all
// stored (counted OutputsAbandoned, logged as an error).
func (p *pass) abandonOutputs(ctx context.Context, rec Record, why string) {
	p.st.OutputsAbandoned++
	p.e.log.ErrorContext(ctx, "reconcile: a sandbox ended before its outputs were all stored; the rest are lost: "+why,
		"sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String(), "parked_at", rec.ParkedAt)
}

// forgetOwed drops id's owed-outputs note; a failure leaves it for the
// next pass, which finds the record and drops it again.
func (p *pass) forgetOwed(ctx context.Context, id string) {
	if err := p.e.store.ForgetOutputsOwed(ctx, id); err != nil {
		p.fail(ctx, "forget owed outputs", id, err)
	}
}

// noteOwed notes that rec's outputs are not all stored after its release
// parked it, so that the next reconcile pass copies the rest. Best
// effort: without the note, the expiry of the sandbox copies them, later.
func (e *Engine) noteOwed(ctx context.Context, rec Record) {
	sctx, cancel := settle(ctx)
	defer cancel()
	if err := e.store.NoteOutputsOwed(sctx, rec.SandboxID, e.now()); err != nil {
		e.log.WarnContext(ctx, "owed outputs not noted; the sandbox's expiry copies them", "sandbox_id", rec.SandboxID, "err", err)
	}
}
