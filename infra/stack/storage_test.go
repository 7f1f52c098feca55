package stack

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
)

// TestNumberParameters: both templates have the storage and API
// parameters, with the same type, default, minimum and description.
func TestNumberParameters(t *testing.T) {
	sam := samRaw(t)["Parameters"].(map[string]any)
	cdk := defaultSynth(t).tpl["Parameters"].(map[string]any)
	for _, p := range NumberParameters {
		want := fmt.Sprintf("Number %v %v %s", p.Default, p.MinValue, p.Description)
		for name, params := range map[string]map[string]any{"template.yaml": sam, "CDK stack": cdk} {
			got, _ := params[p.Name].(map[string]any)
			if s := fmt.Sprintf("%v %v %v %v", got["Type"], got["Default"], got["MinValue"], got["Description"]); s != want {
				t.Errorf("%s %s = %s, want %s", name, p.Name, s, want)
			}
		}
	}
}

// TestOutputLifecycle: the output bucket's lifecycle is the same in both
// templates: uploads aborted, old versions expired, delete markers left
// without versions removed by a rule without an expiration in days (S3
// refuses ExpiredObjectDeleteMarker beside Days or Date), and outputs
// expired only when OutputExpirationDays is above 0.
func TestOutputLifecycle(t *testing.T) {
	sam := props(samRaw(t)["Resources"].(map[string]any)[LogicalBucket].(map[string]any))["LifecycleConfiguration"]
	cdk := props(defaultSynth(t).Resources("AWS::S3::Bucket")[LogicalBucket])["LifecycleConfiguration"]
	if normalized(sam) != normalized(cdk) {
		t.Errorf("lifecycle differs:\n  template.yaml: %s\n  CDK stack:     %s", normalized(sam), normalized(cdk))
	}
	rules := cdk.(map[string]any)["Rules"].([]any)
	want := []string{
		`{"AbortIncompleteMultipartUpload":{"DaysAfterInitiation":1},"Id":"` + RuleAbortUploads + `","NoncurrentVersionExpiration":{"NoncurrentDays":30},"Status":"Enabled"}`,
		`{"ExpiredObjectDeleteMarker":true,"Id":"` + RuleExpiredDeleteMarker + `","Status":"Enabled"}`,
		`{"Fn::If":["HasOutputExpiration",{"ExpirationInDays":{"Ref":"` + ParamOutputExpirationDays + `"},"Id":"` + RuleExpireOutputs +
			`","Prefix":{"Fn::Sub":"${OutputPrefix}/"},"Status":"Enabled"},{"Ref":"AWS::NoValue"}]}`,
	}
	if len(rules) != len(want) {
		t.Fatalf("rules %s, want %d", str(rules), len(want))
	}
	for i, r := range rules {
		if str(r) != want[i] {
			t.Errorf("rule %d = %s\nwant %s", i, str(r), want[i])
		}
		if js := str(r); strings.Contains(js, "ExpiredObjectDeleteMarker") && strings.Contains(js, "ExpirationInDays") {
			t.Errorf("rule %d mixes ExpiredObjectDeleteMarker with ExpirationInDays, which S3 refuses", i)
		}
	}
	cond := str(defaultSynth(t).tpl["Conditions"].(map[string]any)["HasOutputExpiration"])
	if cond != `{"Fn::Not":[{"Fn::Equals":[{"Ref":"`+ParamOutputExpirationDays+`"},"0"]}]}` {
		t.Errorf("HasOutputExpiration = %s", cond)
	}
}

// TestTenantUsageParameter: both templates have SandboxTenantUsage (metrics
// or events, default metrics, the same description) and pass it to every
// function as SANDBOX_TENANT_USAGE.
func TestTenantUsageParameter(t *testing.T) {
	sam := samRaw(t)
	cdk := defaultSynth(t).tpl
	want := fmt.Sprintf("String metrics [metrics events] %s", paramSpec(t, ParamTenantUsage).Description)
	for name, tpl := range map[string]map[string]any{"template.yaml": sam, "CDK stack": cdk} {
		p, _ := tpl["Parameters"].(map[string]any)[ParamTenantUsage].(map[string]any)
		if got := fmt.Sprintf("%v %v %v %v", p["Type"], p["Default"], p["AllowedValues"], p["Description"]); got != want {
			t.Errorf("%s %s = %s, want %s", name, ParamTenantUsage, got, want)
		}
	}
	ref := str(map[string]any{"Ref": ParamTenantUsage})
	globals := sam["Globals"].(map[string]any)["Function"].(map[string]any)["Environment"].(map[string]any)["Variables"].(map[string]any)
	if got := str(globals[config.EnvTenantUsage]); got != ref {
		t.Errorf("template.yaml Globals %s = %s, want %s", config.EnvTenantUsage, got, ref)
	}
	for id, r := range defaultSynth(t).Resources("AWS::Lambda::Function") {
		vars, _ := props(r)["Environment"].(map[string]any)["Variables"].(map[string]any)
		if got := str(vars[config.EnvTenantUsage]); got != ref {
			t.Errorf("CDK %s %s = %s, want %s", id, config.EnvTenantUsage, got, ref)
		}
	}
}

// paramSpec is the Parameter named name.
func paramSpec(t *testing.T, name string) Parameter {
	t.Helper()
	for _, p := range Parameters {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no parameter %s", name)
	return Parameter{}
}
