package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Pause-parking. A warm sandbox idle for Settings.PauseAfter is paused at
// the provider (Capabilities.Pause) and its record moves warm -> pausing
// -> paused; the thread's next acquire moves it paused -> resuming ->
// active. Every step is a leased, fenced write, and the provider call
// between two writes is classified:
//
//   - pausing holds the sandbox's running slot and a paused slot (taken
//     first, within Settings.PausedLimit); a confirmed pause frees the
//     running slot (paused), a pause that certainly failed frees the
//     paused slot (back to warm), a gone sandbox is destroyed, and an
//     ambiguous pause leaves the record pausing for whoever comes next.
//   - resuming holds the paused slot and a running slot (taken first, as
//     a create's reservation is, with its waiting and eviction); a
//     confirmed resume and bootstrap frees the paused slot (active);
//     anything else discards the sandbox and the thread gets a new one.
//
// An invocation may die at any line: a record left pausing or resuming
// (both hold both slots) is finished by the thread's next acquire, which
// resumes it, or by reconcile, which pauses it: the provider's pause and
// resume are idempotent. An active sandbox is never paused (only a warm
// record can be claimed for a pause) and a paused one is never handed out
// before its resume and bootstrap succeeded.

// pauseStore returns the store's pause-parking access when the provider
// can pause and resume (nil otherwise: paused records are then replaced,
// never resumed).
func (e *Engine) pauseStore() PauseStore {
	if e.caps.Pause == nil {
		return nil
	}
	return e.store.pauseStore()
}

// pauseParking reports whether idle warm sandboxes are paused.
func (e *Engine) pauseParking() bool {
	return e.s.PauseAfter >= 0 && e.pauseStore() != nil
}

// holdsPausedSlot reports whether records in st hold a paused slot by
// their state (the paused-slot states).
func holdsPausedSlot(st State) bool {
	return st == StatePausing || st == StatePaused || st == StateResuming
}

// leaseCall bounds a provider call made under rec's lease so that it ends
// a margin before the lease does (a peer taking the record over after the
// lease must not be contradicted by a late call). ok is false when too
// little lease is left to call at all.
func (e *Engine) leaseCall(ctx context.Context, rec Record) (context.Context, context.CancelFunc, bool) {
	left := rec.LeaseExpiresAt.Sub(e.now()) - min(leaseSafety, e.s.LeaseDuration/4)
	if left <= 0 {
		return ctx, func() {}, false
	}
	cctx, cancel := context.WithTimeout(ctx, left)
	return cctx, cancel, true
}

// pauseResult is what pauseWarm did.
type pauseResult int

const (
	pauseSkipped   pauseResult = iota // not claimed (a peer moved it), or no paused slot
	pauseDone                         // paused
	pauseDeferred                     // left pausing (ambiguous) or back to warm (refused, outputs not all copied)
	pauseDestroyed                    // the provider had ended it: destroyed
)

// pauseWarm pauses the warm sandbox rec (only its id and tenant are read)
// for owner. When the paused slots are full, the least recently paused
// sandbox of another thread is destroyed to make room (at most
// maxEvictions). check, when set, runs first (reconcile copies the
// outputs) under a lease that keeps the record warm: a record is pausing
// only once its outputs are copied, so an invocation that dies during the
// copy leaves a warm record whose lease lapses, never a pausing one that a
// later pass would pause uncopied. false gives the pause up.
func (e *Engine) pauseWarm(ctx context.Context, rec Record, owner string, check func(Record) (ok, gone bool)) pauseResult {
	var leased *Record
	if check != nil {
		held, res, ok := e.checkWarm(ctx, rec, owner, check)
		if !ok {
			return res
		}
		leased = &held
	}
	claimed, err := e.claimPauseEvicting(ctx, rec.ThreadKey, owner, func() (Record, error) {
		return e.pauseStore().ClaimPause(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, Owner: owner, Now: e.now(),
			LeaseUntil: e.leaseUntil(ctx)}, e.s.PausedLimit())
	})
	if err != nil {
		e.log.InfoContext(ctx, "pause not claimed", "sandbox_id", rec.SandboxID, "err", err)
		if leased != nil {
			e.unlease(ctx, *leased)
		}
		return pauseSkipped
	}
	return e.finishPause(ctx, claimed)
}

