package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// maxUnusable bounds the sandboxes one acquire gives up on (dead after
// create, failed bootstrap, wedged) before answering ErrProviderUnavailable.
const maxUnusable = 3

// createBudget is the time kept for create + bootstrap after waiting.
const createBudget = 10 * time.Second

// Acquire hands the thread a live sandbox: its active one if alive (reused),
// else its parked one (reclaimed from warm, resumed from paused), else a
// pool member when a pool is kept (pool, see fromPool), else a new one
// (created). A peer's live lease on the thread's record (a release
// syncing, a create in flight) is waited out up to the acquire timeout,
// capped by ctx's deadline. Under the wait policy it waits for a slot in
// the wait queue: it asks again (AcquireOrWait) with its ticket every
// Waiting.RetryAfter, as the HTTP clients do, and gives its place up when
// ctx ends. A reuse or reclaim whose sandbox does not answer within
// probeTimeout is discarded and replaced; the answer is written before
// ctx's deadline (see begin). Its DynamoDB calls per path are measured by
// BenchmarkAcquireDynamoDBCalls.
//
// Errors: *ValidationError; *CapacityError when no slot frees in time
// (one of RefusalReasons);
// ErrLeaseHeld when a peer holds the thread past the acquire timeout;
// ErrStoreUnavailable or an ambiguous *ProviderError on outages;
// ErrProviderUnavailable when created sandboxes died or failed their
// bootstrap and no retry fitted in the time left.
func (e *Engine) Acquire(ctx context.Context, key ThreadKey) (AcquireResult, error) {
	req := AcquireRequest{Key: key}
	for {
		res, err := e.AcquireOrWait(ctx, req)
		if err != nil || res.Waiting == nil {
			return res, err
		}
		req.Ticket = res.Waiting.Ticket
		if err := e.sleep(ctx, res.Waiting.RetryAfter); err != nil {
			e.giveUpTicket(ctx, req)
			return AcquireResult{}, fmt.Errorf("acquire: %w", err)
		}
	}
}

// AcquireOrWait is one ask of an acquire: it hands req's thread its
// sandbox, or, under the wait policy when no slot is free, answers at
// once with the acquire's place in the wait queue (AcquireResult.Waiting)
// rather than holding the invocation; the caller asks again with its
// ticket. An ask with a ticket reads it first: granted, it takes the
// granted slot; still waiting, it takes its turn (waitTurn) and answers
// Waiting again, until the wait's end (Settings.AcquireTimeout after the
// first ask), when it is refused for capacity.
//
// Errors are Acquire's, and a *ValidationError (field "ticket") for a
// ticket that is malformed or another thread's.
func (e *Engine) AcquireOrWait(ctx context.Context, req AcquireRequest) (AcquireResult, error) {
	key := req.Key
	if err := key.Validate(); err != nil {
		return AcquireResult{}, err
	}
	st := &acquireState{}
	waitEnd := e.now().Add(e.s.AcquireTimeout)
	if req.Ticket != "" {
		t, err := decodeTicket(req.Ticket, key)
		if err != nil {
			return AcquireResult{}, err
		}
		st.wait, waitEnd = &waiting{ticket: t}, t.Until.Add(-ticketGrace)
	}
	ctx, cancel := e.begin(ctx)
	defer cancel()
	owner := newOwner()
	defer e.leaveWait(ctx, st)
	if st.wait != nil {
		if w, err := e.continueWait(ctx, key, owner, st, waitEnd); w != nil || err != nil {
			return e.handOver(st, w), err
		}
	}
	return e.attempt(ctx, key, owner, st, waitEnd)
}

