package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// fakeBroker records calls and returns canned results.
type fakeBroker struct {
	mu    sync.Mutex
	calls []string

	acquire  core.AcquireResult
	release  core.ReleaseResult
	sync     core.SyncResult
	renew    core.RenewResult
	record   core.Record
	capacity core.CapacityStatus
	// pages answer Sandboxes: cursor "" is the first, "p<i>" the i-th.
	pages [][]core.Record
	// metrics answer Metrics.
	metrics  []core.SandboxMetric
	err      error
	panicMsg string
}

var _ core.Broker = (*fakeBroker)(nil)

func (f *fakeBroker) note(format string, args ...any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
	if f.panicMsg != "" {
		panic(f.panicMsg)
	}
	return f.err
}

func (f *fakeBroker) AcquireOrWait(_ context.Context, req core.AcquireRequest) (core.AcquireResult, error) {
	if req.Ticket != "" {
		return f.acquire, f.note("Acquire %s ticket %s", req.Key, req.Ticket)
	}
	return f.acquire, f.note("Acquire %s", req.Key)
}
func (f *fakeBroker) Release(_ context.Context, tenant, id string) (core.ReleaseResult, error) {
	return f.release, f.note("Release %s %s", tenant, id)
}
func (f *fakeBroker) ReleaseWith(_ context.Context, tenant, id string, o core.ReleaseOptions) (core.ReleaseResult, error) {
	return f.release, f.note("ReleaseWith %s %s destroy=%v pause=%v", tenant, id, o.Destroy, o.Pause)
}
func (f *fakeBroker) Sandboxes(_ context.Context, tenant, cursor string, limit int) ([]core.Record, string, error) {
	err := f.note("Sandboxes %s %q %d", tenant, cursor, limit)
	i := 0
	if cursor != "" {
		i, _ = strconv.Atoi(strings.TrimPrefix(cursor, "p"))
	}
	if i >= len(f.pages) {
		return nil, "", err
	}
	next := ""
	if i+1 < len(f.pages) {
		next = fmt.Sprintf("p%d", i+1)
	}
	return f.pages[i], next, err
}
func (f *fakeBroker) Sync(_ context.Context, tenant, id string) (core.SyncResult, error) {
	return f.sync, f.note("Sync %s %s", tenant, id)
}
func (f *fakeBroker) ApplyProviderEvent(_ context.Context, ev core.ProviderEvent) (core.WebhookOutcome, error) {
	return core.WebhookApplied, f.note("Webhook %s %s %s", ev.ID, ev.Kind, ev.SandboxID)
}
func (f *fakeBroker) Renew(_ context.Context, tenant, id string, d time.Duration) (core.RenewResult, error) {
	err := f.note("Renew %s %s %s", tenant, id, d)
	if err == nil && f.record.SandboxID != "" && f.record.State != core.StateActive {
		err = core.ErrConflict // as the engine: only an active sandbox renews
	}
	return f.renew, err
}
func (f *fakeBroker) Get(_ context.Context, tenant, id string) (core.Record, error) {
	return f.record, f.note("Get %s %s", tenant, id)
}
func (f *fakeBroker) Metrics(_ context.Context, tenant, id string, start, end time.Time) ([]core.SandboxMetric, error) {
	return f.metrics, f.note("Metrics %s %s %d %d", tenant, id, unixOrZero(start), unixOrZero(end))
}

func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}
func (f *fakeBroker) Capacity(context.Context) (core.CapacityStatus, error) {
	return f.capacity, f.note("Capacity")
}
func (f *fakeBroker) Reconcile(context.Context) (core.ReconcileStats, error) {
	return core.ReconcileStats{}, f.note("Reconcile")
}
func (f *fakeBroker) SetDraining(_ context.Context, on bool) error {
	return f.note("SetDraining %v", on)
}

