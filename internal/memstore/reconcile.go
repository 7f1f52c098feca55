package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// LookupMany reads records, bindings and reservations.
func (s *Store) LookupMany(_ context.Context, ids []string, keys []core.ThreadKey, tokens []string) (core.ReconcileLookup, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := core.ReconcileLookup{Records: map[string]core.Record{}, Bindings: map[core.ThreadKey]core.Binding{},
		Reservations: map[string]core.PendingReservation{}}
	for _, id := range ids {
		if e, ok := s.records[id]; ok {
			out.Records[id] = e.rec
		}
	}
	for _, k := range keys {
		if b, ok := s.bindings[k]; ok {
			out.Bindings[k] = b
		}
	}
	for _, t := range tokens {
		if r, ok := s.reservations[t]; ok {
			out.Reservations[t] = r.pending
		}
	}
	return out, nil
}

// bindingFrom reports whether key's binding is still from (absent when
// !bound).
func (s *Store) bindingFrom(key core.ThreadKey, from core.Binding, bound bool) bool {
	b, ok := s.bindings[key]
	switch {
	case !bound:
		return !ok
	case from.SandboxID != "":
		return ok && b.SandboxID == from.SandboxID
	}
	return ok && b.Reservation == from.Reservation
}

// Adopt records an untracked sandbox (see core.Adoption): ErrConflict when
// a condition fails, nothing written.
func (s *Store) Adopt(_ context.Context, a core.Adoption) (core.Record, error) {
	return s.writeRecord("Adopt", func() (core.Record, error) {
		rec := msRecord(a.Record)
		_, exists := s.records[rec.SandboxID]
		res, resOK := s.reservations[a.Reservation]
		switch {
		case exists, a.Reservation != "" && (!resOK || !res.quota):
			return core.Record{}, fmt.Errorf("adopt %s: condition failed: %w", rec.SandboxID, core.ErrConflict)
		case a.Bind && !s.bindingFrom(rec.ThreadKey, a.From, a.FromBound):
			return core.Record{}, fmt.Errorf("adopt %s: binding moved: %w", rec.SandboxID, core.ErrConflict)
		case !a.Bind && a.Canonical != "" && s.bindings[rec.ThreadKey].SandboxID != a.Canonical:
			return core.Record{}, fmt.Errorf("adopt %s: binding moved: %w", rec.SandboxID, core.ErrConflict)
		}
		quota := true
		if a.Reservation != "" {
			delete(s.reservations, a.Reservation)
			if !rec.Slots.Running() {
				s.freeRunning(res.pending.ThreadKey, res.quota)
				quota = false
			}
		} else if rec.Slots.Running() {
			s.running++
			s.users[userKey{rec.Tenant, rec.User}]++
			s.tenants[rec.Tenant]++
		} else {
			quota = false
		}
		e := &entry{}
		if rec.Slots.Paused {
			rec.Slots.TenantPaused = false
			e.rec = rec
			s.takePaused(e)
			rec.Slots = e.rec.Slots
		}
		token := ""
		if rec.Slots.Running() {
			token = a.Reservation
		}
		rec = s.put(rec, token, quota, false)
		if a.Bind {
			s.bindings[rec.ThreadKey] = core.Binding{ThreadKey: rec.ThreadKey, SandboxID: rec.SandboxID}
		}
		return rec, nil
	})
}

// liveStates are the states a binding may be pointed at (Rebind).
var liveStates = []core.State{core.StateActive, core.StateReleasing, core.StateWarm,
	core.StatePausing, core.StatePaused, core.StateResuming}

// Rebind points key's binding at id if it is still from and the record is
// live (ErrConflict otherwise).
func (s *Store) Rebind(_ context.Context, key core.ThreadKey, id string, from core.Binding, fromBound bool) error {
	return s.write("Rebind", func() error {
		e, ok := s.records[id]
		if !s.bindingFrom(key, from, fromBound) || !ok || !slices.Contains(liveStates, e.rec.State) {
			return fmt.Errorf("rebind %s: %w", id, core.ErrConflict)
		}
		s.bindings[key] = core.Binding{ThreadKey: key, SandboxID: id}
		return nil
	})
}

