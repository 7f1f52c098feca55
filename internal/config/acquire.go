package config

import "time"

// HTTPFunctionTimeout is the timeout of the broker's HTTP API functions
// (template.yaml and infra/stack): API Gateway's HTTP API ends an
// integration at 30 s.
const HTTPFunctionTimeout = 29 * time.Second

// The engine's reserves at the end of an invocation (internal/core: the
// response margin and settle reserve of begin, the create budget of
// Acquire). Kept here to bound SANDBOX_ACQUIRE_TIMEOUT_SECONDS at load time;
// they must follow core's.
const (
	responseMargin = time.Second
	settleReserve  = 6 * time.Second
	createBudget   = 10 * time.Second
)

// MaxAcquireTimeout is the longest wait for a slot an acquire honours in a
// function with timeout t, in whole seconds: the engine stops waiting
// early enough to answer (the response margin, at most a tenth of t), to
// settle its writes (the settle reserve, at most a quarter) and to create
// a sandbox in a freed slot (the create budget, at most half of what is
// left), whatever SANDBOX_ACQUIRE_TIMEOUT_SECONDS says. For the HTTP API
// functions (29 s) it is 12 s.
func MaxAcquireTimeout(t time.Duration) time.Duration {
	end := t - min(responseMargin, t/10)
	work := end - min(settleReserve, t/4)
	wait := work - min(createBudget, work/2)
	return wait.Truncate(time.Second)
}

// acquireTimeout bounds the acquire timeout read (set reports whether
// SANDBOX_ACQUIRE_TIMEOUT_SECONDS was given): a value above what the HTTP
// API functions honour is refused, naming the largest accepted; the
// default, left unset, is lowered to it.
func (p *parser) acquireTimeout(d time.Duration, set bool) time.Duration {
	limit := MaxAcquireTimeout(HTTPFunctionTimeout)
	switch {
	case d <= limit:
		return d
	case set:
		p.fail(EnvAcquireTimeoutSeconds, "an HTTP API function (timeout %s) stops waiting for a slot after %s, keeping the rest "+
			"to create a sandbox, settle and answer; the largest value accepted is %d, got %d",
			HTTPFunctionTimeout, limit, int(limit/time.Second), int(d/time.Second))
	}
	return limit
}