// claimPauseEvicting runs claim (a claim into pausing for key's thread)
// and, while it finds the paused slots full, evicts the least recently
// paused sandbox of another thread (evictPaused) and claims again, at most
// maxEvictions times.
func (e *Engine) claimPauseEvicting(ctx context.Context, key ThreadKey, owner string, claim func() (Record, error)) (Record, error) {
	for evictions := 0; ; evictions++ {
		rec, err := claim()
		if errors.Is(err, ErrPausedFull) && evictions < maxEvictions && e.evictPaused(ctx, key, owner) {
			continue
		}
		return rec, err
	}
}

// pauseAtRelease pauses rec (releasing under this invocation's lease, its
// outputs copied and its idle timeout set) straight from its release: the
// claim moves it to pausing under the release's lease, with no park warm
// before it, so that its running slot's count is written once, by the
// settle that frees the slot (see PauseStore.ClaimReleasePause). It sets
// out.State. done is false when the claim certainly changed nothing and
// the sandbox is to be parked warm instead (the paused slots full, or the
// record no longer the release's: the park's fence tells); a claim that
// may have been applied is settled from a read of the record, and when
// that read fails too the release fails retryable: the record is pausing
// or releasing under the lease, and the release's retry, the thread's
// next acquire or reconcile finishes it once the lease lapses.
func (e *Engine) pauseAtRelease(ctx context.Context, rec Record, out *ReleaseResult) (done bool, err error) {
	if ctx.Err() != nil {
		return false, nil // the work time is spent: park warm, under the settle reserve
	}
	owner, now := rec.LeaseOwner, e.now()
	claimed, err := e.claimPauseEvicting(ctx, rec.ThreadKey, owner, func() (Record, error) {
		// Under the settle reserve, as the park it replaces: the sync and
		// the idle timeout may have used the work time up.
		sctx, cancel := settle(ctx)
		defer cancel()
		return e.pauseStore().ClaimReleasePause(sctx, ReleasePause{Claim: Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant,
			Owner: owner, Now: now, LeaseUntil: e.leaseUntil(ctx)}, Fence: rec.Fence, ExpiresAt: now.Add(e.s.IdleTimeout), Limit: e.s.PausedLimit()})
	})
	switch {
	case err == nil:
	case errors.Is(err, ErrDraining):
		// A draining deployment keeps nothing parked.
		e.destroyClaimed(ctx, rec, EventReasonDraining)
		out.State = releaseDestroyed
		return true, nil
	case errors.Is(err, ErrPausedFull), errors.Is(err, ErrConflict), errors.Is(err, ErrLeaseHeld), errors.Is(err, ErrNotFound):
		e.log.InfoContext(ctx, "pause at release not claimed; parking warm", "sandbox_id", rec.SandboxID, "err", err)
		return false, nil
	default:
		sctx, cancel := settle(ctx)
		cur, gerr := e.store.Get(sctx, rec.SandboxID)
		cancel()
		switch {
		case gerr == nil && cur.State == StatePausing && cur.LeaseOwner == owner:
			claimed = cur
		case gerr == nil && cur.State == StateReleasing && cur.Fence == rec.Fence:
			return false, nil
		default:
			return true, unavailable(fmt.Errorf("pause at release: %w", err))
		}
	}
	e.emit(ctx, rec, rec.PrevState, StatePausing, EventReleased, "")
	switch e.finishPause(ctx, claimed) {
	case pauseDone:
		out.State = string(StatePaused)
	case pauseDestroyed:
		out.State = releaseDestroyed
	default: // given up (warm again) or left pausing: parked for the thread either way
		out.State = string(StateWarm)
	}
	return true, nil
}

