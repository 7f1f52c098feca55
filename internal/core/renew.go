package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// TimerMargin is how long the provider's timer of an active sandbox runs
// past its end (Record.ExpiresAt): the timer always ends after the end,
// so a sandbox is never ended by its provider while it is the thread's.
const TimerMargin = 2 * time.Minute

// maxRenewal bounds a renewal's seconds whatever the lifetime bound.
const maxRenewal = 7 * 24 * time.Hour

// RenewResult is a renewed sandbox: its end (Record.ExpiresAt) as stored.
type RenewResult struct {
	SandboxID string
	ExpiresAt time.Time
}

// Renew moves the end of the caller's active sandbox to d from now
// (ActiveTimeout when d is 0), and its provider's timer to TimerMargin
// past that, neither beyond MaxLifetime from its creation. It never moves
// an end earlier: a renewal to an end the sandbox already has writes
// nothing and calls nothing (renewing is idempotent).
//
// Cost: one conditional write on the record (Store.Renew), then, only
// when the end moved, one provider call (Provider.SetTimeout). The record
// is written first: a provider call that certainly failed is undone by a
// fenced write restoring the earlier end, so the next renewal moves the
// end and the timer again; one that may have applied is undone the same
// way (the timer then ends later than the record says, which is safe).
// An undo that fails leaves an end past the timer, which reconcile finds
// and extends (ReconcileStats.TimersExtended).
//
// Errors: *ValidationError; ErrNotFound (unknown or another tenant's);
// ErrConflict (not active); ErrStoreUnavailable; ErrProviderUnavailable
// when the provider's timer could not be moved (nothing renewed).
func (e *Engine) Renew(ctx context.Context, tenant, sandboxID string, d time.Duration) (RenewResult, error) {
	if err := ValidateSandboxID(sandboxID); err != nil {
		return RenewResult{}, err
	}
	if d == 0 {
		d = e.s.ActiveTimeout
	}
	if d < time.Second || d > maxRenewal {
		return RenewResult{}, &ValidationError{Field: "seconds", Message: fmt.Sprintf("must be 1 to %d", int(maxRenewal/time.Second))}
	}
	ctx, cancel := e.begin(ctx)
	defer cancel()
	now := e.now()
	// Whole seconds: a renewal repeated within the second asks for the
	// same end, and the provider counts its timeout in seconds.
	until := now.Add(d).Truncate(time.Second)
	got, err := e.store.Renew(ctx, Renewal{SandboxID: sandboxID, Tenant: tenant, Now: now, Until: until, MaxLifetime: e.s.MaxLifetime})
	if err != nil {
		return RenewResult{}, fmt.Errorf("renew sandbox %s: %w", sandboxID, err)
	}
	rec := got.Record
	if !rec.ExpiresAt.After(got.Prev) {
		return RenewResult{SandboxID: sandboxID, ExpiresAt: rec.ExpiresAt}, nil
	}
	if err := e.prov.SetTimeout(ctx, sandboxID, e.timerFor(rec, e.now())); err != nil {
		e.undoRenewal(ctx, rec, got.Prev)
		if errors.Is(err, ErrSandboxGone) {
			return RenewResult{}, fmt.Errorf("sandbox %s is gone: %w", sandboxID, ErrConflict)
		}
		return RenewResult{}, unavailable(fmt.Errorf("extend sandbox %s's timer: %w", sandboxID, err))
	}
	return RenewResult{SandboxID: sandboxID, ExpiresAt: rec.ExpiresAt}, nil
}

// timerFor is the provider timeout, from now, of an active sandbox whose
// record is rec: TimerMargin past its end, cut to its lifetime bound.
func (e *Engine) timerFor(rec Record, now time.Time) time.Duration {
	end := rec.ExpiresAt.Add(TimerMargin)
	if e.s.MaxLifetime > 0 && !rec.CreatedAt.IsZero() {
		if bound := rec.CreatedAt.Add(e.s.MaxLifetime); bound.Before(end) {
			end = bound
		}
	}
	return end.Sub(now)
}

// activeTimer is the provider timeout of a sandbox handed out now: its
// end (ActiveTimeout) plus TimerMargin.
func (e *Engine) activeTimer() time.Duration { return e.s.ActiveTimeout + TimerMargin }

// undoRenewal restores rec's end to prev after its provider call failed,
// fenced by the renewal's write: a peer that moved the record since wins.
// Best effort; see Renew.
func (e *Engine) undoRenewal(ctx context.Context, rec Record, prev time.Time) {
	if prev.IsZero() {
		return
	}
	cctx, cancel := settle(ctx)
	defer cancel()
	if _, err := e.store.Apply(cctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateActive, KeepLease: true,
		Now: e.now(), ExpiresAt: prev, Slot: rec.Slot}); err != nil {
		e.log.WarnContext(ctx, "renewal's end not undone after its provider call failed; reconcile extends the timer",
			"sandbox_id", rec.SandboxID, "err", err)
	}
}
