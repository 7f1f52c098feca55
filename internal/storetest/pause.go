package storetest

import (
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// claimPause claims warm record id of acme's into pausing under a limit
// of paused slots.
func (f *fixture) claimPause(id string, limit int) (core.Record, error) {
	return f.s.ClaimPause(f.ctx, core.Claim{SandboxID: id, Tenant: "acme", Owner: "pauser", Now: t0.Add(time.Minute),
		LeaseUntil: t0.Add(2 * time.Minute)}, limit)
}

// paused is a paused record of k, sandbox id (its running slot freed).
func (f *fixture) paused(k core.ThreadKey, id string) core.Record {
	f.t.Helper()
	f.warm(k, id)
	rec, err := f.claimPause(id, big)
	if err != nil {
		f.t.Fatalf("ClaimPause %s: %v", id, err)
	}
	rec, err = f.s.SettlePause(f.ctx, rec, t0.Add(2*time.Minute))
	if err != nil {
		f.t.Fatalf("SettlePause %s: %v", id, err)
	}
	return rec
}

// testPauseSettle: a pause takes a paused slot while the sandbox holds its
// running one; the settle frees the running slot (the user's and tenant's
// too) and keeps the paused one.
func testPauseSettle(f *fixture) {
	k := key("acme", "u1", 1)
	f.warm(k, "sbx1")
	rec, err := f.claimPause("sbx1", 1)
	if err != nil {
		f.t.Fatalf("ClaimPause: %v", err)
	}
	if rec.State != core.StatePausing || !rec.Slots.Paused || !rec.Slots.Running() || !rec.ParkedAt.Equal(t0) || rec.LeaseOwner != "pauser" {
		f.t.Errorf("pausing = %+v; want leased, holding both slots, still parked at t0", rec)
	}
	f.wantUsed(1, 1)
	_, err = f.s.SettlePause(f.ctx, core.Record{SandboxID: "sbx1", Fence: rec.Fence - 1}, t0.Add(2*time.Minute))
	f.wantIs("SettlePause with an old fence", err, core.ErrStaleFence)
	settled, err := f.s.SettlePause(f.ctx, rec, t0.Add(2*time.Minute))
	if err != nil {
		f.t.Fatalf("SettlePause: %v", err)
	}
	got := f.get("sbx1")
	for _, r := range []core.Record{settled, got} {
		if r.State != core.StatePaused || r.Slots.Running() || !r.Slots.Paused || r.LeaseOwner != "" || !r.ParkedAt.Equal(t0.Add(2*time.Minute)) {
			f.t.Errorf("paused = %+v; want paused at t0+2m, paused slot only, no lease", r)
		}
	}
	f.wantUsed(0, 1)
	if look := f.lookup(k); look.TenantUsed != 0 {
		f.t.Errorf("acme's count = %d; want 0 once paused", look.TenantUsed)
	}
	held, err := f.s.TenantsPaused(f.ctx, []string{"acme", "beta"})
	if err != nil || held["acme"] != 1 || held["beta"] != 0 {
		f.t.Errorf("TenantsPaused = %v, %v; want acme 1", held, err)
	}
	list, err := f.s.PausedParkedBefore(f.ctx, t0.Add(time.Hour), 10)
	if err != nil || len(list) != 1 || list[0].SandboxID != "sbx1" {
		f.t.Errorf("PausedParkedBefore = %v, %v; want sbx1", list, err)
	}
	if err := f.s.Free(f.ctx, got, t0.Add(3*time.Minute)); err != nil {
		f.t.Fatalf("Free: %v", err)
	}
	f.wantUsed(0, 0)
}

// testPauseAbortAndLimit: paused slots are bounded by their limit; an
// aborted pause is warm again, parked when it was, its paused slot freed.
func testPauseAbortAndLimit(f *fixture) {
	f.warm(key("acme", "u1", 1), "sbx1")
	f.warm(key("acme", "u1", 2), "sbx2")
	rec, err := f.claimPause("sbx1", 1)
	if err != nil {
		f.t.Fatalf("ClaimPause: %v", err)
	}
	_, err = f.claimPause("sbx2", 1)
	f.wantIs("ClaimPause past the limit", err, core.ErrPausedFull)
	if got := f.get("sbx2"); got.State != core.StateWarm || got.Slots.Paused {
		f.t.Errorf("refused pause moved the record: %+v", got)
	}
	_, err = f.claimPause("sbx1", 1)
	f.wantIs("ClaimPause of a pausing record", err, core.ErrConflict)
	aborted, err := f.s.AbortPause(f.ctx, rec, t0.Add(2*time.Minute))
	if err != nil {
		f.t.Fatalf("AbortPause: %v", err)
	}
	got := f.get("sbx1")
	for _, r := range []core.Record{aborted, got} {
		if r.State != core.StateWarm || r.Slots.Paused || !r.ParkedAt.Equal(t0) || r.LeaseOwner != "" {
			f.t.Errorf("aborted = %+v; want warm, parked at t0, no paused slot, no lease", r)
		}
	}
	f.wantUsed(2, 0)
	if _, err := f.claimPause("sbx2", 1); err != nil {
		f.t.Errorf("ClaimPause after the abort: %v", err)
	}
}

// testResume: a resume claim takes a running slot as a reservation does
// (the thread's user only; the limit and quotas apply); its settle frees
// the paused slot and makes the sandbox active.
func testResume(f *fixture) {
	k := key("acme", "u1", 1)
	paused := f.paused(k, "sbx1")
	f.active(key("beta", "u1", 2), "sbx2")
	resume := func(user string, limit int) (core.Record, error) {
		return f.s.ClaimResume(f.ctx, core.ResumeClaim{Claim: core.Claim{SandboxID: "sbx1", Owner: "o1", Now: t0.Add(3 * time.Minute),
			LeaseUntil: t0.Add(4 * time.Minute)}, Key: core.ThreadKey{Tenant: "acme", User: user, Thread: k.Thread}, Limit: limit})
	}
	_, err := resume("u2", big)
	f.wantIs("another user's resume", err, core.ErrNotFound)
	_, err = resume("u1", 1)
	f.wantRefusal("resume at the limit", err, api.RefusalCapacity)
	if got := f.get("sbx1"); got.State != core.StatePaused || got.Fence != paused.Fence {
		f.t.Errorf("refused resume moved the record: %+v", got)
	}
	rec, err := resume("u1", 2)
	if err != nil {
		f.t.Fatalf("ClaimResume: %v", err)
	}
	if rec.State != core.StateResuming || !rec.Slots.Running() || !rec.Slots.Paused {
		f.t.Errorf("resuming = %+v; want both slots held", rec)
	}
	f.wantUsed(2, 1)
	if look := f.lookup(k); look.TenantUsed != 1 {
		f.t.Errorf("acme's count = %d; want 1", look.TenantUsed)
	}
	rec.PausedFor = time.Minute
	out, err := f.s.SettleResume(f.ctx, rec, t0.Add(4*time.Minute), t0.Add(time.Hour))
	if err != nil {
		f.t.Fatalf("SettleResume: %v", err)
	}
	got := f.get("sbx1")
	for _, r := range []core.Record{out, got} {
		if r.State != core.StateActive || r.Slots.Paused || r.PausedFor != time.Minute || !r.ExpiresAt.Equal(t0.Add(time.Hour)) {
			f.t.Errorf("resumed = %+v; want active, no paused slot, paused for 1m, ending at t0+1h", r)
		}
	}
	f.wantUsed(2, 0)
	_, err = f.s.SettleResume(f.ctx, rec, t0.Add(5*time.Minute), t0.Add(time.Hour))
	f.wantIs("second SettleResume", err, core.ErrStaleFence)
}
