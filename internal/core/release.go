package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Release syncs the sandbox's outputs and parks it warm for its thread; a
// sandbox found dead (or whose timeout cannot be set because it is gone),
// or released while the deployment drains, is destroyed instead.
// Releasing again is idempotent: a warm sandbox answers "warm", a
// destroyed one "destroyed", and a release whose invocation died midway
// (its lease lapsed) is taken over and finished, outputs synced first.
//
// Worst case (see begin): the sync pass ends setTimeoutReserve before the
// work time does; setting the idle timeout takes the rest of the work
// time; the park (or the tombstone, kill and free) takes the settle
// reserve.
//
// Errors: *ValidationError, ErrNotFound (unknown or another tenant's),
// ErrConflict (not active), ErrLeaseHeld (a peer is moving it),
// ErrProviderUnavailable when the sync pass failed outright (the release
// is left to a retry or to reconcile, the sandbox not parked).
func (e *Engine) Release(ctx context.Context, tenant, sandboxID string) (ReleaseResult, error) {
	return e.ReleaseWith(ctx, tenant, sandboxID, ReleaseOptions{})
}

// ReleaseWith is Release, parking or destroying the sandbox as opts say.
func (e *Engine) ReleaseWith(ctx context.Context, tenant, sandboxID string, opts ReleaseOptions) (ReleaseResult, error) {
	if err := ValidateSandboxID(sandboxID); err != nil {
		return ReleaseResult{}, err
	}
	ctx, cancel := e.begin(ctx)
	defer cancel()
	owner := newOwner()
	rec, err := e.store.Claim(ctx, Claim{SandboxID: sandboxID, Tenant: tenant, From: []State{StateActive, StateReleasing},
		To: StateReleasing, Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)})
	if errors.Is(err, ErrConflict) {
		if cur, gerr := e.store.Get(ctx, sandboxID); gerr == nil && cur.Tenant == tenant {
			switch cur.State {
			case StateWarm:
				return ReleaseResult{SandboxID: sandboxID, State: string(StateWarm)}, nil
			case StatePausing, StatePaused:
				// Released already, and parked paused (or being paused).
				return ReleaseResult{SandboxID: sandboxID, State: string(StatePaused)}, nil
			case StateDestroying, StateGone:
				return ReleaseResult{SandboxID: sandboxID, State: releaseDestroyed}, nil
			}
		}
	}
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("claim for release: %w", err)
	}
	if rec.PrevState == StateReleasing {
		e.log.InfoContext(ctx, "taking over an interrupted release", "sandbox_id", sandboxID, "thread", rec.ThreadKey.String())
	}
	return e.finishRelease(ctx, rec, true, opts)
}

// releaseDestroyed is ReleaseResult.State for a sandbox destroyed, not parked.
const releaseDestroyed = "destroyed"

// setTimeoutReserve is the work time a release keeps after its sync pass
// for setting the idle timeout.
const setTimeoutReserve = 2 * time.Second

