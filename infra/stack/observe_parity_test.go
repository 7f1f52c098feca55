package stack

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// observedTypes are the resource types of the alarms and their topic,
// which both templates define alike.
var observedTypes = []string{"AWS::CloudWatch::Alarm", "AWS::SNS::Topic", "AWS::SNS::TopicPolicy", "AWS::SNS::Subscription"}

// cdkHash is the hash CDK appends to a construct's logical ID.
var cdkHash = regexp.MustCompile(`^([A-Za-z0-9]*[a-z])[0-9A-F]{8}$`)

// samID is the template.yaml logical ID of a CDK resource: its ID without
// CDK's hash.
func samID(id string) string {
	if m := cdkHash.FindStringSubmatch(id); m != nil {
		return m[1]
	}
	return id
}

// normalized renders v with references by template.yaml IDs and GetAtt in
// its long form, so that both templates' resources compare as text.
func normalized(v any) string {
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			out := map[string]any{}
			for k, e := range x {
				switch {
				case k == "Ref":
					out[k] = samID(fmt.Sprint(e))
				case k == "Fn::GetAtt":
					parts := asList(e)
					if s, ok := e.(string); ok {
						id, attr, _ := strings.Cut(s, ".")
						parts = []any{id, attr}
					}
					out[k] = []any{samID(fmt.Sprint(parts[0])), parts[1]}
				default:
					out[k] = walk(e)
				}
			}
			return out
		case []any:
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = walk(e)
			}
			return out
		}
		return v
	}
	return str(walk(v))
}

// resourcesOf returns tpl's resources of the types, by template.yaml ID.
func resourcesOf(tpl map[string]any, types ...string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range tpl["Resources"].(map[string]any) {
		r := r.(map[string]any)
		for _, typ := range types {
			if r["Type"] == typ {
				out[samID(id)] = r
			}
		}
	}
	return out
}

// observabilityDiffs lists how template.yaml (sam) differs from the CDK
// stack in its alarms, alarm topic, API access logs, API throttling and
// the schedule's retry policy.
func observabilityDiffs(sam, cdk map[string]any) []string {
	var diffs []string
	differ := func(what string, s, c any) {
		if ns, nc := normalized(s), normalized(c); ns != nc {
			diffs = append(diffs, fmt.Sprintf("%s differ:\n  template.yaml: %s\n  CDK stack:     %s", what, ns, nc))
		}
	}
	samObs, cdkObs := resourcesOf(sam, observedTypes...), resourcesOf(cdk, observedTypes...)
	for _, id := range keys(cdkObs) {
		differ(id, samObs[id], cdkObs[id])
	}
	for _, id := range keys(samObs) {
		if cdkObs[id] == nil {
			diffs = append(diffs, "template.yaml has "+id+", the CDK stack does not")
		}
	}
	api := props(sam["Resources"].(map[string]any)[LogicalAPI].(map[string]any))
	var stage map[string]any
	for _, st := range resourcesOf(cdk, "AWS::ApiGatewayV2::Stage") {
		stage = props(st)
	}
	differ("API access log settings", api["AccessLogSettings"], stage["AccessLogSettings"])
	differ("API throttling", api["DefaultRouteSettings"], stage["DefaultRouteSettings"])
	logs := str(stage["AccessLogSettings"].(map[string]any)["DestinationArn"].(map[string]any)["Fn::GetAtt"].([]any)[0])
	logID := samID(strings.Trim(logs, `"`))
	differ("access log group "+logID, sam["Resources"].(map[string]any)[logID], resourcesOf(cdk, "AWS::Logs::LogGroup")[logID])
	for _, f := range Functions {
		if f.Schedule == "" {
			continue
		}
		var samRetry, cdkRetry any
		for _, ev := range props(sam["Resources"].(map[string]any)[f.LogicalID].(map[string]any))["Events"].(map[string]any) {
			if ev := ev.(map[string]any); ev["Type"] == "Schedule" {
				samRetry = ev["Properties"].(map[string]any)["RetryPolicy"]
			}
		}
		for _, target := range props(resourcesOf(cdk, "AWS::Events::Rule")[LogicalRule])["Targets"].([]any) {
			cdkRetry = target.(map[string]any)["RetryPolicy"]
		}
		differ(f.Name+" schedule's retry policy", samRetry, cdkRetry)
	}
	return diffs
}

// TestObservabilityParity: template.yaml has the CDK stack's alarms, alarm
// topic (policy and e-mail subscription), API access logs and throttling,
// and the schedule's retry policy (no retries), property by property.
func TestObservabilityParity(t *testing.T) {
	cdk := defaultSynth(t)
	if n := len(resourcesOf(cdk.tpl, "AWS::CloudWatch::Alarm")); n != 5 {
		t.Fatalf("CDK stack has %d alarms, want 5: the comparison would be vacuous", n)
	}
	for _, d := range observabilityDiffs(samRaw(t), cdk.tpl) {
		t.Error(d)
	}
	retry := props(resourcesOf(cdk.tpl, "AWS::Events::Rule")[LogicalRule])["Targets"].([]any)[0].(map[string]any)["RetryPolicy"]
	if str(retry) != `{"MaximumEventAgeInSeconds":300,"MaximumRetryAttempts":0}` {
		t.Errorf("CDK schedule's retry policy %s, want no retries", str(retry))
	}
}

// TestObservabilityParityCatchesDrift: a changed threshold, a dropped
// retry policy, a missing alarm and other access logs are each reported.
func TestObservabilityParityCatchesDrift(t *testing.T) {
	raw, err := os.ReadFile(repoTemplate())
	if err != nil {
		t.Fatal(err)
	}
	cdk := defaultSynth(t)
	tests := []struct{ name, old, new, want string }{
		{"threshold", "      Threshold: 90\n", "      Threshold: 80\n", "CapacitySaturationAlarm differ"},
		{"retries", "              MaximumRetryAttempts: 0\n", "              MaximumRetryAttempts: 2\n", "reconcile schedule's retry policy differ"},
		{"missing alarm", "  TombstoneAgeAlarm:\n", "  TombstoneAgeAlarmX:\n", "TombstoneAgeAlarm differ"},
		{"access logs", `"jwtSub":"$context.authorizer.claims.sub"}'`, `"sub":"$context.authorizer.claims.sub"}'`, "API access log settings differ"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(string(raw), tt.old) {
				t.Fatalf("template.yaml has no %q to change", tt.old)
			}
			sam := samRawFrom(t, []byte(strings.Replace(string(raw), tt.old, tt.new, 1)))
			diffs := observabilityDiffs(sam, cdk.tpl)
			if len(diffs) == 0 || !strings.HasPrefix(diffs[0], tt.want) {
				t.Errorf("diffs = %q, want one starting %q", diffs, tt.want)
			}
		})
	}
}
