package provisioner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
)

var _ core.Provider = (*Client)(nil)

// Name is the backend name this provider reports (core.Provider.Name).
const Name = "provisioner"

// DefaultUser is the only user an unverified legacy provisioner (mount
// contract < 2) may create sandboxes for: it cannot isolate users, so a
// create for another user is refused before anything is sent.
const DefaultUser = "default"

// MinIsolatingContract is the first mount contract version whose
// provisioner verifies and isolates users.
const MinIsolatingContract = 2

// Per-call timeouts of the provisioner API: create 30 s, delete 15 s,
// get/list 10 s, capability probe 5 s.
const (
	defaultCreateTimeout  = 30 * time.Second
	defaultDeleteTimeout  = 15 * time.Second
	defaultGetTimeout     = 10 * time.Second
	defaultListTimeout    = 10 * time.Second
	defaultProbeTimeout   = 5 * time.Second
	defaultReadyTimeout   = 60 * time.Second
	defaultCommandTimeout = 60 * time.Second
	defaultCommandMargin  = 10 * time.Second
	defaultFileHeader     = 30 * time.Second
	defaultCapabilityTTL  = 60 * time.Second
	defaultKillConfirm    = 15 * time.Second

	// maxReplyBytes caps a JSON reply read into memory.
	maxReplyBytes = 64 << 20
)

// Timeouts bound each kind of call. Zero fields take the defaults.
type Timeouts struct {
	Create time.Duration // POST /api/sandboxes; default 30 s
	Delete time.Duration // DELETE /api/sandboxes/{id}; default 15 s
	Get    time.Duration // GET /api/sandboxes/{id} and discovery; default 10 s
	List   time.Duration // GET /api/sandboxes; default 10 s
	Probe  time.Duration // GET /api/capabilities; default 5 s
	// Ready bounds the wait for a new sandbox's GET /v1/sandbox to answer
	// before Create hands it out. Default 60 s.
	Ready time.Duration
	// Command is the hard timeout of a command whose Command.Timeout is 0.
	// Default 60 s.
	Command time.Duration
	// CommandMargin is added to a command's timeout to bound the HTTP call.
	// Default 10 s.
	CommandMargin time.Duration
	// FileHeader bounds the wait for a download's response headers; the
	// body is bounded by the caller's ctx. Default 30 s.
	FileHeader time.Duration
	// KillConfirm bounds the wait, after DELETE, for the provisioner to
	// report the sandbox absent (pods terminate asynchronously). Default 15 s.
	KillConfirm time.Duration
}

// Options configure a Client.
type Options struct {
	// BaseURL is the provisioner API base, e.g. http://provisioner:8002. Required.
	BaseURL string
	// APIKey is sent as X-API-Key when set. Secret.
	APIKey string
	// RequiredContract, when > 0, is the lowest mount contract version
	// Create accepts; a provisioner advertising less fails Create with
	// *MountContractChangedError and restarts capability detection.
	RequiredContract int
	// BackendNamespace, when set, is the backend namespace a discovery
	// answer must carry to be trusted; empty means the namespace the
	// capability probe reported (if any).
	BackendNamespace string
	// CapabilityTTL is how long a successful capability probe is trusted.
	// Default 60 s.
	CapabilityTTL time.Duration
	// Home is the sandbox directory commands run in when Command.Cwd is
	// empty; empty means the AIO sandbox's own default.
	Home string
	// Deployment, when set, is encoded in the ids of the sandboxes this
	// client creates ("sbx-<8 hex of its SHA-256>-<random>"), so a
	// provisioner that keeps no metadata still lets reconcile tell this
	// deployment's sandboxes from others' (core.MetaDeployment is derived
	// from the id).
	Deployment string
	Timeouts   Timeouts
	// HTTPClient is used for every call; nil means a client without an
	// overall timeout (each call has its own).
	HTTPClient *http.Client
	// Logger receives warnings (malformed listings); nil means slog.Default().
	Logger *slog.Logger
	// Now is the monotonic clock of the capability backoff; nil means time.Now.
	Now func() time.Time
	// PollInterval is the readiness and kill-confirmation poll period.
	// Default 200 ms.
	PollInterval time.Duration
}

// Client talks to one provisioner and the AIO sandboxes it runs. It is safe
// for concurrent use.
type Client struct {
	base     string
	apiKey   string
	opts     Options
	timeouts Timeouts
	http     *http.Client
	log      *slog.Logger
	now      func() time.Time

	// probeMu is held for a whole capability probe, so concurrent callers
	// wait for the one in flight instead of probing again.
	probeMu sync.Mutex
	// mu guards the capability state below.
	mu           sync.Mutex
	capKnown     bool
	capVersion   int
	capNamespace string
	nextProbe    time.Time // zero: probe now
	failures     int
}

