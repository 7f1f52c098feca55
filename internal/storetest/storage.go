package storetest

import (
	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// stored reads what is recorded for k's thread and tenant.
func (f *fixture) stored(k core.ThreadKey) core.Stored {
	f.t.Helper()
	st, err := f.s.StoredBytes(f.ctx, k)
	if err != nil {
		f.t.Fatalf("StoredBytes(%s): %v", k, err)
	}
	return st
}

// testStorage: a thread's stored bytes move its tenant's total by the
// difference, so another thread's change never resets it; the tenant's cap
// refuses a growth past it (nothing written) but never a shrink; a change
// from bytes no longer recorded is a conflict; other tenants are apart; a
// change whose reply was lost applied once.
func testStorage(f *fixture) {
	a1, a2, z1 := key("acme", "u1", 1), key("acme", "u2", 2), key("zeta", "u1", 1)
	if st := f.stored(a1); st != (core.Stored{}) {
		f.t.Errorf("nothing recorded = %+v; want zero", st)
	}
	const limit = 1000
	record := func(k core.ThreadKey, prev, bytes int64) error {
		return f.s.RecordStored(f.ctx, core.StoredChange{ThreadKey: k, Prev: prev, Bytes: bytes, TenantLimit: limit})
	}
	if err := record(a1, 0, 600); err != nil {
		f.t.Fatalf("RecordStored a1 600: %v", err)
	}
	if err := record(a2, 0, 300); err != nil {
		f.t.Fatalf("RecordStored a2 300: %v", err)
	}
	if st := f.stored(a2); st.Thread != 300 || st.Tenant != 900 {
		f.t.Errorf("a2 = %+v; want 300 of the tenant's 900", st)
	}
	f.wantIs("a2 growing past the tenant's cap", record(a2, 300, 500), core.ErrStorageFull)
	f.wantIs("a growth larger than the cap", record(z1, 0, limit+1), core.ErrStorageFull)
	if st := f.stored(a2); st.Thread != 300 || st.Tenant != 900 {
		f.t.Errorf("a2 after a refused growth = %+v; want 300 of 900, unchanged", st)
	}
	f.wantIs("a change from bytes no longer recorded", record(a1, 0, 10), core.ErrConflict)
	if err := record(a2, 300, 400); err != nil {
		f.t.Errorf("a2 growing to the cap exactly: %v", err)
	}
	if err := record(a1, 600, 100); err != nil {
		f.t.Errorf("a1 shrinking: %v", err)
	}
	if err := f.s.RecordStored(f.ctx, core.StoredChange{ThreadKey: a2, Prev: 400, Bytes: 350, TenantLimit: 10}); err != nil {
		f.t.Errorf("a2 shrinking while over a lowered cap: %v", err)
	}
	if st := f.stored(a1); st.Thread != 100 || st.Tenant != 450 {
		f.t.Errorf("a1 = %+v; want 100 of the tenant's 450", st)
	}
	if err := record(z1, 0, 900); err != nil {
		f.t.Errorf("another tenant's thread under its own cap: %v", err)
	}
	if st := f.stored(z1); st.Thread != 900 || st.Tenant != 900 {
		f.t.Errorf("z1 = %+v; want 900 of 900", st)
	}
	// A change whose reply was lost applied once: the same change again is
	// a conflict, and the totals count it once.
	f.sub.FailNext(true)
	f.wantIs("a change with its reply lost", record(z1, 900, 950), core.ErrStoreUnavailable)
	f.wantIs("the same change again", record(z1, 900, 950), core.ErrConflict)
	if st := f.stored(z1); st.Thread != 950 || st.Tenant != 950 {
		f.t.Errorf("z1 after a lost reply = %+v; want 950 of 950", st)
	}
}
