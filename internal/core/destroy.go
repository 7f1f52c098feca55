package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// destroy claims rec for destruction (from state from) and destroys it,
// for reason (one of EventReasons). A peer that moved the record first
// wins; nothing is killed then.
func (e *Engine) destroy(ctx context.Context, rec Record, owner string, from State, reason string) bool {
	now := e.now()
	cctx, cancel := settle(ctx)
	defer cancel()
	claimed, err := e.store.Claim(cctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{from},
		To: StateDestroying, Owner: owner, Now: now, LeaseUntil: e.leaseUntil(ctx)})
	if err != nil {
		e.log.InfoContext(ctx, "destroy claim lost", "sandbox_id", rec.SandboxID, "err", err)
		return false
	}
	return e.destroyClaimed(ctx, claimed, reason)
}

// kill is a settle step: Provider.Kill under settle's time.
func (e *Engine) kill(ctx context.Context, id string) error {
	ctx, cancel := settle(ctx)
	defer cancel()
	return e.prov.Kill(ctx, id)
}

// destroyClaimed turns a record this invocation holds the lease on into a
// tombstone, kills the sandbox (killClaimed) and frees its slots once the
// kill is confirmed, publishing its end (freeKilled). It reports whether
// the sandbox is confirmed gone.
func (e *Engine) destroyClaimed(ctx context.Context, rec Record, reason string) bool {
	return e.destroyClaimedErr(ctx, rec, reason) == nil
}

// errKillUncertain: the provider did not confirm a kill (an outage, a
// timeout): the tombstone keeps its slot.
var errKillUncertain = errors.New("kill uncertain")

// destroyClaimedErr is destroyClaimed, answering why the sandbox is not
// confirmed gone: an error wrapping errKillUncertain and the provider's
// error when the kill was not confirmed, or the store's error.
func (e *Engine) destroyClaimedErr(ctx context.Context, rec Record, reason string) error {
	k, err := e.killClaimed(ctx, rec, reason)
	if err != nil {
		return err
	}
	return e.freeKilled(ctx, k)
}

// killed is a sandbox whose kill the provider confirmed: its tombstone,
// which still holds its slots (freeKilled frees them; a reservation may
// take its running slot over, Reservation.Handover), the state it left
// and why it was destroyed (one of EventReasons).
type killed struct {
	tomb   Record
	from   State
	reason string
}

// killClaimed turns rec, held under this invocation's lease, into a
// tombstone (unless it is one) and kills its sandbox. The tombstone keeps
// reason as its EndReason (a tombstone's first reason stays, through kill
// retries). An uncertain kill leaves the tombstone, and its slot, for a
// later retry: errKillUncertain.
func (e *Engine) killClaimed(ctx context.Context, rec Record, reason string) (killed, error) {
	k := killed{from: rec.State, reason: reason}
	if k.from == StateDestroying {
		k.from = rec.PrevState // "": recorded as a tombstone (an untracked sandbox)
	}
	stored := rec.EndReason != "" // as read: a tombstone's first reason stays
	if !stored {
		rec.EndReason = reason
	}
	if rec.State != StateDestroying {
		tctx, cancel := settle(ctx)
		tomb, err := e.applyRecord(tctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateDestroying,
			KeepLease: true, Now: e.now(), KillAttempt: true, Slot: rec.Slot, EndReason: rec.EndReason})
		cancel()
		if err != nil {
			e.log.WarnContext(ctx, "tombstone write failed", "sandbox_id", rec.SandboxID, "err", err)
			return killed{}, fmt.Errorf("tombstone: %w", err)
		}
		tomb.EndReason, rec, stored = rec.EndReason, tomb, true
	}
	if err := e.kill(ctx, rec.SandboxID); err != nil {
		e.log.WarnContext(ctx, "kill uncertain; tombstone keeps its slot", "sandbox_id", rec.SandboxID, "err", err)
		e.keepTombstone(ctx, rec, !stored)
		return killed{}, fmt.Errorf("%w: %w", errKillUncertain, err)
	}
	k.tomb = rec
	return k, nil
}

// freeKilled frees the slots of k's tombstone and publishes its end
// (ended). A free that fails leaves the tombstone, and its slots, to a
// later retry of its kill.
func (e *Engine) freeKilled(ctx context.Context, k killed) error {
	fctx, cancel := settle(ctx)
	defer cancel()
	if err := e.store.Free(fctx, k.tomb, e.now()); err != nil {
		e.log.WarnContext(ctx, "free slot after kill failed", "sandbox_id", k.tomb.SandboxID, "err", err)
		return fmt.Errorf("free: %w", err)
	}
	e.ended(ctx, k)
	return nil
}

// ended publishes the end of k's sandbox, gone: EventLost when its thread
// lost it (lostWhileHeld), then EventDestroyed.
func (e *Engine) ended(ctx context.Context, k killed) {
	if lostWhileHeld(k.tomb, k.from, k.tomb.EndReason) {
		e.emit(ctx, k.tomb, k.from, StateGone, EventLost, k.tomb.EndReason)
	}
	e.emit(ctx, k.tomb, k.from, StateGone, EventDestroyed, k.reason)
}

