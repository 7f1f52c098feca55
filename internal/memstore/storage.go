package memstore

import (
	"context"
	"fmt"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

var _ core.StorageStore = (*Store)(nil)

// StoredBytes reads the bytes recorded for key's thread and its tenant.
func (s *Store) StoredBytes(_ context.Context, key core.ThreadKey) (core.Stored, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return core.Stored{Thread: s.storedThread[key], Tenant: s.storedTenant[key.Tenant]}, nil
}

// RecordStored sets c's thread's bytes and moves its tenant's total (see
// core.StorageStore).
func (s *Store) RecordStored(_ context.Context, c core.StoredChange) error {
	return s.write("RecordStored", func() error {
		if got := s.storedThread[c.ThreadKey]; got != c.Prev {
			return fmt.Errorf("thread %s stores %d bytes, not %d: %w", c.ThreadKey, got, c.Prev, core.ErrConflict)
		}
		total := s.storedTenant[c.Tenant] + c.Bytes - c.Prev
		if c.TenantLimit > 0 && c.Bytes > c.Prev && total > c.TenantLimit {
			return fmt.Errorf("tenant %s would store %d bytes: %w", c.Tenant, total, core.ErrStorageFull)
		}
		s.storedThread[c.ThreadKey], s.storedTenant[c.Tenant] = c.Bytes, total
		return nil
	})
}
