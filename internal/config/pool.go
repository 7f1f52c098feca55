package config

import (
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// The pre-warmed pool (core.PoolSettings).
const (
	// EnvPoolSize is how many pool members are kept (default 0: no pool).
	EnvPoolSize = "SANDBOX_POOL_SIZE"
	// EnvPoolMaxAgeSeconds is the age at which a member is recycled
	// (default 3600).
	EnvPoolMaxAgeSeconds = "SANDBOX_POOL_MAX_AGE_SECONDS"
	// EnvPoolRefillFunction names the function a pool claim invokes
	// asynchronously to refill the pool (the templates: the reconcile
	// function, on the acquire function only); empty: the reconcile
	// schedule alone refills.
	EnvPoolRefillFunction = "POOL_REFILL_FUNCTION"
	// EnvPoolParked is how members wait: "paused" or "running" (default:
	// paused when the provider can pause, else running; "paused" with a
	// provider that cannot pause fails at startup).
	EnvPoolParked = "SANDBOX_POOL_PARKED"
)

// maxPoolAge bounds EnvPoolMaxAgeSeconds.
const maxPoolAge = 24 * time.Hour

// Pool configures the pre-warmed pool.
type Pool struct {
	core.PoolSettings
	// RefillFunction is EnvPoolRefillFunction ("" = none).
	RefillFunction string
}

// pool reads the pool variables: a size of 0 or more, a positive age.
func (p *parser) pool() Pool {
	ps := core.DefaultPoolSettings()
	ps.Size = p.intVar(EnvPoolSize, ps.Size, 0)
	ps.MaxAge = p.seconds(EnvPoolMaxAgeSeconds, ps.MaxAge)
	if ps.MaxAge > maxPoolAge {
		p.fail(EnvPoolMaxAgeSeconds, "must be at most %d: it is the members' provider timeout, and E2B runs a sandbox 24 hours at most", int(maxPoolAge/time.Second))
		ps.MaxAge = maxPoolAge
	}
	switch parked := core.PoolParking(p.str(EnvPoolParked, "")); parked {
	case core.PoolParkedDefault, core.PoolParkedPaused, core.PoolParkedRunning:
		ps.Parked = parked
	default:
		p.fail(EnvPoolParked, "must be %s or %s (empty: paused when the provider can pause)", core.PoolParkedPaused, core.PoolParkedRunning)
	}
	return Pool{PoolSettings: ps, RefillFunction: p.str(EnvPoolRefillFunction, "")}
}
