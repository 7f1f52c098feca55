package stack

import (
	"cmp"
	"fmt"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/devstack"
)

// deployment is what the parity test compares between template.yaml and
// the synthesized CDK stack.
type deployment struct {
	Functions map[string]string // function name (CodeUri directory) -> logical ID
	Routes    map[string]string // "METHOD /path" -> function name
	// Tokens: "METHOD /path" -> the header its authorizer reads the token from.
	Tokens    map[string]string
	Schedules map[string]string   // function name -> schedule expression
	Env       map[string][]string // function name -> sorted variable names
	Params    []string            // sorted parameter names
}

// samDeployment reads a SAM template with goformation (as devstack does):
// functions are named by their CodeUri directory, Globals' environment is
// merged into each function's.
func samDeployment(file string) (deployment, error) {
	tpl, err := devstack.OpenTemplate(file)
	if err != nil {
		return deployment{}, err
	}
	d := deployment{Functions: map[string]string{}, Routes: map[string]string{}, Tokens: map[string]string{}, Schedules: map[string]string{}, Env: map[string][]string{}}
	// Each route's token header, as the local gateway reads it.
	app, err := devstack.LoadTemplate(file)
	if err != nil {
		return deployment{}, err
	}
	for _, r := range app.Routes {
		if r.TokenHeader != devstack.NoAuthorizer {
			d.Tokens[r.Key()] = r.TokenHeader
		}
	}
	global := map[string]bool{}
	if g, err := tpl.GetServerlessGlobalFunction(); err == nil && g.Environment != nil {
		for k := range g.Environment.Variables {
			global[k] = true
		}
	}
	for id, fn := range tpl.GetAllServerlessFunctionResources() {
		if fn.CodeUri == nil || fn.CodeUri.String == nil {
			return deployment{}, fmt.Errorf("%s: CodeUri is not a directory", id)
		}
		name := path.Base(strings.TrimRight(*fn.CodeUri.String, "/"))
		d.Functions[name] = id
		env := map[string]bool{}
		for k := range global {
			env[k] = true
		}
		if fn.Environment != nil {
			for k := range fn.Environment.Variables {
				env[k] = true
			}
		}
		d.Env[name] = sortedKeys(env)
		for evName, ev := range fn.Events {
			if ev.Properties == nil {
				continue
			}
			switch ev.Type {
			case "HttpApi":
				e := ev.Properties.HttpApiEvent
				if e == nil || e.Method == nil || e.Path == nil {
					return deployment{}, fmt.Errorf("%s event %s: no method or path", id, evName)
				}
				d.Routes[strings.ToUpper(*e.Method)+" "+*e.Path] = name
			case "Schedule":
				d.Schedules[name] = ev.Properties.ScheduleEvent.Schedule
			default:
				return deployment{}, fmt.Errorf("%s event %s: type %s is not deployed by the CDK stack", id, evName, ev.Type)
			}
		}
	}
	for p := range tpl.Parameters {
		d.Params = append(d.Params, p)
	}
	sort.Strings(d.Params)
	return d, nil
}

// cdkDeployment reads the same facts from a synthesized stack's template.
// Functions are named through the shared logical IDs (Functions).
func cdkDeployment(s *synthesized) deployment {
	d := deployment{Functions: map[string]string{}, Routes: map[string]string{}, Tokens: map[string]string{}, Schedules: map[string]string{}, Env: map[string][]string{}}
	nameOf := map[string]string{}
	for _, f := range Functions {
		nameOf[f.LogicalID] = f.Name
	}
	name := func(logicalID string) string {
		if n, ok := nameOf[logicalID]; ok {
			return n
		}
		return "unknown:" + logicalID
	}
	for id, r := range s.Resources("AWS::Lambda::Function") {
		d.Functions[name(id)] = id
		vars, _ := props(r)["Environment"].(map[string]any)["Variables"].(map[string]any)
		env := map[string]bool{}
		for k := range vars {
			env[k] = true
		}
		d.Env[name(id)] = sortedKeys(env)
	}
	integ := s.Resources("AWS::ApiGatewayV2::Integration")
	for _, r := range s.Resources("AWS::ApiGatewayV2::Route") {
		p := props(r)
		target := str(p["Target"])
		fn := "no integration"
		for iid, ir := range integ {
			if strings.Contains(target, `"`+iid+`"`) {
				uri, _ := props(ir)["IntegrationUri"].(map[string]any)["Fn::GetAtt"].([]any)
				if len(uri) == 2 {
					fn = name(uri[0].(string))
				}
			}
		}
		d.Routes[p["RouteKey"].(string)] = fn
		authz, _ := p["AuthorizerId"].(map[string]any) // none: a route without an authorizer
		if ref, ok := authz["Ref"].(string); ok {
			src, _ := props(s.Resources("AWS::ApiGatewayV2::Authorizer")[ref])["IdentitySource"].([]any)
			if len(src) == 1 {
				h, _ := src[0].(string)
				d.Tokens[p["RouteKey"].(string)] = strings.TrimPrefix(h, "$request.header.")
			}
		}
	}
	for _, r := range s.Resources("AWS::Events::Rule") {
		p := props(r)
		for _, t := range p["Targets"].([]any) {
			arn, _ := t.(map[string]any)["Arn"].(map[string]any)["Fn::GetAtt"].([]any)
			if len(arn) == 2 {
				d.Schedules[name(arn[0].(string))] = p["ScheduleExpression"].(string)
			}
		}
	}
	for p := range s.tpl["Parameters"].(map[string]any) {
		_, cdkOnly := CDKOnlyParameters[p]       // TestCDKOnlyParameters
		if p != "BootstrapVersion" && !cdkOnly { // BootstrapVersion: CDK's bootstrap check, not a setting
			d.Params = append(d.Params, p)
		}
	}
	sort.Strings(d.Params)
	return d
}

