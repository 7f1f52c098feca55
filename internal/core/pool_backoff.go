package core

import (
	"context"
	"time"
)

// RefillBackoff is the pool refill's state after failed creates: how many
// failed in a row, and until when refills create nothing. The zero value
// is a refill whose last create succeeded (or that never failed).
type RefillBackoff struct {
	// Failures counts the refill's failed creates since the last one
	// that succeeded.
	Failures int `json:"failures"`
	// Until is when a refill may create again (zero: at once).
	Until time.Time `json:"backing_off_until"`
}

// Refill back-off: after its first failed create a refill waits
// refillBackoffBase, doubling with each further failure up to
// refillBackoffMax. One refill (a reconcile pass, a claim's kick) stops
// starting creates after maxRefillFailures failures, so a provider that
// keeps failing holds a pass for one create's time, not a retry loop.
const (
	refillBackoffBase = time.Minute
	refillBackoffMax  = 30 * time.Minute
	maxRefillFailures = 2
)

// backoffAfter is the state after a refill that made created members and
// failed failed creates, from b: reset by a success, else counted and
// backed off; unchanged when the refill tried nothing.
func backoffAfter(b RefillBackoff, created, failed int, now time.Time) RefillBackoff {
	switch {
	case created > 0:
		return RefillBackoff{}
	case failed == 0:
		return b
	}
	n := b.Failures + failed
	wait := refillBackoffMax
	if shift := n - 1; shift < 16 {
		wait = min(refillBackoffBase<<shift, refillBackoffMax)
	}
	return RefillBackoff{Failures: n, Until: now.Add(wait)}
}

// refillBackoff reads the refill's state; a failed read counts as none
// (the refill's own writes then fail too, and say so).
func (e *Engine) refillBackoff(ctx context.Context) RefillBackoff {
	b, err := e.store.RefillBackoff(ctx)
	if err != nil {
		e.log.WarnContext(ctx, "reading the pool refill's back-off failed; refilling", "err", err)
		return RefillBackoff{}
	}
	return b
}

// noteRefill stores the refill's state after a refill (only when it
// changed). A failed write leaves the earlier state: at worst a refill
// too many, or one skipped.
func (e *Engine) noteRefill(ctx context.Context, was RefillBackoff, st PoolStats) RefillBackoff {
	b := backoffAfter(was, st.Created, st.Failed, e.now())
	if b == was {
		return b
	}
	sctx, cancel := settle(ctx)
	defer cancel()
	if err := e.store.SetRefillBackoff(sctx, b); err != nil {
		e.log.WarnContext(ctx, "storing the pool refill's back-off failed", "err", err)
	}
	if b.Failures > 0 {
		e.log.WarnContext(ctx, "pool refill backing off after failed creates", "failures", b.Failures, "until", b.Until)
	}
	return b
}