// checkWarm leases the warm record rec for owner, its state unchanged, and
// runs check under the lease. ok reports that check passed and the lease
// (held, the leased record) is still owner's, so the pause claim that
// follows is too; otherwise res says what was done: not leased (a peer
// moved it), destroyed (the provider had ended it), or given up with the
// lease cleared (outputs not all copied).
func (e *Engine) checkWarm(ctx context.Context, rec Record, owner string, check func(Record) (ok, gone bool)) (held Record, res pauseResult, ok bool) {
	held, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateWarm},
		Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)})
	if err != nil {
		e.log.InfoContext(ctx, "pause not claimed", "sandbox_id", rec.SandboxID, "err", err)
		return held, pauseSkipped, false
	}
	switch passed, gone := check(held); {
	case gone:
		e.destroyClaimed(ctx, held, e.endedReason(held, StateWarm))
		return held, pauseDestroyed, false
	case !passed:
		e.unlease(ctx, held)
		return held, pauseDeferred, false
	}
	return held, pauseDone, true
}

// unlease clears this invocation's lease on rec (active or warm) and
// leaves it in its state, so that its thread need not wait for the lease
// to lapse. A failed write leaves the lease to lapse.
func (e *Engine) unlease(ctx context.Context, rec Record) {
	u := Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: rec.State, Now: e.now(), Slot: rec.Slot}
	if rec.State == StateWarm {
		u.ParkedAt, u.Owner = rec.ParkedAt, rec.ThreadKey
	}
	sctx, cancel := settle(ctx)
	defer cancel()
	if _, err := e.store.Apply(sctx, u); err != nil {
		e.log.WarnContext(ctx, "clearing a lease failed; it lapses", "sandbox_id", rec.SandboxID, "state", rec.State, "err", err)
	}
}

