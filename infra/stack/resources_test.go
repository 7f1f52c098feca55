package stack

import (
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/jsii-runtime-go"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/eventpub"
	"github.com/sandbox-broker/sandbox-broker/internal/outputsync"
	"github.com/sandbox-broker/sandbox-broker/internal/wiring"
)

func TestResourceCounts(t *testing.T) {
	s := defaultSynth(t)
	routes, routed := 0, 0
	for _, f := range Functions {
		routes += len(f.Routes)
		if len(f.Routes) > 0 {
			routed++
		}
	}
	want := map[string]int{
		"AWS::Lambda::Function":          len(Functions),
		"AWS::IAM::Role":                 len(Functions),
		"AWS::IAM::Policy":               len(Functions),
		"AWS::Logs::LogGroup":            len(Functions) + 1, // + API access logs
		"AWS::DynamoDB::Table":           1,
		"AWS::S3::Bucket":                2, // outputs + their access logs
		"AWS::SecretsManager::Secret":    2, // the E2B key, the webhook secret
		"AWS::ApiGatewayV2::Api":         1,
		"AWS::ApiGatewayV2::Stage":       1,
		"AWS::ApiGatewayV2::Authorizer":  2,      // Authorization, and X-API-Key for /e2b
		"AWS::ApiGatewayV2::Route":       routes, // one per deployed route
		"AWS::ApiGatewayV2::Integration": routed, // one per function behind the API
		"AWS::Events::Rule":              1,
		"AWS::CloudWatch::Alarm":         5,
		"AWS::CloudWatch::Dashboard":     1,
		"AWS::SNS::Topic":                1,
		"AWS::SNS::TopicPolicy":          1,
		"AWS::SNS::Subscription":         1, // conditional on AlarmEmail
		"AWS::Lambda::EventInvokeConfig": 1, // reconcile: no retries
	}
	for typ, n := range want {
		if got := len(s.Resources(typ)); got != n {
			t.Errorf("%s: %d resources, want %d", typ, got, n)
		}
	}
}

func TestFunctions(t *testing.T) {
	s := defaultSynth(t)
	fns := s.Resources("AWS::Lambda::Function")
	for _, f := range Functions {
		wantEnv := functionEnv(f)
		r, ok := fns[f.LogicalID]
		if !ok {
			t.Errorf("no function %s", f.LogicalID)
			continue
		}
		p := props(r)
		got := []any{p["Runtime"], str(p["Architectures"]), p["Handler"], p["MemorySize"], p["Timeout"]}
		want := []any{"provided.al2023", `["arm64"]`, "bootstrap", float64(f.MemoryMB), float64(f.TimeoutSeconds)}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: runtime, arch, handler, memory, timeout, reserved = %v, want %v", f.Name, got, want)
		}
		env := p["Environment"].(map[string]any)["Variables"].(map[string]any)
		var names []string
		for k := range env {
			names = append(names, k)
		}
		sort.Strings(names)
		if !reflect.DeepEqual(names, wantEnv) {
			t.Errorf("%s: environment = %v\nwant %v", f.Name, names, wantEnv)
		}
		if want := str(ref("ReconcileFunction")); f.RefillsPool && str(env[config.EnvPoolRefillFunction]) != want {
			t.Errorf("%s: %s = %s, want %s", f.Name, config.EnvPoolRefillFunction, str(env[config.EnvPoolRefillFunction]), want)
		}
		if str(env[config.EnvE2BAPIKeySecretARN]) != str(ref(LogicalSecret)) {
			t.Errorf("%s: %s = %s, want a Ref to the secret", f.Name, config.EnvE2BAPIKeySecretARN, str(env[config.EnvE2BAPIKeySecretARN]))
		}
		for _, p := range Parameters {
			if p.Env == config.EnvDeploymentID || !f.Gets(p) {
				continue // TestDeploymentID; the names are checked above
			}
			if str(env[p.Env]) != str(ref(p.Name)) {
				t.Errorf("%s: %s = %s, want Ref %s", f.Name, p.Env, str(env[p.Env]), p.Name)
			}
		}
		// Its log group has a retention, and the function logs there.
		lg := p["LoggingConfig"].(map[string]any)["LogGroup"].(map[string]any)["Ref"].(string)
		if days := props(s.Resources("AWS::Logs::LogGroup")[lg])["RetentionInDays"]; days != float64(30) {
			t.Errorf("%s: log group %s retention = %v, want 30", f.Name, lg, days)
		}
		if !strings.Contains(str(p["Code"]), "S3Bucket") {
			t.Errorf("%s: code = %s, want an S3 asset", f.Name, str(p["Code"]))
		}
	}
	// The API key is never a plain environment value anywhere.
	if strings.Contains(str(s.tpl), `"E2B_API_KEY"`) {
		t.Error("the template sets E2B_API_KEY")
	}
}

