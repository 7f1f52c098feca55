package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// PoolStats summarise a refill, or the pool step of a reconcile pass.
type PoolStats struct {
	// Created: members created, bootstrapped and pooled.
	Created int `json:"created"`
	// Failed: creates or bootstraps that failed (their slots freed, or
	// kept for reconcile when the outcome is unknown).
	Failed int `json:"failed"`
	// Recycled: members destroyed for their age, an excess or draining.
	Recycled int `json:"recycled"`
	// Backoff is the refill's back-off state as the refill left it.
	Backoff RefillBackoff `json:"backoff"`
}

// refillParallel bounds the creates one refill runs at once.
const refillParallel = 4

// poolLead is how long before MaxAge (the members' provider timeout) a
// member stops being handed out and reconcile recycles it: a quarter of
// MaxAge, at most two minutes (two passes of the one-minute schedule).
func (p PoolSettings) poolLead() time.Duration { return min(2*time.Minute, p.MaxAge/4) }

// RefillPool creates pool members until the pool's places are all taken
// (members, refills in flight, members being destroyed), the deployment
// has no free slot, or ctx ends. It never evicts anything. After failed
// creates it backs off (RefillBackoff): it creates nothing until the
// back-off's end, then one member at a time until a create succeeds, and
// one refill stops after maxRefillFailures failures. Concurrent
// refills never overshoot the pool: each create first takes a pool place
// and a slot in one conditional write. A refill that dies midway leaves a
// reservation (freed by reconcile) or a sandbox marked as a pool member in
// its metadata (killed by reconcile): nothing leaks.
//
// Errors: a store or provider failure (the stats say what was done).
func (e *Engine) RefillPool(ctx context.Context) (PoolStats, error) {
	ctx, cancel := e.begin(ctx)
	defer cancel()
	return e.refill(ctx)
}

func (e *Engine) refill(ctx context.Context) (PoolStats, error) {
	ps := e.poolStore()
	if ps == nil {
		return PoolStats{}, nil
	}
	was := e.refillBackoff(ctx)
	if e.now().Before(was.Until) {
		return PoolStats{Backoff: was}, nil
	}
	workers := min(refillParallel, e.poolConfig().settings.Size)
	if was.Failures > 0 {
		workers = 1 // after failures, one create tries the provider
	}
	var (
		mu   sync.Mutex
		st   PoolStats
		errs []error
		wg   sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				stop := st.Failed >= maxRefillFailures
				mu.Unlock()
				if stop {
					return
				}
				created, err := e.refillOne(ctx, ps)
				mu.Lock()
				if created {
					st.Created++
				}
				if err != nil {
					st.Failed++
					errs = append(errs, err)
				}
				mu.Unlock()
				if !created {
					return
				}
			}
		}()
	}
	wg.Wait()
	st.Backoff = e.noteRefill(ctx, was, st)
	if st.Created > 0 || st.Failed > 0 {
		e.log.InfoContext(ctx, "pool refill", "created", st.Created, "failed", st.Failed)
	}
	return st, errors.Join(errs...)
}

