package storetest

import (
	"errors"
	"slices"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// testTenantSandboxes: a tenant's list holds its active, warm and paused
// records, each once across pages of any size, and nothing of another
// tenant's, of a gone record or of a pool member; a cursor not handed out
// is refused.
func testTenantSandboxes(f *fixture) {
	f.active(key("acme", "u1", 1), "sbx-a1")
	f.active(key("acme", "u2", 2), "sbx-a2")
	f.warm(key("acme", "u1", 3), "sbx-a3")
	f.paused(key("acme", "u1", 4), "sbx-a4")
	gone := f.active(key("acme", "u1", 5), "sbx-a5")
	if err := f.s.Free(f.ctx, gone, t0.Add(time.Minute)); err != nil {
		f.t.Fatalf("Free: %v", err)
	}
	f.active(key("beta", "u1", 1), "sbx-b1")
	f.member("sbx-pool", 1)

	want := []string{"sbx-a1", "sbx-a2", "sbx-a3", "sbx-a4"}
	for _, limit := range []int{1, 2, 3, 4, 10} {
		got := f.tenantIDs("acme", limit)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			f.t.Errorf("acme's sandboxes in pages of %d = %v; want %v", limit, got, want)
		}
	}
	if got := f.tenantIDs("beta", 10); !slices.Equal(got, []string{"sbx-b1"}) {
		f.t.Errorf("beta's sandboxes = %v; want [sbx-b1]", got)
	}
	if got := f.tenantIDs("gamma", 10); len(got) != 0 {
		f.t.Errorf("gamma's sandboxes = %v; want none", got)
	}
	_, _, err := f.s.TenantSandboxes(f.ctx, "acme", "not-a-cursor", 10)
	var ve *core.ValidationError
	if !errors.As(err, &ve) {
		f.t.Errorf("TenantSandboxes with a forged cursor = %v; want a validation error", err)
	}
}

// tenantIDs pages through tenant's sandboxes limit at a time and returns
// their ids in the order listed; a page longer than limit, or more pages
// than records, fails the case.
func (f *fixture) tenantIDs(tenant string, limit int) []string {
	f.t.Helper()
	var ids []string
	cursor := ""
	for pages := 0; ; pages++ {
		recs, next, err := f.s.TenantSandboxes(f.ctx, tenant, cursor, limit)
		if err != nil {
			f.t.Fatalf("TenantSandboxes(%s, %q, %d): %v", tenant, cursor, limit, err)
		}
		if len(recs) > limit || pages > 10 {
			f.t.Fatalf("TenantSandboxes(%s, %d): page of %d after %d pages", tenant, limit, len(recs), pages)
		}
		for _, r := range recs {
			if r.Tenant != tenant {
				f.t.Errorf("%s's list holds %s of %s", tenant, r.SandboxID, r.Tenant)
			}
			ids = append(ids, r.SandboxID)
		}
		if next == "" {
			return ids
		}
		cursor = next
	}
}