func TestFunctionAssetsComeFromAssetDir(t *testing.T) {
	// The asset of each function is <AssetDir>/<name>: CDK fails synthesis
	// on a missing directory, so a stack pointing elsewhere cannot pass
	// (the synthesis above points at placeholder directories).
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(fmt.Sprint(r), "missing") {
			t.Errorf("New with a missing asset directory: panic %v, want one naming the directory", r)
		}
	}()
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	p := DefaultProps()
	p.AssetDir = filepath.Join(t.TempDir(), "missing")
	New(app, "Missing", p)
}

func TestRoutesRequireTheAuthorizer(t *testing.T) {
	for name, tc := range map[string]struct {
		s        *synthesized
		authType string
	}{
		"default": {defaultSynth(t), "JWT"},
		"variant": {variantSynth(t), "JWT"},
	} {
		routes := tc.s.Resources("AWS::ApiGatewayV2::Route")
		integ := tc.s.Resources("AWS::ApiGatewayV2::Integration")
		got := map[string]string{}
		for id, r := range routes {
			p := props(r)
			switch {
			case p["RouteKey"] == "POST /webhooks/e2b":
				// Without the JWT authorizer: the webhook's signature
				// authenticates it.
				if p["AuthorizationType"] != "NONE" || p["AuthorizerId"] != nil {
					t.Errorf("%s: webhook route authorization = %v (%v), want NONE", name, p["AuthorizationType"], p["AuthorizerId"])
				}
			case p["AuthorizationType"] != tc.authType:
				t.Errorf("%s: route %s (%v) authorization = %v, want %s", name, id, p["RouteKey"], p["AuthorizationType"], tc.authType)
			case tc.authType == "JWT" && p["AuthorizerId"] == nil:
				t.Errorf("%s: route %v has no AuthorizerId", name, p["RouteKey"])
			}
			// Target: integrations/<integration>; the integration's URI is
			// the function's ARN.
			target := str(p["Target"])
			for iid, ir := range integ {
				if strings.Contains(target, `"`+iid+`"`) {
					got[p["RouteKey"].(string)] = props(ir)["IntegrationUri"].(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
					if v := props(ir)["PayloadFormatVersion"]; v != "2.0" {
						t.Errorf("%s: integration %s payload %v, want 2.0", name, iid, v)
					}
				}
			}
		}
		want := map[string]string{}
		for _, f := range Functions {
			for _, r := range f.Routes {
				want[r.Key()] = f.LogicalID
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: routes = %v\nwant %v", name, got, want)
		}
	}

	// Two JWT authorizers for the same issuer and audience: the token in
	// Authorization, and in X-API-Key (the /e2b routes, for the E2B SDKs).
	authz := defaultSynth(t).Resources("AWS::ApiGatewayV2::Authorizer")
	var sources []string
	for _, a := range authz {
		p := props(a)
		got := []string{str(p["AuthorizerType"]), str(p["JwtConfiguration"])}
		want := []string{`"JWT"`, `{"Audience":[{"Ref":"JwtAudience"}],"Issuer":{"Ref":"JwtIssuer"}}`}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("authorizer = %v, want %v", got, want)
		}
		sources = append(sources, str(p["IdentitySource"]))
	}
	sort.Strings(sources)
	if want := []string{`["$request.header.Authorization"]`, `["$request.header.X-API-Key"]`}; !reflect.DeepEqual(sources, want) {
		t.Errorf("authorizer identity sources %v, want %v", sources, want)
	}
}

func TestStageLogsAndThrottles(t *testing.T) {
	s := defaultSynth(t)
	for _, st := range s.Resources("AWS::ApiGatewayV2::Stage") {
		p := props(st)
		if p["StageName"] != "$default" || p["AutoDeploy"] != true {
			t.Errorf("stage = %v auto-deploy %v, want $default, true", p["StageName"], p["AutoDeploy"])
		}
		als, _ := p["AccessLogSettings"].(map[string]any)
		if als == nil || !strings.Contains(str(als["DestinationArn"]), "ApiAccessLogs") || !strings.Contains(str(als["Format"]), "$context.requestId") {
			t.Errorf("access log settings = %s", str(als))
		}
		rs := p["DefaultRouteSettings"].(map[string]any)
		if str(rs) != `{"ThrottlingBurstLimit":{"Ref":"ApiThrottleBurst"},"ThrottlingRateLimit":{"Ref":"ApiThrottleRate"}}` {
			t.Errorf("throttling = %s, want the parameters ApiThrottleRate and ApiThrottleBurst", str(rs))
		}
	}
}

func TestTable(t *testing.T) {
	s := defaultSynth(t)
	r := s.Resources("AWS::DynamoDB::Table")[LogicalTable]
	if r == nil {
		t.Fatalf("no table %s", LogicalTable)
	}
	p := props(r)
	checks := []struct{ what, got, want string }{
		{"billing", str(p["BillingMode"]), `"PAY_PER_REQUEST"`},
		{"key schema", str(p["KeySchema"]), `[{"AttributeName":"pk","KeyType":"HASH"},{"AttributeName":"sk","KeyType":"RANGE"}]`},
		{"PITR", str(p["PointInTimeRecoverySpecification"]), `{"PointInTimeRecoveryEnabled":true}`},
		{"encryption", str(p["SSESpecification"]), `{"SSEEnabled":true}`},
		{"TTL", str(p["TimeToLiveSpecification"]), `{"AttributeName":"` + ddbstore.AttrTTL + `","Enabled":true}`},
		{"deletion protection", str(p["DeletionProtectionEnabled"]), `true`},
		{"deletion policy", str(r["DeletionPolicy"]), `"Retain"`},
		{"GSIs", str(p["GlobalSecondaryIndexes"]), `[{"IndexName":"gsi1","KeySchema":[{"AttributeName":"gsi1pk","KeyType":"HASH"},{"AttributeName":"gsi1sk","KeyType":"RANGE"}],"Projection":{"ProjectionType":"ALL"}},` +
			`{"IndexName":"gsi2","KeySchema":[{"AttributeName":"gsi2pk","KeyType":"HASH"},{"AttributeName":"gsi2sk","KeyType":"RANGE"}],"Projection":{"ProjectionType":"KEYS_ONLY"}}]`},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("table %s = %s, want %s", c.what, c.got, c.want)
		}
	}
	// Deletion protection is configurable.
	vp := props(variantSynth(t).Resources("AWS::DynamoDB::Table")[LogicalTable])
	if vp["DeletionProtectionEnabled"] != false {
		t.Errorf("variant deletion protection = %v, want false", vp["DeletionProtectionEnabled"])
	}
}

