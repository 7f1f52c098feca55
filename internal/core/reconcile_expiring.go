package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// activeDue reads the active records once for the two steps that act on
// a lease's end: those due a sandbox.expiring (expiringDue, when the lead
// is not 0) and those whose lease ended (leaseEnded), up to
// reconcileBatch of each.
func (p *pass) activeDue(ctx context.Context) (due, ended []Record, err error) {
	e := p.e
	lead, now := e.s.ExpiringLead, e.now()
	err = p.rst.ScanState(ctx, StateActive, func(r Record) bool {
		switch {
		case leaseEnded(r, now):
			if len(ended) < reconcileBatch {
				ended = append(ended, r)
			}
		case expiringDue(r, lead, now):
			if len(due) < reconcileBatch {
				due = append(due, r)
			}
		}
		return len(due) < reconcileBatch || len(ended) < reconcileBatch
	})
	if err != nil {
		return nil, nil, fmt.Errorf("scan active records: %w", err)
	}
	return due, ended, nil
}

// warnExpiring sends sandbox.expiring (EventExpiring) for every active
// sandbox of due (activeDue), whose lease ends within
// Settings.ExpiringLead without having been renewed: a conditional write
// marks the end first (Store.MarkExpiring), and only the pass whose write
// applied sends the event, so passes that overlap or repeat send it once
// per end. A renewal moves the end, and the new end is warned of in its
// turn. The event is best effort, as every event: a pass that dies
// between the mark and the publish loses it.
func (p *pass) warnExpiring(ctx context.Context, due []Record) {
	e := p.e
	for _, rec := range due {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			break
		}
		err := e.store.MarkExpiring(ctx, rec.SandboxID, rec.ExpiresAt)
		if err != nil {
			if !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
				p.fail(ctx, "mark expiring", rec.SandboxID, err)
			}
			continue // renewed, released or warned meanwhile
		}
		p.st.ExpiringSent++
		e.emitExpiring(ctx, rec)
	}
}

// emitExpiring publishes EventExpiring for rec, whose lease ends at
// rec.ExpiresAt.
func (e *Engine) emitExpiring(ctx context.Context, rec Record) {
	if e.events == nil {
		return
	}
	ev := e.event(rec, StateActive, StateActive, EventExpiring, "")
	end := rec.ExpiresAt.UTC().Truncate(time.Millisecond)
	ev.ExpiresAt = &end
	e.publish(ctx, ev)
}
