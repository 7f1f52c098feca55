package core

import (
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	// ErrSandboxGone: the provider says the sandbox does not exist (any more).
	ErrSandboxGone = errors.New("sandbox gone")
	// ErrNotOffered: the provider does not offer the call (a capability
	// it does not declare).
	ErrNotOffered = errors.New("not offered by the sandbox provider")
	// ErrFileNotFound: the path does not exist in the sandbox.
	ErrFileNotFound = errors.New("file not found")
	// ErrNotFound: no record (or a record of another tenant: never disclosed).
	ErrNotFound = errors.New("not found")
	// ErrConflict: the record is not in a state that allows the transition.
	ErrConflict = errors.New("conflicting transition")
	// ErrStaleFence: a conditional write carried an outdated fencing token.
	ErrStaleFence = errors.New("stale fencing token")
	// ErrLeaseHeld: another invocation holds a live lease on the record.
	ErrLeaseHeld = errors.New("lease held by another invocation")
	// ErrThreadBound: the thread already has a live binding.
	ErrThreadBound = errors.New("thread already bound")
	// ErrDraining: the deployment is draining; nothing new is handed out
	// or parked.
	ErrDraining = errors.New("deployment draining")
	// ErrAtFairShare: a claim conditional on a tenant's slot count
	// (Claim.Below) found the tenant holding that many slots or more.
	ErrAtFairShare = errors.New("tenant at its fair share")
	// ErrStorageFull: a change of a thread's stored bytes would take its
	// tenant's total past the tenant's cap (StoredChange.TenantLimit);
	// nothing was written.
	ErrStorageFull = errors.New("tenant storage full")
	// ErrPausedFull: every paused slot is held (Settings.PausedLimit);
	// nothing more is paused until one frees.
	ErrPausedFull = errors.New("paused slots full")
	// ErrGrantLost: the waiter's ticket no longer holds the grant it
	// tried to take (it lapsed and was passed on, or the ticket left the
	// queue); nothing was written.
	ErrGrantLost = errors.New("wait grant lost")
	// ErrStoreUnavailable wraps store failures whose outcome is unknown
	// ("maybe applied"): throttling, timeouts, 5xx.
	ErrStoreUnavailable = errors.New("store unavailable")
	// ErrProviderUnavailable: the provider could not give the thread a
	// working sandbox in time (created ones died or failed bootstrap, or
	// calls stalled); nothing is held for the caller, who may retry.
	ErrProviderUnavailable = errors.New("sandbox provider unavailable")
)

// ValidationError is bad caller input (HTTP 400). Nothing was changed.
type ValidationError struct {
	Field   string
	Message string
}

func (e *ValidationError) Error() string { return e.Field + ": " + e.Message }

// CapacityError is a refused acquire because every slot is held (HTTP 429).
type CapacityError struct {
	Reason api.RefusalReason // one of api.RefusalReasons

	RetryAfter time.Duration
	Status     CapacityStatus
	// Tenants names the tenants holding slots, as the store read them with
	// a RefusalCapacity (fair share); not part of the reply.
	Tenants []string
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("sandbox capacity exceeded (%s): %s", e.Reason, e.Status)
}

// ProviderError is a failed provider call: a refusal that certainly did not
// apply (a 4xx other than not-found; Ambiguous false), or an outage (5xx,
// transport, timeout), Ambiguous when the call may have taken effect.
type ProviderError struct {
	Op         string
	StatusCode int // 0 for transport errors
	Message    string
	// Ambiguous means the operation may have taken effect (timeout, 5xx).
	Ambiguous bool
}

func (e *ProviderError) Error() string {
	if e.StatusCode == 0 {
		return fmt.Sprintf("provider %s: %s", e.Op, e.Message)
	}
	return fmt.Sprintf("provider %s: HTTP %d: %s", e.Op, e.StatusCode, e.Message)
}

// IsAmbiguous reports whether err leaves an operation's outcome unknown:
// anything that is not a certain provider refusal or a known sentinel.
func IsAmbiguous(err error) bool {
	if err == nil {
		return false
	}
	var pe *ProviderError
	if errors.As(err, &pe) {
		return pe.Ambiguous
	}
	return !errors.Is(err, ErrSandboxGone) && !errors.Is(err, ErrFileNotFound)
}

// FileTooLargeError: a file stream passed its byte cap and was aborted.
type FileTooLargeError struct {
	Path     string
	MaxBytes int64
}

func (e *FileTooLargeError) Error() string {
	return fmt.Sprintf("file %q exceeds %d bytes", e.Path, e.MaxBytes)
}