// finishPause asks the provider to pause rec (pausing or resuming, leased
// by this invocation) and settles the record by the answer.
func (e *Engine) finishPause(ctx context.Context, rec Record) pauseResult {
	// A pool member (no thread) settles back to pooled.
	pool, member := e.store.poolStore(), rec.ThreadKey == (ThreadKey{})
	cctx, cancel, ok := e.leaseCall(ctx, rec)
	if !ok {
		e.log.WarnContext(ctx, "too little lease left to pause; left for the next pass", "sandbox_id", rec.SandboxID)
		return pauseDeferred
	}
	err := e.caps.Pause.Pause(cctx, rec.SandboxID)
	cancel()
	switch {
	case err == nil:
		sctx, scancel := settle(ctx)
		defer scancel()
		settlePause := e.pauseStore().SettlePause
		if member {
			settlePause = pool.SettlePoolPause
		}
		paused, err := settlePause(sctx, rec, e.now())
		if err != nil {
			// Stale fence: a peer took the record over (its call decides);
			// maybe applied: the record stays pausing, finished later.
			e.log.WarnContext(ctx, "paused, but the record was not settled", "sandbox_id", rec.SandboxID, "err", err)
			return pauseDeferred
		}
		if member {
			e.log.InfoContext(ctx, "pool member parked paused", "sandbox_id", rec.SandboxID)
			return pauseDone
		}
		e.log.InfoContext(ctx, "sandbox paused", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
		from := StateWarm
		if rec.PrevState == StateReleasing {
			from = StateReleasing // paused at its release
		}
		e.emit(ctx, paused, from, StatePaused, EventPaused, "")
		return pauseDone
	case errors.Is(err, ErrSandboxGone):
		e.log.InfoContext(ctx, "sandbox to pause was gone", "sandbox_id", rec.SandboxID)
		e.destroyClaimed(ctx, rec, e.endedReason(rec, StateWarm))
		return pauseDestroyed
	case IsAmbiguous(err):
		// Maybe paused: the record stays pausing, holding both slots,
		// until the thread's acquire resumes it or reconcile pauses it.
		e.log.WarnContext(ctx, "pause uncertain; left pausing", "sandbox_id", rec.SandboxID, "err", err)
		return pauseDeferred
	default:
		e.log.WarnContext(ctx, "pause refused; kept warm", "sandbox_id", rec.SandboxID, "err", err)
		if rec.State == StatePausing {
			abort := e.pauseStore().AbortPause
			if member {
				abort = pool.AbortPoolPause
			}
			e.abortPause(ctx, rec, abort)
		}
		return pauseDeferred
	}
}

// abortPause returns rec (pausing, leased by this invocation) to warm
// (a pool member to pooled) with abort.
func (e *Engine) abortPause(ctx context.Context, rec Record, abort func(context.Context, Record, time.Time) (Record, error)) {
	sctx, cancel := settle(ctx)
	defer cancel()
	if _, err := abort(sctx, rec, e.now()); err != nil {
		e.log.WarnContext(ctx, "giving up a pause failed; left pausing", "sandbox_id", rec.SandboxID, "err", err)
	}
}

// evictPaused frees a paused slot for key's thread: it gives up a pool
// member parked paused, else destroys the least recently paused sandbox
// of key's tenant or of a tenant holding at least two more paused slots
// than key's (its outputs were copied before it was paused). The claim of
// another tenant's sandbox checks both counts (PausedBelow), so that
// after the eviction and the pause it makes room for, key's tenant holds
// no more paused slots than the tenant it took one from: a tenant never
// pauses its way past another's share of the paused slots. It reports
// whether a slot was freed.
func (e *Engine) evictPaused(ctx context.Context, key ThreadKey, owner string) bool {
	if e.evictPoolMember(ctx, owner, true) {
		return true
	}
	ps := e.pauseStore()
	paused, err := ps.PausedParkedBefore(ctx, e.now().Add(time.Millisecond), evictCandidates)
	if err != nil {
		e.log.WarnContext(ctx, "list paused sandboxes for eviction failed", "err", err)
		return false
	}
	may, guard := e.pausedShare(ctx, key, paused)
	return e.freeEvicted(ctx, e.evictParked(ctx, key, owner, paused, may, guard, EventReasonCapacity))
}

// pausedShare reads the paused counts of key's tenant and of the tenants
// of paused (one read) and returns which of paused key's thread may evict
// and the guard of another tenant's claim. When the counts cannot be
// read, only key's tenant's own may be.
func (e *Engine) pausedShare(ctx context.Context, key ThreadKey, paused []Record) (func(Record) bool, evictGuard) {
	own := func(rec Record) bool { return rec.Tenant == key.Tenant }
	tenants := []string{key.Tenant}
	for _, rec := range paused {
		if rec.Tenant != "" && !slices.Contains(tenants, rec.Tenant) {
			tenants = append(tenants, rec.Tenant)
		}
	}
	if len(tenants) == 1 {
		return own, evictGuard{}
	}
	held, err := e.pauseStore().TenantsPaused(ctx, tenants)
	if err != nil {
		e.log.WarnContext(ctx, "read tenants' paused counts failed; evicting the tenant's own only", "err", err)
		return own, evictGuard{}
	}
	mine := held[key.Tenant]
	may := func(rec Record) bool { return own(rec) || held[rec.Tenant] >= mine+2 }
	return may, evictGuard{paused: &PausedBelow{Tenant: key.Tenant, Held: mine}}
}

// resumeParked hands the thread its parked sandbox back: a paused one
// takes a running slot (waiting and evicting as a create does) and is
// resumed; one left pausing or resuming by an invocation that died (its
// lease lapsed) is taken over and resumed. A resume or bootstrap that
// fails discards the sandbox: the attempt reports retry, and the next one
// finds the binding's record destroyed and creates a fresh sandbox with
// the thread's outputs restored.
func (e *Engine) resumeParked(ctx context.Context, key ThreadKey, rec Record, owner string, st *acquireState) (AcquireResult, bool, error) {
	ps := e.pauseStore()
	var claimed Record
	if rec.State == StatePaused {
		retry, err := e.takeSlot(ctx, key, owner, st, e.freedFirst(ctx, func(now time.Time) error {
			var err error
			claimed, err = ps.ClaimResume(ctx, ResumeClaim{Claim: Claim{SandboxID: rec.SandboxID, Tenant: key.Tenant, Owner: owner,
				Now: now, LeaseUntil: e.leaseUntil(ctx)}, Key: key, Limit: e.s.Limit(), MaxPerUser: e.s.MaxPerUser, MaxPerTenant: e.s.MaxPerTenant,
				Grant: st.grant})
			return e.took(st, err)
		}))
		if err != nil {
			return AcquireResult{}, retry, fmt.Errorf("resume: %w", err)
		}
	} else {
		var err error
		claimed, err = e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: key.Tenant, From: []State{StatePausing, StateResuming},
			To: StateResuming, Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)})
		if err != nil {
			// A peer holds it (a pause or resume in flight) or moved it.
			return AcquireResult{}, true, fmt.Errorf("thread %s: take over %s sandbox: %w", key, rec.State, err)
		}
	}
	return e.finishResume(ctx, claimed)
}

