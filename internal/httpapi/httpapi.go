// Package httpapi adapts API Gateway HTTP API (payload format 2.0) events to
// a core.Broker: it routes, authenticates the tenant from the authorizer
// context, validates input, and maps core errors to the HTTP API the
// docs/api.md documents (routes, bodies, the error table). It holds no state
// and makes no decisions of its own.
package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/uuid"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// MaxBodyBytes is the largest request body accepted (decoded), in bytes.
//
// The local gateway (internal/devstack) refuses a larger body before any
// function runs. In AWS nothing in front of the function can: an API
// Gateway HTTP API's payload quota is a fixed 10 MB (not adjustable; HTTP
// APIs have no request validation and take no AWS WAF ACL), and a
// synchronous Lambda invocation carries at most 6 MB. So the handler checks
// the size first, before decoding and before any store or provider call,
// and answers 413 api.CodeRequestTooLarge; bodies between 6 MB and 10 MB fail
// at Lambda's invoke limit and API Gateway answers them itself.
const MaxBodyBytes = 16 << 10

// Route keys, as declared in template.yaml (API Gateway "METHOD /path").
const (
	RouteAcquire  = "POST /v1/sandboxes/acquire"
	RouteGet      = "GET /v1/sandboxes/{id}"
	RouteCapacity = "GET /v1/capacity"
	RouteRelease  = "POST /v1/sandboxes/{id}/release"
	RouteSync     = "POST /v1/sandboxes/{id}/sync"
	RouteRenew    = "POST /v1/sandboxes/{id}/renew"
	RouteDrain    = "POST /v1/admin/drain"
	RouteUndrain  = "POST /v1/admin/undrain"
	RouteOpenAPI  = "GET /v1/openapi.json"
)

// Retry-After seconds suggested for outages (store or provider), and for
// a provider refusing the deployment's credentials (an operator must put
// a valid key; the functions pick it up on the next request).
const (
	outageRetryAfter = 2
	authRetryAfter   = 30
)

// Handler is the Lambda handler signature for HTTP API events.
type Handler func(ctx context.Context, req events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error)

// NewHandler returns a Lambda handler serving every route of the v1 API
// over b. It never returns a Go error: every failure is an HTTP response
// (a Lambda error would surface as an opaque 502 from API Gateway). Each
// request is logged as one JSON line carrying its request id; internal
// error details are logged, never returned.
func NewHandler(b core.Broker, logger *slog.Logger, opts ...Option) Handler {
	if logger == nil {
		logger = slog.Default()
	}
	h := &handler{broker: b, logger: logger, now: time.Now}
	for _, o := range opts {
		o(h)
	}
	return h.serve
}

type handler struct {
	broker core.Broker
	logger *slog.Logger
	// admins are the tenants allowed on /v1/admin routes.
	admins map[string]bool
	// deployment is the Deployment dimension of the EMF metrics; "" emits
	// none (WithMetrics).
	deployment string
	// tenantClaim is the JWT claim naming the tenant (WithTenantClaim;
	// "" means DefaultTenantClaim).
	tenantClaim string
	// e2bTemplate is the deployment's template, the one E2B creates may
	// name (WithE2BTemplate).
	e2bTemplate string
	// now is the clock the answer deadline is checked against (WithClock).
	now func() time.Time
	// webhookSecret and webhooks serve RouteWebhookE2B (WithE2BWebhook).
	webhookSecret string
	webhooks      WebhookApplier
}

// request is the per-request state threaded through the route functions.
type request struct {
	ev     events.APIGatewayV2HTTPRequest
	id     string // request id (API Gateway's, or generated)
	tenant string
	route  string
	// detail is the internal error text for the log line (never sent).
	detail string
	code   api.ErrorCode
	// metrics collects the EMF metrics of this request, written as one
	// line when it is answered (WithMetrics).
	metrics []core.Metric
}

