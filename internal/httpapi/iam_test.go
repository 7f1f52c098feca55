package httpapi

import (
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// TestTenantSources: the tenant comes from a Lambda authorizer's "tenant"
// or from the JWT claim WithTenantClaim names; an IAM identity (whatever
// its account or session) names none, so such a request is unauthorized.
func TestTenantSources(t *testing.T) {
	iam := &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{
		AccessKey: "ASIAEXAMPLE", AccountID: "123456789012", CallerID: "AROAEXAMPLE:acme",
		UserARN: "arn:aws:sts::123456789012:assumed-role/agent/acme", UserID: "AROAEXAMPLE:acme",
	}
	jwt := func(claims map[string]string) *events.APIGatewayV2HTTPRequestContextAuthorizerDescription {
		return &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: claims}}
	}
	tests := []struct {
		name   string
		claim  string // WithTenantClaim; "" = not set
		auth   *events.APIGatewayV2HTTPRequestContextAuthorizerDescription
		status int
		call   string
	}{
		{"jwt default claim", "", jwt(map[string]string{"tenant": "acme", "sub": "u1"}), 200, "Get acme sbx1"},
		{"cognito custom claim", "custom:tenant", jwt(map[string]string{"custom:tenant": "acme", "tenant": "other"}), 200, "Get acme sbx1"},
		{"configured claim absent", "custom:tenant", jwt(map[string]string{"tenant": "acme"}), 401, ""},
		{"iam identity", "", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{IAM: iam}, 401, ""},
		{"lambda tenant", "", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			Lambda: map[string]any{"tenant": "acme"}, IAM: iam}, 200, "Get acme sbx1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{}
			ev := event(RouteGet, "/v1/sandboxes/sbx1", "", "", map[string]string{"id": "sbx1"})
			ev.RequestContext.Authorizer = tt.auth
			var opts []Option
			if tt.claim != "" {
				opts = append(opts, WithTenantClaim(tt.claim))
			}
			resp, _, logs := serve(t, fb, ev, opts...)
			if resp.StatusCode != tt.status {
				t.Fatalf("status = %d, want %d", resp.StatusCode, tt.status)
			}
			if got := strings.Join(fb.calls, ","); got != tt.call {
				t.Errorf("calls = %q, want %q", got, tt.call)
			}
			if tt.status == 200 && !strings.Contains(logs, `"tenant":"acme"`) {
				t.Errorf("request log %s lacks tenant acme", logs)
			}
		})
	}
}
