// Package client is a Go client for the sandbox-broker HTTP API (v1) and a
// small envd helper that lets a caller work inside an acquired sandbox with
// only the acquire response's connection (no provider API key).
//
// The API it speaks is the broker's HTTP API v1 (docs/api.md;
// served by internal/httpapi):
// POST /v1/sandboxes/acquire, POST /v1/sandboxes/{id}/release,
// POST /v1/sandboxes/{id}/sync, GET /v1/sandboxes/{id}, GET /v1/capacity,
// and the admin routes POST /v1/admin/drain and /v1/admin/undrain, with
// errors shaped {"error":{"code","message","reason","retryable","retry_after_seconds"}}.
//
// Inside a sandbox, Envd speaks E2B's envd (connection protocol "envd":
// envd_url, envd_access_token) and AIO speaks the AIO sandbox API
// (protocol "aio": sandbox_url, access_token), whatever the backend.
//
// The wire types are public packages of their own, shared with the broker
// and the local sandbox host: pkg/api (the broker API's bodies; Sandbox,
// Connection and the other replies here are aliases of them), pkg/envd and
// pkg/aio (the two sandbox protocols).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// DefaultTimeout bounds every API call unless WithTimeout says otherwise. It
// is generous because acquire may wait for a capacity slot (policy "wait",
// SANDBOX_ACQUIRE_TIMEOUT_SECONDS, 30 s by default) and then create and
// bootstrap a sandbox, and release copies outputs to S3 before it answers.
const DefaultTimeout = 3 * time.Minute

// maxErrorBody caps how much of an error response is read (bytes).
const maxErrorBody = 64 << 10

// maxResponseBody caps how much of a success response is decoded (bytes).
const maxResponseBody = 16 << 20