func (h *handler) serve(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (resp events.APIGatewayV2HTTPResponse, _ error) {
	start := time.Now()
	r := &request{ev: ev, id: ev.RequestContext.RequestID}
	if r.id == "" {
		r.id = uuid.NewString()
	}
	defer func() {
		if p := recover(); p != nil {
			r.detail = fmt.Sprintf("panic: %v", p)
			resp = r.errorResponse(http.StatusInternalServerError, apiError{Code: api.CodeInternal, Message: "internal error", Reason: api.ReasonInternal}, 0)
		}
		if resp.Headers == nil {
			resp.Headers = map[string]string{}
		}
		resp.Headers["X-Request-Id"] = r.id
		level := slog.LevelInfo
		if resp.StatusCode >= 500 {
			level = slog.LevelError
		} else if resp.StatusCode >= 400 {
			level = slog.LevelWarn
		}
		attrs := []slog.Attr{
			slog.String("request_id", r.id),
			slog.String("method", method(ev)),
			slog.String("path", ev.RawPath),
			slog.String("route", r.route),
			slog.String("tenant", r.tenant),
			slog.Int("status", resp.StatusCode),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
		}
		if r.code != "" {
			attrs = append(attrs, slog.String("code", string(r.code)))
		}
		if r.detail != "" {
			attrs = append(attrs, slog.String("error", r.detail))
		}
		h.logger.LogAttrs(ctx, level, "request", attrs...)
		if h.deployment != "" {
			core.LogEMF(ctx, h.logger, h.deployment, time.Now(), r.metrics...)
		}
	}()
	// The log line above keeps ctx; the broker gets the answer deadline.
	bounded, cancel := h.withAnswerDeadline(ctx, ev)
	defer cancel()
	return h.dispatch(bounded, r), nil
}

func method(ev events.APIGatewayV2HTTPRequest) string {
	if m := ev.RequestContext.HTTP.Method; m != "" {
		return strings.ToUpper(m)
	}
	if k, _, ok := strings.Cut(ev.RouteKey, " "); ok {
		return strings.ToUpper(k)
	}
	return ""
}

// match resolves the route and the {id} path parameter: from RouteKey and
// PathParameters when API Gateway routed the request, else from the method
// and raw path. It returns "" when no route matches and, then, whether the
// path exists under another method.
func match(ev events.APIGatewayV2HTTPRequest) (route, id string, pathExists bool) {
	switch ev.RouteKey {
	case RouteAcquire, RouteCapacity, RouteDrain, RouteUndrain, RouteOpenAPI, RouteWebhookE2B:
		return ev.RouteKey, "", true
	case RouteGet, RouteRelease, RouteSync, RouteRenew:
		if v, ok := ev.PathParameters["id"]; ok {
			return ev.RouteKey, v, true
		}
	}
	m := method(ev)
	path := ev.RawPath
	if path == "" {
		path = ev.RequestContext.HTTP.Path
	}
	segs := strings.Split(strings.Trim(path, "/"), "/")
	if want, id, ok := e2bRoute(m, segs); ok {
		return want, id, true
	}
	var want string
	switch {
	case len(segs) == 3 && segs[0] == "v1" && segs[1] == "sandboxes" && segs[2] == "acquire":
		want = RouteAcquire
	case len(segs) == 2 && segs[0] == "v1" && segs[1] == "capacity":
		want = RouteCapacity
	case len(segs) == 2 && segs[0] == "v1" && segs[1] == "openapi.json":
		want = RouteOpenAPI
	case len(segs) == 2 && segs[0] == "webhooks" && segs[1] == "e2b":
		want = RouteWebhookE2B
	case len(segs) == 3 && segs[0] == "v1" && segs[1] == "admin" && segs[2] == "drain":
		want = RouteDrain
	case len(segs) == 3 && segs[0] == "v1" && segs[1] == "admin" && segs[2] == "undrain":
		want = RouteUndrain
	case len(segs) == 3 && segs[0] == "v1" && segs[1] == "sandboxes":
		want, id = RouteGet, segs[2]
	case len(segs) == 4 && segs[0] == "v1" && segs[1] == "sandboxes" && segs[3] == "release":
		want, id = RouteRelease, segs[2]
	case len(segs) == 4 && segs[0] == "v1" && segs[1] == "sandboxes" && segs[3] == "sync":
		want, id = RouteSync, segs[2]
	case len(segs) == 4 && segs[0] == "v1" && segs[1] == "sandboxes" && segs[3] == "renew":
		want, id = RouteRenew, segs[2]
	default:
		return "", "", false
	}
	if !strings.HasPrefix(want, m+" ") {
		return "", "", true
	}
	return want, id, true
}

func (h *handler) dispatch(ctx context.Context, r *request) events.APIGatewayV2HTTPResponse {
	route, id, exists := match(r.ev)
	r.route = route
	if route == "" {
		if exists {
			return r.errorResponse(http.StatusMethodNotAllowed, apiError{Code: api.CodeMethodNotAllowed, Message: "method not allowed on this path"}, 0)
		}
		return r.errorResponse(http.StatusNotFound, apiError{Code: api.CodeRouteNotFound, Message: "no such route"}, 0)
	}
	if route == RouteWebhookE2B {
		return h.webhook(ctx, r) // signed, not authorized: no tenant
	}
	tenant, ok := tenantOf(r.ev, h.tenantClaim)
	e2b := isE2B(route)
	if !ok {
		if e2b {
			return r.e2bError(http.StatusUnauthorized, api.CodeUnauthorized, "missing or invalid API key (X-API-Key: the tenant's broker token)", 0)
		}
		return r.errorResponse(http.StatusUnauthorized, apiError{Code: api.CodeUnauthorized, Message: "missing or invalid caller identity"}, 0)
	}
	r.tenant = tenant
	body, err := bodyOf(r.ev)
	if err != nil {
		return r.bodyError(err, e2b)
	}
	if e2b {
		return h.serveE2B(ctx, r, route, id, body)
	}
	if route == RouteRenew {
		return h.renew(ctx, r, id, body)
	}
	if route != RouteAcquire {
		if err := decodeEmpty(body); err != nil {
			return r.fail(err)
		}
	}
	if route == RouteGet || route == RouteRelease || route == RouteSync {
		if err := core.ValidateSandboxID(id); err != nil {
			return r.fail(err)
		}
	}

	return h.serveBroker(ctx, r, route, id, body)
}

// serveBroker serves the broker's own routes for r's tenant, id and body
// already checked.
func (h *handler) serveBroker(ctx context.Context, r *request, route, id string, body []byte) events.APIGatewayV2HTTPResponse {
	tenant := r.tenant
	switch route {
	case RouteAcquire:
		req, err := decodeAcquire(body)
		if err != nil {
			return r.fail(err)
		}
		req.Key.Tenant = tenant
		if err := req.Key.Validate(); err != nil {
			return r.fail(err)
		}
		res, err := h.broker.AcquireOrWait(ctx, req)
		if err != nil {
			return r.fail(err)
		}
		if w := res.Waiting; w != nil {
			return r.waiting(w)
		}
		return r.json(http.StatusOK, acquireBody(res))
	case RouteGet:
		rec, err := h.broker.Get(ctx, tenant, id)
		if err != nil {
			return r.fail(err)
		}
		return r.json(http.StatusOK, recordBody(rec))
	case RouteCapacity:
		st, err := h.broker.Capacity(ctx)
		if err != nil {
			return r.fail(err)
		}
		r.metrics = append(r.metrics, core.CapacityMetrics(st)...)
		return r.json(http.StatusOK, capacityBody(st))
	case RouteRelease:
		res, err := h.broker.Release(ctx, tenant, id)
		if err != nil {
			return r.fail(err)
		}
		if res.Sync != nil {
			r.metrics = append(r.metrics, core.SyncMetrics(*res.Sync)...)
		}
		return r.json(http.StatusOK, releaseBody(res))
	case RouteDrain, RouteUndrain:
		return h.setDraining(ctx, r, route == RouteDrain)
	case RouteOpenAPI:
		doc, err := api.OpenAPIJSON()
		if err != nil {
			return r.fail(err)
		}
		return r.raw(http.StatusOK, doc)
	case RouteSync:
		res, err := h.broker.Sync(ctx, tenant, id)
		if err != nil {
			return r.fail(err)
		}
		r.metrics = append(r.metrics, core.SyncMetrics(res)...)
		return r.json(http.StatusOK, syncBody(res))
	}
	return r.errorResponse(http.StatusNotFound, apiError{Code: api.CodeRouteNotFound, Message: "no such route"}, 0)
}

// DefaultTenantClaim is the JWT claim read for the tenant unless
// WithTenantClaim names another.
const DefaultTenantClaim = "tenant"

// tenantOf reads the caller's tenant from the authorizer context (payload
// format 2.0, requestContext.authorizer), in this order:
//   - a Lambda (or the local) authorizer's context "tenant";
//   - a JWT authorizer's claim named claim (DefaultTenantClaim when "").
//
// IAM authorization (AWS_IAM) names no tenant: an HTTP API admits callers
// of other accounts only through a role of its own account, so the
// caller's account, role or session would not tell tenants apart (and a
// session name is the caller's choice). Such a request is unauthorized.
//
// It reports false when none is present or the value is not a valid id
// (^[A-Za-z0-9_-]{1,64}$, as user and thread ids).
func tenantOf(ev events.APIGatewayV2HTTPRequest, claim string) (string, bool) {
	a := ev.RequestContext.Authorizer
	if a == nil {
		return "", false
	}
	if claim == "" {
		claim = DefaultTenantClaim
	}
	var t string
	switch v, ok := a.Lambda["tenant"].(string); {
	case ok:
		t = v
	case a.JWT != nil:
		t = a.JWT.Claims[claim]
	}
	if t == "" || (core.ThreadKey{Tenant: t, User: "u", Thread: "t"}).Validate() != nil {
		return "", false
	}
	return t, true
}

var errTooLarge = errors.New("request body too large")

// bodyError answers a body bodyOf refused (too large: 413; bad base64:
// 400), in E2B's error shape on the /e2b routes.
func (r *request) bodyError(err error, e2b bool) events.APIGatewayV2HTTPResponse {
	status, code, msg := http.StatusBadRequest, api.CodeValidation, err.Error()
	if errors.Is(err, errTooLarge) {
		status, code, msg = http.StatusRequestEntityTooLarge, api.CodeRequestTooLarge, fmt.Sprintf("request body exceeds %d bytes", MaxBodyBytes)
	}
	if e2b {
		return r.e2bError(status, code, msg, 0)
	}
	e := apiError{Code: code, Message: msg}
	if status == http.StatusBadRequest {
		e.Reason = api.ReasonBody
	}
	return r.errorResponse(status, e, 0)
}

func bodyOf(ev events.APIGatewayV2HTTPRequest) ([]byte, error) {
	if ev.IsBase64Encoded {
		if base64.StdEncoding.DecodedLen(len(ev.Body)) > MaxBodyBytes+3 {
			return nil, errTooLarge
		}
		b, err := base64.StdEncoding.DecodeString(ev.Body)
		if err != nil {
			return nil, errors.New("body: invalid base64 encoding")
		}
		if len(b) > MaxBodyBytes {
			return nil, errTooLarge
		}
		return b, nil
	}
	if len(ev.Body) > MaxBodyBytes {
		return nil, errTooLarge
	}
	return []byte(ev.Body), nil
}

// bodyShape is the one message every malformed acquire body gets.
const bodyShape = `must be a JSON object {"user_id","thread_id"} (and "ticket" when continuing a wait)`

// decodeAcquire parses the acquire body: one JSON object with the string
// fields user_id and thread_id, optionally ticket, nothing after it.
func decodeAcquire(body []byte) (core.AcquireRequest, error) {
	raw, err := strictObject(body, bodyShape, "user_id", "thread_id", "ticket")
	if err != nil {
		return core.AcquireRequest{}, err
	}
	var req core.AcquireRequest
	for _, f := range []struct {
		name     string
		dst      *string
		optional bool
	}{{"user_id", &req.Key.User, false}, {"thread_id", &req.Key.Thread, false}, {"ticket", &req.Ticket, true}} {
		v, ok := raw[f.name]
		if !ok && f.optional {
			continue
		}
		if !ok {
			return core.AcquireRequest{}, &core.ValidationError{Field: f.name, Message: "is required"}
		}
		if err := json.Unmarshal(v, f.dst); err != nil || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			return core.AcquireRequest{}, &core.ValidationError{Field: f.name, Message: "must be a string"}
		}
	}
	return req, nil
}

