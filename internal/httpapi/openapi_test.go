package httpapi

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// TestOpenAPIRoute: GET /v1/openapi.json answers the contract as JSON, to
// a caller with a tenant only, and calls nothing on the broker.
func TestOpenAPIRoute(t *testing.T) {
	want, err := api.OpenAPIJSON()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, route, tenant string
		wantStatus          int
	}{
		{"routed by the gateway", RouteOpenAPI, "acme", http.StatusOK},
		{"raw path", "", "acme", http.StatusOK},
		{"no tenant", RouteOpenAPI, "", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBroker{}
			ev := event(tt.route, "/v1/openapi.json", "", tt.tenant, nil)
			ev.RequestContext.HTTP.Method = "GET"
			resp, err := NewHandler(b, nil)(context.Background(), ev)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d (body %.200s)", resp.StatusCode, tt.wantStatus, resp.Body)
			}
			if tt.wantStatus == http.StatusOK {
				if !bytes.Equal([]byte(resp.Body), want) || resp.Headers["Content-Type"] != "application/json" {
					t.Errorf("got %s body %.80s…, want application/json %.80s…", resp.Headers["Content-Type"], resp.Body, want)
				}
			}
			if len(b.calls) != 0 {
				t.Errorf("broker calls %v, want none", b.calls)
			}
		})
	}
}
