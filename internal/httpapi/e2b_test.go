package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
)

func e2bRecord(state core.State, protocol, url string) core.Record {
	return core.Record{SandboxID: "sb1", ThreadKey: core.ThreadKey{Tenant: "acme", User: "u", Thread: "t"}, State: state, Backend: "e2b",
		Endpoint: core.Endpoint{Protocol: protocol, URL: url, AccessToken: "envd-secret"}}
}

// TestE2BConnect: connect answers E2B's reply for a sandbox the tenant
// holds, reading the record only (no extension, no provider call), and
// E2B's not-found for anything else; every other /e2b route is refused
// without touching the broker.
func TestE2BConnect(t *testing.T) {
	local := e2bRecord(core.StateActive, core.ProtocolEnvd, "http://127.0.0.1:4000")
	hosted := e2bRecord(core.StateActive, core.ProtocolEnvd, "https://49983-sb1.e2b.app")
	aio := e2bRecord(core.StateActive, core.ProtocolAIO, "http://127.0.0.1:5000/sandboxes/sb1")
	aio.Backend = "provisioner"
	e2bDomain := "e2b.app"
	tests := []struct {
		name, method, routeKey, path, tenant string
		params                               map[string]string
		rec                                  core.Record
		err                                  error
		wantStatus                           int
		wantCalls                            []string
		wantDomain                           *string
	}{
		{"v2 connect, local envd", "POST", RouteE2BConnectV2, "/e2b/v2/sandboxes/sb1/connect", "acme", map[string]string{"id": "sb1"}, local, nil, 200, []string{"Get acme sb1"}, nil},
		{"connect, hosted envd", "POST", RouteE2BConnect, "/e2b/sandboxes/sb1/connect", "acme", map[string]string{"id": "sb1"}, hosted, nil, 200, []string{"Get acme sb1"}, &e2bDomain},
		{"raw path connect", "POST", "", "/e2b/v2/sandboxes/sb1/connect", "acme", nil, local, nil, 200, []string{"Get acme sb1"}, nil},
		{"unknown or another tenant's", "POST", RouteE2BConnectV2, "/e2b/v2/sandboxes/sb1/connect", "acme", map[string]string{"id": "sb1"}, core.Record{}, core.ErrNotFound, 404, []string{"Get acme sb1"}, nil},
		{"store down", "POST", RouteE2BConnectV2, "/e2b/v2/sandboxes/sb1/connect", "acme", map[string]string{"id": "sb1"}, core.Record{}, fmt.Errorf("get: %w", core.ErrStoreUnavailable), 503, []string{"Get acme sb1"}, nil},
		{"provisioner backend", "POST", RouteE2BConnectV2, "/e2b/v2/sandboxes/sb1/connect", "acme", map[string]string{"id": "sb1"}, aio, nil, 400, []string{"Get acme sb1"}, nil},
		{"bad id", "POST", RouteE2BConnectV2, "/e2b/v2/sandboxes/a.b/connect", "acme", map[string]string{"id": "a.b"}, local, nil, 400, nil, nil},
		{"no key", "POST", RouteE2BConnectV2, "/e2b/v2/sandboxes/sb1/connect", "", map[string]string{"id": "sb1"}, local, nil, 401, nil, nil},
		{"connect with another method", "GET", "", "/e2b/sandboxes/sb1/connect", "acme", nil, local, nil, 501, nil, nil},
		{"templates", "POST", RouteE2BOther, "/e2b/v3/templates", "acme", map[string]string{"proxy": "v3/templates"}, local, nil, 501, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBroker{record: tt.rec, err: tt.err}
			ev := event(tt.routeKey, tt.path, `{"timeout":3600}`, tt.tenant, tt.params)
			ev.RequestContext.HTTP.Method = tt.method
			resp := serveE2BEvent(t, b, ev, tt.wantStatus, tt.wantCalls)
			if tt.wantStatus != http.StatusOK {
				if tt.wantStatus == http.StatusServiceUnavailable && resp.Headers["Retry-After"] == "" {
					t.Errorf("503 without Retry-After")
				}
				return
			}
			var got struct {
				SandboxID, EnvdVersion, EnvdAccessToken string
				Domain                                  *string
			}
			if err := json.Unmarshal([]byte(resp.Body), &got); err != nil {
				t.Fatal(err)
			}
			if got.SandboxID != "sb1" || got.EnvdVersion != E2BEnvdVersion || got.EnvdAccessToken != "envd-secret" {
				t.Errorf("reply %s", resp.Body)
			}
			if (got.Domain == nil) != (tt.wantDomain == nil) || (got.Domain != nil && *got.Domain != *tt.wantDomain) {
				t.Errorf("domain %v, want %v (body %s)", got.Domain, tt.wantDomain, resp.Body)
			}
		})
	}
}