// New validates opts and returns a Client.
//
// Errors: a missing or malformed BaseURL.
func New(opts Options) (*Client, error) {
	u, err := url.Parse(opts.BaseURL)
	if opts.BaseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("provisioner: base URL %q must be an absolute http(s) URL", opts.BaseURL)
	}
	t := opts.Timeouts
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&t.Create, defaultCreateTimeout)
	def(&t.Delete, defaultDeleteTimeout)
	def(&t.Get, defaultGetTimeout)
	def(&t.List, defaultListTimeout)
	def(&t.Probe, defaultProbeTimeout)
	def(&t.Ready, defaultReadyTimeout)
	def(&t.Command, defaultCommandTimeout)
	def(&t.CommandMargin, defaultCommandMargin)
	def(&t.FileHeader, defaultFileHeader)
	def(&t.KillConfirm, defaultKillConfirm)
	def(&opts.CapabilityTTL, defaultCapabilityTTL)
	def(&opts.PollInterval, 200*time.Millisecond)
	c := &Client{
		base: strings.TrimRight(opts.BaseURL, "/"), apiKey: opts.APIKey, opts: opts, timeouts: t,
		http: opts.HTTPClient, log: opts.Logger, now: opts.Now,
	}
	if c.http == nil {
		c.http = &http.Client{}
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c, nil
}

// Name reports "provisioner".
func (c *Client) Name() string { return Name }

// Capabilities implements core.Provider: AIO endpoints; the inventory is
// one unpaged listing; an endpoint is only known from the provisioner's
// reply; no pause; presence comes from the reconciliation discovery route
// (see Presence).
func (c *Client) Capabilities() core.Capabilities {
	return core.Capabilities{Protocol: core.ProtocolAIO, Discover: c.Presence}
}

// Presence is DiscoverForReconciliation (any incarnation) as a
// core.Presence: a provisioner that does not answer that route
// authoritatively (an older one answers 404) never has a sandbox judged
// absent.
//
// Errors: why the presence is unknown, when known.
func (c *Client) Presence(ctx context.Context, id string) (core.Presence, error) {
	d := c.DiscoverForReconciliation(ctx, id, "")
	switch d.Status {
	case DiscoveryFound:
		return core.PresenceFound, nil
	case DiscoveryAbsent:
		return core.PresenceAbsent, nil
	default:
		return core.PresenceUnknown, d.Err
	}
}

// headers returns the provisioner API headers: X-API-Key when a key is set
// (on every call, listing included).
func (c *Client) headers(h http.Header) {
	if c.apiKey != "" {
		h.Set("X-API-Key", c.apiKey)
	}
}

// reply is a finished HTTP exchange with its (capped) body.
type reply struct {
	status int
	body   []byte
}

// call performs one provisioner API request bounded by timeout. A non-nil
// error is a transport failure (the outcome is unknown).
func (c *Client) call(ctx context.Context, timeout time.Duration, method, path string, in any) (reply, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return reply{}, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return reply{}, err
	}
	c.headers(req.Header)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return reply{}, fmt.Errorf("read reply: %w", err)
	}
	return reply{status: resp.StatusCode, body: b}, nil
}

// statusError turns an unsuccessful reply into a *core.ProviderError: 5xx,
// 408 and 429 are ambiguous, other 4xx certainly did not apply
// (providerhttp.AmbiguousStatus).
func statusError(op string, r reply) *core.ProviderError {
	return &core.ProviderError{Op: op, StatusCode: r.status, Message: replyMessage(r.body), Ambiguous: providerhttp.AmbiguousStatus(r.status)}
}

// replyMessage extracts a readable message from an error body (FastAPI's
// {"detail": ...}, the AIO {"message": ...}, or the raw text).
func replyMessage(body []byte) string {
	var v struct {
		Detail  json.RawMessage `json:"detail"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &v) == nil {
		var s string
		if len(v.Detail) > 0 && json.Unmarshal(v.Detail, &s) == nil && s != "" {
			return s
		}
		if len(v.Detail) > 0 && string(v.Detail) != "null" {
			return string(v.Detail)
		}
		if v.Message != "" {
			return v.Message
		}
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 512 {
		s = s[:512] + "…"
	}
	if s == "" {
		return "no details"
	}
	return s
}

// certain is a refusal that certainly did not apply (core.IsAmbiguous false).
func certain(op, msg string) *core.ProviderError {
	return &core.ProviderError{Op: op, Message: msg}
}

// isCtxErr reports whether err is the caller's own cancellation.
func isCtxErr(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, ctx.Err())
}
