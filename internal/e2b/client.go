package e2b

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
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
)

var _ core.Provider = (*Client)(nil)

// Defaults. Sources: E2B OpenAPI spec (limit maximum 100, default template
// "base" as in the SDKs) and the JS SDK (60 s request timeout, envd port).
const (
	// DefaultTemplate is the template used when CreateSpec.Template is empty.
	DefaultTemplate = "base"
	// DefaultDomain is the sandbox domain used when a create reply has none.
	DefaultDomain = "e2b.app"

	defaultControlPlaneTimeout = 30 * time.Second
	defaultCreateTimeout       = 60 * time.Second
	defaultPauseTimeout        = 60 * time.Second
	defaultCommandTimeout      = 60 * time.Second
	defaultCommandMargin       = 10 * time.Second
	defaultFileHeaderTimeout   = 30 * time.Second
	defaultListPageSize        = 100
	defaultMaxListPages        = 1000
	defaultMaxOutputBytes      = 8 << 20

	// maxReplyBytes caps a control-plane reply read into memory.
	maxReplyBytes = 16 << 20

	// idleConnsPerHost is how many idle connections the default client
	// keeps to each host (net/http's default keeps 2): an output sync
	// reads several files of a sandbox at once, and many goroutines of
	// one process (a reconcile pass beside acquires, a test's workers)
	// call the one API host.
	idleConnsPerHost = 32
)

// Timeouts bound every call. Zero fields take the defaults.
type Timeouts struct {
	// ControlPlane bounds Info, List (per page), Kill and SetTimeout. Default 30 s.
	ControlPlane time.Duration
	// Pause bounds Pause (E2B snapshots the sandbox's memory) and Resume.
	// Default 60 s.
	Pause time.Duration
	// Create bounds Create. Default 60 s.
	Create time.Duration
	// Command is the process timeout used when Command.Timeout is 0 (the JS
	// SDK's default). Default 60 s.
	Command time.Duration
	// CommandMargin is added to a process timeout to bound the whole Run
	// call, so envd can report the end of a process it stopped at its
	// deadline. Default 10 s.
	CommandMargin time.Duration
	// FileHeader bounds the wait for response headers of OpenFile; the body
	// is then bounded by the caller's ctx only. Default 30 s.
	FileHeader time.Duration
}

// Options configure a Client.
type Options struct {
	// APIURL is the control plane base URL, e.g. https://api.e2b.app. Required.
	APIURL string
	// SandboxURL is the envd base URL of every sandbox (requests are routed by
	// the E2b-Sandbox-Id header), like the SDK's E2B_SANDBOX_URL. Empty means
	// e2bapi.EnvdURL(<sandboxID>, <domain>), domain from the create reply or
	// DefaultDomain.
	SandboxURL string
	// APIKey is sent as X-API-Key on control-plane calls. Required unless
	// Keys is set. Secret.
	APIKey string
	// Keys, if set, supplies the key instead of APIKey and is asked for a
	// fresh one when the control plane refuses the key given (401/403): a
	// rotated key is picked up by the next request, which is then sent
	// once more with the new key (a refused request did not apply).
	Keys KeySource
	// HTTPClient is used for every call. Nil means a client on a clone of
	// http.DefaultTransport keeping idleConnsPerHost idle connections per
	// host. Its Timeout should be 0: streams are bounded by
	// ctx and Timeouts.
	HTTPClient *http.Client
	Timeouts   Timeouts
	// ListPageSize is the limit parameter of list calls, 1..100. Default 100.
	ListPageSize int
	// MaxListPages bounds the pages one List follows; more is an error
	// (never a silently partial inventory). Default 1000.
	MaxListPages int
	// MaxOutputBytes caps the bytes of stdout and of stderr kept per Run;
	// the tail is kept. Default 8 MiB.
	MaxOutputBytes int
	// Logger receives warnings about best-effort cleanups. Nil discards.
	Logger *slog.Logger
}

// KeySource supplies the control-plane API key. Key may serve a cached
// key unless refresh is true, which the client asks for when the control
// plane refused the key Key returned: it should then read the key's
// source again (and may return the same key when nothing changed).
type KeySource interface {
	Key(ctx context.Context, refresh bool) (string, error)
}

// staticKey is the KeySource of Options.APIKey.
type staticKey string

func (k staticKey) Key(context.Context, bool) (string, error) { return string(k), nil }

// Client talks to E2B (or an E2B-compatible host). It is safe for
// concurrent use.
type Client struct {
	apiURL     string
	sandboxURL string
	keys       KeySource
	http       *http.Client
	timeouts   Timeouts
	pageSize   int
	maxPages   int
	maxOutput  int
	log        *slog.Logger
}

