package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// claimPause moves a record in c.From to pausing under c's lease, taking a
// paused slot within limit (0: no limit) unless the deployment drains;
// check, when set, is a further condition on the record (a failure is
// ErrLeaseHeld, as the DynamoDB store reports it).
func (s *Store) claimPause(op string, c core.Claim, limit int, check func(*entry) bool, set func(*entry)) (core.Record, error) {
	if c.LeaseUntil.IsZero() {
		return core.Record{}, fmt.Errorf("%s: a lease is required", op)
	}
	c = msClaim(c)
	return s.writeRecord(op, func() (core.Record, error) {
		e, err := s.claimable(c, "")
		if err != nil {
			return core.Record{}, err
		}
		if check != nil && !check(e) {
			return core.Record{}, fmt.Errorf("%s %s: %w", op, c.SandboxID, core.ErrLeaseHeld)
		}
		if s.draining {
			return core.Record{}, fmt.Errorf("%s: %w", op, core.ErrDraining)
		}
		if limit > 0 && s.paused >= limit {
			return core.Record{}, fmt.Errorf("%s %s: %w", op, c.SandboxID, core.ErrPausedFull)
		}
		lease(e, c)
		moveTo(e, core.StatePausing, c.Now, c.Now)
		s.takePaused(e)
		if set != nil {
			set(e)
		}
		return e.rec, nil
	})
}

// ClaimPause moves a warm record to pausing under c's lease, keeping its
// park time, and takes a paused slot (ErrPausedFull when limit are held;
// ErrDraining when the deployment drains).
func (s *Store) ClaimPause(_ context.Context, c core.Claim, limit int) (core.Record, error) {
	c.From = []core.State{core.StateWarm}
	return s.claimPause("ClaimPause", c, limit, nil, nil)
}

// ClaimReleasePause moves a releasing record at r.Fence to pausing,
// parked at r.Claim.Now and ending at r.ExpiresAt, as ClaimPause.
func (s *Store) ClaimReleasePause(_ context.Context, r core.ReleasePause) (core.Record, error) {
	c := msClaim(r.Claim)
	c.From = []core.State{core.StateReleasing}
	r.ExpiresAt = ms(r.ExpiresAt)
	return s.claimPause("ClaimReleasePause", c, r.Limit, func(e *entry) bool { return e.rec.Fence == r.Fence },
		func(e *entry) { e.rec.ParkedAt, e.rec.ExpiresAt = c.Now, r.ExpiresAt })
}

// settle checks that rec is still stored at its fence in one of from
// (else ErrStaleFence) and returns its entry with the settle's common
// moves made: to state st at now (listed at at), fence up, lease cleared.
func (s *Store) settle(op string, rec core.Record, now, at time.Time, st core.State, from ...core.State) (*entry, error) {
	now, at = ms(now), ms(at)
	e, ok := s.records[rec.SandboxID]
	if !ok || e.rec.Fence != rec.Fence || !slices.Contains(from, e.rec.State) {
		return nil, fmt.Errorf("%s %s fence %d: %w", op, rec.SandboxID, rec.Fence, core.ErrStaleFence)
	}
	moveTo(e, st, now, at)
	e.rec.Fence++
	e.rec.UpdatedAt = now
	e.rec.LeaseOwner, e.rec.LeaseExpiresAt = "", time.Time{}
	return e, nil
}

// settlePause moves rec (pausing or resuming) to st, parked at now,
// holding its paused slot only: its running slot is freed.
func (s *Store) settlePause(op string, rec core.Record, now, at time.Time, st core.State) (core.Record, error) {
	return s.writeRecord(op, func() (core.Record, error) {
		e, err := s.settle(op, rec, now, at, st, core.StatePausing, core.StateResuming)
		if err != nil {
			return core.Record{}, err
		}
		if e.rec.Slots.Running() {
			s.freeRunning(e.rec.ThreadKey, e.quota)
		}
		e.quota = false
		e.rec.Slots.NoRunning = true
		e.rec.ParkedAt, e.rec.ExpiresAt = ms(now), time.Time{}
		return e.rec, nil
	})
}