// renew serves RouteRenew: an optional {"seconds": N} body (none, or
// {}: the deployment's active timeout).
func (h *handler) renew(ctx context.Context, r *request, id string, body []byte) events.APIGatewayV2HTTPResponse {
	var seconds int64
	if len(bytes.TrimSpace(body)) > 0 {
		raw, err := strictObject(body, `must be empty or {"seconds": N}`, "seconds")
		if err != nil {
			return r.fail(err)
		}
		if v, ok := raw["seconds"]; ok {
			if err := json.Unmarshal(v, &seconds); err != nil || seconds <= 0 {
				return r.fail(&core.ValidationError{Field: "seconds", Message: "must be a positive whole number"})
			}
		}
	}
	if err := core.ValidateSandboxID(id); err != nil {
		return r.fail(err)
	}
	if seconds > int64(maxRenewSeconds) {
		return r.fail(&core.ValidationError{Field: "seconds", Message: fmt.Sprintf("must be at most %d", maxRenewSeconds)})
	}
	res, err := h.broker.Renew(ctx, r.tenant, id, time.Duration(seconds)*time.Second)
	if err != nil {
		return r.fail(err)
	}
	return r.json(http.StatusOK, api.RenewResult{SandboxID: res.SandboxID, ExpiresAt: api.Time(res.ExpiresAt)})
}

