package memstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Renew moves an active record's end later (see core.Store.Renew).
func (s *Store) Renew(_ context.Context, r core.Renewal) (core.Renewed, error) {
	r.Now, r.Until = ms(r.Now), ms(r.Until)
	var out core.Renewed
	err := s.write("Renew", func() error {
		e, ok := s.records[r.SandboxID]
		if !ok || e.rec.Tenant != r.Tenant {
			return core.ErrNotFound
		}
		out = core.Renewed{Record: e.rec, Prev: e.rec.ExpiresAt}
		if e.rec.State != core.StateActive {
			return fmt.Errorf("sandbox %s is %s: %w", r.SandboxID, e.rec.State, core.ErrConflict)
		}
		until := r.Until
		if r.MaxLifetime > 0 && !e.rec.CreatedAt.IsZero() {
			until = minTime(until, ms(e.rec.CreatedAt.Add(r.MaxLifetime)))
		}
		if !until.After(e.rec.ExpiresAt) {
			return nil
		}
		e.rec.ExpiresAt, e.rec.UpdatedAt = until, r.Now
		e.rec.Fence++
		out.Record = e.rec
		return nil
	})
	if err != nil && !errors.Is(err, core.ErrConflict) {
		return core.Renewed{}, err
	}
	return out, err
}

// MarkExpiring notes the sandbox.expiring event of an active record's end
// (see core.Store.MarkExpiring).
func (s *Store) MarkExpiring(_ context.Context, sandboxID string, end time.Time) error {
	end = ms(end)
	return s.write("MarkExpiring", func() error {
		e, ok := s.records[sandboxID]
		switch {
		case !ok:
			return core.ErrNotFound
		case e.rec.State != core.StateActive || !e.rec.ExpiresAt.Equal(end) || e.rec.ExpiringSentFor.Equal(end):
			return fmt.Errorf("sandbox %s is %s, ending %s: %w", sandboxID, e.rec.State, e.rec.ExpiresAt, core.ErrConflict)
		}
		e.rec.ExpiringSentFor = end
		return nil
	})
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
