package httpapi

import (
	"reflect"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// For the provisioner backend the connection is the AIO sandbox base URL
// (sandbox_url), never envd_* fields.
func TestAcquireProvisionerConnection(t *testing.T) {
	tests := []struct {
		name  string
		token string
		want  string
	}{
		{"with token", "tok", `{"sandbox_url":"http://127.0.0.1:8002/aio/sbx-1","access_token":"tok"}`},
		{"without token", "", `{"sandbox_url":"http://127.0.0.1:8002/aio/sbx-1"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{acquire: core.AcquireResult{Source: core.SourceCreated, Record: core.Record{
				SandboxID: "sbx-1", State: core.StateActive, Backend: "provisioner", EnvdURL: "http://127.0.0.1:8002/aio/sbx-1",
				EnvdAccessToken: tt.token, ExpiresAt: when.Add(time.Hour),
			}}}
			resp, _, _ := serve(t, fb, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u1","thread_id":"t-1"}`, "acme", nil))
			if resp.StatusCode != 200 {
				t.Fatalf("status = %d, body %s", resp.StatusCode, resp.Body)
			}
			got := mustJSON(t, resp.Body)
			if got["backend"] != "provisioner" {
				t.Errorf("backend = %v", got["backend"])
			}
			if conn := got["connection"]; !reflect.DeepEqual(conn, map[string]any(mustJSON(t, tt.want))) {
				t.Errorf("connection = %v, want %s", conn, tt.want)
			}
		})
	}
}
