package core

import (
	"context"
	"fmt"
)

// reconcileBatch bounds the records one reconcile pass touches per kind.
const reconcileBatch = 100

// Reconcile runs one pass. In this slice it expires warm sandboxes idle
// past the idle timeout (kill, then free the slot) and retries tombstones
// whose lease has lapsed. It never calls anything that extends a sandbox's
// life.
func (e *Engine) Reconcile(ctx context.Context) (ReconcileStats, error) {
	start := e.now()
	var st ReconcileStats
	owner := newOwner()
	idle, err := e.store.WarmParkedBefore(ctx, start.Add(-e.s.IdleTimeout), reconcileBatch)
	if err != nil {
		return st, fmt.Errorf("list idle warm sandboxes: %w", err)
	}
	for _, rec := range idle {
		now := e.now()
		claimed, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateWarm},
			To: StateDestroying, Owner: owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)})
		if err != nil {
			continue // a peer took it (reclaim or another pass)
		}
		if e.destroyClaimed(ctx, claimed) {
			st.Expired++
		} else {
			st.Errors++
		}
	}
	tombs, err := e.store.Tombstones(ctx, reconcileBatch)
	if err != nil {
		return st, fmt.Errorf("list tombstones: %w", err)
	}
	for _, rec := range tombs {
		now := e.now()
		claimed, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateDestroying},
			Owner: owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)})
		if err != nil {
			continue
		}
		if e.destroyClaimed(ctx, claimed) {
			st.Killed++
		} else {
			st.Errors++
		}
	}
	st.Duration = e.now().Sub(start)
	e.log.InfoContext(ctx, "reconcile pass", "expired", st.Expired, "killed", st.Killed, "errors", st.Errors, "duration_ms", st.Duration.Milliseconds())
	return st, nil
}