// event builds an HTTP API v2 event the way API Gateway (or devstack) does.
func event(routeKey, path, body string, tenant string, params map[string]string) events.APIGatewayV2HTTPRequest {
	m, _, _ := strings.Cut(routeKey, " ")
	ev := events.APIGatewayV2HTTPRequest{
		Version: "2.0", RouteKey: routeKey, RawPath: path, Body: body, PathParameters: params,
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			RequestID: "req-1",
			HTTP:      events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: m, Path: path},
		},
	}
	if tenant != "" {
		ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			Lambda: map[string]any{"tenant": tenant},
		}
	}
	return ev
}

func serve(t *testing.T, b core.Broker, ev events.APIGatewayV2HTTPRequest, opts ...Option) (events.APIGatewayV2HTTPResponse, map[string]any, string) {
	t.Helper()
	var logs bytes.Buffer
	h := NewHandler(b, slog.New(slog.NewJSONHandler(&logs, nil)), opts...)
	resp, err := h(context.Background(), ev)
	if err != nil {
		t.Fatalf("handler returned a Go error: %v", err)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(resp.Body), &body); err != nil {
		t.Fatalf("response body %q is not JSON: %v", resp.Body, err)
	}
	if ct := resp.Headers["Content-Type"]; ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	return resp, body, logs.String()
}

func mustJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("unmarshal %q: %v", s, err)
	}
	return v
}

var when = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

func TestAcquireSuccessShape(t *testing.T) {
	fb := &fakeBroker{acquire: core.AcquireResult{Source: core.SourceCreated, Record: core.Record{
		SandboxID: "sbx1", State: core.StateActive, Backend: "e2b",
		Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://127.0.0.1:49983", AccessToken: "tok"}, ExpiresAt: when.Add(time.Hour), LeaseOwner: "secret-owner",
	}}}
	resp, _, logs := serve(t, fb, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u1","thread_id":"t-1"}`, "acme", nil))
	if resp.StatusCode != 200 {
		t.Fatalf("status = %d, body %s", resp.StatusCode, resp.Body)
	}
	want := mustJSON(t, `{"sandbox_id":"sbx1","state":"active","source":"created","backend":"e2b",
		"connection":{"protocol":"envd","envd_url":"http://127.0.0.1:49983","envd_access_token":"tok"},"expires_at":"2026-11-29T11:00:00Z"}`)
	if got := mustJSON(t, resp.Body); !reflect.DeepEqual(got, want) {
		t.Errorf("body = %v\nwant %v", got, want)
	}
	if got, want := fb.calls, []string{"Acquire acme/u1/t-1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("calls = %v, want %v", got, want)
	}
	line := mustJSON(t, strings.TrimSpace(logs))
	if line["request_id"] != "req-1" || line["status"] != float64(200) || line["tenant"] != "acme" {
		t.Errorf("log line = %v", line)
	}
	if resp.Headers["X-Request-Id"] != "req-1" {
		t.Errorf("X-Request-Id = %q", resp.Headers["X-Request-Id"])
	}
}

func TestAcquireBodyValidation(t *testing.T) {
	big := `{"user_id":"` + strings.Repeat("a", MaxBodyBytes) + `","thread_id":"t"}`
	tests := []struct {
		name       string
		body       string
		b64        bool
		wantStatus int
		wantReason string
	}{
		{"empty", "", false, 400, "body"},
		{"not json", "user_id=u&thread_id=t", false, 400, "body"},
		{"array", `["u","t"]`, false, 400, "body"},
		{"unknown field", `{"user_id":"u","thread_id":"t","tenant":"other"}`, false, 400, "body"},
		{"trailing data", `{"user_id":"u","thread_id":"t"} {}`, false, 400, "body"},
		{"name in another case", `{"user_id":"alice","USER_ID":"mallory","thread_id":"t"}`, false, 400, "body"},
		{"only a case variant", `{"User_Id":"mallory","thread_id":"t"}`, false, 400, "body"},
		{"duplicate key", `{"user_id":"alice","thread_id":"t","user_id":"mallory"}`, false, 400, "body"},
		{"duplicate key same value", `{"user_id":"u","user_id":"u","thread_id":"t"}`, false, 400, "body"},
		{"escaped name", `{"user\u005fid":"u","thread_id":"t"}`, false, 200, ""},
		{"null user", `{"user_id":null,"thread_id":"t"}`, false, 400, "user_id"},
		{"object user", `{"user_id":{"a":1},"thread_id":"t"}`, false, 400, "user_id"},
		{"unterminated", `{"user_id":"u","thread_id":"t"`, false, 400, "body"},
		{"missing user", `{"thread_id":"t"}`, false, 400, "user_id"},
		{"missing thread", `{"user_id":"u"}`, false, 400, "thread_id"},
		{"number user", `{"user_id":1,"thread_id":"t"}`, false, 400, "user_id"},
		{"bad user chars", `{"user_id":"a/b","thread_id":"t"}`, false, 400, "user_id"},
		{"thread too long", `{"user_id":"u","thread_id":"` + strings.Repeat("x", 65) + `"}`, false, 400, "thread_id"},
		{"too large", big, false, 413, ""},
		{"too large base64", base64.StdEncoding.EncodeToString([]byte(big)), true, 413, ""},
		{"bad base64", "!!!", true, 400, "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{}
			ev := event(RouteAcquire, "/v1/sandboxes/acquire", tt.body, "acme", nil)
			ev.IsBase64Encoded = tt.b64
			resp, body, _ := serve(t, fb, ev)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status = %d, want %d (body %s)", resp.StatusCode, tt.wantStatus, resp.Body)
			}
			if tt.wantStatus == 200 {
				if got, want := fb.calls, []string{"Acquire acme/u/t"}; !reflect.DeepEqual(got, want) {
					t.Errorf("calls = %v, want %v", got, want)
				}
				return
			}
			e := body["error"].(map[string]any)
			if e["code"] != "VALIDATION_ERROR" && tt.wantStatus == 400 {
				t.Errorf("code = %v, want VALIDATION_ERROR", e["code"])
			}
			if tt.wantReason != "" && e["reason"] != tt.wantReason {
				t.Errorf("reason = %v, want %s", e["reason"], tt.wantReason)
			}
			if len(fb.calls) != 0 {
				t.Errorf("broker called: %v", fb.calls)
			}
		})
	}
}

