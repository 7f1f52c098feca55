package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestDrainAndUndrain(t *testing.T) {
	forbidden := route{status: 403, body: `{"error":{"code":"FORBIDDEN","message":"admin route: this tenant is not an administrator","reason":"not_admin","retryable":false}}`}
	tests := []struct {
		name       string
		routes     map[string]route
		args       []string
		wantCode   int
		wantOut    []string
		wantErr    []string
		wantNotErr string
	}{
		{name: "drain", routes: map[string]route{"POST /v1/admin/drain": {status: 200, body: `{"draining":true}`}},
			args: []string{"drain"}, wantOut: []string{"draining: acquires are refused"}},
		{name: "undrain", routes: map[string]route{"POST /v1/admin/undrain": {status: 200, body: `{"draining":false}`}},
			args: []string{"undrain"}, wantOut: []string{"not draining"}},
		{name: "drain as JSON", routes: map[string]route{"POST /v1/admin/drain": {status: 200, body: `{"draining":true}`}},
			args: []string{"--json", "drain"}, wantOut: []string{`"draining": true`}},
		{name: "non-admin tenant", routes: map[string]route{"POST /v1/admin/drain": forbidden},
			args: []string{"--tenant", "other", "drain"}, wantCode: ExitError,
			wantErr: []string{"sbx: drain: FORBIDDEN (HTTP 403): admin route: this tenant is not an administrator [reason: not_admin]", "tenant other is not in the functions' BROKER_ADMIN_TENANTS"}},
		{name: "non-admin tenant undrain as JSON", routes: map[string]route{"POST /v1/admin/undrain": forbidden},
			args: []string{"--json", "undrain"}, wantCode: ExitError,
			wantOut: []string{`"code": "FORBIDDEN"`, `"status": 403`}, wantErr: []string{"sbx: undrain: FORBIDDEN (HTTP 403)"}},
		{name: "arguments are a usage error", args: []string{"drain", "now"}, wantCode: ExitUsage, wantErr: []string{"want no arguments"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.routes)
			code, out, errOut := h.run(nil, tt.args...)
			if code != tt.wantCode {
				t.Fatalf("exit = %d, want %d (stdout %q, stderr %q)", code, tt.wantCode, out, errOut)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("stdout = %q, want it to contain %q", out, w)
				}
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr = %q, want it to contain %q", errOut, w)
				}
			}
			if strings.Contains(tt.name, "JSON") && tt.wantCode == ExitOK {
				var v map[string]any
				if err := json.Unmarshal([]byte(out), &v); err != nil {
					t.Errorf("stdout is not JSON: %v", err)
				}
			}
		})
	}
}