// maxRenewSeconds bounds a renewal's seconds before they reach the engine
// (which holds its own bound), so no conversion overflows.
const maxRenewSeconds = 7 * 24 * 3600

// decodeEmpty checks the body of a route that takes none: nothing, or an
// empty JSON object.
func decodeEmpty(body []byte) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	_, err := strictObject(body, "must be empty or {}")
	return err
}

// strictObject reads body as exactly one JSON object and returns the raw
// value of each member. Unlike encoding/json's struct decoding, which
// matches names in any letter case and lets the last of duplicate keys
// win, it refuses (as a *core.ValidationError on field "body") a name
// that is not one of fields spelled exactly, a name given twice, and
// anything after the object. shape is the message for a body that is not
// an object at all.
func strictObject(body []byte, shape string, fields ...string) (map[string]json.RawMessage, error) {
	bad := func(msg string) error { return &core.ValidationError{Field: "body", Message: msg} }
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, bad(shape)
	}
	out := make(map[string]json.RawMessage, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, bad(shape)
		}
		name, _ := tok.(string)
		if !slices.Contains(fields, name) {
			return nil, bad(fmt.Sprintf("unknown field %q", name))
		}
		if _, dup := out[name]; dup {
			return nil, bad(fmt.Sprintf("duplicate field %q", name))
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, bad(shape)
		}
		out[name] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, bad(shape)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bad("unexpected data after the JSON object")
	}
	return out, nil
}