// TestE2BBodyLimit: every /e2b route checks the body's size before
// anything else, as the broker's own routes do, and answers 413 in E2B's
// error shape without touching the broker.
func TestE2BBodyLimit(t *testing.T) {
	big := strings.Repeat(" ", MaxBodyBytes+1)
	tests := []struct {
		name, routeKey, path string
		params               map[string]string
		body                 string
		b64                  bool
		wantStatus           int
		wantCalls            []string
	}{
		{"connect at the limit", RouteE2BConnectV2, "/e2b/v2/sandboxes/sb1/connect", map[string]string{"id": "sb1"}, strings.Repeat(" ", MaxBodyBytes), false, 200, []string{"Get acme sb1"}},
		{"connect too large", RouteE2BConnectV2, "/e2b/v2/sandboxes/sb1/connect", map[string]string{"id": "sb1"}, big, false, 413, nil},
		{"connect too large (base64)", RouteE2BConnect, "/e2b/sandboxes/sb1/connect", map[string]string{"id": "sb1"}, base64.StdEncoding.EncodeToString([]byte(big)), true, 413, nil},
		{"connect, bad base64", RouteE2BConnect, "/e2b/sandboxes/sb1/connect", map[string]string{"id": "sb1"}, "!!!", true, 400, nil},
		{"bad id too large", RouteE2BConnectV2, "/e2b/v2/sandboxes/a.b/connect", map[string]string{"id": "a.b"}, big, false, 413, nil},
		{"create too large", RouteE2BOther, "/e2b/v2/sandboxes", map[string]string{"proxy": "v2/sandboxes"}, big, false, 413, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBroker{record: e2bRecord(core.StateActive, core.ProtocolEnvd, "http://127.0.0.1:4000")}
			ev := event(tt.routeKey, tt.path, tt.body, "acme", tt.params)
			ev.IsBase64Encoded = tt.b64
			serveE2BEvent(t, b, ev, tt.wantStatus, tt.wantCalls)
		})
	}
}

// serveE2BEvent serves ev with b and checks the status, the broker calls
// and, for an error, E2B's {code, message} shape.
func serveE2BEvent(t *testing.T, b *fakeBroker, ev events.APIGatewayV2HTTPRequest, wantStatus int, wantCalls []string) events.APIGatewayV2HTTPResponse {
	t.Helper()
	resp, err := NewHandler(b, nil)(context.Background(), ev)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != wantStatus {
		t.Fatalf("status %d, want %d (body %s)", resp.StatusCode, wantStatus, resp.Body)
	}
	if !slices.Equal(wantCalls, []string{"*"}) && !slices.Equal(b.calls, wantCalls) { // "*": checked by the caller
		t.Errorf("broker calls %q, want %q", b.calls, wantCalls)
	}
	if wantStatus >= http.StatusBadRequest {
		var e e2bapi.Error
		if err := json.Unmarshal([]byte(resp.Body), &e); err != nil || e.Code != wantStatus || e.Message == "" {
			t.Errorf("body %s: want E2B's {code: %d, message}", resp.Body, wantStatus)
		}
	}
	return resp
}
