package api

// The machine-readable vocabulary of refusals and errors, in one place.
// The HTTP adapter answers with exactly these; docs/api.md's error table
// lists exactly these (a test holds the two together).

// RefusalReason says why an acquire was refused for capacity
// (CapacityError.Reason, and the "reason" of a SANDBOX_CAPACITY_EXCEEDED
// answer).
type RefusalReason string

// Capacity refusal reasons.
const (
	// RefusalCapacity: every slot of the deployment is held (HTTP 429).
	RefusalCapacity RefusalReason = "capacity"
	// RefusalUserQuota: the (tenant, user) holds SANDBOX_MAX_PER_USER
	// slots already (HTTP 429).
	RefusalUserQuota RefusalReason = "user_quota"
	// RefusalTenantQuota: the tenant holds SANDBOX_MAX_PER_TENANT slots
	// already, across all its users (HTTP 429).
	RefusalTenantQuota RefusalReason = "tenant_quota"
	// RefusalTooManyWaiters: under the wait policy, the tenant already has
	// SANDBOX_MAX_WAITERS_PER_TENANT acquires waiting for a slot; refused
	// at once instead of waiting (HTTP 429).
	RefusalTooManyWaiters RefusalReason = "too_many_waiters"
	// RefusalCapacityBackend: the capacity ledger could not decide (the
	// store failed), so nothing was created: fail closed (HTTP 429).
	RefusalCapacityBackend RefusalReason = "capacity_backend"
	// RefusalDraining: the deployment is draining (HTTP 503).
	RefusalDraining RefusalReason = "draining"
)

// RefusalReasons lists every capacity refusal reason the broker produces.
func RefusalReasons() []RefusalReason {
	return []RefusalReason{RefusalCapacity, RefusalUserQuota, RefusalTenantQuota, RefusalTooManyWaiters, RefusalCapacityBackend, RefusalDraining}
}

// ErrorCode is the "code" of an HTTP API error answer.
type ErrorCode string

// HTTP API error codes.
const (
	CodeValidation          ErrorCode = "VALIDATION_ERROR"          // 400: bad input, nothing changed
	CodeUnauthorized        ErrorCode = "UNAUTHORIZED"              // 401: no caller identity
	CodeForbidden           ErrorCode = "FORBIDDEN"                 // 403: admin route, tenant not an admin
	CodeSandboxNotFound     ErrorCode = "SANDBOX_NOT_FOUND"         // 404: no such sandbox (or another tenant's)
	CodeRouteNotFound       ErrorCode = "ROUTE_NOT_FOUND"           // 404: no such route
	CodeMethodNotAllowed    ErrorCode = "METHOD_NOT_ALLOWED"        // 405: route exists, method does not
	CodeConflict            ErrorCode = "CONFLICT"                  // 409: the record's state refuses the transition
	CodeRequestTooLarge     ErrorCode = "REQUEST_TOO_LARGE"         // 413: body over the limit
	CodeCapacityExceeded    ErrorCode = "SANDBOX_CAPACITY_EXCEEDED" // 429 (503 when draining): see RefusalReason
	CodeInternal            ErrorCode = "INTERNAL"                  // 500: a bug; the log has the detail
	CodeStoreUnavailable    ErrorCode = "STORE_UNAVAILABLE"         // 503: the state store failed, retry
	CodeProviderUnavailable ErrorCode = "PROVIDER_UNAVAILABLE"      // 503: the sandbox provider failed, retry
)

// ErrorCodes lists every HTTP API error code.
func ErrorCodes() []ErrorCode {
	return []ErrorCode{CodeValidation, CodeUnauthorized, CodeForbidden, CodeSandboxNotFound, CodeRouteNotFound,
		CodeMethodNotAllowed, CodeConflict, CodeRequestTooLarge, CodeCapacityExceeded, CodeInternal,
		CodeStoreUnavailable, CodeProviderUnavailable}
}

// Reasons of HTTP API error answers other than capacity refusals. A
// VALIDATION_ERROR's reason is the name of the offending field (user_id,
// thread_id, sandbox_id) or "body".
const (
	ReasonNotFound            = "not_found"
	ReasonLeaseHeld           = "lease_held"
	ReasonConflict            = "conflict"
	ReasonNotAdmin            = "not_admin"
	ReasonStoreUnavailable    = "store_unavailable"
	ReasonProviderUnavailable = "provider_unavailable"
	// ReasonProviderAuth: the provider refused the deployment's own
	// credentials (401/403: a placeholder or rotated API key).
	ReasonProviderAuth = "provider_auth"
	ReasonInternal     = "internal"
	ReasonBody         = "body"
	// ReasonSignature: a provider webhook without a valid signature
	// (UNAUTHORIZED, 401).
	ReasonSignature = "signature"
	// ReasonReplayed: a provider webhook whose event was applied before
	// (CONFLICT, 409); nothing changed.
	ReasonReplayed = "replayed"
)

// ErrorReasons lists every reason an HTTP API error answer other than a
// capacity refusal or a field validation carries.
func ErrorReasons() []string {
	return []string{ReasonNotFound, ReasonLeaseHeld, ReasonConflict, ReasonNotAdmin, ReasonStoreUnavailable,
		ReasonProviderUnavailable, ReasonProviderAuth, ReasonInternal, ReasonBody, ReasonSignature, ReasonReplayed}
}