// attempt acquires for key's thread, trying again after retryable
// failures until the work's end (see workEnd), and queueing under the
// wait policy until waitEnd.
func (e *Engine) attempt(ctx context.Context, key ThreadKey, owner string, st *acquireState, waitEnd time.Time) (AcquireResult, error) {
	deadline := e.workEnd(ctx, waitEnd)
	failures := 0 // sandboxes the provider handed out that proved unusable
	for attempt := 0; ; attempt++ {
		res, retry, err := e.acquireOnce(ctx, key, owner, st)
		if err == nil {
			if pr := st.previous; pr != nil && pr.SandboxID != res.Record.SandboxID {
				res.Previous = pr
			}
			return res, nil
		}
		if errors.Is(err, ErrProviderUnavailable) {
			if failures++; failures >= maxUnusable {
				return AcquireResult{}, err
			}
		}
		if !retry {
			return AcquireResult{}, err
		}
		if errors.Is(err, ErrGrantLost) {
			// The grant lapsed and was passed on before it was taken:
			// leave the queue (what is still ours) and try again at once,
			// as a new arrival. Nothing to back off from, and no busy
			// loop (no grant is held until the next wait); past the
			// deadline the attempt's refusal is the capacity refusal a
			// waiter that timed out gets, never the lost grant.
			e.leaveWait(ctx, st)
			continue
		}
		wait := backoff(attempt)
		var ce *CapacityError
		switch {
		case !errors.As(err, &ce):
		case e.s.Policy != PolicyWait || ce.Reason != api.RefusalCapacity || !e.now().Before(waitEnd):
			return AcquireResult{}, err
		default:
			if st.grant != nil {
				// Refused holding a grant: a take that could not use it.
				// Pass it on rather than wait for it again.
				e.leaveWait(ctx, st)
			}
			switch w, werr := e.queue(ctx, key, owner, st, waitEnd, ce.Status); {
			case werr == nil && w == nil:
				continue // granted: the next attempt takes the slot
			case werr == nil:
				return e.handOver(st, w), nil
			case errors.Is(werr, errTicketGone):
				continue // look again (and queue again if still full)
			default:
				return AcquireResult{}, werr
			}
		}
		if !e.now().Add(wait).Before(deadline) {
			if st.refusal != nil && errors.Is(err, ErrLeaseHeld) {
				return AcquireResult{}, st.refusal
			}
			return AcquireResult{}, contended(err)
		}
		if serr := e.sleep(ctx, wait); serr != nil {
			return AcquireResult{}, fmt.Errorf("acquire: %w", serr)
		}
	}
}

// workEnd is when an ask stops trying again: waitEnd, or earlier, so
// that the create which follows a freed slot can finish inside the
// invocation (a create cut short by the deadline is ambiguous and would
// keep its reservation). ctx's deadline (the work's end, see begin) is
// wall-clock; it is translated onto the engine's clock.
func (e *Engine) workEnd(ctx context.Context, waitEnd time.Time) time.Time {
	dl, ok := ctx.Deadline()
	if !ok {
		return waitEnd
	}
	left := time.Until(dl)
	left -= min(createBudget, left/2)
	if end := e.now().Add(left); end.Before(waitEnd) {
		return end
	}
	return waitEnd
}

// contended is what an acquire whose time ran out on a race returns: a
// thread whose binding or record moved under every attempt is being
// changed by peers, which is the retryable conflict of a held lease, not
// the conflict or absence the last attempt happened to meet.
func contended(err error) error {
	if errors.Is(err, ErrThreadBound) || errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrStaleFence) {
		return fmt.Errorf("acquire: the thread changed under every attempt (last: %v): %w", err, ErrLeaseHeld)
	}
	return err
}

// acquireState is what one Acquire remembers across its attempts.
type acquireState struct {
	// wait is this acquire's ticket in the wait queue (nil: not waiting).
	wait *waiting
	// grant is the slot held in trust for the ticket, once granted: the
	// next take consumes it.
	grant *Grant
	// lostChecked: slots no sandbox uses were looked for (freeLost; once
	// per acquire).
	lostChecked bool
	// tenantUsed is the slots the thread's tenant held at the lookup;
	// atShare: an eviction found it holding its fair share since.
	tenantUsed int
	atShare    bool
	// poolTries counts the pool members this acquire claimed.
	poolTries int
	// killErr is the last eviction's kill the provider did not confirm
	// (see takeSlot).
	killErr error
	// previous is the ended sandbox the thread's binding named at the
	// last attempt's lookup, which that attempt replaces (see previousOf).
	previous *Previous
	// freeing: at the last attempt's lookup a peer held the lease of the
	// thread's own active sandbox, destroying it (a webhook, reconcile;
	// an eviction takes only parked ones, for its own thread): its running
	// slot is about to be freed, so a capacity refusal waits for it.
	// refusal is that refusal, answered if the acquire's time runs out
	// first.
	freeing bool
	refusal *CapacityError
}

