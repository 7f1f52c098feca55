package storetest

import (
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// testRenew: a renewal moves an active record's end later only, cut to
// its lifetime bound, with its fence; it refuses another tenant's record
// (not found) and one that is not active (a conflict, with the record).
func testRenew(f *fixture) {
	rec := f.active(key("acme", "u1", 1), "sbx1") // created t0, ends t0+1h
	renew := func(tenant string, until time.Time, life time.Duration) (core.Renewed, error) {
		return f.s.Renew(f.ctx, core.Renewal{SandboxID: "sbx1", Tenant: tenant, Now: t0.Add(time.Minute), Until: until, MaxLifetime: life})
	}
	_, err := renew("beta", t0.Add(2*time.Hour), 0)
	f.wantIs("another tenant's renewal", err, core.ErrNotFound)
	_, err = f.s.Renew(f.ctx, core.Renewal{SandboxID: "nope", Tenant: "acme", Now: t0, Until: t0.Add(2 * time.Hour)})
	f.wantIs("renewal of no record", err, core.ErrNotFound)

	got, err := renew("acme", t0.Add(2*time.Hour), 0)
	if err != nil || !got.Record.ExpiresAt.Equal(t0.Add(2*time.Hour)) || !got.Prev.Equal(rec.ExpiresAt) || got.Record.Fence <= rec.Fence {
		f.t.Fatalf("renewal = %+v, %v; want the end moved to t0+2h from t0+1h, fence moved", got, err)
	}
	if stored := f.get("sbx1"); !stored.ExpiresAt.Equal(got.Record.ExpiresAt) || stored.Fence != got.Record.Fence || stored.State != core.StateActive {
		f.t.Errorf("stored = %+v; want what the renewal returned", stored)
	}
	same, err := renew("acme", t0.Add(90*time.Minute), 0)
	if err != nil || !same.Record.ExpiresAt.Equal(t0.Add(2*time.Hour)) || same.Record.Fence != got.Record.Fence {
		f.t.Errorf("an earlier renewal = %+v, %v; want nothing written", same, err)
	}
	cut, err := renew("acme", t0.Add(5*time.Hour), 3*time.Hour)
	if err != nil || !cut.Record.ExpiresAt.Equal(t0.Add(3*time.Hour)) || !cut.Prev.Equal(t0.Add(2*time.Hour)) {
		f.t.Errorf("a renewal past the lifetime = %+v, %v; want the end cut to t0+3h", cut, err)
	}
	if at, err := renew("acme", t0.Add(4*time.Hour), 3*time.Hour); err != nil || !at.Record.ExpiresAt.Equal(t0.Add(3*time.Hour)) {
		f.t.Errorf("a renewal at the lifetime bound = %+v, %v; want the end left at t0+3h", at, err)
	}
	warm := f.park(f.get("sbx1"), t0.Add(2*time.Minute))
	found, err := renew("acme", t0.Add(6*time.Hour), 0)
	f.wantIs("a warm record's renewal", err, core.ErrConflict)
	if found.Record.State != core.StateWarm || f.get("sbx1").Fence != warm.Fence {
		f.t.Errorf("refused renewal = %+v; want the warm record, unchanged", found)
	}
	f.wantUsed(1, 0)
}

// testMarkExpiring: an active record's end is marked once (a second mark
// of the same end is a conflict), without moving its fence; a renewed
// end is marked again; a mark of another end, of a record not active or
// of no record is refused.
func testMarkExpiring(f *fixture) {
	rec := f.active(key("acme", "u1", 1), "sbx1") // ends t0+1h
	f.wantIs("a mark of another end", f.s.MarkExpiring(f.ctx, "sbx1", t0.Add(time.Minute)), core.ErrConflict)
	f.wantIs("a mark of no record", f.s.MarkExpiring(f.ctx, "nope", rec.ExpiresAt), core.ErrNotFound)
	if err := f.s.MarkExpiring(f.ctx, "sbx1", rec.ExpiresAt); err != nil {
		f.t.Fatalf("MarkExpiring: %v", err)
	}
	marked := f.get("sbx1")
	if !marked.ExpiringSentFor.Equal(rec.ExpiresAt) || marked.Fence != rec.Fence || !marked.ExpiresAt.Equal(rec.ExpiresAt) {
		f.t.Errorf("marked = %+v; want ExpiringSentFor the end, fence and end unchanged", marked)
	}
	f.wantIs("a second mark of the same end", f.s.MarkExpiring(f.ctx, "sbx1", rec.ExpiresAt), core.ErrConflict)
	got, err := f.s.Renew(f.ctx, core.Renewal{SandboxID: "sbx1", Tenant: "acme", Now: t0, Until: t0.Add(2 * time.Hour)})
	if err != nil {
		f.t.Fatalf("Renew: %v", err)
	}
	if err := f.s.MarkExpiring(f.ctx, "sbx1", got.Record.ExpiresAt); err != nil {
		f.t.Errorf("a mark of the renewed end: %v", err)
	}
	f.park(f.get("sbx1"), t0.Add(time.Minute))
	f.wantIs("a warm record's mark", f.s.MarkExpiring(f.ctx, "sbx1", got.Record.ExpiresAt), core.ErrConflict)
}

// testEndReason: a tombstone write records why the sandbox ends, and the
// free keeps it; a free with a reason records it when the tombstone had
// none.
func testEndReason(f *fixture) {
	one := f.active(key("acme", "u1", 1), "sbx1")
	tomb, err := f.s.Apply(f.ctx, core.Update{SandboxID: "sbx1", Fence: one.Fence, State: core.StateDestroying, KeepLease: true,
		Now: t0, Slot: one.Slot, EndReason: core.EventReasonProviderKilled})
	if err == nil && tomb.SandboxID == "" {
		tomb = f.get("sbx1")
	}
	if err != nil || tomb.EndReason != core.EventReasonProviderKilled {
		f.t.Fatalf("tombstone = %+v, %v; want its end reason", tomb, err)
	}
	if err := f.s.Free(f.ctx, tomb, t0); err != nil {
		f.t.Fatalf("Free: %v", err)
	}
	if gone := f.get("sbx1"); gone.State != core.StateGone || gone.EndReason != core.EventReasonProviderKilled {
		f.t.Errorf("gone = %+v; want the tombstone's reason kept", gone)
	}
	two := f.active(key("acme", "u1", 2), "sbx2")
	claimed, err := f.s.Claim(f.ctx, core.Claim{SandboxID: "sbx2", Tenant: "acme", From: []core.State{core.StateActive},
		To: core.StateDestroying, Owner: "o", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	if err != nil {
		f.t.Fatalf("Claim: %v", err)
	}
	claimed.EndReason = core.EventReasonUnresponsive
	if err := f.s.Free(f.ctx, claimed, t0); err != nil {
		f.t.Fatalf("Free: %v", err)
	}
	if gone := f.get("sbx2"); gone.EndReason != core.EventReasonUnresponsive || two.EndReason != "" {
		f.t.Errorf("gone = %+v; want the reason the free carried", gone)
	}
	f.wantUsed(0, 0)
}

// testSeenWebhook: a webhook event id is recorded once; a second record
// before it lapses is a conflict (a replay), one after it is accepted;
// other ids are independent.
func testSeenWebhook(f *fixture) {
	until := t0.Add(10 * time.Minute)
	if err := f.s.SeenWebhook(f.ctx, "ev1", t0, until); err != nil {
		f.t.Fatalf("SeenWebhook: %v", err)
	}
	f.wantIs("a replay", f.s.SeenWebhook(f.ctx, "ev1", t0.Add(time.Minute), until), core.ErrConflict)
	if err := f.s.SeenWebhook(f.ctx, "ev2", t0, until); err != nil {
		f.t.Errorf("another id: %v", err)
	}
	if err := f.s.SeenWebhook(f.ctx, "ev1", until.Add(time.Second), until.Add(time.Hour)); err != nil {
		f.t.Errorf("after it lapsed: %v", err)
	}
}