// SettlePause moves rec (pausing or resuming, fenced) to paused, parked at
// now with no provider end time, and frees its running slot.
func (s *Store) SettlePause(_ context.Context, rec core.Record, now time.Time) (core.Record, error) {
	return s.settlePause("SettlePause", rec, now, now, core.StatePaused)
}

// abortPause moves rec (pausing, fenced) back to st and frees its paused
// slot.
func (s *Store) abortPause(op string, rec core.Record, now time.Time, st core.State, at time.Time, parkedAt *time.Time) (core.Record, error) {
	return s.writeRecord(op, func() (core.Record, error) {
		e, err := s.settle(op, rec, now, at, st, core.StatePausing)
		if err != nil {
			return core.Record{}, err
		}
		if e.rec.Slots.Paused {
			s.freePaused(e)
		}
		if parkedAt != nil {
			e.rec.ParkedAt = ms(*parkedAt)
		}
		return e.rec, nil
	})
}

// AbortPause moves rec (pausing, fenced) back to warm, parked when it was,
// and frees its paused slot.
func (s *Store) AbortPause(_ context.Context, rec core.Record, now time.Time) (core.Record, error) {
	return s.abortPause("AbortPause", rec, now, core.StateWarm, rec.ParkedAt, &rec.ParkedAt)
}

// ClaimResume moves a paused record of r.Key's thread to resuming under
// the lease and takes a running slot as Reserve does.
func (s *Store) ClaimResume(_ context.Context, r core.ResumeClaim) (core.Record, error) {
	c := msClaim(r.Claim)
	c.From = []core.State{core.StatePaused}
	c.Tenant = r.Key.Tenant
	if c.LeaseUntil.IsZero() {
		return core.Record{}, errors.New("claim resume: a lease is required")
	}
	return s.writeRecord("ClaimResume", func() (core.Record, error) {
		e, err := s.claimable(c, r.Key.User)
		if err != nil {
			return core.Record{}, err
		}
		t := take{key: r.Key, limit: r.Limit, maxUser: r.MaxPerUser, maxTenant: r.MaxPerTenant, grant: r.Grant}
		if err := s.checkTake(t); err != nil {
			return core.Record{}, err
		}
		s.doTake(t)
		lease(e, c)
		moveTo(e, core.StateResuming, c.Now, c.Now)
		e.quota = true
		e.rec.Slots.NoRunning = false
		return e.rec, nil
	})
}

// SettleResume moves rec (resuming, or a claiming pool member: fenced) to
// active ending at expiresAt, stores rec.PausedFor and frees its paused
// slot.
func (s *Store) SettleResume(_ context.Context, rec core.Record, now, expiresAt time.Time) (core.Record, error) {
	return s.writeRecord("SettleResume", func() (core.Record, error) {
		e, err := s.settle("settle resume", rec, now, now, core.StateActive, core.StateResuming, core.StateClaiming)
		if err != nil {
			return core.Record{}, err
		}
		if e.rec.Slots.Paused {
			s.freePaused(e)
		}
		e.rec.Slots = core.Slots{}
		e.rec.ParkedAt, e.rec.ExpiresAt, e.rec.PausedFor = time.Time{}, ms(expiresAt), rec.PausedFor.Truncate(time.Millisecond)
		return e.rec, nil
	})
}

// PausedParkedBefore lists up to limit paused records paused before t,
// oldest first.
func (s *Store) PausedParkedBefore(_ context.Context, t time.Time, limit int) ([]core.Record, error) {
	return s.list(core.StatePaused, limit, func(e *entry) bool { return e.rec.ParkedAt.Before(t) }), nil
}

// TenantsPaused reads how many paused slots each of tenants holds.
func (s *Store) TenantsPaused(_ context.Context, tenants []string) (map[string]int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(tenants))
	for _, t := range tenants {
		if n := s.tenantPaused[t]; n > 0 {
			out[t] = n
		}
	}
	return out, nil
}