// diffDeployments lists every difference between a and b, field by field.
func diffDeployments(a, b deployment, aName, bName string) []string {
	var out []string
	cmp := func(what string, x, y any) {
		if !reflect.DeepEqual(x, y) {
			out = append(out, fmt.Sprintf("%s differ:\n  %s: %v\n  %s: %v", what, aName, x, bName, y))
		}
	}
	cmp("functions", a.Functions, b.Functions)
	cmp("routes", a.Routes, b.Routes)
	cmp("token headers of the routes' authorizers", a.Tokens, b.Tokens)
	cmp("schedules", a.Schedules, b.Schedules)
	cmp("environment variable names", a.Env, b.Env)
	cmp("parameters", a.Params, b.Params)
	return out
}

// functionEnv is f's environment by name: a variable per parameter it
// gets (EVENT_BUS_NAME only if it publishes events), the resource
// references, and POOL_REFILL_FUNCTION for a function that refills the
// pool.
func functionEnv(f Function) []string {
	set := map[string]bool{}
	for _, p := range Parameters {
		if f.Gets(p) {
			set[p.Env] = true
		}
	}
	for k := range ResourceEnv {
		set[k] = true
	}
	if f.RefillsPool {
		set[config.EnvPoolRefillFunction] = true
	}
	if f.ServesWebhooks() {
		set[config.EnvWebhookSecretARN] = true
	}
	return sortedKeys(set)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func repoTemplate() string { return filepath.Join("..", "..", "template.yaml") }

// TestParity: template.yaml, the CDK stack and internal/config agree on the
// functions, routes, schedule, parameters and environment variable names.
func TestParity(t *testing.T) {
	sam, err := samDeployment(repoTemplate())
	if err != nil {
		t.Fatalf("template.yaml: %v", err)
	}
	cdk := cdkDeployment(defaultSynth(t))
	for _, d := range diffDeployments(sam, cdk, "template.yaml", "CDK stack") {
		t.Error(d)
	}

	// Both equal the spec in this package...
	want := deployment{Functions: map[string]string{}, Routes: map[string]string{}, Tokens: map[string]string{}, Schedules: map[string]string{}, Env: map[string][]string{}}
	for _, f := range Functions {
		want.Functions[f.Name] = f.LogicalID
		want.Env[f.Name] = functionEnv(f)
		for _, r := range f.Routes {
			want.Routes[r.Key()] = f.Name
			if !r.Public() {
				want.Tokens[r.Key()] = cmp.Or(r.TokenHeader, "Authorization")
			}
		}
		if f.Schedule != "" {
			want.Schedules[f.Name] = f.Schedule
		}
	}
	for _, p := range Parameters {
		want.Params = append(want.Params, p.Name)
	}
	for _, f := range Functions {
		want.Params = append(want.Params, f.ReservedParam())
	}
	want.Params = append(want.Params, "JwtAudience", "JwtIssuer", ParamAlarmEmail)
	for _, p := range NumberParameters {
		want.Params = append(want.Params, p.Name)
	}
	sort.Strings(want.Params)
	for _, d := range diffDeployments(cdk, want, "CDK stack", "infra/stack spec") {
		t.Error(d)
	}

	// ...and what the functions' configuration loader reads: every
	// deployed variable is one internal/config declares, and every variable it
	// declares is deployed or listed in NotDeployed with a reason.
	declared := map[string]bool{}
	for _, v := range config.VariableNames() {
		declared[v] = true
	}
	deployed := map[string]bool{}
	for _, f := range Functions {
		for _, v := range functionEnv(f) {
			deployed[v] = true
		}
	}
	for v := range deployed {
		if !declared[v] {
			t.Errorf("%s is deployed but internal/config does not read it (renamed?)", v)
		}
	}
	for v := range declared {
		_, skipped := NotDeployed[v]
		switch {
		case deployed[v] && skipped:
			t.Errorf("%s is both deployed and listed in NotDeployed", v)
		case !deployed[v] && !skipped:
			t.Errorf("internal/config reads %s but neither template.yaml nor the CDK stack sets it: add a Parameter (infra/stack/spec.go and template.yaml) or a NotDeployed reason", v)
		}
	}
	for v := range NotDeployed {
		if !declared[v] {
			t.Errorf("NotDeployed lists %s, which internal/config does not declare", v)
		}
	}
	// The parameters' defaults agree between the two templates.
	tpl, err := devstack.OpenTemplate(repoTemplate())
	if err != nil {
		t.Fatal(err)
	}
	cdkParams := defaultSynth(t).tpl["Parameters"].(map[string]any)
	for _, p := range Parameters {
		sp := tpl.Parameters[p.Name]
		cp, _ := cdkParams[p.Name].(map[string]any)
		pattern := ""
		if sp.AllowedPattern != nil {
			pattern = *sp.AllowedPattern
		}
		if fmt.Sprint(sp.Default) != fmt.Sprint(cp["Default"]) || pattern != stringOr(cp["AllowedPattern"]) ||
			fmt.Sprint(anyList(sp.AllowedValues)) != fmt.Sprint(anyList(cp["AllowedValues"])) {
			t.Errorf("parameter %s: template.yaml default %v pattern %q values %v; CDK default %v pattern %v values %v",
				p.Name, sp.Default, pattern, sp.AllowedValues, cp["Default"], cp["AllowedPattern"], cp["AllowedValues"])
		}
	}
}

// TestCDKOnlyParameters: the parameters only the CDK stack has are there.
func TestCDKOnlyParameters(t *testing.T) {
	params := defaultSynth(t).tpl["Parameters"].(map[string]any)
	sam, err := samDeployment(repoTemplate())
	if err != nil {
		t.Fatal(err)
	}
	for p := range CDKOnlyParameters {
		if _, ok := params[p]; !ok {
			t.Errorf("CDKOnlyParameters lists %s, which the CDK stack lacks", p)
		}
		if slices.Contains(sam.Params, p) {
			t.Errorf("CDKOnlyParameters lists %s, which template.yaml has too", p)
		}
	}
}

// anyList normalizes a missing list to an empty one.
func anyList(v any) []any {
	l, _ := v.([]any)
	if l == nil {
		return []any{}
	}
	return l
}

func stringOr(v any) string {
	s, _ := v.(string)
	return s
}

// TestParityCatchesDrift renames a variable, a route and the schedule in a
// copy of template.yaml: the comparison must report each.
func TestParityCatchesDrift(t *testing.T) {
	raw, err := os.ReadFile(repoTemplate())
	if err != nil {
		t.Fatal(err)
	}
	cdk := cdkDeployment(defaultSynth(t))
	tests := []struct {
		name, old, new, want string
	}{
		{"renamed variable", "SANDBOX_BURST_LIMIT:", "SANDBOX_BURST_LIMITS:", "environment variable names"},
		{"renamed route", "Path: /v1/capacity", "Path: /v1/capacities", "routes"},
		{"changed schedule", "rate(1 minute)", "rate(10 minutes)", "schedules"},
		{"renamed function", "functions/sync/", "functions/syncer/", "functions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(string(raw), tt.old) {
				t.Fatalf("template.yaml has no %q to change", tt.old)
			}
			p := filepath.Join(t.TempDir(), "template.yaml")
			if err := os.WriteFile(p, []byte(strings.Replace(string(raw), tt.old, tt.new, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			sam, err := samDeployment(p)
			if err != nil {
				t.Fatal(err)
			}
			diffs := diffDeployments(sam, cdk, "template.yaml", "CDK stack")
			if len(diffs) == 0 || !strings.HasPrefix(diffs[0], tt.want) {
				t.Errorf("diffs = %q, want one about %s", diffs, tt.want)
			}
		})
	}
}

// TestPolicyParity: each function's role in template.yaml grants the
// same actions, statement by statement (by Sid), as the CDK stack's.
func TestPolicyParity(t *testing.T) {
	sam := samRaw(t)
	s := defaultSynth(t)
	bySid := func(statements []map[string]any) map[string]string {
		out := map[string]string{}
		for _, st := range statements {
			var acts []string
			for _, a := range asList(st["Action"]) {
				acts = append(acts, fmt.Sprint(a))
			}
			sort.Strings(acts)
			out[fmt.Sprint(st["Sid"])] = strings.Join(acts, ",")
		}
		return out
	}
	for _, f := range Functions {
		got, want := bySid(samStatements(t, sam, f)), bySid(cdkStatements(t, s, f))
		if len(want) == 0 || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: template.yaml statements %v\nCDK stack statements %v", f.Name, got, want)
		}
	}
}

// TestRoutesMatchHandler: the deployed routes are exactly the route keys
// the HTTP handler serves (internal/httpapi's Route* constants, read from its
// sources).
func TestRoutesMatchHandler(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "internal", "httpapi", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var decls []ast.Decl
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := goparser.ParseFile(token.NewFileSet(), file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, f.Decls...)
	}
	var handler []string
	for _, d := range decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if !strings.HasPrefix(id.Name, "Route") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					handler = append(handler, v)
				}
			}
		}
	}
	sort.Strings(handler)
	deployed := deployedRoutes()
	if len(handler) == 0 || !reflect.DeepEqual(handler, deployed) {
		t.Errorf("internal/httpapi serves %q\ninfra/stack deploys %q", handler, deployed)
	}
}