// TestBodylessRoutesRefuseFields: routes that take no body accept none or
// {}, and answer 400 VALIDATION_ERROR, calling nothing, for any field.
func TestBodylessRoutesRefuseFields(t *testing.T) {
	routes := []struct {
		key, path string
		params    map[string]string
	}{
		{RouteRelease, "/v1/sandboxes/sbx1/release", map[string]string{"id": "sbx1"}},
		{RouteSync, "/v1/sandboxes/sbx1/sync", map[string]string{"id": "sbx1"}},
		{RouteGet, "/v1/sandboxes/sbx1", map[string]string{"id": "sbx1"}},
		{RouteCapacity, "/v1/capacity", nil},
		{RouteDrain, "/v1/admin/drain", nil},
		{RouteUndrain, "/v1/admin/undrain", nil},
	}
	bodies := []struct {
		body string
		ok   bool
	}{
		{"", true}, {" {} ", true}, {`{"force":true}`, false}, {`[]`, false}, {`{} {}`, false}, {`x`, false},
	}
	for _, rt := range routes {
		for _, b := range bodies {
			t.Run(rt.key+" "+b.body, func(t *testing.T) {
				fb := &fakeBroker{}
				resp, body, _ := serve(t, fb, event(rt.key, rt.path, b.body, "acme", rt.params))
				if b.ok {
					if resp.StatusCode == 400 {
						t.Fatalf("status = 400 for an accepted body: %s", resp.Body)
					}
					return
				}
				if resp.StatusCode != 400 {
					t.Fatalf("status = %d, want 400 (body %s)", resp.StatusCode, resp.Body)
				}
				if e := body["error"].(map[string]any); e["code"] != "VALIDATION_ERROR" {
					t.Errorf("code = %v, want VALIDATION_ERROR", e["code"])
				}
				if len(fb.calls) != 0 {
					t.Errorf("broker called: %v", fb.calls)
				}
			})
		}
	}
}