// finishResume resumes rec (resuming, leased by this invocation), re-runs
// the bootstrap and settles the record active; on any failure the sandbox
// is discarded (destroyed, or left a tombstone holding its slots).
func (e *Engine) finishResume(ctx context.Context, rec Record) (AcquireResult, bool, error) {
	cctx, cancel, ok := e.leaseCall(ctx, rec)
	if !ok {
		return AcquireResult{}, true, fmt.Errorf("resume %s: lease too short: %w", rec.SandboxID, ErrLeaseHeld)
	}
	err := e.caps.Pause.Resume(cctx, rec.SandboxID, e.activeTimer())
	cancel()
	if err != nil {
		e.log.WarnContext(ctx, "resume failed; discarding the paused sandbox", "sandbox_id", rec.SandboxID, "err", err)
		reason := EventReasonNotResumable
		if errors.Is(err, ErrSandboxGone) {
			reason = e.endedReason(rec, StatePaused)
		}
		e.destroyClaimed(ctx, rec, reason)
		return AcquireResult{}, true, unavailable(fmt.Errorf("resume sandbox %s: %v", rec.SandboxID, err))
	}
	if err := e.bootstrap(ctx, rec.Ref(), probeTimeout); err != nil {
		e.log.WarnContext(ctx, "resumed sandbox bootstrap failed; discarding", "sandbox_id", rec.SandboxID, "err", err)
		e.destroyClaimed(ctx, rec, e.unanswered(ctx, rec, StatePaused)) // its timer was just set: gone is a kill
		return AcquireResult{}, true, unavailable(err)
	}
	now := e.now()
	if !rec.ParkedAt.IsZero() && rec.ParkedAt.Before(now) && rec.PrevState == StatePaused {
		rec.PausedFor += now.Sub(rec.ParkedAt)
	}
	sctx, scancel := settle(ctx)
	defer scancel()
	active, err := e.pauseStore().SettleResume(sctx, rec, now, now.Add(e.s.ActiveTimeout))
	if err != nil {
		// Not handed out: a record left resuming could be paused again
		// by reconcile under the agent. This acquire (its lease) or the
		// thread's next one finishes it.
		return AcquireResult{}, true, fmt.Errorf("settle resume of %s: %w", rec.SandboxID, err)
	}
	e.log.InfoContext(ctx, "sandbox resumed", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
	e.emit(ctx, active, StatePaused, StateActive, EventResumed, "")
	return AcquireResult{Record: active, Source: SourceResumed, Restore: e.resumeRestore(ctx, active)}, false, nil
}
