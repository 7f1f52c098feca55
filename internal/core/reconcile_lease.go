package core

import (
	"context"
	"time"
)

// takeBackEnded takes back the active sandboxes of ended (activeDue),
// whose lease ended without a renewal or a release (Record.ExpiresAt
// passed): their outputs are copied to S3 first, then they are destroyed
// and their thread is told why (leaseEndReason: EventLost, and Previous
// at its next acquire). The provider's timer runs TimerMargin past the
// end, so the sandbox still runs for the copy. A copy that fails or is
// incomplete leaves the sandbox to the next pass until half of that
// margin has passed; after that it is destroyed anyway, counted
// OutputsAbandoned.
//
// A renewal wins: the claim reads the end again, and a renewal after the
// claim moves the fence, so the tombstone's write fails and nothing is
// killed (the claim's lease then lapses).
func (p *pass) takeBackEnded(ctx context.Context, ended []Record) {
	for _, rec := range ended {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			break
		}
		p.takeBack(ctx, rec)
	}
}

// leaseEnded reports whether rec is an active sandbox whose end has
// passed.
func leaseEnded(rec Record, now time.Time) bool {
	return rec.State == StateActive && !rec.ExpiresAt.IsZero() && !now.Before(rec.ExpiresAt)
}

// takeBack takes back one active sandbox whose lease ended (see
// takeBackEnded).
func (p *pass) takeBack(ctx context.Context, rec Record) {
	e := p.e
	claimed, ok := p.leaseOf(ctx, rec, "claim an ended lease") // usually its thread is releasing it
	if !ok {
		return
	}
	if !leaseEnded(claimed, e.now()) {
		e.unlease(ctx, claimed) // renewed meanwhile
		return
	}
	complete, gone := p.syncParked(ctx, claimed, "taking back an ended lease")
	if !complete && !gone {
		if e.now().Before(claimed.ExpiresAt.Add(TimerMargin / 2)) {
			p.st.Deferred++ // the next pass copies the rest
			e.unlease(ctx, claimed)
			return
		}
		p.abandonOutputs(ctx, claimed, "its lease ended and its provider's timer is about to")
	}
	reason := e.leaseEndReason(claimed)
	if gone {
		reason = e.endedReason(claimed, StateActive)
	}
	e.log.InfoContext(ctx, "reconcile: taking back a sandbox whose lease ended without renewal",
		"sandbox_id", claimed.SandboxID, "thread", claimed.ThreadKey.String(), "ended_at", claimed.ExpiresAt, "reason", reason)
	tomb, err := e.applyRecord(ctx, Update{SandboxID: claimed.SandboxID, Fence: claimed.Fence, State: StateDestroying,
		KeepLease: true, Now: e.now(), Slot: claimed.Slot, EndReason: reason})
	if err != nil {
		p.skip(ctx, "tombstone an ended lease", claimed.SandboxID, err) // stale fence: renewed or released since the claim
		return
	}
	tomb.PrevState = StateActive // the state it left: the claim only took a lease
	p.destroy(ctx, tomb, reason, &p.st.LeasesEnded)
}

// leaseEndReason is why an active sandbox whose lease ended is taken
// back: max_lifetime when its end was its lifetime bound (no renewal could
// pass it), else provider_timeout (the lease ran out without renewal).
func (e *Engine) leaseEndReason(rec Record) string {
	if e.s.MaxLifetime > 0 && !rec.CreatedAt.IsZero() && !rec.ExpiresAt.Before(rec.CreatedAt.Add(e.s.MaxLifetime)) {
		return EventReasonMaxLifetime
	}
	return EventReasonProviderTimeout
}
