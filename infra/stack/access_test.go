package stack

import (
	"errors"
	"go/types"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"golang.org/x/tools/go/callgraph"
	"golang.org/x/tools/go/callgraph/cha"
	"golang.org/x/tools/go/callgraph/vta"
	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

// module is this repository's module path.
const module = "github.com/sandbox-broker/sandbox-broker"

// sdkActions maps each AWS SDK call the clients' interfaces declare to the
// IAM actions it is authorized as.
var sdkActions = map[string][]string{
	// DynamoDB
	"GetItem": {"dynamodb:GetItem"}, "PutItem": {"dynamodb:PutItem"}, "UpdateItem": {"dynamodb:UpdateItem"},
	"DeleteItem": {"dynamodb:DeleteItem"}, "Query": {"dynamodb:Query"}, "BatchGetItem": {"dynamodb:BatchGetItem"},
	"Scan":               {"dynamodb:Scan"},
	"TransactWriteItems": {"dynamodb:ConditionCheckItem", "dynamodb:DeleteItem", "dynamodb:PutItem", "dynamodb:UpdateItem"},
	"TransactGetItems":   {"dynamodb:GetItem"},
	// A PartiQL SELECT (the store's only statement) is authorized as
	// dynamodb:PartiQLSelect on the table.
	"ExecuteStatement": {"dynamodb:PartiQLSelect"},
	// S3
	"GetObject": {"s3:GetObject"}, "HeadObject": {"s3:GetObject"}, "PutObject": {"s3:PutObject"},
	"CreateMultipartUpload": {"s3:PutObject"}, "UploadPart": {"s3:PutObject"}, "CompleteMultipartUpload": {"s3:PutObject"},
	"AbortMultipartUpload": {"s3:AbortMultipartUpload"}, "ListObjectsV2": {"s3:ListBucket"},
	"DeleteObject": {"s3:DeleteObject"}, "DeleteObjects": {"s3:DeleteObject"},
	// KMS, Secrets Manager
	"GenerateDataKey": {"kms:GenerateDataKey"}, "Decrypt": {"kms:Decrypt"},
	"GetSecretValue": {"secretsmanager:GetSecretValue"},
	// Lambda
	"Invoke": {"lambda:InvokeFunction"},
	// EventBridge
	"PutEvents": {"events:PutEvents"},
}

// clientAPIs are the interfaces through which the functions call AWS.
var clientAPIs = []string{
	module + "/internal/ddbstore.API",
	module + "/internal/outputsync.S3API",
	module + "/internal/tokenseal.KMSAPI",
	module + "/internal/eventpub.API",
	module + "/internal/wiring.LambdaAPI",
	module + "/internal/wiring.SecretsAPI",
}

// program is the functions' code as SSA with a call graph (variable type
// analysis over class hierarchy analysis), built once.
type program struct {
	prog  *ssa.Program
	graph *callgraph.Graph
	err   error
}

var (
	programOnce sync.Once
	programMemo program
)

// loadProgram builds the call graph of the module's functions/ and
// internal/ packages (their dependencies from export data, without
// bodies).
func loadProgram(t *testing.T) program {
	t.Helper()
	programOnce.Do(func() {
		cfg := &packages.Config{Mode: packages.LoadSyntax, Dir: repoRoot()}
		pkgs, err := packages.Load(cfg, "./functions/...", "./internal/...")
		if err == nil && packages.PrintErrors(pkgs) > 0 {
			err = errors.New("the packages have errors (printed above)")
		}
		if err != nil {
			programMemo.err = err
			return
		}
		prog, _ := ssautil.Packages(pkgs, ssa.InstantiateGenerics)
		prog.Build()
		graph := vta.CallGraph(ssautil.AllFunctions(prog), cha.CallGraph(prog))
		graph.DeleteSyntheticNodes()
		programMemo = program{prog: prog, graph: graph}
	})
	if programMemo.err != nil {
		t.Fatalf("load the functions' code: %v", programMemo.err)
	}
	return programMemo
}

// repoRoot is the repository, two levels up.
func repoRoot() string { return filepath.Join("..", "..") }

// function returns pkg's function or *T method name ("Engine.Acquire").
func (p program) function(t *testing.T, pkg, name string) *ssa.Function {
	t.Helper()
	sp := p.prog.ImportedPackage(module + "/" + pkg)
	if sp == nil {
		t.Fatalf("package %s is not in the program", pkg)
	}
	typ, method, isMethod := strings.Cut(name, ".")
	if !isMethod {
		if f := sp.Func(name); f != nil {
			return f
		}
		t.Fatalf("%s has no function %s", pkg, name)
	}
	named := sp.Pkg.Scope().Lookup(typ).Type()
	ms := p.prog.MethodSets.MethodSet(types.NewPointer(named))
	for i := range ms.Len() {
		if ms.At(i).Obj().Name() == method {
			return p.prog.MethodValue(ms.At(i))
		}
	}
	t.Fatalf("%s.%s has no method %s", pkg, typ, method)
	return nil
}

// clientCalls returns the clientAPIs calls reachable from entries, as
// "API.Method". A function referenced as a value in reachable code (a
// closure, a method value) counts as reachable: it may be called by code
// without a body here (errgroup, the SDK).
func (p program) clientCalls(entries ...*ssa.Function) []string {
	calls := map[string]bool{}
	seen := map[*ssa.Function]bool{}
	var walk func(f *ssa.Function)
	walk = func(f *ssa.Function) {
		if f == nil || seen[f] {
			return
		}
		seen[f] = true
		for _, b := range f.Blocks {
			for _, ins := range b.Instrs {
				for _, op := range ins.Operands(nil) {
					if fn, ok := (*op).(*ssa.Function); ok {
						walk(fn)
					}
				}
				if c, ok := ins.(ssa.CallInstruction); ok && c.Common().IsInvoke() {
					iface := types.TypeString(c.Common().Value.Type(), nil)
					if slices.Contains(clientAPIs, iface) {
						calls[iface[strings.LastIndex(iface, "/")+1:]+"."+c.Common().Method.Name()] = true
					}
				}
			}
		}
		if n := p.graph.Nodes[f]; n != nil {
			for _, e := range n.Out {
				walk(e.Callee.Func)
			}
		}
	}
	for _, e := range entries {
		walk(e)
	}
	out := make([]string, 0, len(calls))
	for c := range calls {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// derivedActions are the IAM actions f's code calls: the client calls
// reachable from its cold start (wiring.NewBrokerFor) and from the engine
// methods its routes or schedule reach (brokerCalls). A pool refill client
// exists only in the functions given POOL_REFILL_FUNCTION (RefillsPool),
// though every cold start's code can build one.
func derivedActions(t *testing.T, p program, f Function) ([]string, []string) {
	t.Helper()
	entries := []*ssa.Function{p.function(t, "internal/wiring", "NewBrokerFor")}
	for _, m := range brokerCalls(t, f) {
		entries = append(entries, p.function(t, "internal/core", "Engine."+m))
	}
	calls := p.clientCalls(entries...)
	var acts []string
	for _, c := range calls {
		method := c[strings.LastIndex(c, ".")+1:]
		mapped, ok := sdkActions[method]
		if !ok {
			t.Errorf("%s: no IAM mapping for %s: add it to sdkActions", f.Name, c)
		}
		if c == "wiring.LambdaAPI.Invoke" && !f.RefillsPool {
			continue
		}
		acts = append(acts, mapped...)
	}
	return actions(acts), calls
}

// TestFunctionActions pins each function's Actions to what its code calls,
// and checks both templates grant it exactly those (and its logs).
func TestFunctionActions(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks and analyses the functions' code")
	}
	p := loadProgram(t)
	sam := samRaw(t)
	cdk := defaultSynth(t)
	for _, f := range Functions {
		t.Run(f.Name, func(t *testing.T) {
			derived, calls := derivedActions(t, p, f)
			if !reflect.DeepEqual(derived, f.Actions) {
				t.Errorf("its code calls %v\n(%v)\nActions = %v", derived, calls, f.Actions)
			}
			want := actions(f.Actions, LogActions)
			if got := grantedActions(samStatements(t, sam, f)); !reflect.DeepEqual(got, want) {
				t.Errorf("template.yaml grants %v, want %v", got, want)
			}
			if got := grantedActions(cdkStatements(t, cdk, f)); !reflect.DeepEqual(got, want) {
				t.Errorf("CDK stack grants %v, want %v", got, want)
			}
			if f.PublishesEvents != f.Allows("events:PutEvents") || f.RefillsPool != f.Allows("lambda:InvokeFunction") {
				t.Errorf("PublishesEvents %v, RefillsPool %v disagree with Actions %v", f.PublishesEvents, f.RefillsPool, f.Actions)
			}
		})
	}
}

// TestFunctionActionsFindCalls: the analysis finds the scan of the counter
// repair from reconcile's pass, and no scan from a status read (so
// TestFunctionActions can fail both ways).
func TestFunctionActionsFindCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks and analyses the functions' code")
	}
	p := loadProgram(t)
	if calls := p.clientCalls(p.function(t, "internal/core", "Engine.Reconcile")); !slices.Contains(calls, "ddbstore.API.Scan") {
		t.Errorf("Reconcile reaches %v, no Scan", calls)
	}
	if calls := p.clientCalls(p.function(t, "internal/core", "Engine.Get")); slices.Contains(calls, "ddbstore.API.Scan") || len(calls) == 0 {
		t.Errorf("Get reaches %v: want some calls, no Scan", calls)
	}
}