// finishRelease completes a release of rec (claimed releasing under this
// invocation's lease): sync, idle timeout, park (or destroy, or pause, as
// opts say). When strict,
// a sync pass that failed outright (the sandbox or S3 unreachable, not
// gone) stops the release before the park: the record stays releasing, so
// the outputs are not left in a parked sandbox whose idle timeout may end
// it first; the caller retries, or reconcile takes the release over once
// the lease lapses (not strict: it parks whatever the sync did, so no
// record stays releasing).
func (e *Engine) finishRelease(ctx context.Context, rec Record, strict bool, opts ReleaseOptions) (ReleaseResult, error) {
	sandboxID := rec.SandboxID
	out := ReleaseResult{SandboxID: sandboxID}
	destroyed := func(reason string) (ReleaseResult, error) {
		e.destroyClaimed(ctx, rec, reason)
		out.State = releaseDestroyed
		return out, nil
	}
	dead := false
	if e.sync != nil {
		sctx, cancel := reserveEnd(ctx, setTimeoutReserve)
		res, serr := e.sync.Sync(sctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
		cancel()
		out.Sync = &res
		if serr != nil {
			out.SyncError = serr.Error()
			dead = errors.Is(serr, ErrSandboxGone)
			if !dead && strict {
				return out, unavailable(fmt.Errorf("sync before park (the release is retried or taken over): %v", serr))
			}
		}
	}
	if !dead && opts.Destroy && (out.Sync == nil || out.Sync.Complete) && out.SyncError == "" {
		return destroyed(EventReasonKilled)
	}
	if !dead && e.now().Add(leaseSafety).After(rec.LeaseExpiresAt) {
		// The lease (nearly) lapsed: a peer may have reclaimed the sandbox,
		// and shortening its timeout now would cut the peer's run short.
		// The fenced park below tells whether we still own it.
		e.log.WarnContext(ctx, "release outlived its lease; not touching the timeout", "sandbox_id", sandboxID)
	} else if !dead {
		err := e.prov.SetTimeout(ctx, sandboxID, e.s.IdleTimeout)
		dead = errors.Is(err, ErrSandboxGone)
		if err != nil && !dead {
			e.log.WarnContext(ctx, "set idle timeout failed; parking with the active timeout", "sandbox_id", sandboxID, "err", err)
		}
	}
	if dead {
		return destroyed(e.endedReason(rec, StateActive))
	}
	if (e.s.PauseAfter == 0 || opts.Pause) && e.pauseParking() && (out.Sync == nil || out.Sync.Complete) && out.SyncError == "" {
		// Pause at release, the outputs just copied (an incomplete copy
		// parks it warm: reconcile copies the rest before pausing it).
		if done, err := e.pauseAtRelease(ctx, rec, &out); done {
			return out, err
		}
	}
	if e.drainingNow(ctx) {
		// A draining deployment keeps nothing warm.
		return destroyed(EventReasonDraining)
	}
	now := e.now()
	pctx, cancel := settle(ctx)
	_, err := e.store.Apply(pctx, Update{SandboxID: sandboxID, Fence: rec.Fence, State: StateWarm, Now: now,
		ParkedAt: now, ExpiresAt: now.Add(e.s.IdleTimeout), Slot: rec.Slot, Owner: rec.ThreadKey})
	cancel()
	if err != nil {
		return out, fmt.Errorf("park warm: %w", err)
	}
	if out.Sync != nil && !out.Sync.Complete {
		e.noteOwed(ctx, rec)
	}
	e.emit(ctx, rec, rec.PrevState, StateWarm, EventReleased, "")
	out.State = string(StateWarm)
	return out, nil
}

// reserveEnd returns ctx ending d before ctx's deadline (unchanged without
// one; at once when less than d is left).
func reserveEnd(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, dl.Add(-d))
}

// Sync copies the sandbox's outputs now. The sandbox must be active or warm
// and not held by a peer (else ErrConflict / ErrLeaseHeld).
func (e *Engine) Sync(ctx context.Context, tenant, sandboxID string) (SyncResult, error) {
	if err := ValidateSandboxID(sandboxID); err != nil {
		return SyncResult{}, err
	}
	if e.sync == nil {
		return SyncResult{}, errors.New("sync: no output sink configured")
	}
	ctx, cancel := e.begin(ctx)
	defer cancel()
	owner := newOwner()
	rec, err := e.store.Claim(ctx, Claim{SandboxID: sandboxID, Tenant: tenant, From: []State{StateActive, StateWarm},
		Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)})
	if err != nil {
		return SyncResult{}, fmt.Errorf("claim for sync: %w", err)
	}
	res, serr := e.sync.Sync(ctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
	if errors.Is(serr, ErrSandboxGone) {
		e.destroyClaimed(ctx, rec, e.endedReason(rec, rec.State))
		return res, fmt.Errorf("sync: %w", serr)
	}
	dctx, dcancel := settle(ctx)
	defer dcancel()
	if _, err := e.store.Apply(dctx, Update{SandboxID: sandboxID, Fence: rec.Fence, State: rec.State, Now: e.now(),
		ParkedAt: rec.ParkedAt, ExpiresAt: rec.ExpiresAt, Slot: rec.Slot, Owner: rec.ThreadKey}); err != nil {
		return res, errors.Join(serr, fmt.Errorf("drop sync lease: %w", err))
	}
	if serr != nil {
		return res, fmt.Errorf("sync: %w", serr)
	}
	return res, nil
}
