package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

func TestParseReconcileSettings(t *testing.T) {
	c, _, err := Parse(base())
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got, want := c.Reconcile, core.DefaultReconcileSettings(); !reflect.DeepEqual(got, want) {
		t.Errorf("defaults = %+v, want %+v", got, want)
	}
	c, _, err = Parse(base("RECONCILE_MAX_PAGES=3", "RECONCILE_MAX_ITEMS=50", "RECONCILE_MAX_SECONDS=20",
		"RECONCILE_GRACE_SECONDS=0", "RECONCILE_ORPHAN_TTL_SECONDS=600", "RECONCILE_KNOWN_TENANTS=acme, beta"))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	r := c.Reconcile
	if r.MaxPages != 3 || r.MaxItems != 50 || r.MaxDuration != 20*time.Second || r.Grace != 0 || r.OrphanTTL != 10*time.Minute ||
		!reflect.DeepEqual(r.KnownTenants, []string{"acme", "beta"}) {
		t.Errorf("overrides = %+v", r)
	}
	for _, bad := range []string{"RECONCILE_MAX_PAGES=0", "RECONCILE_MAX_ITEMS=x", "RECONCILE_MAX_SECONDS=0",
		"RECONCILE_GRACE_SECONDS=-1", "RECONCILE_ORPHAN_TTL_SECONDS=0", "RECONCILE_KNOWN_TENANTS=a/b"} {
		name, _, _ := strings.Cut(bad, "=")
		if _, _, err := Parse(base(bad)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Parse(%s) = %v, want an error naming %s", bad, err, name)
		}
	}
}