// notePendingKill keeps err, an eviction's kill the provider did not
// confirm (nil: none).
func (st *acquireState) notePendingKill(err error) {
	if err != nil {
		st.killErr = err
	}
}

// acquireOnce makes one attempt. retry reports whether waiting and trying
// again may succeed (lease held, capacity full, a concurrent create).
func (e *Engine) acquireOnce(ctx context.Context, key ThreadKey, owner string, st *acquireState) (res AcquireResult, retry bool, err error) {
	look, err := e.store.Lookup(ctx, key, e.s.Limit())
	if err != nil {
		return res, false, fmt.Errorf("lookup thread: %w", err)
	}
	if look.Draining {
		return res, false, e.drainingError()
	}
	var replaceID, replaceRes string
	st.previous, st.freeing, st.refusal = nil, false, nil
	b := look.Binding
	switch {
	case !look.Bound:
	case b.SandboxID != "":
		// One conditional write hands the thread's sandbox back, whether
		// it was active (reuse) or parked (reclaim, including one whose
		// releaser died); a live lease of a peer (a release syncing) is
		// waited out. The refusal carries the record as it is.
		now := e.now()
		rec, err := e.store.Claim(ctx, Claim{SandboxID: b.SandboxID, Tenant: key.Tenant,
			From: []State{StateActive, StateWarm, StateReleasing}, To: StateActive,
			Owner: owner, Now: now})
		switch {
		case err == nil && rec.PrevState == StateActive:
			return e.reuse(ctx, rec, owner)
		case err == nil && rec.PrevState == StateReleasing:
			// A release died mid-way and its lease lapsed: take it over,
			// copying the outputs first, then hand the sandbox back.
			e.syncTakenOver(ctx, rec)
			return e.reclaim(ctx, rec, owner)
		case err == nil:
			return e.reclaim(ctx, rec, owner)
		case errors.Is(err, ErrLeaseHeld):
			return res, true, fmt.Errorf("thread %s: %w", key, err)
		case errors.Is(err, ErrConflict) && rec.State == StateClaiming:
			return e.takeOverClaim(ctx, rec, owner)
		case errors.Is(err, ErrConflict) && holdsPausedSlot(rec.State) && e.pauseStore() != nil:
			// Parked paused (or on the way in or out): resume it.
			st.tenantUsed, st.atShare = look.TenantUsed, false
			return e.resumeParked(ctx, key, rec, owner, st)
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict):
			// The binding names a record that is gone or being destroyed:
			// the thread needs a new sandbox, and learns why it changed.
			replaceID, st.previous = b.SandboxID, previousOf(rec)
			st.freeing = rec.State == StateDestroying && rec.PrevState == StateActive && rec.Slots.Running() &&
				rec.Leased(owner, now) && e.s.Policy != PolicyWait // a waiter queues: the free dispatches the queue
		default:
			return res, false, fmt.Errorf("claim thread's sandbox: %w", err)
		}
	case b.Reservation != "":
		if e.now().Before(b.ReservationExpiresAt) {
			return res, true, fmt.Errorf("thread %s: create in flight: %w", key, ErrLeaseHeld)
		}
		replaceRes = b.Reservation
	}
	st.tenantUsed, st.atShare = look.TenantUsed, false
	if res, handled, retry, err := e.fromPool(ctx, key, owner, replaceID, replaceRes, st); handled {
		return res, retry, err
	}
	return e.create(ctx, key, owner, replaceID, replaceRes, st)
}

// takeoverSyncShare is the part of the work time left that an acquire
// taking over a dead release spends copying the outputs.
const takeoverSyncShare = 3

