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
