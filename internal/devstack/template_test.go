package devstack

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

func repoTemplate(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadTemplateReadsRepoTemplate(t *testing.T) {
	app, err := LoadTemplate(repoTemplate(t))
	if err != nil {
		t.Fatalf("LoadTemplate: %v", err)
	}
	var names []string
	for _, f := range app.Functions {
		names = append(names, f.Name)
	}
	if want := []string{"acquire", "reconcile", "release", "status", "sync"}; !reflect.DeepEqual(names, want) {
		t.Errorf("functions = %v, want %v", names, want)
	}
	var routes []string
	for _, r := range app.Routes {
		routes = append(routes, r.Key()+" -> "+r.Function)
	}
	want := []string{
		"GET /v1/capacity -> status",
		"GET /v1/openapi.json -> status",
		"GET /v1/sandboxes/{id} -> status",
		"POST /v1/admin/drain -> status",
		"POST /v1/admin/undrain -> status",
		"POST /v1/sandboxes/acquire -> acquire",
		"POST /v1/sandboxes/{id}/release -> release",
		"POST /v1/sandboxes/{id}/renew -> release",
		"POST /v1/sandboxes/{id}/sync -> sync",
		"POST /webhooks/e2b -> release",
	}
	want = append(want, "ANY /e2b/{proxy+} -> status", "POST /e2b/sandboxes/{id}/connect -> status", "POST /e2b/v2/sandboxes/{id}/connect -> status")
	slices.Sort(want)
	for _, r := range app.Routes {
		wantHeader := "Authorization"
		if strings.HasPrefix(r.Path, "/e2b/") {
			wantHeader = "X-API-Key" // the E2B SDKs send the key there
		}
		if r.Path == "/webhooks/e2b" {
			wantHeader = NoAuthorizer // its signature authenticates it
		}
		if r.TokenHeader != wantHeader {
			t.Errorf("%s: token header %q, want %q", r.Key(), r.TokenHeader, wantHeader)
		}
	}
	if !reflect.DeepEqual(routes, want) {
		t.Errorf("routes = %q\nwant %q", routes, want)
	}
	for _, f := range app.Functions {
		if f.Timeout <= 0 || f.Timeout > 15*time.Minute || f.MemoryMB < 128 {
			t.Errorf("%s: timeout %s memory %d MB out of Lambda's range", f.Name, f.Timeout, f.MemoryMB)
		}
		if f.Name == "acquire" && f.MemoryMB != 256 {
			t.Errorf("acquire memory = %d MB, want 256 from Globals", f.MemoryMB)
		}
		if !slices.Contains(f.Env, "SANDBOX_ACQUIRE_TIMEOUT_SECONDS=20") || slices.ContainsFunc(f.Env, func(kv string) bool { return strings.HasSuffix(kv, "=") }) {
			t.Errorf("%s env = %v, want the Globals defaults without empty values", f.Name, f.Env)
		}
		if f.Name == "reconcile" {
			if !reflect.DeepEqual(f.Schedules, []time.Duration{time.Minute}) {
				t.Errorf("reconcile schedules = %v, want [1m]", f.Schedules)
			}
		} else if len(f.Schedules) != 0 {
			t.Errorf("%s has schedules %v", f.Name, f.Schedules)
		}
	}
}

func TestParseRate(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"rate(5 minutes)", 5 * time.Minute, false},
		{"rate(1 minute)", time.Minute, false},
		{"rate(2 hours)", 2 * time.Hour, false},
		{"rate(1 day)", 24 * time.Hour, false},
		{"rate(1 minutes)", 0, true},
		{"rate(5 minute)", 0, true},
		{"rate(0 minutes)", 0, true},
		{"rate(5 weeks)", 0, true},
		{"cron(0 12 * * ? *)", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseRate(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestRouteMatching(t *testing.T) {
	app := App{Routes: []Route{
		{"POST", "/v1/sandboxes/acquire", "acquire", ""},
		{"GET", "/v1/sandboxes/{id}", "acquire", ""},
		{"POST", "/v1/sandboxes/{id}/release", "release", ""},
		{"ANY", "/files/{path+}", "files", ""},
	}}
	tests := []struct {
		method, path string
		wantKey      string
		wantParams   map[string]string
		wantFound    bool
	}{
		{"POST", "/v1/sandboxes/acquire", "POST /v1/sandboxes/acquire", map[string]string{}, true},
		{"GET", "/v1/sandboxes/acquire", "GET /v1/sandboxes/{id}", map[string]string{"id": "acquire"}, true},
		{"GET", "/v1/sandboxes/a%2Fb", "GET /v1/sandboxes/{id}", map[string]string{"id": "a/b"}, true},
		{"POST", "/v1/sandboxes/x/release", "POST /v1/sandboxes/{id}/release", map[string]string{"id": "x"}, true},
		{"DELETE", "/v1/sandboxes/x", "", nil, true},
		{"GET", "/v1/sandboxes", "", nil, false},
		{"GET", "/v1/sandboxes/x/release/more", "", nil, false},
		{"PUT", "/files/a/b/c", "ANY /files/{path+}", map[string]string{"path": "a/b/c"}, true},
	}
	for _, tt := range tests {
		r, params, found := app.match(tt.method, tt.path)
		key := ""
		if r.Path != "" {
			key = r.Key()
		}
		if key != tt.wantKey || found != tt.wantFound || (tt.wantParams != nil && !reflect.DeepEqual(params, tt.wantParams)) {
			t.Errorf("match(%s %s) = %q %v %v; want %q %v %v", tt.method, tt.path, key, params, found, tt.wantKey, tt.wantParams, tt.wantFound)
		}
	}
}

func TestLoadTemplateRejectsCron(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.yaml")
	os.WriteFile(p, []byte(`Transform: AWS::Serverless-2016-10-31
Resources:
  F:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: .build/f/
      Events:
        S:
          Type: Schedule
          Properties:
            Schedule: cron(0 12 * * ? *)
`), 0o644)
	if _, err := LoadTemplate(p); err == nil {
		t.Error("want an error for a cron schedule")
	}
}

// TestTemplateTableMatchesStore keeps template.yaml's table in step with
// the attribute and index names ddbstore uses.
func TestTemplateTableMatchesStore(t *testing.T) {
	tpl, err := OpenTemplate(repoTemplate(t))
	if err != nil {
		t.Fatal(err)
	}
	tables := tpl.GetAllDynamoDBTableResources()
	if len(tables) != 1 {
		t.Fatalf("template declares %d tables, want 1", len(tables))
	}
	for _, tbl := range tables {
		keys := map[string]string{}
		for _, k := range tbl.KeySchema {
			keys[k.AttributeName] = k.KeyType
		}
		if !reflect.DeepEqual(keys, map[string]string{ddbstore.AttrPK: "HASH", ddbstore.AttrSK: "RANGE"}) {
			t.Errorf("key schema = %v", keys)
		}
		if len(tbl.GlobalSecondaryIndexes) != 2 {
			t.Fatalf("GSIs = %+v, want %s and %s", tbl.GlobalSecondaryIndexes, ddbstore.IndexGSI1, ddbstore.IndexGSI2)
		}
		for i, want := range []struct{ name, pk, sk, projection string }{
			{ddbstore.IndexGSI1, ddbstore.AttrGSI1PK, ddbstore.AttrGSI1SK, "ALL"},
			{ddbstore.IndexGSI2, ddbstore.AttrGSI2PK, ddbstore.AttrGSI2SK, "KEYS_ONLY"},
		} {
			got := tbl.GlobalSecondaryIndexes[i]
			if got.IndexName != want.name {
				t.Errorf("GSI %d = %s, want %s", i, got.IndexName, want.name)
			}
			gsi := map[string]string{}
			for _, k := range got.KeySchema {
				gsi[k.AttributeName] = k.KeyType
			}
			if !reflect.DeepEqual(gsi, map[string]string{want.pk: "HASH", want.sk: "RANGE"}) {
				t.Errorf("%s key schema = %v", want.name, gsi)
			}
			if p := got.Projection; p == nil || p.ProjectionType == nil || *p.ProjectionType != want.projection {
				t.Errorf("%s projection = %+v, want %s", want.name, p, want.projection)
			}
		}
		if ttl := tbl.TimeToLiveSpecification; ttl == nil || ttl.AttributeName == nil || *ttl.AttributeName != ddbstore.AttrTTL || !ttl.Enabled {
			t.Errorf("TTL = %+v, want %s enabled", ttl, ddbstore.AttrTTL)
		}
		for _, a := range tbl.AttributeDefinitions {
			if a.AttributeType != "S" {
				t.Errorf("attribute %s type %s, want S", a.AttributeName, a.AttributeType)
			}
		}
	}
	if n := len(tpl.GetAllS3BucketResources()); n != 1 {
		t.Errorf("template declares %d buckets, want 1", n)
	}
}