// TestAcquireReportsRestore: an acquire that restored (or continued
// restoring) the thread's outputs says so, with counts; one that did not
// carries no restore.
func TestAcquireReportsRestore(t *testing.T) {
	tests := []struct {
		name    string
		restore *core.SyncResult
		want    any
	}{
		{"none", nil, nil},
		{"incomplete", &core.SyncResult{Uploaded: 20, Remaining: 25, Bytes: 200,
			Deferred: []core.DeferredFile{{Path: "outputs/f20.txt", Reason: "max_files"}}},
			map[string]any{"complete": false, "restored": 20.0, "skipped": 0.0, "remaining": 25.0, "bytes": 200.0,
				"deferred": []any{map[string]any{"path": "outputs/f20.txt", "reason": "max_files"}}, "excluded": []any{}}},
		{"complete", &core.SyncResult{Uploaded: 3, Skipped: 20, Complete: true},
			map[string]any{"complete": true, "restored": 3.0, "skipped": 20.0, "remaining": 0.0, "bytes": 0.0, "deferred": []any{}, "excluded": []any{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{acquire: core.AcquireResult{Source: core.SourceCreated, Restore: tt.restore,
				Record: core.Record{SandboxID: "s", Backend: "e2b"}}}
			resp, body, _ := serve(t, fb, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, resp.Body)
			}
			if got := body["restore"]; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("restore = %#v, want %#v", got, tt.want)
			}
		})
	}
}

// TestAcquireNamesPrevious: an acquire that replaced the thread's ended
// sandbox names it and its reason; one that did not carries no previous.
func TestAcquireNamesPrevious(t *testing.T) {
	for _, tt := range []struct {
		name string
		prev *core.Previous
		want any
	}{
		{"none", nil, nil},
		{"lost", &core.Previous{SandboxID: "old", Reason: core.EventReasonProviderTimeout},
			map[string]any{"sandbox_id": "old", "reason": "provider_timeout"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{acquire: core.AcquireResult{Source: core.SourceCreated, Previous: tt.prev,
				Record: core.Record{SandboxID: "s", Backend: "e2b"}}}
			resp, body, _ := serve(t, fb, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, resp.Body)
			}
			if got := body["previous"]; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("previous = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestAcquireBase64Body(t *testing.T) {
	fb := &fakeBroker{acquire: core.AcquireResult{Source: core.SourceReused, Record: core.Record{SandboxID: "s"}}}
	ev := event(RouteAcquire, "/v1/sandboxes/acquire", base64.StdEncoding.EncodeToString([]byte(`{"user_id":"u","thread_id":"t"}`)), "acme", nil)
	ev.IsBase64Encoded = true
	resp, _, _ := serve(t, fb, ev)
	if resp.StatusCode != 200 || len(fb.calls) != 1 {
		t.Fatalf("status %d calls %v", resp.StatusCode, fb.calls)
	}
}

func TestTenantFromAuthorizer(t *testing.T) {
	tests := []struct {
		name string
		auth *events.APIGatewayV2HTTPRequestContextAuthorizerDescription
		want int
		call string
	}{
		{"none", nil, 401, ""},
		{"empty lambda", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{Lambda: map[string]any{}}, 401, ""},
		{"non-string", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{Lambda: map[string]any{"tenant": 7}}, 401, ""},
		{"malformed", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{Lambda: map[string]any{"tenant": "a b"}}, 401, ""},
		{"lambda", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{Lambda: map[string]any{"tenant": "acme"}}, 200, "Capacity"},
		{"jwt", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"tenant": "acme"}}}, 200, "Capacity"},
		{"jwt without claim", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"sub": "x"}}}, 401, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{}
			ev := event(RouteCapacity, "/v1/capacity", "", "", nil)
			ev.RequestContext.Authorizer = tt.auth
			resp, body, _ := serve(t, fb, ev)
			if resp.StatusCode != tt.want {
				t.Fatalf("status = %d, want %d", resp.StatusCode, tt.want)
			}
			if tt.want == 401 {
				if e := body["error"].(map[string]any); e["code"] != "UNAUTHORIZED" {
					t.Errorf("code = %v", e["code"])
				}
			}
			if got := strings.Join(fb.calls, ","); got != tt.call {
				t.Errorf("calls = %q, want %q", got, tt.call)
			}
		})
	}
}

