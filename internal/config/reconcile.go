package config

import (
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Reconcile pass budgets and periods; unset means
// core.DefaultReconcileSettings.
const (
	EnvReconcileMaxPages         = "RECONCILE_MAX_PAGES"
	EnvReconcileMaxItems         = "RECONCILE_MAX_ITEMS"
	EnvReconcileMaxSeconds       = "RECONCILE_MAX_SECONDS"
	EnvReconcileGraceSeconds     = "RECONCILE_GRACE_SECONDS"
	EnvReconcileOrphanTTLSeconds = "RECONCILE_ORPHAN_TTL_SECONDS"
	// EnvReconcileKnownTenants lists (comma-separated) the tenants this
	// deployment serves; sandboxes of other tenants are orphans. Empty:
	// every tenant counts as existing.
	EnvReconcileKnownTenants = "RECONCILE_KNOWN_TENANTS"
)

// reconcile reads the RECONCILE_* variables: pages, items and seconds are
// positive whole numbers, the grace period may be 0.
func (p *parser) reconcile() core.ReconcileSettings {
	rs := core.DefaultReconcileSettings()
	rs.MaxPages = p.intVar(EnvReconcileMaxPages, rs.MaxPages, 1)
	rs.MaxItems = p.intVar(EnvReconcileMaxItems, rs.MaxItems, 1)
	rs.MaxDuration = p.seconds(EnvReconcileMaxSeconds, rs.MaxDuration)
	rs.Grace = time.Duration(p.intVar(EnvReconcileGraceSeconds, int(rs.Grace/time.Second), 0)) * time.Second
	rs.OrphanTTL = p.seconds(EnvReconcileOrphanTTLSeconds, rs.OrphanTTL)
	rs.KnownTenants = p.tenantList(EnvReconcileKnownTenants)
	return rs
}
