package stack

import (
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
)

// TestPropsFromContext: the context keys set props; the removed ones (IAM
// auth, the reservation switch) are refused with what replaced them.
func TestPropsFromContext(t *testing.T) {
	tests := []struct {
		name    string
		ctx     map[string]any
		wantErr string // "" = no error
		check   func(Props) bool
	}{
		{"defaults", nil, "", func(p Props) bool { return p.AssetDir == DefaultAssetDir && p.AlarmTopicARN == "" }},
		{"alarm topic", map[string]any{CtxAlarmTopicARN: "arn:aws:sns:eu-west-1:1:t"}, "", func(p Props) bool { return p.AlarmTopicARN == "arn:aws:sns:eu-west-1:1:t" }},
		{"iam auth", map[string]any{"auth": "iam"}, "auth=iam: no longer read: the API always uses the JWT authorizer", nil},
		{"reservations off", map[string]any{"reservedConcurrency": "false"}, "reservedConcurrency=false: no longer read", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := awscdk.NewApp(&awscdk.AppProps{Context: &tt.ctx, Outdir: jsii.String(t.TempDir())})
			p, err := PropsFromContext(app.Node())
			switch {
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error = %v, want one containing %q", err, tt.wantErr)
			case tt.wantErr == "" && (err != nil || !tt.check(p)):
				t.Errorf("props = %+v, %v", p, err)
			}
		})
	}
}