// keepTombstone writes the reason rec's end has (rec.EndReason) on rec, a
// tombstone whose kill was not confirmed, when the store does not have it
// yet (unrecorded). Best effort: the retry that frees it writes the
// reason.
func (e *Engine) keepTombstone(ctx context.Context, rec Record, unrecorded bool) {
	if !unrecorded {
		return
	}
	tctx, cancel := settle(ctx)
	_, _ = e.store.Apply(tctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateDestroying, KeepLease: true,
		Now: e.now(), EndReason: rec.EndReason})
	cancel()
}

// lostSlotsInterval is how often one engine looks for lost slots before
// refusing (freeLost): at most once per interval, so that refusals under
// contention do not each pay the search. Reconcile frees them on every
// pass too.
const lostSlotsInterval = 2 * time.Second

// freeLost frees slots that no sandbox uses, when nothing may be evicted:
// a tombstone's whose kill can be retried, else those of sandboxes the
// provider has ended (freeDead). At most once per lostSlotsInterval per
// engine (by its clock); it reports whether it freed any, and killErr
// when a retried kill was not confirmed (as evictOne).
func (e *Engine) freeLost(ctx context.Context, owner string) (freed bool, killErr error) {
	now := e.now().UnixNano()
	next := e.lostCheck.Load()
	if now < next || !e.lostCheck.CompareAndSwap(next, now+int64(lostSlotsInterval)) {
		return false, nil
	}
	if freed, killErr = e.retryTombstone(ctx, owner); freed {
		return true, nil
	}
	return e.freeDead(ctx, owner) > 0, killErr
}

// retryTombstone frees a tombstone's slot by retrying its kill, if one of
// a sample of them has a lapsed retry lease; it reports whether it did,
// and killErr when the kill was not confirmed.
func (e *Engine) retryTombstone(ctx context.Context, owner string) (bool, error) {
	tombs, err := e.store.Sample(ctx, StateDestroying, 5)
	if err != nil {
		return false, nil
	}
	for _, rec := range tombs {
		claimed, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateDestroying},
			Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)})
		if err != nil {
			continue // a peer holds its retry lease
		}
		err = e.destroyClaimedErr(ctx, claimed, EventReasonKillRetried)
		return err == nil, uncertainKill(err)
	}
	return false, nil
}

// deadBatch bounds the dead sandboxes one acquire frees, and deadSample
// the active records it examines to find them.
const (
	deadBatch  = 5
	deadSample = 50
)

// confirmedGone reports whether the provider says the sandbox no longer
// exists: Capabilities.Discover's PresenceAbsent when declared, else
// Provider.Info's ErrSandboxGone. Found is a plain false.
//
// Errors: why the answer is not known (an unknown presence, a failed
// read); never proof either way.
func (e *Engine) confirmedGone(ctx context.Context, id string) (bool, error) {
	if e.caps.Discover == nil {
		_, err := e.prov.Info(ctx, id)
		if errors.Is(err, ErrSandboxGone) {
			return true, nil
		}
		return false, err
	}
	switch p, err := e.caps.Discover(ctx, id); {
	case p == PresenceAbsent:
		return true, nil
	case p == PresenceFound:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("sandbox presence unknown: %w", err)
	default:
		return false, errPresenceUnknown
	}
}

// errPresenceUnknown: the provider's discovery could not say whether a
// sandbox exists.
var errPresenceUnknown = errors.New("sandbox presence unknown")

// freeDead frees the slots of records whose provider end time has passed,
// once the provider confirms the sandbox is gone (a read, as the kill
// path's confirmation): warm ones parked longer than the idle timeout and
// active ones past their recorded end. It returns the slots freed.
func (e *Engine) freeDead(ctx context.Context, owner string) int {
	now := e.now()
	var cands []Record
	if warm, err := e.store.WarmParkedBefore(ctx, now.Add(-e.s.IdleTimeout), deadBatch); err == nil {
		cands = append(cands, warm...)
	}
	// The active ones: the least recently updated of a random part of the
	// active index (see Store.Sample), a read bounded whatever the fleet's
	// size. One the sample misses is found by a later refusal's sample, or
	// freed by reconcile's pass.
	if active, err := e.store.Sample(ctx, StateActive, deadSample); err == nil {
		for _, r := range active {
			if !r.ExpiresAt.IsZero() && r.ExpiresAt.Before(now) && len(cands) < 2*deadBatch {
				cands = append(cands, r)
			}
		}
	}
	freed := 0
	for _, r := range cands {
		if freed >= deadBatch || ctx.Err() != nil {
			break
		}
		if gone, _ := e.confirmedGone(ctx, r.SandboxID); !gone {
			continue // alive (its end was extended) or unknown: never free on doubt
		}
		claimed, err := e.store.Claim(ctx, Claim{SandboxID: r.SandboxID, Tenant: r.Tenant, From: []State{r.State},
			To: StateDestroying, Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)})
		if err != nil {
			continue // a peer moved it
		}
		e.log.InfoContext(ctx, "freeing the slot of a sandbox the provider ended", "sandbox_id", r.SandboxID, "state", r.State)
		if e.destroyClaimed(ctx, claimed, e.endedReason(r, r.State)) {
			freed++
		}
	}
	return freed
}
