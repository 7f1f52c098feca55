package stack

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/awslabs/goformation/v7/intrinsics"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
)

// samRaw is template.yaml as CloudFormation JSON, intrinsics unresolved
// (!If, !Ref... become {"Fn::If": ...}, {"Ref": ...}).
func samRaw(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(repoTemplate())
	if err != nil {
		t.Fatal(err)
	}
	return samRawFrom(t, raw)
}

// samRawFrom is samRaw of a template's text.
func samRawFrom(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	js, err := intrinsics.ProcessYAML(raw, &intrinsics.ProcessorOptions{NoProcess: true})
	if err != nil {
		t.Fatalf("template.yaml: %v", err)
	}
	var tpl map[string]any
	if err := json.Unmarshal(js, &tpl); err != nil {
		t.Fatal(err)
	}
	return tpl
}

func samResource(t *testing.T, tpl map[string]any, id string) map[string]any {
	t.Helper()
	r, _ := tpl["Resources"].(map[string]any)[id].(map[string]any)
	if r == nil {
		t.Fatalf("template.yaml has no resource %s", id)
	}
	return r
}

// alarmTopicID is the logical ID of the stack's one SNS topic.
func alarmTopicID(t *testing.T, s *synthesized) string {
	t.Helper()
	topics := keys(s.Resources("AWS::SNS::Topic"))
	if len(topics) != 1 {
		t.Fatalf("SNS topics %v, want one", topics)
	}
	return topics[0]
}

// elfMachine opens an executable and reports its machine and whether it
// asks for a dynamic loader.
func elfMachine(t *testing.T, file string) (elf.Machine, bool) {
	t.Helper()
	f, err := elf.Open(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	defer f.Close()
	dynamic := false
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			dynamic = true
		}
	}
	return f.Machine, dynamic
}

// samBuildMetadata is each function's Metadata in template.yaml: sam
// build runs `make build-<LogicalId>` with ARTIFACTS_DIR set, in a copy of
// the project root (ProjectRootDirectory, so go.mod is there), with the
// root Makefile (ContextPath) and the root as working directory.
const samBuildMetadata = `{"BuildMethod":"makefile","ContextPath":".","ProjectRootDirectory":".","WorkingDirectory":"."}`

// bootstrapProblems lists how file falls short of a static arm64
// executable without a symbol table or DWARF (-s -w) and without root's
// path in it (-trimpath).
func bootstrapProblems(t *testing.T, file, root string) []string {
	t.Helper()
	var out []string
	if m, dyn := elfMachine(t, file); m != elf.EM_AARCH64 || dyn {
		out = append(out, fmt.Sprintf("machine %v, dynamic %v; want EM_AARCH64, static", m, dyn))
	}
	f, err := elf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, name := range []string{".symtab", ".debug_info"} {
		if f.Section(name) != nil {
			out = append(out, "has "+name+`: not stripped (-ldflags="-s -w")`)
		}
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), root) {
		out = append(out, "contains the build machine's path "+root+" (want -trimpath)")
	}
	return out
}