// ClaimDuplicate is Claim (with a state to move to and a lease), applied
// only if key's binding still names canonical (else ErrConflict).
func (s *Store) ClaimDuplicate(_ context.Context, c core.Claim, key core.ThreadKey, canonical string) (core.Record, error) {
	if len(c.From) == 0 || c.To == "" || c.LeaseUntil.IsZero() {
		return core.Record{}, errors.New("claim duplicate: need source states, a target state and a lease")
	}
	c = msClaim(c)
	return s.writeRecord("ClaimDuplicate", func() (core.Record, error) {
		e, err := s.claimable(c, "")
		if err != nil {
			return recordOf(e), err
		}
		if b, ok := s.bindings[key]; !ok || b.SandboxID != canonical {
			return core.Record{}, fmt.Errorf("thread %s no longer names %s: %w", key, canonical, core.ErrConflict)
		}
		prev := e.rec.PrevState
		lease(e, c)
		moveTo(e, c.To, c.Now, c.Now)
		e.rec.PrevState = prev // as the DynamoDB store: a duplicate's claim keeps it
		e.rec.ParkedAt = time.Time{}
		return e.rec, nil
	})
}

// FirstSeen records now as id's first sighting unless one is recorded,
// and returns the first sighting.
func (s *Store) FirstSeen(_ context.Context, id string, now time.Time) (time.Time, error) {
	now = ms(now)
	var out time.Time
	err := s.write("FirstSeen", func() error {
		if t, ok := s.firstSeen[id]; ok {
			out = t
			return nil
		}
		s.firstSeen[id], out = now, now
		return nil
	})
	return out, err
}

// Cursor reads the inventory cursor (zero value if none).
func (s *Store) Cursor(context.Context) (core.ReconcileCursor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor, nil
}

// SaveCursor writes c if the stored version is still c.Version (else
// ErrConflict), at version c.Version+1.
func (s *Store) SaveCursor(_ context.Context, c core.ReconcileCursor) error {
	return s.write("SaveCursor", func() error {
		if c.Version != s.cursor.Version || c.Version == 0 && s.cursorSaved {
			return fmt.Errorf("save reconcile cursor: version %d, stored %d: %w", c.Version, s.cursor.Version, core.ErrConflict)
		}
		c.Version++
		c.CycleStart = ms(c.CycleStart)
		s.cursor, s.cursorSaved = c, true
		return nil
	})
}

// SaveSeen stores part of a cycle's inventory (replacing the part).
func (s *Store) SaveSeen(_ context.Context, cycle, part string, seen []core.SeenSandbox) error {
	return s.write("SaveSeen", func() error {
		if s.seen[cycle] == nil {
			s.seen[cycle] = map[string][]core.SeenSandbox{}
		}
		s.seen[cycle][part] = slices.Clone(seen)
		return nil
	})
}

// Seen reads every stored part of a cycle's inventory, by part name.
func (s *Store) Seen(_ context.Context, cycle string) ([]core.SeenSandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	parts := make([]string, 0, len(s.seen[cycle]))
	for p := range s.seen[cycle] {
		parts = append(parts, p)
	}
	sort.Strings(parts)
	var out []core.SeenSandbox
	for _, p := range parts {
		out = append(out, s.seen[cycle][p]...)
	}
	return out, nil
}

// ScanState calls fn for every record in state, oldest first (for
// StateCreating: every reservation, as a Record with its token, thread,
// CreatedAt and ExpiresAt), until fn returns false.
func (s *Store) ScanState(_ context.Context, state core.State, fn func(core.Record) bool) error {
	var recs []core.Record
	if state == core.StateCreating {
		s.mu.Lock()
		for _, r := range s.reservations {
			p := r.pending
			recs = append(recs, core.Record{State: core.StateCreating, ReservationToken: p.Token, ThreadKey: p.ThreadKey,
				Seed: r.seed, CreatedAt: p.CreatedAt, UpdatedAt: p.CreatedAt, ExpiresAt: p.ExpiresAt})
		}
		s.mu.Unlock()
		sort.Slice(recs, func(i, j int) bool {
			if !recs[i].CreatedAt.Equal(recs[j].CreatedAt) {
				return recs[i].CreatedAt.Before(recs[j].CreatedAt)
			}
			return recs[i].ReservationToken < recs[j].ReservationToken
		})
	} else {
		recs = s.list(state, 0, nil)
	}
	for _, r := range recs {
		if !fn(r) {
			break
		}
	}
	return nil
}

// RepairCounters implements core.CapacityStore: the store's counters
// move with their holders under one lock and never drift, so there is
// nothing to correct.
func (s *Store) RepairCounters(context.Context, int) (core.CounterRepair, error) {
	return core.CounterRepair{}, nil
}
