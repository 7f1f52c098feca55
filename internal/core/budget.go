package core

import (
	"context"
	"time"
)

// Time budgets. An Acquire, Release or Sync runs inside one invocation
// whose ctx carries its deadline (the Lambda's). That time is split, from
// the end:
//
//   - the response margin (at most responseMargin, a tenth of the time
//     when less is left) stays free so the invocation answers;
//   - the settle reserve (at most settleReserve, a quarter of what is left)
//     is kept for the writes and the kill that settle the state: tombstone,
//     kill, free, park, free a reservation. Each of those steps gets at most
//     settleStep, so one stalled dependency cannot starve the next step;
//   - the rest is the work: store reads and claims, provider calls, output
//     sync and restore. Their ctx ends where the settle reserve begins, and
//     every call's own timeout (the store's, the provider's, a command's)
//     is derived from it, so none outlives what is left.
//
// Without a deadline (tests, tools) nothing is reserved and settle steps
// still get settleStep each. Behind API Gateway the deadline is the
// earlier of the function's and the request's arrival at the gateway plus
// 29 s (internal/httpapi): the gateway's 30 s count a cold start's init,
// the function's timeout does not.
//
// Worst case, for a function timeout T (29 s in template.yaml): the answer
// is written by T-1 s; work stops at T-7 s; an acquire that gives up on a
// stalled provider answers 503 (PROVIDER_UNAVAILABLE, retryable) between
// T-7 s and T-1 s, its discard settled or left as a tombstone or a
// reservation that reconcile settles.
const (
	settleReserve = 6 * time.Second
	settleStep    = 2 * time.Second
	// leaseSlack is added to an invocation's end to form its leases: a
	// peer takes a record over once the invocation that held it cannot be
	// running any more.
	leaseSlack = leaseSafety + 5*time.Second
)

type budgetKey struct{}

// budget is an invocation's end (less the response margin), as recorded
// in its ctx by begin.
type budget struct{ end time.Time }

// begin bounds one invocation: the returned ctx ends where the work must
// stop, remembers the invocation's end for settle and carries the
// operation's event publisher; cancel waits for its publishes (see
// publisher.flush), then cancels.
func (e *Engine) begin(ctx context.Context) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		end := dl.Add(-min(responseMargin, left/10))
		work := end.Add(-min(settleReserve, left/4))
		ctx = context.WithValue(ctx, budgetKey{}, budget{end: end})
		ctx, cancel = context.WithDeadline(ctx, work)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	ctx, flush := e.withPublisher(ctx)
	return ctx, func() { flush(); cancel() }
}

// invocationEnd returns the end begin recorded in ctx, if any.
func invocationEnd(ctx context.Context) (time.Time, bool) {
	b, ok := ctx.Value(budgetKey{}).(budget)
	return b.end, ok
}

// settle returns the context of one settle step of the engine (a kill, a
// free, a park): not canceled with ctx, it lasts at most settleStep and
// never past the invocation's end recorded in ctx by begin.
func settle(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(settleStep)
	if end, ok := invocationEnd(ctx); ok && end.Before(deadline) {
		deadline = end
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// CleanupContext returns a context for the clean-up that follows a call or
// a pass made under ctx (store a manifest, abort an upload, confirm a
// sandbox is gone): it is not canceled with ctx, and it ends after d or at
// ctx's deadline, whichever comes first, so a clean-up never eats the time
// the engine keeps for settling state. Call cancel when done.
func CleanupContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// leaseUntil is the end of a lease taken now by the invocation of ctx:
// LeaseDuration, shortened to the invocation's end plus leaseSlack when
// the invocation ends sooner (it cannot act after its end).
func (e *Engine) leaseUntil(ctx context.Context) time.Time {
	now := e.now()
	until := now.Add(e.s.LeaseDuration)
	if end, ok := invocationEnd(ctx); ok {
		if t := now.Add(time.Until(end) + leaseSlack); t.Before(until) {
			until = t
		}
	}
	return until
}

// shareOf returns ctx limited to 1/n of the work time it has left (all of
// it without a deadline).
func shareOf(ctx context.Context, n int) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/time.Duration(n)))
}