// refillOne reserves a pool place and a slot, creates and bootstraps a
// member and pools it. created false with a nil error: the pool or the
// deployment is full.
func (e *Engine) refillOne(ctx context.Context, ps PoolStore) (bool, error) {
	ps2 := e.poolConfig().settings
	now := e.now()
	token := "res-" + newOwner()[4:]
	err := ps.ReservePool(ctx, PoolReservation{Token: token, Limit: e.s.Limit(), Size: ps2.Size, Now: now,
		ExpiresAt: e.leaseUntil(ctx)})
	var ce *CapacityError
	switch {
	case errors.Is(err, ErrPoolFull), errors.As(err, &ce):
		return false, nil
	case err != nil:
		// Maybe applied: reconcile frees a reservation no sandbox carries.
		return false, fmt.Errorf("reserve pool place: %w", err)
	}
	asked := now // the member runs, and is metered, from its create
	ref, err := e.prov.Create(ctx, CreateSpec{
		Template: e.s.Template,
		Timeout:  ps2.MaxAge,
		Metadata: map[string]string{
			MetaDeployment: e.s.Deployment, MetaCreatedAt: now.UTC().Format(time.RFC3339),
			MetaReservation: token, MetaPool: MetaPoolMember,
		},
	})
	if err != nil {
		if IsAmbiguous(err) {
			return false, fmt.Errorf("create pool member (reservation kept): %w", err)
		}
		return false, errors.Join(fmt.Errorf("create pool member: %w", err), e.freeReservation(ctx, token, ThreadKey{}))
	}
	if err := e.prepareMember(ctx, ref); err != nil {
		_, err = e.discardCreated(ctx, ref.ID, token, ThreadKey{}, fmt.Errorf("pool member %s: %w", ref.ID, err))
		return false, err
	}
	now = e.now()
	fctx, cancel := settle(ctx)
	defer cancel()
	rec, err := ps.FinalizePool(fctx, token, Record{SandboxID: ref.ID, State: StatePooled, Backend: e.prov.Name(),
		Endpoint: ref.Endpoint, ReservationToken: token, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(ps2.MaxAge),
		PrevMeteredAt: asked, MeteredAt: now, MeteredState: StateCreating})
	if err != nil {
		// The reservation was settled meanwhile (or the write was lost):
		// reconcile recognises the member by its metadata and the table.
		return false, fmt.Errorf("pool member %s: finalize: %w", ref.ID, err)
	}
	e.emit(ctx, rec, StateCreating, StatePooled, EventCreated, "")
	if e.membersPaused() {
		e.pauseMember(ctx, ps, rec)
	}
	return true, nil
}

// pauseMember parks a new member (pooled, running) paused: it takes a
// paused slot, the provider pauses it, and its running slot is freed, as
// for a thread's warm sandbox (finishPause). A member that cannot be
// paused (the paused slots are full, the provider refused) stays running;
// one left pausing by an uncertain pause is finished by reconcile; one the
// provider lost is destroyed. A refill never evicts to make room.
func (e *Engine) pauseMember(ctx context.Context, ps PoolStore, rec Record) {
	now := e.now()
	claimed, err := ps.ClaimPoolPause(ctx, Claim{SandboxID: rec.SandboxID, Owner: newOwner(), Now: now,
		LeaseUntil: e.leaseUntil(ctx)}, e.s.PausedLimit())
	if err != nil {
		e.log.InfoContext(ctx, "pool member kept running: its pause was not claimed", "sandbox_id", rec.SandboxID, "err", err)
		return
	}
	e.finishPause(ctx, claimed)
}

// prepareMember bootstraps a new member and writes its marker
// (poolMarker), which the claim's check reads back.
func (e *Engine) prepareMember(ctx context.Context, ref SandboxRef) error {
	if err := e.bootstrap(ctx, ref, bootstrapTimeout); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err := e.prov.WriteFile(wctx, ref, poolMarker, strings.NewReader(ref.ID)); err != nil {
		return fmt.Errorf("write pool marker: %w", err)
	}
	return nil
}

// pool is reconcile's pool step: members past their age (less the lead),
// beyond the pool's size, or all of them while draining or with no pool
// configured, are destroyed; then the pool is refilled (not while
// draining), within the pass's time.
func (p *pass) pool(ctx context.Context, draining bool) error {
	e := p.e
	ps := e.store.poolStore()
	if e.poolStore() != nil { // a pool is kept: claims may have been interrupted
		if err := p.interruptedClaims(ctx); err != nil {
			return err
		}
	}
	set := e.poolConfig().settings
	members, err := ps.PoolMembers(ctx, reconcileBatch)
	if err != nil {
		return fmt.Errorf("list pool members: %w", err)
	}
	cutoff := p.start.Add(-(set.MaxAge - set.poolLead()))
	excess := len(members) - set.Size
	for i, m := range members {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			return nil
		}
		if !draining && i >= excess && !m.CreatedAt.Before(cutoff) {
			continue
		}
		reason := EventReasonPoolRecycled
		if draining {
			reason = EventReasonDraining
		}
		if e.destroyPoolMember(ctx, m, p.owner, reason) {
			p.st.PoolRecycled++
		}
	}
	if draining || set.Size <= 0 || p.outOfTime() {
		return nil
	}
	rctx, cancel := p.workContext(ctx)
	defer cancel()
	st, err := e.refill(rctx)
	p.st.PoolCreated += st.Created
	p.st.PoolRefillFailures = st.Backoff.Failures
	if err != nil {
		return fmt.Errorf("refill pool: %w", err)
	}
	return nil
}

