package core

import (
	"context"
	"testing"
	"time"
)

// The time of an invocation adds up: work ends where the settle reserve
// begins, settle steps end by the invocation's end, which leaves the
// response margin, and leases end a slack after the invocation.
func TestBudgetSplitsTheInvocation(t *testing.T) {
	e := &Engine{s: DefaultSettings(), now: time.Now}
	tests := []struct {
		left, wantMargin, wantSettle time.Duration
	}{
		{29 * time.Second, time.Second, 6 * time.Second},
		{8 * time.Second, 800 * time.Millisecond, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.left.String(), func(t *testing.T) {
			parent, cancel := context.WithTimeout(context.Background(), tt.left)
			defer cancel()
			dl, _ := parent.Deadline()
			work, wcancel := e.begin(parent)
			defer wcancel()
			end, ok := invocationEnd(work)
			if !ok {
				t.Fatal("begin recorded no invocation end")
			}
			if got := dl.Sub(end); absDiff(got, tt.wantMargin) > 50*time.Millisecond {
				t.Errorf("response margin = %s, want %s", got, tt.wantMargin)
			}
			wdl, _ := work.Deadline()
			if got := end.Sub(wdl); absDiff(got, tt.wantSettle) > 50*time.Millisecond {
				t.Errorf("settle reserve = %s, want %s", got, tt.wantSettle)
			}
			// A settle step outlives the work's cancellation, never the end.
			wcancel()
			sctx, scancel := settle(work)
			defer scancel()
			if sctx.Err() != nil {
				t.Errorf("settle step canceled with the work")
			}
			if sdl, _ := sctx.Deadline(); sdl.After(end) || sdl.After(time.Now().Add(settleStep)) {
				t.Errorf("settle step deadline %s past the end %s or the step", sdl, end)
			}
			// A clean-up ends with the work, not in the settle reserve.
			cctx, ccancel := CleanupContext(work, time.Minute)
			defer ccancel()
			if cdl, _ := cctx.Deadline(); cdl.After(wdl) {
				t.Errorf("clean-up deadline %s after the work's end %s", cdl, wdl)
			}
			if lease := e.leaseUntil(work); absDiff(lease.Sub(end), leaseSlack) > 50*time.Millisecond {
				t.Errorf("lease ends %s after the invocation, want %s", lease.Sub(end), leaseSlack)
			}
		})
	}
	// Without a deadline nothing is reserved and leases last LeaseDuration.
	work, cancel := e.begin(context.Background())
	defer cancel()
	if _, ok := work.Deadline(); ok {
		t.Error("begin set a deadline on a context without one")
	}
	if got := time.Until(e.leaseUntil(work)); absDiff(got, e.s.LeaseDuration) > 50*time.Millisecond {
		t.Errorf("lease = %s, want %s", got, e.s.LeaseDuration)
	}
}

func absDiff(a, b time.Duration) time.Duration {
	if a > b {
		return a - b
	}
	return b - a
}