// TestBootstrapProblemsFound: a plain arm64 build of a small program is
// reported unstripped and with local paths (so TestDeployArtefacts can
// fail).
func TestBootstrapProblemsFound(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles a program")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() { println(\"hi\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "bootstrap")
	cmd := exec.Command("go", "build", "-o", out, "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0", "GO111MODULE=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	problems := strings.Join(bootstrapProblems(t, out, dir), "; ")
	if !strings.Contains(problems, ".symtab") || !strings.Contains(problems, "trimpath") {
		t.Errorf("problems of an unstripped build = %q, want .symtab and -trimpath named", problems)
	}
}

// TestDeployArtefacts builds what each deploy path uploads, as it builds
// it, and checks every bootstrap: static arm64 (the functions run on
// arm64; an x86-64 bootstrap deploys fine and fails every invocation),
// stripped, without local paths, and the same bytes from both paths.
//   - SAM: `sam build` runs the Makefile's build-<LogicalId> target
//     (BuildMethod makefile); the test runs that target.
//   - CDK: `make synth` builds with the Makefile's deploy-build target into
//     DEPLOY_BUILD, the stack's DefaultAssetDir; the test runs that target.
func TestDeployArtefacts(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles the five functions")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	tpl := samRaw(t)
	globals := tpl["Globals"].(map[string]any)["Function"].(map[string]any)
	if str(globals["Architectures"]) != `["arm64"]` || globals["Runtime"] != "provided.al2023" || globals["Handler"] != "bootstrap" {
		t.Fatalf("template.yaml Globals: architectures %s runtime %v handler %v, want arm64 provided.al2023 bootstrap",
			str(globals["Architectures"]), globals["Runtime"], globals["Handler"])
	}
	runMake := func(args ...string) {
		t.Helper()
		cmd := exec.Command("make", append([]string{"-s", "--no-print-directory", "-C", root}, args...)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	samOut, cdkOut := t.TempDir(), t.TempDir()
	for _, f := range Functions {
		r := samResource(t, tpl, f.LogicalID)
		if md := str(r["Metadata"]); md != samBuildMetadata {
			t.Errorf("%s: Metadata %s, want %s", f.LogicalID, md, samBuildMetadata)
		}
		if codeURI, _ := props(r)["CodeUri"].(string); filepath.Clean(codeURI) != filepath.Join("functions", f.Name) {
			t.Errorf("%s: CodeUri %q, want functions/%s/ (the main package; devstack names the function by it)", f.LogicalID, codeURI, f.Name)
		}
		runMake("build-"+f.LogicalID, "ARTIFACTS_DIR="+filepath.Join(samOut, f.Name))
	}
	dirOut, err := exec.Command("make", "-s", "--no-print-directory", "-C", root, "print-deploy-build").Output()
	if err != nil {
		t.Fatalf("make print-deploy-build: %v", err)
	}
	if got := strings.TrimSpace(string(dirOut)); got != DefaultAssetDir {
		t.Errorf("make synth builds into %q, the stack deploys %q", got, DefaultAssetDir)
	}
	runMake("deploy-build", "DEPLOY_BUILD="+cdkOut)
	for _, f := range Functions {
		sam, cdk := filepath.Join(samOut, f.Name, "bootstrap"), filepath.Join(cdkOut, f.Name, "bootstrap")
		for what, file := range map[string]string{"sam build": sam, "make deploy-build": cdk} {
			for _, p := range bootstrapProblems(t, file, root) {
				t.Errorf("%s %s: %s", what, f.Name, p)
			}
		}
		a, errA := os.ReadFile(sam)
		b, errB := os.ReadFile(cdk)
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Errorf("%s: sam build and make deploy-build differ (%d and %d bytes; %v %v)", f.Name, len(a), len(b), errA, errB)
		}
	}
}

// TestReservedConcurrencyIsAParameter: no reservation unless a parameter
// asks for one, in both templates (a reservation needs account quota:
// Lambda keeps 100 executions unreserved, and new accounts' quota is far
// below 100 + the sum).
func TestReservedConcurrencyIsAParameter(t *testing.T) {
	sam := samRaw(t)
	cdk := defaultSynth(t)
	for _, f := range Functions {
		want := fmt.Sprintf(`{"Fn::If":["Reserve%s",{"Ref":"%s"},{"Ref":"AWS::NoValue"}]}`, f.LogicalIDBase(), f.ReservedParam())
		wantCond := fmt.Sprintf(`{"Fn::Not":[{"Fn::Equals":[{"Ref":"%s"},"0"]}]}`, f.ReservedParam())
		for name, tpl := range map[string]map[string]any{"template.yaml": sam, "CDK stack": cdk.tpl} {
			fn := props(tpl["Resources"].(map[string]any)[f.LogicalID].(map[string]any))
			if got := str(fn["ReservedConcurrentExecutions"]); got != want {
				t.Errorf("%s %s: reserved concurrency %s, want %s", name, f.Name, got, want)
			}
			param, _ := tpl["Parameters"].(map[string]any)[f.ReservedParam()].(map[string]any)
			if param["Type"] != "Number" || fmt.Sprint(param["Default"]) != "0" || fmt.Sprint(param["MinValue"]) != "0" {
				t.Errorf("%s: parameter %s = %s, want a Number defaulting to 0 (no reservation)", name, f.ReservedParam(), str(param))
			}
			if got := str(tpl["Conditions"].(map[string]any)["Reserve"+f.LogicalIDBase()]); got != wantCond {
				t.Errorf("%s: condition Reserve%s = %s, want %s", name, f.LogicalIDBase(), got, wantCond)
			}
		}
	}
}

// TestDeploymentID: both templates default SANDBOX_DEPLOYMENT_ID to the
// stack name and refuse "default" (stacks sharing an E2B team would adopt
// or kill each other's sandboxes).
func TestDeploymentID(t *testing.T) {
	sam := samRaw(t)
	cdk := defaultSynth(t)
	wantEnv := `{"Fn::If":["HasDeploymentId",{"Ref":"SandboxDeploymentId"},{"Ref":"AWS::StackName"}]}`
	wantRule := `[{"Assert":{"Fn::Not":[{"Fn::Equals":[{"Ref":"SandboxDeploymentId"},"default"]}]},"AssertDescription":"SandboxDeploymentId must not be \"default\"; leave it empty to use the stack name."}]`
	if got := str(sam["Globals"].(map[string]any)["Function"].(map[string]any)["Environment"].(map[string]any)["Variables"].(map[string]any)[config.EnvDeploymentID]); got != wantEnv {
		t.Errorf("template.yaml %s = %s, want %s", config.EnvDeploymentID, got, wantEnv)
	}
	for _, f := range Functions {
		env := props(cdk.Resources("AWS::Lambda::Function")[f.LogicalID])["Environment"].(map[string]any)["Variables"].(map[string]any)
		if got := str(env[config.EnvDeploymentID]); got != wantEnv {
			t.Errorf("CDK %s: %s = %s, want %s", f.Name, config.EnvDeploymentID, got, wantEnv)
		}
	}
	for name, tpl := range map[string]map[string]any{"template.yaml": sam, "CDK stack": cdk.tpl} {
		rule, _ := tpl["Rules"].(map[string]any)["DeploymentIdIsNotDefault"].(map[string]any)
		if got := str(rule["Assertions"]); got != wantRule {
			t.Errorf("%s: rule DeploymentIdIsNotDefault assertions %s, want %s", name, got, wantRule)
		}
		if got := str(tpl["Conditions"].(map[string]any)["HasDeploymentId"]); got != `{"Fn::Not":[{"Fn::Equals":[{"Ref":"SandboxDeploymentId"},""]}]}` {
			t.Errorf("%s: condition HasDeploymentId = %s", name, got)
		}
		p := tpl["Parameters"].(map[string]any)["SandboxDeploymentId"].(map[string]any)
		if p["Default"] != "" {
			t.Errorf("%s: SandboxDeploymentId default %v, want empty (the stack name)", name, p["Default"])
		}
	}
}

// TestListBucketGrant pins what S3 needs to answer a GetObject of a missing
// key (the first manifest read of a thread) with 404 rather than 403: the
// caller must be allowed s3:ListBucket on the bucket, and a grant limited
// by an s3:prefix condition does not count (a GetObject request carries no
// s3:prefix). Both templates grant it unconditionally, to the functions
// that read outputs.
func TestListBucketGrant(t *testing.T) {
	sam := samRaw(t)
	cdk := defaultSynth(t)
	want := `{"Action":"s3:ListBucket","Effect":"Allow","Resource":{"Fn::GetAtt":["OutputBucket","Arn"]},"Sid":"ListOutputBucket"}`
	for _, f := range Functions {
		found := 0
		for name, statements := range map[string][]map[string]any{"template.yaml": samStatements(t, sam, f), "CDK stack": cdkStatements(t, cdk, f)} {
			for _, st := range statements {
				if strings.Contains(str(st["Action"]), "s3:ListBucket") {
					found++
					// !GetAtt X.Arn is the short form of ["X", "Arn"].
					if got := strings.Replace(str(st), `"OutputBucket.Arn"`, `["OutputBucket","Arn"]`, 1); got != want {
						t.Errorf("%s %s: %s, want %s", name, f.Name, got, want)
					}
				}
			}
		}
		if want := map[bool]int{true: 2, false: 0}[f.Allows("s3:ListBucket")]; found != want {
			t.Errorf("%s: %d ListBucket statements across both templates, want %d", f.Name, found, want)
		}
	}
}

// TestReconcileIsNotRetried: a failed pass is not retried by Lambda's
// asynchronous invocation (EventInvokeConfig) nor by EventBridge: the next
// scheduled pass starts over.
func TestReconcileIsNotRetried(t *testing.T) {
	sam := samRaw(t)
	eic := props(samResource(t, sam, "ReconcileFunction"))["EventInvokeConfig"].(map[string]any)
	if fmt.Sprint(eic["MaximumRetryAttempts"]) != "0" || fmt.Sprint(eic["MaximumEventAgeInSeconds"]) != "60" {
		t.Errorf("template.yaml reconcile EventInvokeConfig = %s, want MaximumRetryAttempts 0, MaximumEventAgeInSeconds 60", str(eic))
	}
	for _, f := range Functions {
		if f.Schedule == "" {
			if _, ok := props(samResource(t, sam, f.LogicalID))["EventInvokeConfig"]; ok {
				t.Errorf("template.yaml %s: EventInvokeConfig on an HTTP function", f.Name)
			}
		}
	}
	cfgs := defaultSynth(t).Resources("AWS::Lambda::EventInvokeConfig")
	if len(cfgs) != 1 {
		t.Fatalf("CDK: %d EventInvokeConfig, want 1", len(cfgs))
	}
	for _, c := range cfgs {
		p := props(c)
		if p["MaximumRetryAttempts"] != float64(0) || p["MaximumEventAgeInSeconds"] != float64(60) || str(p["FunctionName"]) != `{"Ref":"ReconcileFunction"}` {
			t.Errorf("CDK EventInvokeConfig = %s, want the reconcile function with MaximumRetryAttempts 0, MaximumEventAgeInSeconds 60", str(p))
		}
	}
}

// TestAlarmTopic: the stack creates the topic the alarms notify. It is not
// encrypted with SNS's AWS managed key (CloudWatch alarms cannot use that
// key: its policy cannot grant them kms:GenerateDataKey), accepts TLS only,
// lets this account's CloudWatch alarms publish (the policy CDK writes for
// TLS replaces SNS's default one), and gets an e-mail subscription only when
// AlarmEmail is set.
func TestAlarmTopic(t *testing.T) {
	s := defaultSynth(t)
	id := alarmTopicID(t, s)
	if k := props(s.Resources("AWS::SNS::Topic")[id])["KmsMasterKeyId"]; k != nil {
		t.Errorf("topic key %v: CloudWatch alarms cannot publish to a topic under the AWS managed key", k)
	}
	var stmts []string
	for _, pol := range s.Resources("AWS::SNS::TopicPolicy") {
		if str(props(pol)["Topics"]) != "["+str(ref(id))+"]" {
			continue
		}
		for _, st := range props(pol)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			st := st.(map[string]any)
			stmts = append(stmts, fmt.Sprintf("%v %v %v %v", st["Effect"], str(st["Principal"]), str(st["Action"]), str(st["Condition"])))
		}
	}
	sort.Strings(stmts)
	want := []string{
		`Allow {"Service":"cloudwatch.amazonaws.com"} "sns:Publish" {"StringEquals":{"aws:SourceAccount":{"Ref":"AWS::AccountId"}}}`,
		`Deny "*" "sns:Publish" {"Bool":{"aws:SecureTransport":"false"}}`,
	}
	if !reflect.DeepEqual(stmts, want) {
		t.Errorf("topic policy statements\n%q\nwant\n%q", stmts, want)
	}
	subs := s.Resources("AWS::SNS::Subscription")
	for _, sub := range subs {
		p := props(sub)
		if sub["Condition"] != "HasAlarmEmail" || p["Protocol"] != "email" || str(p["Endpoint"]) != str(ref(ParamAlarmEmail)) || str(p["TopicArn"]) != str(ref(id)) {
			t.Errorf("subscription = %s, want an e-mail one to %s under HasAlarmEmail", str(sub), ParamAlarmEmail)
		}
	}
	if len(subs) != 1 || str(s.tpl["Conditions"].(map[string]any)["HasAlarmEmail"]) != `{"Fn::Not":[{"Fn::Equals":[{"Ref":"AlarmEmail"},""]}]}` {
		t.Errorf("%d subscriptions, condition %s", len(subs), str(s.tpl["Conditions"].(map[string]any)["HasAlarmEmail"]))
	}
	if p := s.tpl["Parameters"].(map[string]any)[ParamAlarmEmail].(map[string]any); p["Default"] != "" {
		t.Errorf("AlarmEmail default %v, want empty (no subscription)", p["Default"])
	}
}

// guideParameters reads the deploy parameters of docs/configuration.md's
// settings table (the table whose header starts "| variable | default |
// parameter | parameter default |"): each row's third cell names a
// parameter (backquoted, or "–" for a variable no parameter sets) and its
// fourth gives the parameter's default.
func guideParameters(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "| variable | default | parameter | parameter default |") {
			in = true
			continue
		}
		if !in || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 5 {
			t.Fatalf("configuration row %q: want 5 cells", line)
		}
		name := strings.Trim(strings.TrimSpace(cells[2]), "`")
		if name == "–" {
			continue
		}
		rows[name] = strings.TrimSpace(cells[3])
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no settings table with deploy parameters", file)
	}
	return rows
}