// syncTakenOver copies the outputs of a sandbox whose release died before
// its sync finished. Best effort: the sandbox goes back to its thread,
// whose next release syncs again.
func (e *Engine) syncTakenOver(ctx context.Context, rec Record) {
	e.log.InfoContext(ctx, "taking over an interrupted release", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
	e.salvage(ctx, rec, "taken-over release")
}

// salvage copies what it can of rec's outputs, under a share of the work
// time left, before the sandbox changes hands or is discarded. Best
// effort: an incomplete copy is logged, and the thread's next sync or
// release (or its restore into a fresh sandbox) goes on from the manifest.
func (e *Engine) salvage(ctx context.Context, rec Record, why string) {
	if e.sync == nil {
		return
	}
	sctx, cancel := shareOf(ctx, takeoverSyncShare)
	defer cancel()
	res, err := e.sync.Sync(sctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
	if err != nil || !res.Complete {
		e.log.WarnContext(ctx, "sync incomplete", "why", why, "sandbox_id", rec.SandboxID, "deferred", len(res.Deferred), "err", err)
	}
}

// fairShareBelow is the condition under which an acquire of key's thread
// may evict another tenant's warm sandbox: its tenant holds fewer slots
// than its fair share (Settings.FairShare), checked by the eviction's
// claim itself, since the count read at the lookup (st.tenantUsed) may be
// stale by then. It is nil when the tenant held its share or more at the
// lookup, or an eviction found it so since (st.atShare): its acquires
// then evict only its own tenant's warm sandboxes. The tenants holding
// slots are those a capacity refusal names (CapacityError.Tenants: they
// may still name tenants that just freed their last slot, until reconcile
// drops them: the share is then smaller, never larger) plus key's tenant.
func (e *Engine) fairShareBelow(key ThreadKey, st *acquireState, tenants []string) *TenantBelow {
	n := len(tenants)
	if !slices.Contains(tenants, key.Tenant) {
		n++
	}
	share := e.s.FairShare(n)
	if st.atShare || st.tenantUsed >= share {
		return nil
	}
	return &TenantBelow{Tenant: key.Tenant, Slots: share}
}

func (e *Engine) drainingError() *CapacityError {
	return &CapacityError{Reason: api.RefusalDraining, RetryAfter: 30 * time.Second,
		Status: CapacityStatus{Limit: e.s.Limit(), Policy: string(e.s.Policy), Draining: true}}
}

// reuse returns the thread's active sandbox if the provider still runs it
// and it answers. The checks are a read (Provider.Info) that never extends
// its life and a trivial command under probeTimeout; a sandbox that does
// not answer is discarded and the thread gets a fresh one. A sandbox the
// provider reports paused is resumed first (Capabilities.Pause), or
// discarded when it cannot be.
func (e *Engine) reuse(ctx context.Context, rec Record, owner string) (AcquireResult, bool, error) {
	info, err := e.prov.Info(ctx, rec.SandboxID)
	if err == nil && info.State == SandboxPaused {
		if rerr := e.resume(ctx, rec.SandboxID); rerr != nil {
			e.log.WarnContext(ctx, "active sandbox is paused and was not resumed; discarding", "sandbox_id", rec.SandboxID, "err", rerr)
			e.destroy(ctx, rec, owner, StateActive, EventReasonNotResumable)
			return AcquireResult{}, true, unavailable(fmt.Errorf("sandbox %s is paused: %v", rec.SandboxID, rerr))
		}
		info.EndAt = e.now().Add(e.s.ActiveTimeout)
	}
	if err == nil {
		if perr := e.probe(ctx, rec.Ref()); perr != nil {
			// The thread has not released it: its outputs may not be in
			// S3 yet. A slow but living sandbox may still hand them over.
			e.log.WarnContext(ctx, "active sandbox does not answer; copying its outputs, then discarding", "sandbox_id", rec.SandboxID, "err", perr)
			e.salvage(ctx, rec, "unresponsive active sandbox")
			e.destroy(ctx, rec, owner, StateActive, e.unanswered(ctx, rec, StateActive))
			return AcquireResult{}, true, unavailable(fmt.Errorf("sandbox %s does not answer: %v", rec.SandboxID, perr))
		}
	}
	switch {
	case err == nil:
		if !info.EndAt.IsZero() && (rec.ExpiresAt.IsZero() || info.EndAt.Before(rec.ExpiresAt)) {
			rec.ExpiresAt = info.EndAt // the provider ends it first; reuse does not extend it
		}
		e.emit(ctx, rec, StateActive, StateActive, EventReused, "")
		return AcquireResult{Record: rec, Source: SourceReused, Restore: e.resumeRestore(ctx, rec)}, false, nil
	case errors.Is(err, ErrSandboxGone):
		e.log.InfoContext(ctx, "active sandbox gone; replacing", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
		e.destroy(ctx, rec, owner, StateActive, e.endedReason(rec, StateActive))
		return AcquireResult{}, true, unavailable(fmt.Errorf("sandbox %s was gone", rec.SandboxID))
	default:
		return AcquireResult{}, false, fmt.Errorf("probe sandbox: %w", err)
	}
}

// resume starts a paused sandbox again for ActiveTimeout, through
// Capabilities.Pause.
//
// Errors: errCannotResume when the provider declares no Pause; the
// provider's error.
func (e *Engine) resume(ctx context.Context, id string) error {
	if e.caps.Pause == nil {
		return errCannotResume
	}
	return e.caps.Pause.Resume(ctx, id, e.activeTimer())
}

// errCannotResume: the provider reports a sandbox paused but declares no
// Capabilities.Pause.
var errCannotResume = errors.New("the provider cannot resume paused sandboxes")

// reclaim finishes taking a warm sandbox back (rec is already active):
// extend its timeout and re-run bootstrap. If either fails the sandbox is
// discarded (destroyed, or left as a tombstone) and acquire tries again.
// The discard is fenced by rec's claim: if a concurrent acquire for the
// thread took the sandbox meanwhile (reused it), the fence is stale and
// nothing is killed (invariant 3).
func (e *Engine) reclaim(ctx context.Context, rec Record, owner string) (AcquireResult, bool, error) {
	if err := e.prov.SetTimeout(ctx, rec.SandboxID, e.activeTimer()); err != nil {
		e.log.WarnContext(ctx, "warm sandbox reconnect failed; discarding", "sandbox_id", rec.SandboxID, "err", err)
		reason := EventReasonUnresponsive
		if errors.Is(err, ErrSandboxGone) {
			reason = e.endedReason(rec, rec.PrevState)
		}
		e.destroyClaimed(ctx, rec, reason)
		return AcquireResult{}, true, unavailable(fmt.Errorf("reconnect warm sandbox: %v", err))
	}
	rec.ExpiresAt = e.now().Add(e.s.ActiveTimeout)
	// The bootstrap, under the probe's short timeout, is the check that
	// the sandbox answers: a wedged one is discarded, not handed out.
	if err := e.bootstrap(ctx, rec.Ref(), probeTimeout); err != nil {
		e.log.WarnContext(ctx, "warm sandbox bootstrap failed; discarding", "sandbox_id", rec.SandboxID, "err", err)
		e.destroyClaimed(ctx, rec, e.unanswered(ctx, rec, StateActive))
		return AcquireResult{}, true, unavailable(err)
	}
	rec = e.recordExpiry(ctx, rec)
	e.emit(ctx, rec, rec.PrevState, StateActive, EventReclaimed, "")
	return AcquireResult{Record: rec, Source: SourceReclaimed, Restore: e.resumeRestore(ctx, rec)}, false, nil
}

// recordExpiry stores the provider timeout reclaim set, so that the record
// (GET /v1/sandboxes/{id}, the dead-slot check) agrees with the acquire
// reply instead of keeping the warm idle deadline. The write is fenced by
// the take-back claim: a peer that moved the record since wins, and a
// failed or lost write only leaves the older deadline, which every reader
// confirms with the provider before acting on it.
func (e *Engine) recordExpiry(ctx context.Context, rec Record) Record {
	cctx, cancel := settle(ctx)
	defer cancel()
	updated, err := e.store.Apply(cctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateActive,
		Now: e.now(), ExpiresAt: rec.ExpiresAt, Slot: rec.Slot})
	if err != nil {
		e.log.InfoContext(ctx, "reclaimed sandbox's expiry not recorded", "sandbox_id", rec.SandboxID, "err", err)
		return rec
	}
	updated.Endpoint = rec.Endpoint
	return updated
}