func TestRoutingByPathWithoutRouteKey(t *testing.T) {
	fb := &fakeBroker{
		record:   core.Record{SandboxID: "abc", State: core.StateWarm, ThreadKey: core.ThreadKey{User: "u", Thread: "t"}, Backend: "e2b", CreatedAt: when, Endpoint: core.Endpoint{AccessToken: "tok"}},
		release:  core.ReleaseResult{SandboxID: "abc", State: "warm", Sync: &core.SyncResult{Uploaded: 1, Bytes: 3, Complete: true}},
		sync:     core.SyncResult{Skipped: 2, Complete: true},
		capacity: core.CapacityStatus{Limit: 3, Used: 2, Active: 1, Granted: 1, Policy: "wait"},
	}
	tests := []struct {
		method, path string
		wantCall     string
		wantBody     string
	}{
		{"GET", "/v1/sandboxes/abc", "Get acme abc",
			`{"sandbox_id":"abc","state":"warm","user_id":"u","thread_id":"t","backend":"e2b","created_at":"2026-11-29T10:00:00Z"}`},
		{"POST", "/v1/sandboxes/abc/release", "Release acme abc",
			`{"sandbox_id":"abc","state":"warm","sync":{"uploaded":1,"skipped":0,"deferred":[],"excluded":[],"bytes":3,"complete":true}}`},
		{"POST", "/v1/sandboxes/abc/sync", "Sync acme abc",
			`{"uploaded":0,"skipped":2,"deferred":[],"excluded":[],"bytes":0,"complete":true}`},
		{"GET", "/v1/capacity", "Capacity",
			`{"limit":3,"used":2,"active":1,"warm":0,"reserved":0,"transitioning":0,"tombstones":0,"pool":0,"granted":1,"paused":0,"paused_limit":0,"policy":"wait","draining":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			fb.calls = nil
			ev := event("$default", tt.path, "", "acme", nil)
			ev.RequestContext.HTTP.Method = tt.method
			resp, _, _ := serve(t, fb, ev)
			if resp.StatusCode != 200 {
				t.Fatalf("status = %d body %s", resp.StatusCode, resp.Body)
			}
			if got := strings.Join(fb.calls, ","); got != tt.wantCall {
				t.Errorf("calls = %q, want %q", got, tt.wantCall)
			}
			if got, want := mustJSON(t, resp.Body), mustJSON(t, tt.wantBody); !reflect.DeepEqual(got, want) {
				t.Errorf("body = %v\nwant %v", got, want)
			}
		})
	}
}

func TestRoutingByRouteKeyUsesPathParameter(t *testing.T) {
	fb := &fakeBroker{release: core.ReleaseResult{SandboxID: "abc", State: "destroyed"}}
	resp, body, _ := serve(t, fb, event(RouteRelease, "/prod/v1/sandboxes/abc/release", "", "acme", map[string]string{"id": "abc"}))
	if resp.StatusCode != 200 || body["state"] != "destroyed" || body["sync"] != nil {
		t.Fatalf("status %d body %s", resp.StatusCode, resp.Body)
	}
	if got := strings.Join(fb.calls, ","); got != "Release acme abc" {
		t.Errorf("calls = %q", got)
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	tests := []struct {
		method, path string
		want         int
	}{
		{"GET", "/v2/whatever", 404},
		{"DELETE", "/v1/sandboxes/abc", 405},
		{"GET", "/v1/sandboxes/abc/release", 405},
		{"GET", "/v1/sandboxes/acquire", 405},
	}
	for _, tt := range tests {
		fb := &fakeBroker{}
		ev := event("$default", tt.path, "", "acme", nil)
		ev.RequestContext.HTTP.Method = tt.method
		resp, _, _ := serve(t, fb, ev)
		if resp.StatusCode != tt.want || len(fb.calls) != 0 {
			t.Errorf("%s %s: status %d calls %v, want %d and no call", tt.method, tt.path, resp.StatusCode, fb.calls, tt.want)
		}
	}
}

func TestMalformedSandboxIDIs400WithoutBrokerCall(t *testing.T) {
	for _, id := range []string{"a.b", "..", "a%2Fb", strings.Repeat("x", 129), "sp ace", ""} {
		for _, rk := range []string{RouteGet, RouteRelease, RouteSync} {
			fb := &fakeBroker{}
			path := strings.Replace(strings.SplitN(rk, " ", 2)[1], "{id}", id, 1)
			resp, body, _ := serve(t, fb, event(rk, path, "", "acme", map[string]string{"id": id}))
			if resp.StatusCode != 400 || len(fb.calls) != 0 {
				t.Errorf("%s id %q: status %d calls %v, want 400 and no call", rk, id, resp.StatusCode, fb.calls)
				continue
			}
			if e := body["error"].(map[string]any); e["code"] != "VALIDATION_ERROR" || e["reason"] != "sandbox_id" {
				t.Errorf("%s id %q: error %v", rk, id, e)
			}
		}
	}
}

func TestErrorMapping(t *testing.T) {
	capErr := &core.CapacityError{Reason: "capacity", RetryAfter: 1500 * time.Millisecond,
		Status: core.CapacityStatus{Limit: 1, Used: 1, Active: 1, Warm: 0, Reserved: 0}}
	tests := []struct {
		name          string
		err           error
		status        int
		code          string
		retryAfter    string
		retryable     bool
		detailsLogged bool
	}{
		{"validation", &core.ValidationError{Field: "user_id", Message: "bad"}, 400, "VALIDATION_ERROR", "", false, false},
		{"capacity", fmt.Errorf("acquire: %w", capErr), 429, "SANDBOX_CAPACITY_EXCEEDED", "2", true, false},
		{"not found", fmt.Errorf("get: %w", core.ErrNotFound), 404, "SANDBOX_NOT_FOUND", "", false, false},
		{"gone", core.ErrSandboxGone, 404, "SANDBOX_NOT_FOUND", "", false, false},
		{"conflict", core.ErrConflict, 409, "CONFLICT", "", false, true},
		{"lease held", core.ErrLeaseHeld, 409, "CONFLICT", "1", true, true},
		{"store", fmt.Errorf("put: %w: throttled", core.ErrStoreUnavailable), 503, "STORE_UNAVAILABLE", "2", true, true},
		{"provider ambiguous", &core.ProviderError{Op: "create", StatusCode: 502, Message: "bad gateway", Ambiguous: true}, 503, "PROVIDER_UNAVAILABLE", "2", true, true},
		{"provider transport", &core.ProviderError{Op: "create", Message: "connection refused"}, 503, "PROVIDER_UNAVAILABLE", "2", true, true},
		{"deadline", fmt.Errorf("create: %w", context.DeadlineExceeded), 503, "PROVIDER_UNAVAILABLE", "2", true, true},
		{"created sandboxes unusable", fmt.Errorf("acquire: %w: sandbox sb1 was gone", core.ErrProviderUnavailable), 503, "PROVIDER_UNAVAILABLE", "2", true, true},
		{"full, eviction's kill unconfirmed", fmt.Errorf("%w: no slot freed (capacity): kill uncertain: provider kill: HTTP 503", core.ErrProviderUnavailable), 503, "PROVIDER_UNAVAILABLE", "2", true, true},
		{"provider 4xx", &core.ProviderError{Op: "create", StatusCode: 400, Message: "template secret-x not found"}, 500, "INTERNAL", "", false, true},
		{"provider 401", fmt.Errorf("acquire: %w", &core.ProviderError{Op: "create", StatusCode: 401, Message: "unauthorized (check the E2B API key): invalid"}), 503, "PROVIDER_UNAVAILABLE", "30", true, true},
		{"provider 403", &core.ProviderError{Op: "list", StatusCode: 403, Message: "forbidden: team"}, 503, "PROVIDER_UNAVAILABLE", "30", true, true},
		{"other", errors.New("boom: secret detail"), 500, "INTERNAL", "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{err: tt.err}
			resp, body, logs := serve(t, fb, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil))
			if resp.StatusCode != tt.status {
				t.Fatalf("status = %d, want %d", resp.StatusCode, tt.status)
			}
			e, ok := body["error"].(map[string]any)
			if !ok {
				t.Fatalf("body %s has no error object", resp.Body)
			}
			for _, k := range []string{"code", "message", "reason", "retryable", "retry_after_seconds"} {
				if _, ok := e[k]; !ok {
					t.Errorf("error object lacks %q: %v", k, e)
				}
			}
			if e["code"] != tt.code || e["retryable"] != tt.retryable {
				t.Errorf("code %v retryable %v, want %s %v", e["code"], e["retryable"], tt.code, tt.retryable)
			}
			if got := resp.Headers["Retry-After"]; got != tt.retryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tt.retryAfter)
			}
			if tt.retryAfter != "" && fmt.Sprint(e["retry_after_seconds"]) != tt.retryAfter {
				t.Errorf("retry_after_seconds = %v, want %s", e["retry_after_seconds"], tt.retryAfter)
			}
			if tt.status >= 500 && strings.Contains(resp.Body, "secret") {
				t.Errorf("internal detail leaked: %s", resp.Body)
			}
			if tt.detailsLogged && !strings.Contains(logs, tt.err.Error()) {
				t.Errorf("log %q lacks the error detail", logs)
			}
			if !strings.Contains(logs, `"request_id":"req-1"`) {
				t.Errorf("log %q lacks the request id", logs)
			}
			if strings.HasPrefix(tt.name, "provider 40") && tt.status == 503 && e["reason"] != "provider_auth" {
				t.Errorf("reason %v, want provider_auth", e["reason"])
			}
			if tt.code == "SANDBOX_CAPACITY_EXCEEDED" {
				want := map[string]any{"limit": 1.0, "used": 1.0}
				if !reflect.DeepEqual(e["details"], want) || e["reason"] != "capacity" {
					t.Errorf("details %v reason %v", e["details"], e["reason"])
				}
			}
		})
	}
}

func TestPanicBecomes500(t *testing.T) {
	fb := &fakeBroker{panicMsg: "nil map"}
	resp, body, logs := serve(t, fb, event(RouteCapacity, "/v1/capacity", "", "acme", nil))
	if resp.StatusCode != 500 || body["error"].(map[string]any)["code"] != "INTERNAL" {
		t.Fatalf("status %d body %s", resp.StatusCode, resp.Body)
	}
	if !strings.Contains(logs, "panic: nil map") {
		t.Errorf("logs %q lack the panic", logs)
	}
}

func TestGeneratesRequestIDWhenMissing(t *testing.T) {
	ev := event(RouteCapacity, "/v1/capacity", "", "acme", nil)
	ev.RequestContext.RequestID = ""
	resp, _, logs := serve(t, &fakeBroker{}, ev)
	id := resp.Headers["X-Request-Id"]
	if id == "" || !strings.Contains(logs, id) {
		t.Errorf("request id %q not generated or not logged (%s)", id, logs)
	}
}

func TestAcquireWaitingAnswers202WithTheTicket(t *testing.T) {
	fb := &fakeBroker{acquire: core.AcquireResult{Waiting: &core.Waiting{Ticket: "tk-9", RetryAfter: 1500 * time.Millisecond, Until: when}}}
	resp, body, _ := serve(t, fb, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u1","thread_id":"t-1","ticket":"tk-8"}`, "acme", nil))
	if resp.StatusCode != 202 || resp.Headers["Retry-After"] != "2" {
		t.Fatalf("status %d, Retry-After %q (%s), want 202 and 2", resp.StatusCode, resp.Headers["Retry-After"], resp.Body)
	}
	want := map[string]any{"ticket": "tk-9", "retry_after_seconds": float64(2), "wait_until": "2026-11-29T10:00:00Z"}
	if !reflect.DeepEqual(body, want) {
		t.Errorf("body %v, want %v", body, want)
	}
	if got, want := fb.calls, []string{"Acquire acme/u1/t-1 ticket tk-8"}; !reflect.DeepEqual(got, want) {
		t.Errorf("calls = %v, want %v", got, want)
	}
	for _, bad := range []string{`{"user_id":"u1","thread_id":"t-1","ticket":7}`, `{"user_id":"u1","thread_id":"t-1","ticket":null}`} {
		fb.calls = nil
		resp, body, _ := serve(t, fb, event(RouteAcquire, "/v1/sandboxes/acquire", bad, "acme", nil))
		e, _ := body["error"].(map[string]any)
		if resp.StatusCode != 400 || e["reason"] != "ticket" || len(fb.calls) != 0 {
			t.Errorf("%s: %d %v, calls %v; want 400 on the ticket, no call", bad, resp.StatusCode, body, fb.calls)
		}
	}
}

