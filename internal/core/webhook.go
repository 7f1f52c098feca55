package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ProviderEventKind is what a provider's lifecycle webhook reports.
type ProviderEventKind string

// Provider event kinds the engine acts on; any other is acknowledged and
// ignored.
const (
	// ProviderKilled: the provider ended the sandbox.
	ProviderKilled ProviderEventKind = "killed"
	// ProviderPaused: the provider paused the sandbox.
	ProviderPaused ProviderEventKind = "paused"
	// ProviderResumed and ProviderUpdated change nothing the broker
	// records: a resumed sandbox's thread resumes it again at its next
	// acquire, and the broker sets the timers it relies on itself.
	ProviderResumed ProviderEventKind = "resumed"
	ProviderUpdated ProviderEventKind = "updated"
)

// ProviderEvent is one lifecycle event a provider sent (a webhook whose
// signature the HTTP adapter verified).
type ProviderEvent struct {
	// ID is the event's id, the same in every redelivery of it.
	ID        string
	Kind      ProviderEventKind
	SandboxID string
	// At is when the event happened, by the provider's clock.
	At time.Time
}

// WebhookOutcome says what a provider event did.
type WebhookOutcome string

// Webhook outcomes.
const (
	// WebhookApplied: the record moved (freed, or recorded paused).
	WebhookApplied WebhookOutcome = "applied"
	// WebhookIgnored: nothing to do (not this deployment's sandbox,
	// already as the event says, or a kind the broker does not act on).
	WebhookIgnored WebhookOutcome = "ignored"
	// WebhookDeferred: a peer holds the record (a release, an acquire)
	// and finds the sandbox's state itself; reconcile is the backstop.
	WebhookDeferred WebhookOutcome = "deferred"
)

// WebhookTolerance is how far a webhook's timestamp may be from the
// broker's clock; older or later ones are refused (a replay outside the
// window the store remembers ids for).
const WebhookTolerance = 5 * time.Minute

// ErrReplayed: the webhook's event id was applied before.
var ErrReplayed = errors.New("webhook replayed")

// ApplyProviderEvent applies a provider's lifecycle webhook through the
// conditional writes reconcile uses: a killed sandbox's record is claimed
// for destruction and its slot freed at once (the kill that confirms it
// is idempotent); a warm one the provider paused is recorded paused. The
// event id is recorded first (Store.SeenWebhook) and a replay changes
// nothing. A webhook that never comes, or whose writes fail after its id
// was recorded, is reconcile's to notice.
//
// Errors: *ValidationError (a bad sandbox id; field "timestamp" outside
// WebhookTolerance); ErrReplayed; ErrStoreUnavailable.
func (e *Engine) ApplyProviderEvent(ctx context.Context, ev ProviderEvent) (WebhookOutcome, error) {
	if err := ValidateSandboxID(ev.SandboxID); err != nil {
		return "", err
	}
	now := e.now()
	if ev.At.Before(now.Add(-WebhookTolerance)) || ev.At.After(now.Add(WebhookTolerance)) {
		return "", &ValidationError{Field: "timestamp", Message: fmt.Sprintf("must be within %s of now", WebhookTolerance)}
	}
	ctx, cancel := e.begin(ctx)
	defer cancel()
	// Remembered past the end of the window a replay could pass in.
	if err := e.store.SeenWebhook(ctx, ev.ID, now, ev.At.Add(WebhookTolerance+time.Minute)); err != nil {
		if errors.Is(err, ErrConflict) {
			return "", fmt.Errorf("webhook %s: %w", ev.ID, ErrReplayed)
		}
		return "", fmt.Errorf("record webhook %s: %w", ev.ID, err)
	}
	switch ev.Kind {
	case ProviderKilled:
		return e.providerKilled(ctx, ev.SandboxID)
	case ProviderPaused:
		return e.providerPaused(ctx, ev.SandboxID)
	}
	return WebhookIgnored, nil
}

