package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
)

var _ core.Pauser = (*Client)(nil)

// Pause freezes a running sandbox with POST /sandboxes/{id}/pause: E2B
// keeps its memory and files, stops its timeout clock and stops billing it
// as running, until Resume (connect).
//
// Errors:
//   - nil: the sandbox is paused (paused now, or already paused: E2B answers
//     409 for both "already paused" and "in another transition", so a 409 is
//     settled with a read of the sandbox's state).
//   - core.ErrSandboxGone: the API answered 404 (no such sandbox, running or
//     paused).
//   - *core.ProviderError with Ambiguous false: the pause certainly did not
//     apply (400, 401, 403); the sandbox still runs.
//   - anything else is ambiguous (core.IsAmbiguous): timeouts, transport
//     failures, 408, 429, 5xx, and a 409 whose follow-up read did not show
//     the sandbox paused (it is in another transition). The sandbox may be
//     paused or running; Info tells, and Pause may be called again.
func (c *Client) Pause(ctx context.Context, id string) error {
	if err := core.ValidateSandboxID(id); err != nil {
		return err
	}
	const op = "pause sandbox"
	// {} as the SDK sends it: a full (memory) snapshot, E2B's default.
	body := struct{}{}
	status, _, reply, err := c.call(ctx, c.timeouts.Pause, op, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", nil, body)
	if err != nil {
		return err
	}
	switch {
	case status >= 200 && status <= 299:
		return nil
	case apiNotFound(status, reply):
		return fmt.Errorf("e2b %s %s: %w", op, id, core.ErrSandboxGone)
	case status == http.StatusConflict:
		info, err := c.Info(ctx, id)
		switch {
		case err == nil && info.State == core.SandboxPaused:
			return nil
		case errors.Is(err, core.ErrSandboxGone):
			return fmt.Errorf("e2b %s %s: conflict, then %w", op, id, core.ErrSandboxGone)
		}
		return statusError(op, status, reply, true)
	}
	return statusError(op, status, reply, providerhttp.AmbiguousStatus(status))
}

// Resume starts a paused sandbox again with POST
// /v2/sandboxes/{id}/connect {timeout} (as the SDK's Sandbox.connect does):
// E2B restores its memory, files and processes under the same id, envd
// address and access token, and ends it timeout (ceil seconds) from now.
// A sandbox that is already running is left running and its end is only
// ever moved later (E2B's connect semantics). timeout <= 0 sends no
// timeout: E2B's default (300 s) applies.
//
// Errors:
//   - nil: the sandbox runs (200: it was running; 201: resumed).
//   - core.ErrSandboxGone: the API answered 404 (no such sandbox, or its
//     paused snapshot is gone).
//   - *core.ProviderError with Ambiguous false: certainly not resumed (400,
//     401, 403, and 409: E2B refuses to connect to a sandbox being killed).
//   - anything else is ambiguous (core.IsAmbiguous): timeouts, transport
//     failures, 408, 429, 5xx, an unreadable reply. The sandbox may be
//     running (and billed) or still paused; Info tells.
func (c *Client) Resume(ctx context.Context, id string, timeout time.Duration) error {
	if err := core.ValidateSandboxID(id); err != nil {
		return err
	}
	const op = "resume sandbox"
	var body struct {
		Timeout *int64 `json:"timeout,omitempty"`
	}
	if timeout > 0 {
		s := ceilSeconds(timeout)
		body.Timeout = &s
	}
	status, _, reply, err := c.call(ctx, c.timeouts.Pause, op, http.MethodPost, "/v2/sandboxes/"+url.PathEscape(id)+"/connect", nil, body)
	if err != nil {
		return err
	}
	switch {
	case status == http.StatusOK || status == http.StatusCreated:
		return nil
	case apiNotFound(status, reply):
		return fmt.Errorf("e2b %s %s: %w", op, id, core.ErrSandboxGone)
	case status == http.StatusConflict:
		return statusError(op, status, reply, false)
	}
	return statusError(op, status, reply, providerhttp.AmbiguousStatus(status))
}

// pausedNotGone settles a 404 from a call E2B serves for running
// sandboxes only (set timeout), with a read of the sandbox: gone when the
// read says so too (core.ErrSandboxGone); a certain *core.ProviderError
// when it reads as paused (nothing applied, and it is not gone); else an
// ambiguous one (it runs again, or the read failed).
func (c *Client) pausedNotGone(ctx context.Context, op, id string, status int, reply []byte) error {
	ctx, cancel := core.CleanupContext(ctx, confirmTimeout)
	defer cancel()
	info, err := c.Info(ctx, id)
	switch {
	case errors.Is(err, core.ErrSandboxGone):
		return fmt.Errorf("e2b %s %s: %w", op, id, core.ErrSandboxGone)
	case err == nil && info.State == core.SandboxPaused:
		pe := statusError(op, status, reply, false)
		pe.Message = "sandbox is paused: " + pe.Message
		return pe
	}
	return statusError(op, status, reply, true)
}