// The renew route takes no body or {"seconds": N}, strictly, and answers
// the sandbox's new end.
func TestRenewRoute(t *testing.T) {
	end := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	f := &fakeBroker{renew: core.RenewResult{SandboxID: "sbx1", ExpiresAt: end}}
	renew := func(body string) events.APIGatewayV2HTTPResponse {
		resp, _, _ := serve(t, f, event(RouteRenew, "/v1/sandboxes/sbx1/renew", body, "acme", map[string]string{"id": "sbx1"}))
		return resp
	}
	for _, c := range []struct {
		body string
		code int
		call string
	}{
		{"", 200, "Renew acme sbx1 0s"},
		{"{}", 200, "Renew acme sbx1 0s"},
		{`{"seconds":90}`, 200, "Renew acme sbx1 1m30s"},
		{`{"seconds":0}`, 400, ""},
		{`{"seconds":1.5}`, 400, ""},
		{`{"seconds":"9"}`, 400, ""},
		{`{"Seconds":9}`, 400, ""},
		{`{"seconds":9,"seconds":9}`, 400, ""},
		{`{"seconds":999999999}`, 400, ""},
	} {
		f.calls = nil
		resp := renew(c.body)
		if resp.StatusCode != c.code {
			t.Errorf("renew %q = %d %s, want %d", c.body, resp.StatusCode, resp.Body, c.code)
			continue
		}
		if c.code == 200 {
			if len(f.calls) != 1 || f.calls[0] != c.call || !strings.Contains(resp.Body, `"expires_at":"2026-12-01T10:00:00Z"`) {
				t.Errorf("renew %q: calls %v, body %s; want %s", c.body, f.calls, resp.Body, c.call)
			}
		} else if len(f.calls) != 0 || !strings.Contains(resp.Body, `"VALIDATION_ERROR"`) {
			t.Errorf("renew %q: calls %v, body %s; want a validation error and no call", c.body, f.calls, resp.Body)
		}
	}
	f.err = core.ErrConflict
	if resp := renew(""); resp.StatusCode != 409 || !strings.Contains(resp.Body, `"CONFLICT"`) {
		t.Errorf("renew of a sandbox not active = %d %s, want 409 CONFLICT", resp.StatusCode, resp.Body)
	}
	f.err = core.ErrNotFound
	if resp := renew(""); resp.StatusCode != 404 {
		t.Errorf("renew of another tenant's sandbox = %d %s, want 404", resp.StatusCode, resp.Body)
	}
}

// TestCapacityShowsThePoolRefillsBackoff: GET /v1/capacity carries
// pool_refill while the pool's refill backs off, and omits it otherwise.
func TestCapacityShowsThePoolRefillsBackoff(t *testing.T) {
	until := time.Date(2026, 12, 7, 9, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		refill *core.RefillBackoff
		want   any
	}{
		{"backing off", &core.RefillBackoff{Failures: 3, Until: until},
			map[string]any{"failures": float64(3), "backing_off_until": "2026-12-07T09:30:00Z"}},
		{"not backing off", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := &fakeBroker{capacity: core.CapacityStatus{Limit: 3, PoolRefill: tc.refill}}
			ev := event(RouteCapacity, "/v1/capacity", "", "acme", nil)
			resp, body, _ := serve(t, fb, ev)
			got, present := body["pool_refill"]
			if resp.StatusCode != 200 || present != (tc.want != nil) || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("status %d, pool_refill = %v (present %v); want %v", resp.StatusCode, got, present, tc.want)
			}
		})
	}
}
