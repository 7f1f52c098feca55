package core

import (
	"errors"
	"fmt"
	"reflect"
	"time"
)

// ReconcileSettings bound and tune one reconcile pass. Build them
// with DefaultReconcileSettings, override, and pass them with
// WithReconcileSettings; Reconcile validates them.
type ReconcileSettings struct {
	// MaxPages bounds the provider inventory pages read per pass
	// (RECONCILE_MAX_PAGES, > 0).
	MaxPages int
	// MaxItems bounds the sandboxes examined per pass (RECONCILE_MAX_ITEMS, > 0).
	MaxItems int
	// MaxDuration bounds a pass's inventory walk in wall time
	// (RECONCILE_MAX_SECONDS, > 0).
	MaxDuration time.Duration
	// Grace is how long a duplicate (or an untracked sandbox of a crashed
	// create) is left alone after reconcile first saw it
	// (RECONCILE_GRACE_SECONDS, >= 0).
	Grace time.Duration
	// OrphanTTL is the age past which a sandbox tagged for this deployment
	// but with no valid tenant/user/thread is killed
	// (RECONCILE_ORPHAN_TTL_SECONDS, > 0).
	OrphanTTL time.Duration
	// PageSize is the provider list page size (1..100, E2B's maximum).
	PageSize int
	// MaxBackoff caps the wait between kill attempts of a tombstone (> 0).
	MaxBackoff time.Duration
	// KnownTenants, when non-empty, lists the tenants this deployment
	// serves (RECONCILE_KNOWN_TENANTS). Tenants come from the authorizer and
	// there is no registry to ask, so this is the operator's word: a
	// sandbox of any other tenant is an orphan (killed after OrphanTTL).
	// Empty: every well-formed tenant counts as existing.
	KnownTenants []string
}

// DefaultReconcileSettings returns the defaults: 10 pages, 1000 items,
// 60 s, 30 s grace, 1 h orphan TTL (a pass only reads inventory, so its
// item budget is generous).
func DefaultReconcileSettings() ReconcileSettings {
	return ReconcileSettings{
		MaxPages:    10,
		MaxItems:    1000,
		MaxDuration: 60 * time.Second,
		Grace:       30 * time.Second,
		OrphanTTL:   time.Hour,
		PageSize:    100,
		MaxBackoff:  time.Hour,
	}
}

// Validate returns every problem, each naming its field.
func (r ReconcileSettings) Validate() error {
	var errs []error
	if r.MaxPages <= 0 {
		errs = append(errs, fmt.Errorf("MaxPages: must be > 0, got %d", r.MaxPages))
	}
	if r.MaxItems <= 0 {
		errs = append(errs, fmt.Errorf("MaxItems: must be > 0, got %d", r.MaxItems))
	}
	if r.MaxDuration <= 0 {
		errs = append(errs, fmt.Errorf("MaxDuration: must be > 0, got %s", r.MaxDuration))
	}
	if r.Grace < 0 {
		errs = append(errs, fmt.Errorf("Grace: must be >= 0, got %s", r.Grace))
	}
	if r.OrphanTTL <= 0 {
		errs = append(errs, fmt.Errorf("OrphanTTL: must be > 0, got %s", r.OrphanTTL))
	}
	if r.PageSize < 1 || r.PageSize > 100 {
		errs = append(errs, fmt.Errorf("PageSize: must be 1..100, got %d", r.PageSize))
	}
	if r.MaxBackoff <= 0 {
		errs = append(errs, fmt.Errorf("MaxBackoff: must be > 0, got %s", r.MaxBackoff))
	}
	return errors.Join(errs...)
}

// reconcileConfig is what the reconcile Options set (Engine.rc).
type reconcileConfig struct {
	settings ReconcileSettings
}

// WithReconcileSettings sets the reconcile budgets and periods (default
// DefaultReconcileSettings()). The zero value means the defaults; a zero
// PageSize or MaxBackoff takes its default.
func WithReconcileSettings(rs ReconcileSettings) Option {
	return func(e *Engine) {
		def := DefaultReconcileSettings()
		if reflect.ValueOf(rs).IsZero() {
			rs = def
		}
		if rs.PageSize == 0 {
			rs.PageSize = def.PageSize
		}
		if rs.MaxBackoff == 0 {
			rs.MaxBackoff = def.MaxBackoff
		}
		e.reconcileConfig().settings = rs
	}
}

// inventoryStore is the store's ReconcileStore, metered.
func (e *Engine) inventoryStore() ReconcileStore {
	return meteredReconcileStore{ReconcileStore: e.store.Store, e: e}
}