// grantedActions are the Allow actions of statements, sorted.
func grantedActions(statements []map[string]any) []string {
	var out []string
	for _, st := range statements {
		if st["Effect"] == "Allow" {
			for _, a := range asList(st["Action"]) {
				out = append(out, a.(string))
			}
		}
	}
	return actions(out)
}

// samStatements are the statements of f's role in template.yaml (its
// inline policies); the role must have no managed policy.
func samStatements(t *testing.T, sam map[string]any, f Function) []map[string]any {
	t.Helper()
	roleRef, _ := props(samResource(t, sam, f.LogicalID))["Role"].(map[string]any)["Fn::GetAtt"].(string)
	roleID, attr, _ := strings.Cut(roleRef, ".")
	if attr != "Arn" {
		t.Fatalf("template.yaml %s: Role %v, want !GetAtt <its role>.Arn", f.LogicalID, roleRef)
	}
	role := props(samResource(t, sam, roleID))
	if role["ManagedPolicyArns"] != nil {
		t.Errorf("template.yaml %s: managed policies %v", roleID, role["ManagedPolicyArns"])
	}
	var out []map[string]any
	for _, p := range asList(role["Policies"]) {
		for _, st := range p.(map[string]any)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			out = append(out, st.(map[string]any))
		}
	}
	return out
}

// cdkStatements are the statements of the policy on f's role in the
// synthesized stack.
func cdkStatements(t *testing.T, s *synthesized, f Function) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, pol := range s.Resources("AWS::IAM::Policy") {
		if !strings.HasPrefix(str(props(pol)["Roles"]), `[{"Ref":"`+f.LogicalID+`Role`) {
			continue
		}
		for _, st := range props(pol)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			out = append(out, st.(map[string]any))
		}
	}
	return out
}