// New validates opts and returns a Client. It fails when APIURL or a
// non-empty SandboxURL is not an absolute http(s) URL, when APIKey is empty,
// or when a limit is out of range.
func New(opts Options) (*Client, error) {
	apiURL, err := baseURL("APIURL", opts.APIURL)
	if err != nil {
		return nil, err
	}
	var sandboxURL string
	if opts.SandboxURL != "" {
		if sandboxURL, err = baseURL("SandboxURL", opts.SandboxURL); err != nil {
			return nil, err
		}
	}
	keys := opts.Keys
	if keys == nil {
		if strings.TrimSpace(opts.APIKey) == "" {
			return nil, errors.New("e2b: APIKey is empty")
		}
		keys = staticKey(opts.APIKey)
	}
	if opts.ListPageSize < 0 || opts.ListPageSize > 100 {
		return nil, fmt.Errorf("e2b: ListPageSize must be 1..100, got %d", opts.ListPageSize)
	}
	if opts.MaxListPages < 0 || opts.MaxOutputBytes < 0 {
		return nil, errors.New("e2b: MaxListPages and MaxOutputBytes must be >= 0")
	}
	c := &Client{
		apiURL:     apiURL,
		sandboxURL: sandboxURL,
		keys:       keys,
		http:       opts.HTTPClient,
		timeouts:   opts.Timeouts,
		pageSize:   or(opts.ListPageSize, defaultListPageSize),
		maxPages:   or(opts.MaxListPages, defaultMaxListPages),
		maxOutput:  or(opts.MaxOutputBytes, defaultMaxOutputBytes),
		log:        opts.Logger,
	}
	if c.http == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = idleConnsPerHost
		c.http = &http.Client{Transport: tr}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	t := &c.timeouts
	t.ControlPlane = or(t.ControlPlane, defaultControlPlaneTimeout)
	t.Create = or(t.Create, defaultCreateTimeout)
	t.Pause = or(t.Pause, defaultPauseTimeout)
	t.Command = or(t.Command, defaultCommandTimeout)
	t.CommandMargin = or(t.CommandMargin, defaultCommandMargin)
	t.FileHeader = or(t.FileHeader, defaultFileHeaderTimeout)
	return c, nil
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func baseURL(field, raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("e2b: %s %q is not an absolute http(s) URL", field, raw)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("e2b: %s %q must not carry a query or fragment", field, raw)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Name returns "e2b".
func (c *Client) Name() string { return "e2b" }

// Capabilities implements core.Provider: envd endpoints, a paged inventory
// (ListPage), endpoints and access tokens read by id (Locate) and pause
// and resume (Pause, Resume).
func (c *Client) Capabilities() core.Capabilities {
	return core.Capabilities{Protocol: core.ProtocolEnvd, Pager: c, Locate: c.Locate, Pause: c, Metrics: c.Metrics}
}

// sandboxInfo is a listed or read sandbox as core reports it.
func sandboxInfo(d e2bapi.ListedSandbox) core.SandboxInfo {
	return core.SandboxInfo{
		ID:         d.SandboxID,
		TemplateID: d.TemplateID,
		Metadata:   d.Metadata,
		State:      d.State,
		StartedAt:  d.StartedAt.UTC(),
		EndAt:      d.EndAt.UTC(),
	}
}

// ceilSeconds rounds d up to whole seconds; negative is 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// Create starts a sandbox with POST /v2/sandboxes (as the SDK does) and
// returns its envd address and access token.
//
// Errors: a 4xx other than 404, 408, 409 and 429 is a *core.ProviderError
// with Ambiguous false (no sandbox was created). Anything else (5xx, 429,
// transport errors, timeouts, an unreadable reply) is a *core.ProviderError
// with Ambiguous true: the sandbox may exist, find it by its metadata.
func (c *Client) Create(ctx context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	body := e2bapi.NewSandbox{
		TemplateID: or(spec.Template, DefaultTemplate),
		Metadata:   spec.Metadata,
		EnvVars:    spec.EnvVars,
	}
	if spec.Timeout > 0 {
		s := float64(ceilSeconds(spec.Timeout))
		body.Timeout = &s
	}
	for k := range spec.EnvVars {
		if !envKey.MatchString(k) {
			return core.SandboxRef{}, &core.ValidationError{Field: "envVars", Message: fmt.Sprintf("key %q must match %s", k, envKey)}
		}
	}
	const op = "create"
	status, _, reply, err := c.call(ctx, c.timeouts.Create, op, http.MethodPost, "/v2/sandboxes", nil, body)
	if err != nil {
		return core.SandboxRef{}, err
	}
	if status < 200 || status > 299 {
		return core.SandboxRef{}, statusError(op, status, reply, createAmbiguous(status))
	}
	var sb e2bapi.Sandbox
	if err := json.Unmarshal(reply, &sb); err != nil || sb.SandboxID == "" {
		// The create may well have happened: we cannot tell which sandbox.
		return core.SandboxRef{}, &core.ProviderError{Op: op, StatusCode: status, Message: "unreadable create reply: " + snippet(reply), Ambiguous: true}
	}
	return core.SandboxRef{ID: sb.SandboxID, Endpoint: c.endpoint(sb.SandboxID, sb.Domain, sb.EnvdAccessToken)}, nil
}

// endpoint is the envd endpoint of sandbox id in domain (nil or empty:
// DefaultDomain) with its access token.
func (c *Client) endpoint(id string, domain *string, token string) core.Endpoint {
	d := DefaultDomain
	if domain != nil && *domain != "" {
		d = *domain
	}
	return core.Endpoint{Protocol: core.ProtocolEnvd, URL: c.envdURL(id, d), AccessToken: token}
}

// createAmbiguous reports whether a create answered with status may still
// have created a sandbox.
func createAmbiguous(status int) bool {
	switch status {
	case http.StatusNotFound, http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return true
	}
	return status < 400 || status > 499
}

// envdURL is the envd base URL of sandbox id: Options.SandboxURL, else the
// per-sandbox host the SDK derives (<port>-<id>.<domain>).
func (c *Client) envdURL(id, domain string) string {
	if c.sandboxURL != "" {
		return c.sandboxURL
	}
	return e2bapi.EnvdURL(id, domain)
}

// Info reads a sandbox with GET /sandboxes/{id}, which does not extend its
// life. A 404 from the API (or an empty reply, as the SDK reads it) is
// core.ErrSandboxGone.
func (c *Client) Info(ctx context.Context, id string) (core.SandboxInfo, error) {
	d, err := c.detail(ctx, id)
	if err != nil {
		return core.SandboxInfo{}, err
	}
	return sandboxInfo(d.ListedSandbox), nil
}

// detail reads GET /sandboxes/{id} (see Info).
func (c *Client) detail(ctx context.Context, id string) (e2bapi.SandboxDetail, error) {
	if err := core.ValidateSandboxID(id); err != nil {
		return e2bapi.SandboxDetail{}, err
	}
	const op = "get sandbox"
	status, _, reply, err := c.call(ctx, c.timeouts.ControlPlane, op, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, nil)
	if err != nil {
		return e2bapi.SandboxDetail{}, err
	}
	if apiNotFound(status, reply) || (status == http.StatusOK && len(bytes.TrimSpace(reply)) == 0) {
		return e2bapi.SandboxDetail{}, fmt.Errorf("e2b %s %s: %w", op, id, core.ErrSandboxGone)
	}
	if status != http.StatusOK {
		return e2bapi.SandboxDetail{}, statusError(op, status, reply, providerhttp.AmbiguousStatus(status))
	}
	var d e2bapi.SandboxDetail
	if err := json.Unmarshal(reply, &d); err != nil {
		return e2bapi.SandboxDetail{}, &core.ProviderError{Op: op, StatusCode: status, Message: "unreadable reply: " + err.Error(), Ambiguous: true}
	}
	if d.SandboxID == "" {
		d.SandboxID = id
	}
	return d, nil
}

// List returns every sandbox matching f with GET /v2/sandboxes, following
// X-Next-Token until it is empty. The metadata filter is double-encoded as
// the SDK does it (a query string as the value of the metadata parameter).
// More than MaxListPages pages, or a repeated token, is an error.
func (c *Client) List(ctx context.Context, f core.ListFilter) ([]core.SandboxInfo, error) {
	const op = "list sandboxes"
	q := listQuery(f, c.pageSize)
	var out []core.SandboxInfo
	seen := map[string]bool{}
	token := ""
	for page := 0; ; page++ {
		if page >= c.maxPages {
			return nil, fmt.Errorf("e2b %s: more than %d pages", op, c.maxPages)
		}
		if token != "" {
			q.Set("nextToken", token)
		}
		items, next, err := c.fetchPage(ctx, op, q)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		token = next
		if token == "" {
			return out, nil
		}
		if seen[token] {
			return nil, fmt.Errorf("e2b %s: next token %q repeated", op, token)
		}
		seen[token] = true
	}
}

// Kill ends a sandbox with DELETE /sandboxes/{id}. nil means confirmed gone:
// a 2xx, or a 404 from the API (a 404 that is not the API's JSON, such as a
// proxy's "page not found", is an error: it confirms nothing).
func (c *Client) Kill(ctx context.Context, id string) error {
	if err := core.ValidateSandboxID(id); err != nil {
		return err
	}
	const op = "kill sandbox"
	status, _, reply, err := c.call(ctx, c.timeouts.ControlPlane, op, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil)
	if err != nil {
		return err
	}
	if (status >= 200 && status <= 299) || apiNotFound(status, reply) {
		return nil
	}
	return statusError(op, status, reply, providerhttp.AmbiguousStatus(status))
}

// SetTimeout makes the sandbox end d from now (ceil seconds) with POST
// /sandboxes/{id}/timeout. A 404 from the API is core.ErrSandboxGone,
// unless the sandbox then reads as paused (E2B answers 404 for a paused
// one): that is a certain *core.ProviderError, as a paused sandbox has no
// running timeout to set (Resume sets it).
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := core.ValidateSandboxID(id); err != nil {
		return err
	}
	const op = "set timeout"
	body := struct {
		Timeout int64 `json:"timeout"`
	}{ceilSeconds(d)}
	status, _, reply, err := c.call(ctx, c.timeouts.ControlPlane, op, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", nil, body)
	if err != nil {
		return err
	}
	if apiNotFound(status, reply) {
		// E2B answers 404 for a paused sandbox too.
		return c.pausedNotGone(ctx, op, id, status, reply)
	}
	if status < 200 || status > 299 {
		return statusError(op, status, reply, providerhttp.AmbiguousStatus(status))
	}
	return nil
}

// call does one control-plane request bounded by timeout and reads the
// reply (up to maxReplyBytes). A transport error or timeout is returned as
// an ambiguous *core.ProviderError that also wraps the cause, so
// errors.Is(err, context.DeadlineExceeded) holds for timeouts. When the
// control plane refuses the key (401/403), the key source is asked for a
// fresh key and, if it differs, the request is sent once more with it.
func (c *Client) call(ctx context.Context, timeout time.Duration, op, method, path string, query url.Values, body any) (int, http.Header, []byte, error) {
	var payload []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, nil, fmt.Errorf("e2b %s: encode request: %w", op, err)
		}
		payload = b
	}
	key, err := c.keys.Key(ctx, false)
	if err != nil {
		return 0, nil, nil, &core.ProviderError{Op: op, Message: "api key: " + err.Error()}
	}
	status, hdr, reply, err := c.send(ctx, timeout, op, method, path, query, payload, key)
	if err != nil || (status != http.StatusUnauthorized && status != http.StatusForbidden) {
		return status, hdr, reply, err
	}
	fresh, kerr := c.keys.Key(ctx, true)
	if kerr != nil {
		c.log.WarnContext(ctx, "e2b: refresh of a refused api key failed", "op", op, "status", status, "err", kerr)
		return status, hdr, reply, nil
	}
	if fresh == key {
		return status, hdr, reply, nil
	}
	c.log.InfoContext(ctx, "e2b: api key refused; retrying with the refreshed key", "op", op, "status", status)
	return c.send(ctx, timeout, op, method, path, query, payload, fresh)
}

