package devstack

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOpenTemplateSkipsUnparsedSAM: the HTTP API's access log settings and
// a schedule's retry policy, which goformation cannot read, neither fail
// the parse nor hide the schedule.
func TestOpenTemplateSkipsUnparsedSAM(t *testing.T) {
	tpl := `Transform: AWS::Serverless-2016-10-31
Resources:
  Api:
    Type: AWS::Serverless::HttpApi
    Properties:
      AccessLogSettings:
        DestinationArn: arn:aws:logs:eu-west-1:123456789012:log-group:x
        Format: "$context.requestId"
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: functions/reconcile/
      Handler: bootstrap
      Runtime: provided.al2023
      Events:
        Tick:
          Type: Schedule
          Properties:
            Schedule: rate(1 minute)
            RetryPolicy:
              MaximumRetryAttempts: 0
`
	file := filepath.Join(t.TempDir(), "template.yaml")
	if err := os.WriteFile(file, []byte(tpl), 0o644); err != nil {
		t.Fatal(err)
	}
	app, err := LoadTemplate(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(app.Functions) != 1 || len(app.Functions[0].Schedules) != 1 {
		t.Errorf("functions %+v, want reconcile with its schedule", app.Functions)
	}
}
