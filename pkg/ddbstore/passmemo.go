package ddbstore

import (
	"context"
	"sync"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// passMemo remembers, for the length of one reconcile pass, the index and
// queue partition keys a whole-key read found empty. A pass reads every
// key of every state several times (the expiry walks, the dead-slot check
// of each walk that completes, the counters' tally twice, the queue's
// repair and its free-dispatches); on an idle deployment nearly all of
// those keys are empty, and each read of one is still a query. Within the
// pass the next read of a key found empty skips it.
//
// Only emptiness is remembered, and only from a read of the whole key (no
// sort-key condition, no limit), so a remembered key held nothing when it
// was read. An entry filed under it later in the pass is missed by the
// pass's later reads and found by the next pass's: every use the pass
// makes of an index read tolerates that, since none acts on an entry's
// absence (the tally takes a count only when two tallies agree and the
// exact count confirms it; an expiry or a free only acts on what it
// reads; the inventory looks sandboxes up by id). Entries filed before
// the pass that stay filed throughout are always seen.
type passMemo struct {
	mu    sync.Mutex
	empty map[string]bool
}

type passMemoKey struct{}

// WithPass returns ctx carrying a fresh memo of empty keys for one
// reconcile pass: the store's reads under it skip a key an earlier
// whole-key read of the pass found empty.
func (s *Store) WithPass(ctx context.Context) context.Context {
	return context.WithValue(ctx, passMemoKey{}, &passMemo{empty: map[string]bool{}})
}

var _ core.PassScoped = (*Store)(nil)

// memoOf is ctx's pass memo, or nil outside a pass.
func memoOf(ctx context.Context) *passMemo {
	m, _ := ctx.Value(passMemoKey{}).(*passMemo)
	return m
}

// known reports whether pk was found empty earlier in the pass.
func (m *passMemo) known(pk string) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.empty[pk]
}

// found records that a whole-key read of pk found it empty.
func (m *passMemo) found(pk string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.empty[pk] = true
}
