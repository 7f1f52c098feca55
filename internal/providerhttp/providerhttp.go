// Package providerhttp holds what the HTTP clients of the sandbox providers
// (internal/e2b and internal/provisioner) do alike: the *core.ProviderError values
// they return for transport failures and for errors that carry a cause,
// the rule for which HTTP statuses leave an operation's outcome unknown,
// and a request whose response headers must arrive within a bound.
package providerhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
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

// ErrHeaderTimeout is the cause of a DoHeaderTimeout call whose response
// headers did not arrive in time.
var ErrHeaderTimeout = errors.New("timed out waiting for response headers")

// DoHeaderTimeout sends req with hc, waiting at most headerTimeout for the
// response headers; the body is then bounded by req's context only (a
// download may take longer than its first byte). On success the caller
// reads resp.Body and then calls cancel(nil), which ends the request. A
// late answer fails with an error wrapping ErrHeaderTimeout and
// context.DeadlineExceeded; other errors are hc.Do's. On error the request
// is already cancelled.
func DoHeaderTimeout(hc *http.Client, req *http.Request, headerTimeout time.Duration) (*http.Response, context.CancelCauseFunc, error) {
	reqCtx, cancel := context.WithCancelCause(req.Context())
	timer := time.AfterFunc(headerTimeout, func() { cancel(ErrHeaderTimeout) })
	resp, err := hc.Do(req.WithContext(reqCtx))
	if !timer.Stop() && err == nil {
		// The timer fired as the headers arrived: the body is cancelled.
		resp.Body.Close()
		err = context.Cause(reqCtx)
	}
	if err != nil {
		if cause := context.Cause(reqCtx); errors.Is(cause, ErrHeaderTimeout) {
			err = fmt.Errorf("%w: %w", cause, context.DeadlineExceeded)
		}
		cancel(nil)
		return nil, nil, err
	}
	return resp, cancel, nil
}
