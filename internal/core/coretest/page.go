package coretest

import (
	"context"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

var _ core.PagedLister = (*FakeProvider)(nil)

// ListPage implements core.PagedLister: up to limit sandboxes matching
// filter (its metadata and states), in id order, after the id cursor ("" = from the start); next is
// the last id returned when more follow. StartedAt is read from the
// core.MetaCreatedAt metadata (zero without it). Each call is recorded as
// "list".
func (f *FakeProvider) ListPage(_ context.Context, filter core.ListFilter, cursor string, limit int) ([]core.SandboxInfo, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "list")
	ids := make([]string, 0, len(f.sandboxes))
	for id, sb := range f.sandboxes {
		if id <= cursor && cursor != "" {
			continue
		}
		match := true
		for k, v := range filter.Metadata {
			match = match && sb.meta[k] == v
		}
		if match && (len(filter.States) == 0 || slices.Contains(filter.States, sb.state())) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	if limit <= 0 {
		limit = 100
	}
	next := ""
	if len(ids) > limit {
		ids = ids[:limit]
		next = ids[limit-1]
	}
	out := make([]core.SandboxInfo, len(ids))
	for i, id := range ids {
		sb := f.sandboxes[id]
		started, _ := time.Parse(time.RFC3339, sb.meta[core.MetaCreatedAt])
		out[i] = core.SandboxInfo{ID: id, Metadata: maps.Clone(sb.meta), State: sb.state(), StartedAt: started, EndAt: sb.endAt}
	}
	return out, next, nil
}
