package core

import (
	"context"
	"time"
)

// timerCallTimeout bounds reconcile's call that moves a provider's timer.
const timerCallTimeout = 5 * time.Second

// keepTimer makes sure the provider's timer of an active sandbox ends
// after the sandbox's end (Record.ExpiresAt), as a hand-out and a
// renewal leave it: when the inventory says the timer ends less than
// half of TimerMargin after that end (a renewal whose provider call and
// undo both failed, say), the timer is moved to TimerMargin past the end
// (within the lifetime bound), counted TimersExtended.
//
// Only running sandboxes listed with an end are considered, and the call
// (Provider.SetTimeout) never resumes a paused sandbox. An end already
// past is left alone: the sandbox is taken back as any other. The record
// is read again just before the call, so that a renewal or release made
// since the page was read is not undone by an older end.
func (p *pass) keepTimer(ctx context.Context, in SandboxInfo, rec Record) {
	e := p.e
	if in.State != SandboxRunning || in.EndAt.IsZero() || !p.timerShort(in, rec) {
		return
	}
	cur, err := e.store.Get(ctx, rec.SandboxID)
	if err != nil {
		p.skip(ctx, "read an active record whose timer ends early", rec.SandboxID, err)
		return
	}
	if !p.timerShort(in, cur) {
		return
	}
	now := e.now()
	d := e.timerFor(cur, now)
	if !now.Add(d).After(in.EndAt) {
		return // the lifetime bound allows no later end
	}
	cctx, cancel := context.WithTimeout(ctx, timerCallTimeout)
	defer cancel()
	if err := e.prov.SetTimeout(cctx, cur.SandboxID, d); err != nil {
		// Gone: the walk's dead-record check frees it. Anything else:
		// the next pass tries again.
		p.fail(ctx, "move the timer of an active sandbox", cur.SandboxID, err)
		return
	}
	p.st.TimersExtended++
	e.log.InfoContext(ctx, "reconcile: moved the timer of an active sandbox past its end", "sandbox_id", cur.SandboxID,
		"thread", cur.ThreadKey.String(), "timer_was", in.EndAt, "ends_at", cur.ExpiresAt)
}

// timerShort reports whether rec is active with its end still ahead and
// in's timer ending less than half of TimerMargin after it.
func (p *pass) timerShort(in SandboxInfo, rec Record) bool {
	return rec.State == StateActive && rec.ExpiresAt.After(p.e.now()) && in.EndAt.Before(rec.ExpiresAt.Add(TimerMargin/2))
}
