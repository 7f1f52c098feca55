package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

func TestAdminDrainRoutes(t *testing.T) {
	tests := []struct {
		name      string
		route     string
		path      string
		tenant    string
		wantCode  int
		wantCalls []string
	}{
		{"admin drains", RouteDrain, "/v1/admin/drain", "ops", http.StatusOK, []string{"SetDraining true"}},
		{"admin undrains", RouteUndrain, "/v1/admin/undrain", "ops", http.StatusOK, []string{"SetDraining false"}},
		{"tenant refused", RouteDrain, "/v1/admin/drain", "acme", http.StatusForbidden, nil},
		{"raw path routed", "", "/v1/admin/drain", "ops", http.StatusOK, []string{"SetDraining true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBroker{}
			h := NewHandler(b, nil, WithAdminTenants("ops"))
			ev := event(tt.route, tt.path, "", tt.tenant, nil)
			ev.RequestContext.HTTP.Method = "POST"
			resp, err := h(context.Background(), ev)
			if err != nil {
				t.Fatalf("handler: %v", err)
			}
			if resp.StatusCode != tt.wantCode {
				t.Errorf("status = %d, want %d (body %s)", resp.StatusCode, tt.wantCode, resp.Body)
			}
			if !slices.Equal(b.calls, tt.wantCalls) {
				t.Errorf("broker calls = %v, want %v", b.calls, tt.wantCalls)
			}
		})
	}
}

func TestDrainingAcquireIs503(t *testing.T) {
	b := &fakeBroker{err: &core.CapacityError{Reason: "draining", RetryAfter: 30e9, Status: core.CapacityStatus{Limit: 3, Draining: true}}}
	h := NewHandler(b, nil)
	resp, _ := h(context.Background(), event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Headers["Retry-After"] != "30" {
		t.Fatalf("status %d Retry-After %q, want 503 and 30", resp.StatusCode, resp.Headers["Retry-After"])
	}
	var body struct {
		Error struct {
			Code, Reason string
			Details      map[string]any
		}
	}
	if err := json.Unmarshal([]byte(resp.Body), &body); err != nil || body.Error.Reason != "draining" || body.Error.Code != "SANDBOX_CAPACITY_EXCEEDED" {
		t.Errorf("body = %s, want code SANDBOX_CAPACITY_EXCEEDED reason draining", resp.Body)
	}
	// The draining refusal reads no counts: it must not report zeros as usage.
	if want := map[string]any{"limit": float64(3), "draining": true}; !reflect.DeepEqual(body.Error.Details, want) {
		t.Errorf("details = %v, want %v", body.Error.Details, want)
	}
}
