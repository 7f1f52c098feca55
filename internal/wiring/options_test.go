package wiring

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/httpapi"
)

type capacityBroker struct {
	core.Broker // only Capacity and SetDraining are called
	st          core.CapacityStatus
}

func (b *capacityBroker) Capacity(context.Context) (core.CapacityStatus, error) { return b.st, nil }
func (b *capacityBroker) SetDraining(context.Context, bool) error               { return nil }

// TestHTTPOptions: the HTTP functions' handler lets BROKER_ADMIN_TENANTS
// drain and writes EMF metrics under SANDBOX_DEPLOYMENT_ID.
func TestHTTPOptions(t *testing.T) {
	cfg, _, err := config.Parse([]string{"E2B_API_KEY=k", "TABLE_NAME=t", "OUTPUT_BUCKET=b", "TOKEN_LOCAL_KEY=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
		"SANDBOX_DEPLOYMENT_ID=blue", "BROKER_ADMIN_TENANTS=ops"})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	h := httpapi.NewHandler(&capacityBroker{st: core.CapacityStatus{Limit: 3, Used: 1}}, slog.New(slog.NewJSONHandler(&logs, nil)), HTTPOptions(cfg)...)
	call := func(route, path, tenant string) int {
		m, _, _ := strings.Cut(route, " ")
		resp, err := h(context.Background(), events.APIGatewayV2HTTPRequest{RouteKey: route, RawPath: path,
			RequestContext: events.APIGatewayV2HTTPRequestContext{HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: m},
				Authorizer: &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{Lambda: map[string]any{"tenant": tenant}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	if got := call(httpapi.RouteDrain, "/v1/admin/drain", "ops"); got != 200 {
		t.Errorf("drain by admin tenant: status %d, want 200", got)
	}
	if got := call(httpapi.RouteDrain, "/v1/admin/drain", "acme"); got != 403 {
		t.Errorf("drain by other tenant: status %d, want 403", got)
	}
	logs.Reset()
	if got := call(httpapi.RouteCapacity, "/v1/capacity", "acme"); got != 200 {
		t.Fatalf("capacity: status %d", got)
	}
	var found bool
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) == nil && line["_aws"] != nil {
			found = true
			if line["Deployment"] != "blue" || line[core.MetricCapacityUsed] != 1.0 || line[core.MetricCapacityLimit] != 3.0 {
				t.Errorf("EMF line %s: want Deployment blue, used 1, limit 3", l)
			}
		}
	}
	if !found {
		t.Errorf("no EMF line in %s", logs.String())
	}
}

// TestHTTPOptionsTenantClaim: BROKER_TENANT_CLAIM picks the JWT claim that
// names the tenant (Cognito's custom:tenant).
func TestHTTPOptionsTenantClaim(t *testing.T) {
	cfg, _, err := config.Parse([]string{"E2B_API_KEY=k", "TABLE_NAME=t", "OUTPUT_BUCKET=b", "TOKEN_LOCAL_KEY=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
		"BROKER_TENANT_CLAIM=custom:tenant", "BROKER_ADMIN_TENANTS=ops"})
	if err != nil {
		t.Fatal(err)
	}
	h := httpapi.NewHandler(&capacityBroker{st: core.CapacityStatus{Limit: 3}}, slog.New(slog.NewJSONHandler(&bytes.Buffer{}, nil)), HTTPOptions(cfg)...)
	for _, tt := range []struct {
		claims map[string]string
		want   int
	}{
		{map[string]string{"custom:tenant": "ops"}, 200},
		{map[string]string{"tenant": "ops"}, 401},
	} {
		resp, err := h(context.Background(), events.APIGatewayV2HTTPRequest{RouteKey: httpapi.RouteDrain, RawPath: "/v1/admin/drain",
			RequestContext: events.APIGatewayV2HTTPRequestContext{HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "POST"},
				Authorizer: &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
					JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: tt.claims}}}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tt.want {
			t.Errorf("claims %v: status %d, want %d", tt.claims, resp.StatusCode, tt.want)
		}
	}
}