// Response bodies (docs/api.md's route table).

// waiting is the 202 answer of an acquire that waits for a slot, with
// Retry-After in whole seconds.
func (r *request) waiting(w *core.Waiting) events.APIGatewayV2HTTPResponse {
	secs := max(1, int((w.RetryAfter+time.Second-1)/time.Second))
	resp := r.json(http.StatusAccepted, api.AcquireWaiting{Ticket: w.Ticket, RetryAfterSeconds: secs, WaitUntil: w.Until.UTC()})
	resp.Headers["Retry-After"] = strconv.Itoa(secs)
	return resp
}

// acquireBody is the acquire reply; the connection is keyed by the
// endpoint's protocol, never by the backend.
func acquireBody(res core.AcquireResult) api.Sandbox {
	ep := res.Record.Endpoint
	return api.Sandbox{
		SandboxID:  res.Record.SandboxID,
		State:      string(core.StateActive),
		Source:     string(res.Source),
		Backend:    res.Record.Backend,
		Connection: api.EndpointConnection(ep.Protocol, ep.URL, ep.AccessToken),
		ExpiresAt:  res.Record.ExpiresAt,
		Restore:    restoreBody(res.Restore),
		Previous:   previousBody(res.Previous),
	}
}

// previousBody names the thread's earlier sandbox an acquire replaced;
// nil when it replaced none that ended without the thread asking.
func previousBody(p *core.Previous) *api.Previous {
	if p == nil {
		return nil
	}
	return &api.Previous{SandboxID: p.SandboxID, Reason: p.Reason}
}