func TestBuckets(t *testing.T) {
	s := defaultSynth(t)
	buckets := s.Resources("AWS::S3::Bucket")
	for id, r := range buckets {
		p := props(r)
		if got := str(p["PublicAccessBlockConfiguration"]); got != `{"BlockPublicAcls":true,"BlockPublicPolicy":true,"IgnorePublicAcls":true,"RestrictPublicBuckets":true}` {
			t.Errorf("%s: public access block = %s", id, got)
		}
		if !strings.Contains(str(p["BucketEncryption"]), `"SSEAlgorithm":"AES256"`) {
			t.Errorf("%s: encryption = %s", id, str(p["BucketEncryption"]))
		}
		if !strings.Contains(str(p["LifecycleConfiguration"]), `"AbortIncompleteMultipartUpload":{"DaysAfterInitiation":1}`) {
			t.Errorf("%s: lifecycle = %s, want incomplete multipart uploads aborted", id, str(p["LifecycleConfiguration"]))
		}
	}
	out := props(buckets[LogicalBucket])
	if out == nil {
		t.Fatalf("no bucket %s", LogicalBucket)
	}
	if str(out["VersioningConfiguration"]) != `{"Status":"Enabled"}` {
		t.Errorf("versioning = %s", str(out["VersioningConfiguration"]))
	}
	if !strings.Contains(str(out["LoggingConfiguration"]), "AccessLogBucket") {
		t.Errorf("server access logging = %s", str(out["LoggingConfiguration"]))
	}
	// Enforced TLS: each bucket's policy denies aws:SecureTransport=false.
	tls := 0
	for _, pol := range s.Resources("AWS::S3::BucketPolicy") {
		js := str(props(pol)["PolicyDocument"])
		if strings.Contains(js, `"Effect":"Deny"`) && strings.Contains(js, `{"Bool":{"aws:SecureTransport":"false"}}`) {
			tls++
		}
	}
	if tls != len(buckets) {
		t.Errorf("%d of %d buckets deny non-TLS access", tls, len(buckets))
	}
}

