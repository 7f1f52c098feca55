package ddbstore

import (
	"context"
	"sync"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// passMemo remembers, for the length of one reconcile pass, the state
// index keys a read of the whole key (no sort-key condition) found empty.
// A pass reads every key of every state several times (the expiry walks,
// the dead-slot check of each walk that completes, the counters' tally);
// on an idle deployment nearly all of those keys are empty, and each read
// of one is still a query. Within the pass the next read of a key found
// empty skips it.
//
// An entry filed under such a key later in the pass (by an acquire, or by
// the pass itself: a tombstone, a pool member, a release), or still on its
// way into the index when the key was read (the index is eventually
// consistent), is missed by the pass's later reads and found by the next
// pass's. Every use the pass makes of an index read allows that, since
// none acts on an entry's absence: an expiry, a free or a retried kill
// acts only on what it reads; the inventory looks sandboxes up by id; the
// counter repair corrects a count only when two passes found the same
// difference at the same revision of the count, and a holder filed since
// moved that revision (its exact count, which confirms a correction,
// reads every key: withoutPass). The wait queue's reads do not use the
// memo: a dispatch serves tickets in order, and a ticket filed under a
// skipped key could be one to serve first.
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

// withoutPass is ctx with no pass memo: its reads read every key.
func withoutPass(ctx context.Context) context.Context {
	return context.WithValue(ctx, passMemoKey{}, (*passMemo)(nil))
}

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