// providerKilled frees the slot of sandbox id, which the provider ended:
// a live record is claimed for destruction, for the reason the provider
// ended it (see endedReason), and a tombstone's kill is confirmed.
func (e *Engine) providerKilled(ctx context.Context, id string) (WebhookOutcome, error) {
	rec, err := e.store.Get(ctx, id)
	switch {
	case errors.Is(err, ErrNotFound):
		return WebhookIgnored, nil // not this deployment's, or long gone
	case err != nil:
		return "", fmt.Errorf("read sandbox %s: %w", id, err)
	case rec.State == StateGone:
		return WebhookIgnored, nil
	}
	reason, to := e.endedReason(rec, rec.State), StateDestroying
	if rec.State == StateDestroying {
		reason, to = EventReasonKillRetried, "" // a lease only: the tombstone is confirmed
	}
	now := e.now()
	// From the state as read: a record a peer moved since is the peer's.
	claimed, err := e.store.Claim(ctx, Claim{SandboxID: id, Tenant: rec.Tenant, From: []State{rec.State},
		To: to, Owner: newOwner(), Now: now, LeaseUntil: e.leaseUntil(ctx)})
	switch {
	case errors.Is(err, ErrLeaseHeld):
		e.log.InfoContext(ctx, "webhook: killed sandbox held by a peer; left to it", "sandbox_id", id, "state", rec.State)
		return WebhookDeferred, nil
	case errors.Is(err, ErrConflict), errors.Is(err, ErrNotFound):
		return WebhookIgnored, nil // moved on meanwhile: its mover finds it gone, or reconcile does
	case err != nil:
		return "", fmt.Errorf("claim killed sandbox %s: %w", id, err)
	}
	if to == "" {
		claimed.PrevState = rec.PrevState
	}
	e.log.InfoContext(ctx, "webhook: the provider ended the sandbox; freeing its slot", "sandbox_id", id, "state", rec.State, "reason", reason)
	if err := e.destroyClaimedErr(ctx, claimed, reason); err != nil {
		return "", fmt.Errorf("free killed sandbox %s: %w", id, err)
	}
	return WebhookApplied, nil
}

// providerPaused records paused a warm sandbox the provider paused (the
// paused slot taken and settled as a pause of the broker's own). An
// active one stays active: its thread's next acquire finds it paused and
// resumes it. Without pause support, or with every paused slot held, it
// stays warm and its thread's next acquire finds it as it is.
func (e *Engine) providerPaused(ctx context.Context, id string) (WebhookOutcome, error) {
	ps := e.pauseStore()
	rec, err := e.store.Get(ctx, id)
	switch {
	case errors.Is(err, ErrNotFound):
		return WebhookIgnored, nil
	case err != nil:
		return "", fmt.Errorf("read sandbox %s: %w", id, err)
	case rec.State != StateWarm || ps == nil:
		e.log.InfoContext(ctx, "webhook: sandbox paused at the provider; record left as it is", "sandbox_id", id, "state", rec.State)
		return WebhookIgnored, nil
	}
	claimed, err := ps.ClaimPause(ctx, Claim{SandboxID: id, Tenant: rec.Tenant, Owner: newOwner(), Now: e.now(),
		LeaseUntil: e.leaseUntil(ctx)}, e.s.PausedLimit())
	switch {
	case errors.Is(err, ErrLeaseHeld):
		return WebhookDeferred, nil
	case errors.Is(err, ErrConflict), errors.Is(err, ErrNotFound), errors.Is(err, ErrPausedFull), errors.Is(err, ErrDraining):
		e.log.InfoContext(ctx, "webhook: paused sandbox not recorded paused", "sandbox_id", id, "err", err)
		return WebhookIgnored, nil
	case err != nil:
		return "", fmt.Errorf("claim paused sandbox %s: %w", id, err)
	}
	sctx, cancel := settle(ctx)
	defer cancel()
	paused, err := ps.SettlePause(sctx, claimed, e.now())
	if err != nil {
		// Left pausing under a lapsing lease: reconcile finishes it.
		return "", fmt.Errorf("settle paused sandbox %s: %w", id, err)
	}
	e.emit(ctx, paused, StateWarm, StatePaused, EventPaused, "")
	return WebhookApplied, nil
}