// Client calls the broker API with a bearer token. It is safe for concurrent use.
type Client struct {
	base    *url.URL
	token   string
	http    *http.Client
	timeout time.Duration
	agent   string
	// sleep waits between the polls of a waiting acquire.
	sleep func(ctx context.Context, d time.Duration) error
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient replaces the HTTP client (default: a client without its own
// timeout; every call is bounded by the Client's timeout instead).
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithTimeout bounds every call to d (d <= 0 keeps DefaultTimeout). A
// deadline already on the caller's context applies too; the earlier wins.
func WithTimeout(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithSleep replaces how a waiting acquire waits between its polls (tests).
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *Client) { c.sleep = sleep }
}

// sleepCtx waits d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WithUserAgent sets the User-Agent header of every call.
func WithUserAgent(ua string) Option { return func(c *Client) { c.agent = ua } }

// New returns a client for the broker at baseURL (e.g. "http://127.0.0.1:8787";
// a path prefix such as an API Gateway stage is kept). token is sent as
// "Authorization: Bearer <token>"; it may be empty when an authorizer in front
// of the API needs none. It fails when baseURL is not an absolute http(s) URL.
func New(baseURL, token string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil {
		return nil, fmt.Errorf("parse api url: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("api url %q: want an absolute http:// or https:// URL", baseURL)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawQuery, u.Fragment = "", ""
	c := &Client{base: u, token: token, http: &http.Client{}, timeout: DefaultTimeout, agent: "sandbox-broker-client", sleep: sleepCtx}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// BaseURL is the API base URL the client calls, without a trailing slash.
func (c *Client) BaseURL() string { return c.base.String() }

// The broker API's bodies (pkg/api, shared with the server).
type (
	// Connection is how to reach a sandbox, keyed by its protocol
	// (Connection.Kind): KindEnvd is reached with NewEnvd, KindAIO with
	// NewAIO. The tokens are secrets.
	Connection = api.Connection
	// Sandbox is the acquire reply: a sandbox handed to a thread.
	Sandbox = api.Sandbox
	// DeferredFile is an output file a sync pass did not copy, and why.
	DeferredFile = api.DeferredFile
	// SyncResult is the reply of Sync: one pass copying outputs/ and
	// workspace/ to S3.
	SyncResult = api.SyncResult
	// ReleaseResult is the reply of Release.
	ReleaseResult = api.ReleaseResult
	// RenewResult is the reply of Renew.
	RenewResult = api.RenewResult
	// Capacity is the reply of Capacity: deployment-wide slot usage.
	Capacity = api.Capacity
	// DrainStatus is the reply of Drain and Undrain.
	DrainStatus = api.DrainStatus
	// RestoreResult reports a restore of a thread's outputs into its
	// sandbox (Sandbox.Restore).
	RestoreResult = api.RestoreResult
	// Previous names the thread's earlier sandbox and why it ended
	// (Sandbox.Previous).
	Previous = api.Previous
)

// Connection kinds (Connection.Kind).
const (
	KindEnvd = api.ProtocolEnvd // E2B envd: NewEnvd
	KindAIO  = api.ProtocolAIO  // AIO sandbox API: NewAIO
)

// Record is the body of GET /v1/sandboxes/{id}: the broker's record of a
// sandbox, kept as the raw JSON object so fields added by the server are not lost.
type Record = json.RawMessage

// ErrorCodeCapacity is the API error code of a refused acquire (HTTP 429).
const ErrorCodeCapacity = string(api.CodeCapacityExceeded)

// APIError is a non-2xx answer from the broker, decoded from
// {"error":{"code","message","reason","retryable","retry_after_seconds"}}.
// When the body has another shape (e.g. a gateway's own 401), Code is
// "HTTP_<status>" and Message holds the start of the body.
type APIError struct {
	Status  int    // HTTP status code
	Code    string // one of api.ErrorCodes, e.g. SANDBOX_CAPACITY_EXCEEDED
	Message string
	// Reason is one of api.RefusalReasons for SANDBOX_CAPACITY_EXCEEDED,
	// the offending field's name for VALIDATION_ERROR, else one of
	// api.ErrorReasons (or empty).
	Reason    string
	Retryable bool
	// RetryAfter is how long to wait before retrying: retry_after_seconds,
	// else the Retry-After header (seconds); 0 when neither was given.
	RetryAfter time.Duration
	// Details holds extra facts the server sent, e.g. the capacity counters
	// of a 429 (limit, used, active, warm, reserved); nil when none.
	Details map[string]any
}

// Error renders "CODE (HTTP status): message [reason: …] (retry after …)".
func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (HTTP %d)", e.Code, e.Status)
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.Reason != "" {
		b.WriteString(" [reason: " + e.Reason + "]")
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %s)", e.RetryAfter)
	}
	return b.String()
}

// IsCapacity reports whether err is a capacity refusal: code
// SANDBOX_CAPACITY_EXCEEDED (HTTP 429, or 503 while the deployment drains),
// or any 429.
func IsCapacity(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && (ae.Status == http.StatusTooManyRequests || ae.Code == ErrorCodeCapacity)
}

// ErrorCodeForbidden is the API error code of an admin route called by a
// tenant that is not in BROKER_ADMIN_TENANTS (HTTP 403).
const ErrorCodeForbidden = string(api.CodeForbidden)

// IsForbidden reports whether err is a 403 (e.g. a non-admin tenant on an
// admin route).
func IsForbidden(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusForbidden
}

// IsNotFound reports whether err is a 404 (unknown sandbox, or another tenant's).
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// Acquire asks for the thread's sandbox: POST /v1/sandboxes/acquire with
// {"user_id","thread_id"}. ids must match ^[A-Za-z0-9_-]{1,64}$ (the server
// checks). When the broker answers 202 (waiting for a slot under the
// overflow policy wait), Acquire asks again with the ticket after the
// answer's retry_after_seconds, until it gets the sandbox or a refusal:
// the broker bounds the whole wait (its acquire timeout), ctx may end it
// sooner. Errors: *APIError (429 capacity, 400 validation, 503 outage), or
// a transport error.
func (c *Client) Acquire(ctx context.Context, userID, threadID string) (Sandbox, error) {
	body := api.AcquireRequest{UserID: userID, ThreadID: threadID}
	for {
		var raw json.RawMessage
		status, err := c.send(ctx, http.MethodPost, "/v1/sandboxes/acquire", body, &raw)
		if err != nil {
			return Sandbox{}, err
		}
		if status != http.StatusAccepted {
			var out Sandbox
			if err := json.Unmarshal(raw, &out); err != nil {
				return Sandbox{}, fmt.Errorf("acquire: decode response: %w", err)
			}
			return out, nil
		}
		var w api.AcquireWaiting
		if err := json.Unmarshal(raw, &w); err != nil || w.Ticket == "" {
			return Sandbox{}, fmt.Errorf("acquire: decode waiting answer %q: %v", raw, err)
		}
		body.Ticket = w.Ticket
		if err := c.sleep(ctx, time.Duration(max(w.RetryAfterSeconds, 1))*time.Second); err != nil {
			return Sandbox{}, fmt.Errorf("acquire: waiting for a slot: %w", err)
		}
	}
}

// Release ends the thread's use of a sandbox: outputs are copied to S3, then
// it is parked warm (or destroyed if dead): POST /v1/sandboxes/{id}/release.
func (c *Client) Release(ctx context.Context, sandboxID string) (ReleaseResult, error) {
	var out ReleaseResult
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/release", nil, &out)
	return out, err
}

// Sync copies the sandbox's outputs/ and workspace/ to S3 now:
// POST /v1/sandboxes/{id}/sync.
func (c *Client) Sync(ctx context.Context, sandboxID string) (SyncResult, error) {
	var out SyncResult
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/sync", nil, &out)
	return out, err
}

// Get returns the broker's record of a sandbox: GET /v1/sandboxes/{id}.
// Another tenant's sandbox is a 404 *APIError.
func (c *Client) Get(ctx context.Context, sandboxID string) (Record, error) {
	var out json.RawMessage
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(sandboxID), nil, &out)
	return out, err
}

// Capacity returns the deployment-wide slot usage: GET /v1/capacity.
func (c *Client) Capacity(ctx context.Context) (Capacity, error) {
	var out Capacity
	err := c.do(ctx, http.MethodGet, "/v1/capacity", nil, &out)
	return out, err
}

// Drain puts the deployment into draining: POST /v1/admin/drain. From then
// on acquires are refused (503, reason "draining") and releases destroy
// their sandbox instead of parking it warm. Only tenants listed in the
// functions' BROKER_ADMIN_TENANTS may call it; others get a 403 *APIError
// (code FORBIDDEN, reason not_admin; see IsForbidden).
func (c *Client) Drain(ctx context.Context) (DrainStatus, error) {
	var out DrainStatus
	err := c.do(ctx, http.MethodPost, "/v1/admin/drain", nil, &out)
	return out, err
}

// Undrain ends draining: POST /v1/admin/undrain. Same permission as Drain.
func (c *Client) Undrain(ctx context.Context) (DrainStatus, error) {
	var out DrainStatus
	err := c.do(ctx, http.MethodPost, "/v1/admin/undrain", nil, &out)
	return out, err
}

// do sends one request bounded by c.timeout and decodes a 2xx JSON body into
// out, or the error body into an *APIError.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	_, err := c.send(ctx, method, path, in, out)
	return err
}

