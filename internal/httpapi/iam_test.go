package httpapi

import (
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// TestTenantFromIAM: with AWS_IAM authorization (API Gateway HTTP API,
// payload 2.0: requestContext.authorizer.iam) the tenant is the caller's
// account id; a Lambda or JWT tenant takes precedence; an IAM context
// without an account id is unauthorized.
func TestTenantFromIAM(t *testing.T) {
	iam := func(account string) *events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription {
		return &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{
			AccessKey: "ASIAEXAMPLE", AccountID: account, CallerID: "AROAEXAMPLE:session",
			UserARN: "arn:aws:sts::" + account + ":assumed-role/agent/session", UserID: "AROAEXAMPLE:session",
		}
	}
	tests := []struct {
		name   string
		auth   *events.APIGatewayV2HTTPRequestContextAuthorizerDescription
		status int
		call   string
	}{
		{"account id", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{IAM: iam("123456789012")}, 200, "Get 123456789012 sbx1"},
		{"no account id", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{IAM: iam("")}, 401, ""},
		{"malformed account id", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{IAM: iam("12/34")}, 401, ""},
		{"lambda tenant wins", &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			Lambda: map[string]any{"tenant": "acme"}, IAM: iam("123456789012")}, 200, "Get acme sbx1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{}
			ev := event(RouteGet, "/v1/sandboxes/sbx1", "", "", map[string]string{"id": "sbx1"})
			ev.RequestContext.Authorizer = tt.auth
			resp, _, logs := serve(t, fb, ev)
			if resp.StatusCode != tt.status {
				t.Fatalf("status = %d, want %d", resp.StatusCode, tt.status)
			}
			if got := strings.Join(fb.calls, ","); got != tt.call {
				t.Errorf("calls = %q, want %q", got, tt.call)
			}
			if tt.status == 200 {
				tenant := strings.Fields(tt.call)[1]
				if !strings.Contains(logs, `"tenant":"`+tenant+`"`) {
					t.Errorf("request log %s lacks tenant %s", logs, tenant)
				}
			}
		})
	}
}
