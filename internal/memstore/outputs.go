package memstore

import (
	"context"
	"sort"
	"time"
)

// NoteOutputsOwed notes that id's outputs are not all stored; a note
// already there keeps its time.
func (s *Store) NoteOutputsOwed(_ context.Context, id string, now time.Time) error {
	return s.write("NoteOutputsOwed", func() error {
		if _, ok := s.owed[id]; !ok {
			s.owed[id] = ms(now)
		}
		return nil
	})
}

// OutputsOwed lists up to limit noted sandboxes, oldest note first.
func (s *Store) OutputsOwed(_ context.Context, limit int) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.owed))
	for id := range s.owed {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		a, b := s.owed[ids[i]], s.owed[ids[j]]
		if !a.Equal(b) {
			return a.Before(b)
		}
		return ids[i] < ids[j]
	})
	return ids[:min(limit, len(ids))], nil
}

// ForgetOutputsOwed drops id's note.
func (s *Store) ForgetOutputsOwed(_ context.Context, id string) error {
	return s.write("ForgetOutputsOwed", func() error {
		delete(s.owed, id)
		return nil
	})
}