// send is do, also returning the 2xx status.
func (c *Client) send(ctx context.Context, method, path string, in, out any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	// path is already escaped (ids go through url.PathEscape).
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, body)
	if err != nil {
		return 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.agent != "" {
		req.Header.Set("User-Agent", c.agent)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, decodeError(resp)
	}
	if out == nil {
		return resp.StatusCode, nil
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxResponseBody))
	if err := dec.Decode(out); err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: decode response (HTTP %d): %w", method, path, resp.StatusCode, err)
	}
	return resp.StatusCode, nil
}

// errorBody is the wire shape of an API error, or of an error of the
// gateway in front of the broker.
type errorBody struct {
	Error *api.Error `json:"error"`
	// Message is what API Gateway's own errors carry ({"message":"Unauthorized"}).
	Message string `json:"message"`
}

// decodeError turns a non-2xx response into an *APIError.
func decodeError(resp *http.Response) *APIError {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &APIError{Status: resp.StatusCode}
	var eb errorBody
	if json.Unmarshal(raw, &eb) == nil && eb.Error != nil && eb.Error.Code != "" {
		e.Code, e.Message, e.Reason, e.Retryable = eb.Error.Code, eb.Error.Message, eb.Error.Reason, eb.Error.Retryable
		e.Details = eb.Error.Details
		if s := eb.Error.RetryAfterSeconds; s > 0 {
			e.RetryAfter = time.Duration(s * float64(time.Second))
		}
	} else {
		e.Code = "HTTP_" + strconv.Itoa(resp.StatusCode)
		switch {
		case eb.Message != "":
			e.Message = eb.Message
		default:
			msg := strings.TrimSpace(string(raw))
			if len(msg) > 200 {
				msg = msg[:200] + "…"
			}
			if msg == "" {
				msg = http.StatusText(resp.StatusCode)
			}
			e.Message = msg
		}
		e.Retryable = resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
	}
	if e.RetryAfter == 0 {
		if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s > 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
	}
	return e
}