// recordBody is GET /v1/sandboxes/{id}: the record without secrets or
// lease internals.
func recordBody(r core.Record) api.Record {
	return api.Record{
		SandboxID: r.SandboxID, State: string(r.State), UserID: r.User, ThreadID: r.Thread,
		Backend: r.Backend, CreatedAt: api.Time(r.CreatedAt), UpdatedAt: api.Time(r.UpdatedAt),
		ParkedAt: api.Time(r.ParkedAt), ExpiresAt: api.Time(r.ExpiresAt), Source: string(r.HandOut()), EndReason: r.EndReason,
	}
}

// restoreBody reports a restore; nil when none ran.
func restoreBody(r *core.SyncResult) *api.RestoreResult {
	if r == nil {
		return nil
	}
	s := syncBody(*r)
	return &api.RestoreResult{Complete: s.Complete, Restored: s.Uploaded, Skipped: s.Skipped, Remaining: s.Remaining,
		Bytes: s.Bytes, Deferred: s.Deferred, Excluded: s.Excluded}
}

func releaseBody(res core.ReleaseResult) api.ReleaseResult {
	var s *api.SyncResult
	if res.Sync != nil {
		v := syncBody(*res.Sync)
		s = &v
	}
	return api.ReleaseResult{SandboxID: res.SandboxID, State: res.State, Sync: s, SyncError: res.SyncError}
}

// syncBody is a sync pass's reply; nil deferred and excluded lists become
// [] so clients see arrays.
func syncBody(s core.SyncResult) api.SyncResult {
	return api.SyncResult{Uploaded: s.Uploaded, Skipped: s.Skipped, Deferred: files(s.Deferred),
		Excluded: files(s.Excluded), Bytes: s.Bytes, Complete: s.Complete, Remaining: s.Remaining}
}

func files(fs []core.DeferredFile) []api.DeferredFile {
	out := make([]api.DeferredFile, len(fs))
	for i, f := range fs {
		out[i] = api.DeferredFile{Path: f.Path, Reason: f.Reason}
	}
	return out
}

func capacityBody(st core.CapacityStatus) api.Capacity {
	out := api.Capacity{Limit: st.Limit, Used: st.Used, Active: st.Active, Warm: st.Warm, Reserved: st.Reserved,
		Transitioning: st.Transitioning, Tombstones: st.Tombstones, Pool: st.Pool, Granted: st.Granted, Paused: st.Paused, PausedLimit: st.PausedLimit,
		Policy: st.Policy, Draining: st.Draining, CountedAt: st.CountedAt.UTC()}
	if b := st.PoolRefill; b != nil {
		out.PoolRefill = &api.PoolRefill{Failures: b.Failures, BackingOffUntil: b.Until.UTC()}
	}
	return out
}

// Errors.

// apiError is an error reply before its Retry-After is set.
type apiError struct {
	Code      api.ErrorCode
	Message   string
	Reason    string
	Retryable bool
	Details   map[string]any
}