// interruptedClaims destroys the members whose hand-out was interrupted:
// claiming, their claimer's lease lapsed, and no acquire of the thread
// took them over since. The thread never received the sandbox (only an
// active record is handed out), so nothing of its is lost: its next
// acquire claims or creates another and restores its outputs there.
// Left alone, such a record would hold its slots (a paused member's
// running and paused slots) until the thread came back.
func (p *pass) interruptedClaims(ctx context.Context) error {
	e := p.e
	stale, err := p.lapsed(ctx, StateClaiming)
	if err != nil {
		return err
	}
	for _, rec := range stale {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			return nil
		}
		claimed, err := p.claim(ctx, rec, StateDestroying, StateClaiming)
		if err != nil {
			p.skip(ctx, "claim interrupted pool hand-out", rec.SandboxID, err) // its thread took it over
			continue
		}
		e.log.InfoContext(ctx, "reconcile: destroying a pool member whose hand-out was interrupted", "sandbox_id", rec.SandboxID,
			"thread", rec.ThreadKey.String())
		if e.destroyClaimed(ctx, claimed, EventReasonClaimInterrupted) {
			p.st.PoolRecycled++
		}
	}
	return nil
}

// poolLedger repairs the pool's place count (see repairCount) to the
// number of places held: pool reservations, members, and thread-less
// records being paused or destroyed, as RepairCounters counted them. Only
// while a pool is kept: nothing reads the count otherwise.
func (p *pass) poolLedger(ctx context.Context, seen *HolderCount) error {
	if p.e.poolStore() == nil || seen == nil {
		return nil
	}
	return p.repairCount(ctx, "pool place count", &p.cursor.Pool, *seen, p.e.store.RepairPoolPlaces)
}

// poolSandbox handles a sandbox of the inventory created for the pool
// (MetaPool). A tracked one (a record that is not gone), pooled or
// claimed (the table, not its metadata, says which thread it serves), is
// neither an orphan nor a duplicate. An untracked one is a refill that
// died between its create and its finalize, or one whose kill did not
// take (its record gone): once its reservation is settled or presumed crashed
// and the grace period is over, it is recorded as a tombstone (consuming
// the reservation's slot and pool place) and killed.
func (p *pass) poolSandbox(ctx context.Context, in SandboxInfo, look ReconcileLookup) {
	e := p.e
	if rec, ok := look.Records[in.ID]; ok && rec.State != StateGone {
		return // tracked; a gone record is not: its sandbox leaked
	}
	ps := e.store.poolStore()
	token := in.Metadata[MetaReservation]
	res, hasRes := look.Reservations[token]
	if hasRes && !p.crashed(res, e.now()) {
		p.st.Deferred++ // its refill is still in flight
		return
	}
	// The grace runs from its create (its metadata says when), not from
	// the pass that first found its refill over.
	if !p.graceWaited(ctx, in.ID, p.rs.Grace, startedAt(in)) {
		return
	}
	consumed := ""
	if hasRes {
		consumed = token
	}
	claimed, err := ps.AdoptPoolSandbox(ctx, p.adoptedRecord(in, ThreadKey{}, StateDestroying), consumed)
	if err != nil {
		p.st.Deferred++
		p.skip(ctx, "adopt pool leftover", in.ID, err)
		return
	}
	if hasRes {
		p.st.ReservationsSettled++
	}
	e.log.InfoContext(ctx, "reconcile: killing an unfinished pool member", "sandbox_id", in.ID)
	p.destroy(ctx, claimed, EventReasonOrphan, &p.st.Killed)
}
