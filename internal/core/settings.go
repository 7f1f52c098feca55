package core

import (
	"errors"
	"fmt"
	"time"
)

// OverflowPolicy decides what acquire does when every slot is held.
type OverflowPolicy string

// Overflow policies: what acquire does when every slot is held.
const (
	PolicyReject OverflowPolicy = "reject" // 429 at once
	PolicyWait   OverflowPolicy = "wait"   // poll up to AcquireTimeout, then 429
	PolicyBurst  OverflowPolicy = "burst"  // allow BurstLimit slots over Replicas
)

// Settings configure the engine. Build them with DefaultSettings and
// override; Validate before use.
type Settings struct {
	// Deployment names this broker deployment; it scopes the capacity ledger
	// and is written to every sandbox's metadata.
	Deployment string
	// Replicas is the deployment-wide slot limit (> 0).
	Replicas int
	Policy   OverflowPolicy
	// BurstLimit extra slots under PolicyBurst (>= 0).
	BurstLimit int
	// MaxPerUser caps the slots one (tenant, user) holds; 0 = no cap.
	MaxPerUser int
	// MaxPerTenant caps the slots one tenant holds across its users; 0 = no
	// cap. It is also the tenant's fair share when set (see FairShare).
	MaxPerTenant int
	// MaxWaitersPerTenant bounds how many of a tenant's acquires may wait
	// for a slot at once under PolicyWait; past it an acquire is refused at
	// once (RefusalTooManyWaiters). 0 = the most places a tenant can have
	// (100).
	MaxWaitersPerTenant int
	// AcquireTimeout bounds waiting for a slot under PolicyWait (> 0).
	AcquireTimeout time.Duration
	// IdleTimeout is how long a released sandbox stays warm; it is set as the
	// provider timeout when parking, so the provider ends it even if the
	// broker never comes back.
	IdleTimeout time.Duration
	// ActiveTimeout is how long a handed-out sandbox is the thread's
	// (Record.ExpiresAt) before a renewal, and a renewal's default; the
	// provider's timer ends TimerMargin after that.
	ActiveTimeout time.Duration
	// MaxLifetime bounds a sandbox's life from its CreatedAt: no renewal
	// and no provider timer it sets goes past it (0: no bound).
	MaxLifetime time.Duration
	// ExpiringLead is how long before a lease's end (Record.ExpiresAt)
	// reconcile sends sandbox.expiring when it was not renewed (0: never).
	ExpiringLead time.Duration
	// LeaseDuration bounds how long one invocation may hold a record in a
	// transitional state before peers may take it over.
	LeaseDuration time.Duration
	// Template is the provider template id ("" = provider default).
	Template string
	// Home is the sandbox user's home directory.
	Home string
	// PauseAfter is how long a warm sandbox stays idle before it is paused
	// (pause-parking), for providers whose Capabilities declare Pause: 0
	// pauses at release, a negative value never pauses.
	PauseAfter time.Duration
	// MaxPaused bounds the paused slots (>= 0); 0 means 10 × Replicas
	// (see PausedLimit).
	MaxPaused int
	// PausedTTL is how long a sandbox may stay paused before reconcile
	// destroys it (> 0).
	PausedTTL time.Duration
	// TenantUsage is where per-tenant usage goes (usage.go): "" is
	// TenantUsageMetrics.
	TenantUsage TenantUsage
}

// TenantUsage says how per-tenant usage is published. Each tenant's pair
// of usage metrics is a pair of CloudWatch custom metrics, billed per
// month; its lifecycle events carry the same seconds at no fixed cost.
type TenantUsage string

// Where per-tenant usage goes.
const (
	// TenantUsageMetrics: usage metrics per tenant (dimensions Deployment
	// and Tenant), and the lifecycle events.
	TenantUsageMetrics TenantUsage = "metrics"
	// TenantUsageEvents: per tenant only in the lifecycle events and the
	// usage log lines; the usage metrics are the deployment's totals
	// (dimension Deployment).
	TenantUsageEvents TenantUsage = "events"
)

// PauseNever is the PauseAfter that never pauses.
const PauseNever = -time.Second

// PausedLimit is the number of paused slots: MaxPaused, or 10 × Replicas
// when it is 0.
func (s Settings) PausedLimit() int {
	if s.MaxPaused > 0 {
		return s.MaxPaused
	}
	return 10 * s.Replicas
}