// send is one attempt of call, with key.
func (c *Client) send(ctx context.Context, timeout time.Duration, op, method, path string, query url.Values, payload []byte, key string) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	u := c.apiURL + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("e2b %s: %w", op, err)
	}
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Accept", "application/json")
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil, providerhttp.Transport(op, err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return 0, nil, nil, providerhttp.Transport(op, err)
	}
	return resp.StatusCode, resp.Header, reply, nil
}

// statusError turns an unsuccessful control-plane reply into a
// *core.ProviderError with the body's message (E2B's {code, message}).
func statusError(op string, status int, body []byte, ambiguous bool) *core.ProviderError {
	return replyError(op, status, body, ambiguous, "check the E2B API key")
}

// replyError is statusError with the hint given for a 401.
func replyError(op string, status int, body []byte, ambiguous bool, authHint string) *core.ProviderError {
	msg := snippet(body)
	var ae e2bapi.Error
	if json.Unmarshal(body, &ae) == nil && ae.Message != "" {
		msg = ae.Message
	}
	switch status {
	case http.StatusUnauthorized:
		msg = "unauthorized (" + authHint + "): " + msg
	case http.StatusForbidden:
		msg = "forbidden: " + msg
	case http.StatusTooManyRequests:
		msg = "rate limited: " + msg
	}
	return &core.ProviderError{Op: op, StatusCode: status, Message: msg, Ambiguous: ambiguous}
}

// apiNotFound reports a 404 that comes from the E2B API itself: its body is
// empty or JSON (E2B answers {"code":404,"message":…}). A text 404 from a
// router or proxy means a wrong URL, not a missing sandbox.
func apiNotFound(status int, body []byte) bool {
	if status != http.StatusNotFound {
		return false
	}
	body = bytes.TrimSpace(body)
	return len(body) == 0 || json.Valid(body)
}

// snippet is the start of a body for error messages.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 512 {
		s = s[:512] + "…"
	}
	if s == "" {
		return "(empty body)"
	}
	return s
}
