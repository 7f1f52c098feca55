// Package providererr builds the *core.ProviderError values that the HTTP
// clients of the sandbox providers (pkg/e2b and pkg/provisioner) return
// alike: transport failures, errors that carry a cause, and the rule for
// which HTTP statuses leave an operation's outcome unknown.
package providererr

import (
	"net/http"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// WithCause returns pe that also unwraps to cause: its text is pe's (which
// should already quote the cause), errors.As finds pe and errors.Is
// matches cause (a sentinel, or context.DeadlineExceeded for a timeout).
func WithCause(pe *core.ProviderError, cause error) error {
	return &causedError{pe: pe, cause: cause}
}

// Transport is an ambiguous *core.ProviderError for op whose message is
// err's text, unwrapping to err too (WithCause): a request that failed in
// transport or timed out may or may not have been applied.
func Transport(op string, err error) error {
	return WithCause(&core.ProviderError{Op: op, Message: err.Error(), Ambiguous: true}, err)
}

// AmbiguousStatus reports whether an unsuccessful HTTP status leaves an
// operation's outcome unknown: 5xx, 408 and 429 (and anything below 400);
// other 4xx certainly did not apply.
func AmbiguousStatus(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status < 400 || status > 499
}

// causedError is a *core.ProviderError with an underlying cause.
type causedError struct {
	pe    *core.ProviderError
	cause error
}

func (e *causedError) Error() string   { return e.pe.Error() }
func (e *causedError) Unwrap() []error { return []error{e.pe, e.cause} }