// DefaultSettings returns the defaults docs/configuration.md documents.
func DefaultSettings() Settings {
	return Settings{
		Deployment:          "default",
		Replicas:            3,
		Policy:              PolicyWait,
		MaxWaitersPerTenant: 10,
		BurstLimit:          0,
		AcquireTimeout:      30 * time.Second,
		IdleTimeout:         1800 * time.Second,
		ActiveTimeout:       3600 * time.Second,
		MaxLifetime:         24 * time.Hour,
		ExpiringLead:        time.Minute,
		LeaseDuration:       120 * time.Second,
		Home:                "/home/user",
		PauseAfter:          300 * time.Second,
		PausedTTL:           7 * 24 * time.Hour,
		TenantUsage:         TenantUsageMetrics,
	}
}

// Limit is the number of slots acquire may fill.
func (s Settings) Limit() int {
	if s.Policy == PolicyBurst {
		return s.Replicas + s.BurstLimit
	}
	return s.Replicas
}

// FairShare is the number of slots a tenant may hold before its acquires
// stop evicting other tenants' warm sandboxes: the deployment limit
// divided among the tenants holding slots (the acquiring tenant counted
// even if it holds none), rounded up, and never more than MaxPerTenant
// when that is set. tenants is the number of tenants holding slots,
// including the acquiring one.
func (s Settings) FairShare(tenants int) int {
	share := s.Limit()
	if tenants > 1 {
		share = (share + tenants - 1) / tenants
	}
	if s.MaxPerTenant > 0 {
		share = min(share, s.MaxPerTenant)
	}
	return share
}

// ExpiryLead is how long before the provider's own timer (IdleTimeout after
// parking) reconcile starts expiring a warm sandbox: a quarter of the idle
// timeout, at most two minutes (two passes of the one-minute schedule).
// Expiring copies the outputs a capped release sync deferred, which needs
// the sandbox alive; starting at the provider's timer would find it ended.
func (s Settings) ExpiryLead() time.Duration {
	return min(2*time.Minute, s.IdleTimeout/4)
}

// Validate returns every problem, each naming its field.
func (s Settings) Validate() error {
	var errs []error
	if s.Deployment == "" || !idPattern.MatchString(s.Deployment) {
		errs = append(errs, fmt.Errorf("Deployment: %q must match ^[A-Za-z0-9_-]{1,64}$", s.Deployment))
	}
	if s.Replicas <= 0 {
		errs = append(errs, fmt.Errorf("Replicas: must be > 0, got %d", s.Replicas))
	}
	switch s.Policy {
	case PolicyReject, PolicyWait, PolicyBurst:
	default:
		errs = append(errs, fmt.Errorf("Policy: unknown overflow policy %q (want reject, wait or burst)", s.Policy))
	}
	if s.MaxPerUser < 0 {
		errs = append(errs, fmt.Errorf("MaxPerUser: must be >= 0, got %d", s.MaxPerUser))
	}
	if s.MaxWaitersPerTenant < 0 || s.MaxWaitersPerTenant > maxWaiterPlaces {
		errs = append(errs, fmt.Errorf("MaxWaitersPerTenant: must be 0 to %d, got %d", maxWaiterPlaces, s.MaxWaitersPerTenant))
	}
	if s.MaxPerTenant < 0 {
		errs = append(errs, fmt.Errorf("MaxPerTenant: must be >= 0, got %d", s.MaxPerTenant))
	}
	if s.MaxPaused < 0 {
		errs = append(errs, fmt.Errorf("MaxPaused: must be >= 0, got %d", s.MaxPaused))
	}
	if s.MaxLifetime < 0 || (s.MaxLifetime > 0 && s.MaxLifetime < s.ActiveTimeout) {
		errs = append(errs, fmt.Errorf("MaxLifetime: must be 0 or at least ActiveTimeout (%s), got %s", s.ActiveTimeout, s.MaxLifetime))
	}
	switch s.TenantUsage {
	case "", TenantUsageMetrics, TenantUsageEvents:
	default:
		errs = append(errs, fmt.Errorf("TenantUsage: must be %s or %s, got %q", TenantUsageMetrics, TenantUsageEvents, s.TenantUsage))
	}
	if s.ExpiringLead < 0 {
		errs = append(errs, fmt.Errorf("ExpiringLead: must be >= 0, got %s", s.ExpiringLead))
	}
	if s.BurstLimit < 0 {
		errs = append(errs, fmt.Errorf("BurstLimit: must be >= 0, got %d", s.BurstLimit))
	}
	for name, d := range map[string]time.Duration{
		"AcquireTimeout": s.AcquireTimeout, "IdleTimeout": s.IdleTimeout,
		"ActiveTimeout": s.ActiveTimeout, "LeaseDuration": s.LeaseDuration, "PausedTTL": s.PausedTTL,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be > 0, got %s", name, d))
		}
	}
	if s.Home == "" || s.Home[0] != '/' {
		errs = append(errs, fmt.Errorf("Home: must be an absolute path, got %q", s.Home))
	}
	return errors.Join(errs...)
}
