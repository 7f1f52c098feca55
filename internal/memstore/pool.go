package memstore

import (
	"context"
	"fmt"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// ReservePool takes a running slot within r.Limit and one of r.Size pool
// places for a refill's create: ErrPoolFull when the places are taken, a
// *CapacityError when the slots are (or the deployment drains).
func (s *Store) ReservePool(_ context.Context, r core.PoolReservation) error {
	r.Now, r.ExpiresAt = ms(r.Now), ms(r.ExpiresAt)
	return s.write("ReservePool", func() error {
		if s.pool >= r.Size {
			return core.ErrPoolFull
		}
		if _, ok := s.reservations[r.Token]; ok {
			return fmt.Errorf("reservation %s exists: %w", r.Token, core.ErrConflict)
		}
		t := take{limit: r.Limit, skipQuota: true}
		if err := s.checkTake(t); err != nil {
			return err
		}
		s.doTake(t)
		s.movePool(1)
		s.reservations[r.Token] = &reservation{pending: core.PendingReservation{Token: r.Token, CreatedAt: r.Now, ExpiresAt: r.ExpiresAt}}
		return nil
	})
}

// notLive reports whether id names no record, or a gone one (a pool
// record may replace it).
func (s *Store) notLive(id string) bool {
	e, ok := s.records[id]
	return !ok || e.rec.State == core.StateGone
}

// FinalizePool turns pool reservation token into the pooled, thread-less
// record rec (its slot and place carry over); ErrConflict when the
// reservation is gone or a live record has the id.
func (s *Store) FinalizePool(_ context.Context, token string, rec core.Record) (core.Record, error) {
	rec = msRecord(rec)
	return s.writeRecord("FinalizePool", func() (core.Record, error) {
		res, ok := s.reservations[token]
		if !ok || res.quota || !s.notLive(rec.SandboxID) {
			return core.Record{}, fmt.Errorf("finalize pool reservation %s: %w", token, core.ErrConflict)
		}
		delete(s.reservations, token)
		rec.ThreadKey, rec.State = core.ThreadKey{}, core.StatePooled
		return s.put(rec, token, false, true), nil
	})
}

// PoolMembers lists up to limit pooled records, oldest first.
func (s *Store) PoolMembers(_ context.Context, limit int) ([]core.Record, error) {
	return s.list(core.StatePooled, limit, nil), nil
}

// SomePoolMembers lists up to limit pooled records, newest first.
func (s *Store) SomePoolMembers(_ context.Context, limit int) ([]core.Record, error) {
	all := s.list(core.StatePooled, 0, nil)
	var out []core.Record
	for i := len(all) - 1; i >= 0 && (limit <= 0 || len(out) < limit); i-- {
		out = append(out, all[i])
	}
	return out, nil
}

// ClaimPoolMember binds pool member c.Member to c's thread under c.Owner's
// lease, taking the user's and tenant's slots (and, for a member parked
// paused, a running slot within c.Limit). A claim already applied for the
// thread under the same owner is returned as is. Refusals: ErrConflict
// (no longer pooled as listed), ErrThreadBound, ErrGrantLost, then the
// quotas, draining and capacity (see core.PoolStore).
func (s *Store) ClaimPoolMember(_ context.Context, c core.PoolClaim) (core.Record, error) {
	c.Now, c.LeaseUntil, c.Member = ms(c.Now), ms(c.LeaseUntil), msRecord(c.Member)
	return s.writeRecord("ClaimPoolMember", func() (core.Record, error) {
		m := c.Member
		e, ok := s.records[m.SandboxID]
		if ok && e.rec.State == core.StateClaiming && e.rec.ThreadKey == c.ThreadKey && e.rec.LeaseOwner == c.Owner {
			return e.rec, nil
		}
		paused := m.Slots.Paused
		if !ok || e.rec.State != core.StatePooled || !e.poolPlace || e.rec.Fence != m.Fence ||
			paused != (e.rec.Slots.Paused && !e.rec.Slots.Running()) || !paused && !e.rec.Slots.Running() {
			return core.Record{}, fmt.Errorf("pool member %s: %w", m.SandboxID, core.ErrConflict)
		}
		if !s.bindingIs(c.ThreadKey, c.ReplaceSandboxID, c.ReplaceReservation) {
			return core.Record{}, fmt.Errorf("thread %s: %w", c.ThreadKey, core.ErrThreadBound)
		}
		t := take{key: c.ThreadKey, limit: c.Limit, maxUser: c.MaxPerUser, maxTenant: c.MaxPerTenant, grant: c.Grant, skipRoom: !paused, below: c.Below}
		if !paused {
			t.grant = nil
		}
		if err := s.checkTake(t); err != nil {
			return core.Record{}, err
		}
		if paused {
			s.doTake(t)
		} else {
			s.users[userKey{c.Tenant, c.User}]++
			s.tenants[c.Tenant]++
		}
		s.movePool(-1)
		metered := m.MeteredAt
		if metered.IsZero() {
			metered = c.Now
		}
		e.rec.ThreadKey, e.rec.Seed = c.ThreadKey, c.Seed()
		e.rec.PrevState, e.rec.State = core.StatePooled, core.StateClaiming
		e.rec.Fence++
		e.rec.LeaseOwner, e.rec.LeaseExpiresAt, e.rec.UpdatedAt = c.Owner, c.LeaseUntil, c.Now
		e.rec.PrevMeteredAt, e.rec.MeteredAt, e.rec.MeteredState = metered, c.Now, core.StatePooled
		e.rec.Slots = core.Slots{Paused: paused}
		e.quota, e.poolPlace, e.at = true, false, c.Now
		s.bindings[c.ThreadKey] = core.Binding{ThreadKey: c.ThreadKey, SandboxID: m.SandboxID}
		return e.rec, nil
	})
}

// ClaimPoolPause moves a pooled member holding a running slot to pausing
// under c's lease and takes a paused slot, as ClaimPause.
func (s *Store) ClaimPoolPause(_ context.Context, c core.Claim, limit int) (core.Record, error) {
	c.From, c.Tenant = []core.State{core.StatePooled}, ""
	return s.claimPause("ClaimPoolPause", c, limit, func(e *entry) bool { return e.poolPlace && e.rec.Slots.Running() }, nil)
}

// SettlePoolPause moves a member being paused (fenced) back to pooled,
// holding its paused slot only.
func (s *Store) SettlePoolPause(_ context.Context, rec core.Record, now time.Time) (core.Record, error) {
	return s.settlePause("SettlePoolPause", rec, now, rec.CreatedAt, core.StatePooled)
}

// AbortPoolPause moves a member being paused (fenced) back to pooled,
// running, its paused slot freed.
func (s *Store) AbortPoolPause(_ context.Context, rec core.Record, now time.Time) (core.Record, error) {
	return s.abortPause("AbortPoolPause", rec, now, core.StatePooled, rec.CreatedAt, nil)
}

// AdoptPoolSandbox records an untracked pool sandbox as the thread-less
// rec: consuming reservation's slot and place when set (ErrConflict when
// it is gone), else taking new ones without a limit check.
func (s *Store) AdoptPoolSandbox(_ context.Context, rec core.Record, reservation string) (core.Record, error) {
	rec.ThreadKey, rec.Slots = core.ThreadKey{}, core.Slots{}
	rec = msRecord(rec)
	return s.writeRecord("AdoptPoolSandbox", func() (core.Record, error) {
		if !s.notLive(rec.SandboxID) {
			return core.Record{}, fmt.Errorf("adopt pool sandbox %s: %w", rec.SandboxID, core.ErrConflict)
		}
		if reservation != "" {
			res, ok := s.reservations[reservation]
			if !ok || res.quota {
				return core.Record{}, fmt.Errorf("adopt pool sandbox %s: %w", rec.SandboxID, core.ErrConflict)
			}
			delete(s.reservations, reservation)
			return s.put(rec, reservation, false, true), nil
		}
		s.running++
		s.movePool(1)
		return s.put(rec, "", false, true), nil
	})
}

// PoolCount reads the pool's taken places.
func (s *Store) PoolCount(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pool, nil
}

// RepairPoolPlaces sets the pool's place count to counted if its revision
// is still revision (else ErrConflict).
func (s *Store) RepairPoolPlaces(_ context.Context, revision int64, counted int) error {
	return s.write("RepairPoolPlaces", func() error {
		if s.poolRevision != revision {
			return fmt.Errorf("repair pool places: revision %d, now %d: %w", revision, s.poolRevision, core.ErrConflict)
		}
		s.pool = counted
		s.poolRevision++
		return nil
	})
}

// RefillBackoff reads the refill's back-off state.
func (s *Store) RefillBackoff(context.Context) (core.RefillBackoff, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refillBackoff, nil
}

// SetRefillBackoff replaces the refill's back-off state.
func (s *Store) SetRefillBackoff(_ context.Context, b core.RefillBackoff) error {
	return s.write("SetRefillBackoff", func() error {
		b.Until = ms(b.Until)
		s.refillBackoff = b
		return nil
	})
}