func TestSecret(t *testing.T) {
	s := defaultSynth(t)
	sec := s.Resources("AWS::SecretsManager::Secret")[LogicalSecret]
	if sec == nil {
		t.Fatalf("no secret %s", LogicalSecret)
	}
	p := props(sec)
	if _, plain := p["SecretString"]; plain || p["GenerateSecretString"] == nil {
		t.Errorf("secret properties = %s: want a generated placeholder, no literal value", str(p))
	}
	// With an existing secret, nothing is created and the policies and the
	// environment name that ARN.
	v := variantSynth(t)
	if n := len(v.Resources("AWS::SecretsManager::Secret")); n != 1 || v.Resources("AWS::SecretsManager::Secret")[LogicalWebhookSecret] == nil {
		t.Errorf("variant creates %d secrets, want the webhook secret only", n)
	}
	arn := "arn:aws:secretsmanager:eu-west-1:123456789012:secret:e2b-key-AbCdEf"
	for _, f := range Functions {
		env := props(v.Resources("AWS::Lambda::Function")[f.LogicalID])["Environment"].(map[string]any)["Variables"].(map[string]any)
		if env[config.EnvE2BAPIKeySecretARN] != arn {
			t.Errorf("variant %s: %s = %v", f.Name, config.EnvE2BAPIKeySecretARN, env[config.EnvE2BAPIKeySecretARN])
		}
	}
}

func TestSchedule(t *testing.T) {
	s := defaultSynth(t)
	rule := s.Resources("AWS::Events::Rule")[LogicalRule]
	if rule == nil {
		t.Fatalf("no rule %s", LogicalRule)
	}
	p := props(rule)
	if p["ScheduleExpression"] != ReconcileSchedule || p["State"] != "ENABLED" {
		t.Errorf("rule = %v %v, want %s ENABLED", p["ScheduleExpression"], p["State"], ReconcileSchedule)
	}
	targets := p["Targets"].([]any)
	if len(targets) != 1 || str(targets[0].(map[string]any)["Arn"]) != str(getAtt("ReconcileFunction", "Arn")) {
		t.Errorf("targets = %s, want the reconcile function", str(targets))
	}
	// EventBridge may invoke it.
	ok := false
	for _, perm := range s.Resources("AWS::Lambda::Permission") {
		pp := props(perm)
		if pp["Principal"] == "events.amazonaws.com" && str(pp["FunctionName"]) == str(getAtt("ReconcileFunction", "Arn")) {
			ok = true
		}
	}
	if !ok {
		t.Error("no permission for EventBridge to invoke the reconcile function")
	}
}

