package memstore

import (
	"context"
	"sort"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// TenantSandboxes lists up to limit of tenant's records in
// core.TenantListed states, state by state, each by sandbox id (the
// position in the cursor).
func (s *Store) TenantSandboxes(_ context.Context, tenant, cursor string, limit int) ([]core.Record, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return core.PageTenant(cursor, limit, func(st core.State, after string, yield func(core.Record, string) bool) error {
		var page []core.Record
		for _, e := range s.records {
			if e.rec.Tenant == tenant && e.rec.State == st && e.rec.SandboxID > after {
				page = append(page, e.rec)
			}
		}
		sort.Slice(page, func(a, b int) bool { return page[a].SandboxID < page[b].SandboxID })
		for _, rec := range page {
			if !yield(rec, rec.SandboxID) {
				return nil
			}
		}
		return nil
	})
}
