package core

import (
	"context"
	"slices"
	"time"
)

// endedReason is why the provider no longer runs rec's sandbox, which was
// in state in (a claim may have moved rec since): max_lifetime when its
// lifetime bound had passed and ended its timer, provider_timeout when
// the timer the broker last set had passed, else provider_killed (killed
// at the provider, or it died). The timer of a parked (warm) sandbox is
// its end; an active one's runs TimerMargin past its end; a paused one
// runs none.
func (e *Engine) endedReason(rec Record, in State) string {
	now := e.now()
	end := rec.ExpiresAt
	switch {
	case in == StatePaused || in == StatePausing:
		return EventReasonProviderKilled
	case end.IsZero():
	case in != StateWarm:
		end = end.Add(TimerMargin)
	}
	if e.s.MaxLifetime > 0 && !rec.CreatedAt.IsZero() {
		bound := rec.CreatedAt.Add(e.s.MaxLifetime)
		if !now.Before(bound) && (end.IsZero() || !end.Before(bound)) {
			return EventReasonMaxLifetime
		}
	}
	if !end.IsZero() && !now.Before(end) {
		return EventReasonProviderTimeout
	}
	return EventReasonProviderKilled
}

// unanswered is why rec's sandbox (in state in), which failed a probe, a
// bootstrap or a reconnect, is discarded: the reason the provider ended
// it when the provider says it is gone, else unresponsive (it exists but
// does not answer, or the provider cannot say).
func (e *Engine) unanswered(ctx context.Context, rec Record, in State) string {
	cctx, cancel := settle(ctx)
	defer cancel()
	if gone, _ := e.confirmedGone(cctx, rec.SandboxID); gone {
		return e.endedReason(rec, in)
	}
	return EventReasonUnresponsive
}

// lostWhileHeld reports whether rec, destroyed from state from for
// reason, was lost by its thread: it was active (handed out, not being
// taken back from warm) and ended for one of LostReasons.
func lostWhileHeld(rec Record, from State, reason string) bool {
	return from == StateActive && rec.PrevState == StateActive && slices.Contains(LostReasons(), reason)
}

// Previous is a thread's earlier sandbox, named once by the acquire that
// replaces it: why it ended without the thread asking.
type Previous struct {
	SandboxID string
	// Reason is the record's EndReason (one of EventReasons).
	Reason string
}

// previousOf is what an acquire that replaces rec, the sandbox its
// thread's binding names (ended or ending), tells the thread: nil when it
// ended as the thread asked (a kill at its release) or for no recorded
// reason.
func previousOf(rec Record) *Previous {
	if rec.SandboxID == "" || rec.EndReason == "" || rec.EndReason == EventReasonKilled {
		return nil
	}
	return &Previous{SandboxID: rec.SandboxID, Reason: rec.EndReason}
}

// expiringDue reports whether rec's lease ends within lead of now, not
// yet past, and no sandbox.expiring was sent for that end.
func expiringDue(rec Record, lead time.Duration, now time.Time) bool {
	end := rec.ExpiresAt
	return lead > 0 && rec.State == StateActive && !end.IsZero() && now.Before(end) && !now.Before(end.Add(-lead)) &&
		!rec.ExpiringSentFor.Equal(end)
}