// TestIAMLeastPrivilege checks each function's policy statement by
// statement: exactly its actions on exactly its resources.
func TestIAMLeastPrivilege(t *testing.T) {
	s := defaultSynth(t)
	roles := s.Resources("AWS::IAM::Role")
	policies := s.Resources("AWS::IAM::Policy")
	prefixObjects := `{"Fn::Join":["",[{"Fn::GetAtt":["OutputBucket","Arn"]},"/",{"Ref":"OutputPrefix"},"/*"]]}`
	for _, f := range Functions {
		fn := props(s.Resources("AWS::Lambda::Function")[f.LogicalID])
		roleID := fn["Role"].(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
		role := props(roles[roleID])
		if role["ManagedPolicyArns"] != nil || role["Policies"] != nil {
			t.Errorf("%s: role has managed or inline policies: %s", f.Name, str(role))
		}
		if !strings.Contains(str(role["AssumeRolePolicyDocument"]), `"Service":"lambda.amazonaws.com"`) {
			t.Errorf("%s: trust policy = %s", f.Name, str(role["AssumeRolePolicyDocument"]))
		}
		var attached []map[string]any
		for _, p := range policies {
			if strings.Contains(str(props(p)["Roles"]), `"`+roleID+`"`) {
				attached = append(attached, props(p))
			}
		}
		if len(attached) != 1 {
			t.Fatalf("%s: %d policies on its role, want 1", f.Name, len(attached))
		}
		lg := fn["LoggingConfig"].(map[string]any)["LogGroup"].(map[string]any)["Ref"].(string)
		want := map[string][2]string{"WriteOwnLogs": {str(LogActions), str(getAtt(lg, "Arn"))}}
		// A statement holds the actions of its resource f calls, or is absent.
		expect := func(sid string, all []string, resource string) {
			if acts := f.Granted(all); len(acts) > 0 {
				want[sid] = [2]string{str(acts), resource}
			}
		}
		expect("TableItems", DynamoDBActions, str(getAtt(LogicalTable, "Arn")))
		expect("TableIndexes", DynamoDBIndexActions, `[{"Fn::Join":["",[{"Fn::GetAtt":["Table","Arn"]},"/index/gsi1"]]},`+
			`{"Fn::Join":["",[{"Fn::GetAtt":["Table","Arn"]},"/index/gsi2"]]}]`)
		expect("OutputObjects", S3ObjectActions, prefixObjects)
		expect("ListOutputBucket", S3BucketActions, str(getAtt(LogicalBucket, "Arn")))
		expect("ReadE2BApiKey", SecretActions, str(ref(LogicalSecret)))
		if f.ServesWebhooks() {
			expect("ReadWebhookSecret", SecretActions, str(ref(LogicalWebhookSecret)))
		}
		expect("SealAccessTokens", KMSActions, str(getAtt(LogicalTokenKey, "Arn")))
		expect("PublishEvents", EventActions, `{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":events:",{"Ref":"AWS::Region"},":",`+
			`{"Ref":"AWS::AccountId"},":event-bus/",{"Ref":"EventBusName"}]]}`)
		expect("InvokePoolRefill", LambdaInvokeActions, str(getAtt("ReconcileFunction", "Arn")))
		got := map[string][2]string{}
		for _, st := range attached[0]["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			st := st.(map[string]any)
			if st["Effect"] != "Allow" {
				t.Errorf("%s: statement %v effect %v", f.Name, st["Sid"], st["Effect"])
			}
			got[st["Sid"].(string)] = [2]string{str(st["Action"]), str(st["Resource"])}
			for _, a := range asList(st["Action"]) {
				if strings.Contains(a.(string), "*") {
					t.Errorf("%s: wildcard action %v", f.Name, a)
				}
			}
			if r := str(st["Resource"]); strings.Contains(r, "*") && r != prefixObjects {
				t.Errorf("%s: wildcard resource %s (only the output prefix's objects may use one)", f.Name, r)
			}
			switch {
			case st["Sid"] == "SealAccessTokens":
				if str(st["Condition"]) != `{"StringEquals":{"kms:EncryptionContext:purpose":"sandbox-access-token"}}` {
					t.Errorf("%s: kms condition = %s, want the token encryption context only", f.Name, str(st["Condition"]))
				}
			case st["Condition"] != nil:
				t.Errorf("%s: statement %v has condition %s (TestListBucketGrant)", f.Name, st["Sid"], str(st["Condition"]))
			}
		}
		// Single actions render as a string, lists as arrays.
		for k, v := range want {
			if strings.HasPrefix(v[0], `["`) && !strings.Contains(v[0], ",") {
				want[k] = [2]string{strings.Trim(v[0], "[]"), v[1]}
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: statements =\n%v\nwant\n%v", f.Name, got, want)
		}
	}
}

func asList(v any) []any {
	if l, ok := v.([]any); ok {
		return l
	}
	return []any{v}
}

// TestActionsCoverTheClients derives the IAM actions from the SDK calls
// the store and the syncer declare (ddbstore.API, outputsync.S3API): a
// new call without its permission fails here.
func TestActionsCoverTheClients(t *testing.T) {
	iam := sdkActions
	derive := func(iface reflect.Type) []string {
		set := map[string]bool{}
		for i := range iface.NumMethod() {
			m := iface.Method(i).Name
			actions, ok := iam[m]
			if !ok {
				t.Errorf("%s.%s: no IAM mapping: add it here and grant its action in stack.go", iface, m)
			}
			for _, a := range actions {
				set[a] = true
			}
		}
		var out []string
		for a := range set {
			out = append(out, a)
		}
		sort.Strings(out)
		return out
	}
	sorted := func(l ...[]string) []string {
		out := slices.Concat(l...)
		sort.Strings(out)
		return slices.Compact(out)
	}
	if got, want := sorted(DynamoDBActions, DynamoDBIndexActions), derive(reflect.TypeFor[ddbstore.API]()); !reflect.DeepEqual(got, want) {
		t.Errorf("DynamoDB actions granted = %v, ddbstore.API needs %v", got, want)
	}
	if got, want := sorted(S3ObjectActions, S3BucketActions), derive(reflect.TypeFor[outputsync.S3API]()); !reflect.DeepEqual(got, want) {
		t.Errorf("S3 actions granted = %v, outputsync.S3API needs %v", got, want)
	}
	if got, want := sorted(LambdaInvokeActions), derive(reflect.TypeFor[wiring.LambdaAPI]()); !reflect.DeepEqual(got, want) {
		t.Errorf("Lambda actions granted = %v, wiring.LambdaAPI needs %v", got, want)
	}
	if got, want := sorted(EventActions), derive(reflect.TypeFor[eventpub.API]()); !reflect.DeepEqual(got, want) {
		t.Errorf("EventBridge actions granted = %v, eventpub.API needs %v", got, want)
	}
}

func TestAlarmsAndDashboard(t *testing.T) {
	s := defaultSynth(t)
	alarms := s.Resources("AWS::CloudWatch::Alarm")
	// Alarm logical IDs are the construct IDs plus CDK's hash suffix.
	byID := func(id string) map[string]any {
		var found []map[string]any
		for lid, a := range alarms {
			if strings.HasPrefix(lid, id) {
				found = append(found, props(a))
			}
		}
		if len(found) != 1 {
			t.Fatalf("%d alarms named %s* (have %v)", len(found), id, keys(alarms))
		}
		return found[0]
	}
	topicRef := str(ref(alarmTopicID(t, s)))
	tests := []struct {
		id        string
		contains  []string
		threshold float64
		periods   float64
		missing   string
	}{
		{"CapacitySaturationAlarm", []string{`"100 * used / limit"`, `"MetricName":"CapacityUsed"`, `"MetricName":"CapacityLimit"`, `"Namespace":"SandboxBroker"`, `"Name":"Deployment"`}, 90, 3, "notBreaching"},
		// A pass that crashes or times out writes no BudgetExhausted: FILL
		// counts its period as failed, and no data at all breaches.
		{"ReconcileFailingAlarm", []string{`"FILL(errors, 0) + FILL(exhausted, 1)"`, `"MetricName":"Errors"`, `"MetricName":"BudgetExhausted"`, `"ReconcileFunction"`}, 1, 3, "breaching"},
		{"TombstoneAgeAlarm", []string{`"MetricName":"TombstoneOldestAgeSeconds"`, `"Statistic":"Maximum"`}, 1800, 2, "notBreaching"},
		{"ServerErrorRateAlarm", []string{`"MetricName":"5xx"`, `"MetricName":"Count"`, `"Namespace":"AWS/ApiGateway"`}, 5, 3, "notBreaching"},
		{"FunctionThrottlesAlarm", []string{`"MetricName":"Throttles"`, `"Namespace":"AWS/Lambda"`, `FILL(acquire, 0) + FILL(status, 0) + FILL(release, 0) + FILL(sync, 0) + FILL(reconcile, 0)`,
			`"AcquireFunction"`, `"StatusFunction"`, `"ReleaseFunction"`, `"SyncFunction"`, `"ReconcileFunction"`}, 1, 2, "notBreaching"},
	}
	for _, tt := range tests {
		p := byID(tt.id)
		js := str(p)
		for _, c := range tt.contains {
			if !strings.Contains(js, c) {
				t.Errorf("%s: missing %s in %s", tt.id, c, js)
			}
		}
		if p["Threshold"] != tt.threshold || p["EvaluationPeriods"] != tt.periods || p["TreatMissingData"] != tt.missing {
			t.Errorf("%s: threshold %v periods %v missing %v, want %v %v %s", tt.id, p["Threshold"], p["EvaluationPeriods"], p["TreatMissingData"], tt.threshold, tt.periods, tt.missing)
		}
		// Every alarm notifies the stack's topic, by default.
		if str(p["AlarmActions"]) != "["+topicRef+"]" || str(p["OKActions"]) != "["+topicRef+"]" {
			t.Errorf("%s: alarm actions %s OK actions %s, want the alarm topic %s", tt.id, str(p["AlarmActions"]), str(p["OKActions"]), topicRef)
		}
	}
	if p := byID("ReconcileFailingAlarm"); p["DatapointsToAlarm"] != float64(3) {
		t.Errorf("reconcile alarm datapoints = %v, want 3 (N consecutive passes)", p["DatapointsToAlarm"])
	}
	// With an existing topic, every alarm notifies it and none is created.
	if n := len(variantSynth(t).Resources("AWS::SNS::Topic")); n != 0 {
		t.Errorf("variant with an alarm topic ARN creates %d topics, want 0", n)
	}
	for id, a := range variantSynth(t).Resources("AWS::CloudWatch::Alarm") {
		if !strings.Contains(str(props(a)["AlarmActions"]), "arn:aws:sns:eu-west-1:123456789012:oncall") {
			t.Errorf("variant %s: actions = %s", id, str(props(a)["AlarmActions"]))
		}
	}
	for _, d := range s.Resources("AWS::CloudWatch::Dashboard") {
		body := str(props(d)["DashboardBody"])
		for _, m := range []string{MetricCapacityUsed, MetricCapacityLimit, MetricCapacityRejected, MetricReconcileBudgetExhausted, MetricTombstoneOldestAge, MetricSyncDeferred, "5xx", "Throttles"} {
			if !strings.Contains(body, m) {
				t.Errorf("dashboard lacks %s", m)
			}
		}
	}
}

// TestAlarmMetricsAreEmitted: every embedded metric the alarms and the
// dashboard read is one a function emits (reconcile's pass stats, from
// core.ReconcileStats.EMFAttrs; core's other metrics, core.EmittedMetrics,
// written through core.EMFAttrs), or is listed in PendingMetrics.
func TestAlarmMetricsAreEmitted(t *testing.T) {
	emitted := map[string]bool{}
	var others []core.Metric
	for _, name := range core.EmittedMetrics() {
		others = append(others, core.Metric{Name: name, Unit: "Count"})
	}
	for _, a := range append((core.ReconcileStats{}).EMFAttrs("d", time.Unix(0, 0)), core.EMFAttrs("d", time.Unix(0, 0), others...)...) {
		if a.Key != "_aws" {
			continue
		}
		meta := a.Value.Any().(map[string]any)
		for _, d := range meta["CloudWatchMetrics"].([]map[string]any) {
			if d["Namespace"] != MetricNamespace || str(d["Dimensions"]) != `[["`+DimensionDeployment+`"]]` {
				t.Errorf("core emits namespace %v dimensions %v, the stack reads %s %s", d["Namespace"], d["Dimensions"], MetricNamespace, DimensionDeployment)
			}
			for _, m := range d["Metrics"].([]map[string]string) {
				emitted[m["Name"]] = true
			}
		}
	}
	if len(emitted) == 0 {
		t.Fatal("core emits no EMF metrics: the check is stale")
	}
	s := defaultSynth(t)
	var read []string
	for _, r := range s.Resources("AWS::CloudWatch::Alarm") {
		metrics, _ := props(r)["Metrics"].([]any)
		for _, m := range metrics {
			if ms, ok := m.(map[string]any)["MetricStat"].(map[string]any); ok {
				metric := ms["Metric"].(map[string]any)
				if metric["Namespace"] == MetricNamespace {
					read = append(read, metric["MetricName"].(string))
				}
			}
		}
		if mn, ok := props(r)["MetricName"].(string); ok && props(r)["Namespace"] == MetricNamespace {
			read = append(read, mn)
		}
	}
	if len(read) == 0 {
		t.Fatal("found no embedded metric in the alarms")
	}
	for _, m := range append(read, MetricReconcileBudgetExhausted, MetricReconcileErrors, MetricReconcileKilled, MetricReconcileExpired) {
		if !emitted[m] && !slices.Contains(PendingMetrics, m) {
			t.Errorf("metric %s is read but neither emitted by core nor listed in PendingMetrics", m)
		}
	}
	for _, m := range PendingMetrics {
		if emitted[m] {
			t.Errorf("metric %s is emitted now: remove it from PendingMetrics", m)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestNagFindsViolations proves the cdk-nag wiring reports findings (so
// the zero-findings check in TestNagClean can fail): a bare bucket breaks
// several AwsSolutions rules.
func TestNagFindsViolations(t *testing.T) {
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	st := awscdk.NewStack(app, jsii.String("Bad"), nil)
	awss3.NewBucket(st, jsii.String("Open"), nil)
	ApplyNag(app)
	ann := assertions.Annotations_FromStack(st)
	found := ann.FindError(jsii.String("*"), assertions.Match_StringLikeRegexp(jsii.String("AwsSolutions-S10")))
	if len(*found) == 0 {
		t.Error("cdk-nag reported no AwsSolutions-S10 error for a bucket without enforced TLS")
	}
}
