package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// warnExpiring sends sandbox.expiring (EventExpiring) for every active
// sandbox whose lease ends within Settings.ExpiringLead without having
// been renewed: a conditional write marks the end first
// (Store.MarkExpiring), and only the pass whose write applied sends the
// event, so passes that overlap or repeat send it once per end. A renewal
// moves the end, and the new end is warned of in its turn. The event is
// best effort, as every event: a pass that dies between the mark and the
// publish loses it.
func (p *pass) warnExpiring(ctx context.Context) error {
	e := p.e
	lead := e.s.ExpiringLead
	if p.rst == nil || lead <= 0 {
		return nil
	}
	now := e.now()
	var due []Record
	err := p.rst.ScanState(ctx, StateActive, func(r Record) bool {
		if expiringDue(r, lead, now) {
			due = append(due, r)
		}
		return len(due) < reconcileBatch
	})
	if err != nil {
		return fmt.Errorf("scan active records: %w", err)
	}
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
	return nil
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