// guideDefault renders a template parameter's default as
// docs/configuration.md writes it: `value`, "empty", or "required" (no default).
func guideDefault(p map[string]any) string {
	d, ok := p["Default"]
	switch {
	case !ok:
		return "required"
	case fmt.Sprint(d) == "":
		return "empty"
	}
	return "`" + fmt.Sprint(d) + "`"
}

// TestGuideParameterTable: docs/configuration.md's settings table lists
// exactly template.yaml's parameters and the CDK stack's, with their
// defaults (CDK-only ones say so).
func TestGuideParameterTable(t *testing.T) {
	got := guideParameters(t, configurationPage)
	want := map[string]string{}
	for name, p := range samRaw(t)["Parameters"].(map[string]any) {
		want[name] = guideDefault(p.(map[string]any))
	}
	for name, p := range defaultSynth(t).tpl["Parameters"].(map[string]any) {
		if _, ok := CDKOnlyParameters[name]; ok {
			want[name] = guideDefault(p.(map[string]any)) + " (CDK only)"
		}
	}
	for _, name := range keys(want) {
		if g, ok := got[name]; !ok {
			t.Errorf("docs/configuration.md lacks parameter %s (default %s)", name, want[name])
		} else if g != want[name] {
			t.Errorf("docs/configuration.md parameter %s: default %q, want %q", name, g, want[name])
		}
	}
	for _, name := range keys(got) {
		if _, ok := want[name]; !ok {
			t.Errorf("docs/configuration.md lists parameter %s, which neither template has", name)
		}
	}
}

// configurationPage is the guide's page holding the parameter table.
var configurationPage = filepath.Join("..", "..", "docs", "configuration.md")

// TestGuideTableCatchesDrift: the table comparison reports a renamed and a
// missing parameter.
func TestGuideTableCatchesDrift(t *testing.T) {
	raw, err := os.ReadFile(configurationPage)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "configuration.md")
	changed := strings.Replace(string(raw), "| `SandboxReplicas` |", "| `SandboxReplica` |", 1)
	if changed == string(raw) {
		t.Fatal("docs/configuration.md has no SandboxReplicas row to rename")
	}
	if err := os.WriteFile(p, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	rows := guideParameters(t, p)
	if _, ok := rows["SandboxReplicas"]; ok {
		t.Error("renamed row still read as SandboxReplicas")
	}
	if _, ok := rows["SandboxReplica"]; !ok {
		t.Error("renamed row not read")
	}
}
