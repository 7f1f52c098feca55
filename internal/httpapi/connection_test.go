package httpapi

import (
	"reflect"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// The connection's keys follow the endpoint's protocol, whatever the
// backend: envd_url and envd_access_token for envd, sandbox_url (and
// access_token when there is one) for AIO; "protocol" names it.
func TestAcquireConnectionByProtocol(t *testing.T) {
	const url = "http://127.0.0.1:8002/aio/sbx-1"
	tests := []struct {
		name     string
		backend  string
		endpoint core.Endpoint
		want     string
	}{
		{"aio with token", "provisioner", core.Endpoint{Protocol: core.ProtocolAIO, URL: url, AccessToken: "tok"},
			`{"protocol":"aio","sandbox_url":"` + url + `","access_token":"tok"}`},
		{"aio without token", "provisioner", core.Endpoint{Protocol: core.ProtocolAIO, URL: url},
			`{"protocol":"aio","sandbox_url":"` + url + `"}`},
		{"envd without token", "e2b", core.Endpoint{Protocol: core.ProtocolEnvd, URL: url},
			`{"protocol":"envd","envd_url":"` + url + `","envd_access_token":""}`},
		{"envd on another backend", "fake", core.Endpoint{Protocol: core.ProtocolEnvd, URL: url, AccessToken: "tok"},
			`{"protocol":"envd","envd_url":"` + url + `","envd_access_token":"tok"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{acquire: core.AcquireResult{Source: core.SourceCreated, Record: core.Record{
				SandboxID: "sbx-1", State: core.StateActive, Backend: tt.backend, Endpoint: tt.endpoint, ExpiresAt: when.Add(time.Hour),
			}}}
			resp, _, _ := serve(t, fb, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u1","thread_id":"t-1"}`, "acme", nil))
			if resp.StatusCode != 200 {
				t.Fatalf("status = %d, body %s", resp.StatusCode, resp.Body)
			}
			got := mustJSON(t, resp.Body)
			if got["backend"] != tt.backend {
				t.Errorf("backend = %v, want %s", got["backend"], tt.backend)
			}
			if conn := got["connection"]; !reflect.DeepEqual(conn, map[string]any(mustJSON(t, tt.want))) {
				t.Errorf("connection = %v, want %s", conn, tt.want)
			}
		})
	}
}