// fail maps an error from the broker (or input validation) to a response.
func (r *request) fail(err error) events.APIGatewayV2HTTPResponse {
	var (
		ve *core.ValidationError
		ce *core.CapacityError
		pe *core.ProviderError
		ne net.Error
	)
	switch {
	case errors.As(err, &ve):
		return r.errorResponse(http.StatusBadRequest, apiError{Code: api.CodeValidation, Message: ve.Error(), Reason: ve.Field}, 0)
	case errors.As(err, &ce):
		status := http.StatusTooManyRequests
		if ce.Reason == api.RefusalDraining {
			status = http.StatusServiceUnavailable // draining is an outage, not a full pool
		}
		secs := int(math.Ceil(ce.RetryAfter.Seconds()))
		if secs < 1 {
			secs = 1
		}
		reason := ce.Reason
		if reason == "" {
			reason = api.RefusalCapacity
		}
		if status == http.StatusTooManyRequests {
			r.metrics = append(r.metrics, core.RejectedMetric())
			if reason == api.RefusalCapacity { // the ledger was read: its figures are real
				r.metrics = append(r.metrics, core.CapacityMetrics(ce.Status)...)
			}
		}
		details := map[string]any{"limit": ce.Status.Limit}
		if reason == api.RefusalCapacity { // the ledger's count; other refusals carry none: zeros would mislead
			details["used"] = ce.Status.Used
		}
		if ce.Status.Draining {
			details["draining"] = true
		}
		return r.errorResponse(status, apiError{
			Code: api.CodeCapacityExceeded, Message: "sandbox capacity exceeded", Reason: string(reason), Retryable: true,
			Details: details,
		}, secs)
	case errors.Is(err, core.ErrNotFound), errors.Is(err, core.ErrSandboxGone):
		return r.errorResponse(http.StatusNotFound, apiError{Code: api.CodeSandboxNotFound, Message: "sandbox not found", Reason: api.ReasonNotFound}, 0)
	case errors.Is(err, core.ErrLeaseHeld):
		r.detail = err.Error()
		return r.errorResponse(http.StatusConflict, apiError{Code: api.CodeConflict, Message: "the sandbox is being changed by another request", Reason: api.ReasonLeaseHeld, Retryable: true}, 1)
	case errors.Is(err, core.ErrConflict), errors.Is(err, core.ErrStaleFence), errors.Is(err, core.ErrThreadBound):
		r.detail = err.Error()
		return r.errorResponse(http.StatusConflict, apiError{Code: api.CodeConflict, Message: "the sandbox is not in a state that allows this operation", Reason: api.ReasonConflict}, 0)
	case errors.Is(err, core.ErrStoreUnavailable):
		r.detail = err.Error()
		return r.errorResponse(http.StatusServiceUnavailable, apiError{Code: api.CodeStoreUnavailable, Message: "state store unavailable, retry later", Reason: api.ReasonStoreUnavailable, Retryable: true}, outageRetryAfter)
	case errors.As(err, &pe) && (pe.StatusCode == http.StatusUnauthorized || pe.StatusCode == http.StatusForbidden):
		// The provider refused the deployment's credentials (a rotated or
		// placeholder key): an outage of this deployment, not the caller's
		// fault nor an internal error.
		r.detail = err.Error()
		return r.errorResponse(http.StatusServiceUnavailable, apiError{Code: api.CodeProviderUnavailable,
			Message: "the sandbox provider refused this deployment's credentials, retry later", Reason: api.ReasonProviderAuth, Retryable: true}, authRetryAfter)
	case errors.Is(err, core.ErrProviderUnavailable),
		errors.As(err, &pe) && (pe.Ambiguous || pe.StatusCode == 0 || pe.StatusCode >= 500 || pe.StatusCode == http.StatusTooManyRequests),
		errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne):
		r.detail = err.Error()
		return r.errorResponse(http.StatusServiceUnavailable, apiError{Code: api.CodeProviderUnavailable, Message: "sandbox provider unavailable, retry later", Reason: api.ReasonProviderUnavailable, Retryable: true}, outageRetryAfter)
	default:
		r.detail = err.Error()
		return r.errorResponse(http.StatusInternalServerError, apiError{Code: api.CodeInternal, Message: "internal error (request " + r.id + ")", Reason: api.ReasonInternal}, 0)
	}
}

func (r *request) errorResponse(status int, e apiError, retryAfter int) events.APIGatewayV2HTTPResponse {
	r.code = e.Code
	resp := r.json(status, api.ErrorReply{Error: api.Error{Code: string(e.Code), Message: e.Message, Reason: e.Reason,
		Retryable: e.Retryable, RetryAfterSeconds: float64(retryAfter), Details: e.Details}})
	if retryAfter > 0 {
		resp.Headers["Retry-After"] = strconv.Itoa(retryAfter)
	}
	return resp
}

func (r *request) json(status int, v any) events.APIGatewayV2HTTPResponse {
	b, err := json.Marshal(v)
	if err != nil { // unreachable for the types above
		r.detail = "marshal response: " + err.Error()
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"INTERNAL","message":"internal error","reason":"internal","retryable":false,"retry_after_seconds":0}}`)
	}
	return r.raw(status, b)
}

// raw answers status with b, a JSON document.
func (r *request) raw(status int, b []byte) events.APIGatewayV2HTTPResponse {
	return events.APIGatewayV2HTTPResponse{
		StatusCode: status,
		Headers:    map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store"},
		Body:       string(b),
	}
}
