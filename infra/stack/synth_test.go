package stack

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
)

func TestMain(m *testing.M) {
	// Node 20 is past its end of life for jsii: silence the banner. jsii
	// prepares its Node child (and copies the environment) while its
	// packages initialize, before TestMain runs, so setting the variable
	// here is too late: re-exec the test binary with it set instead.
	const silence = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"
	if os.Getenv(silence) == "" {
		exe, err := os.Executable()
		if err == nil {
			err = syscall.Exec(exe, os.Args, append(os.Environ(), silence+"=20"))
		}
		fmt.Fprintf(os.Stderr, "re-exec with %s=20 failed (%v): Node's banner will show\n", silence, err)
	}
	code := m.Run()
	jsii.Close()
	os.Exit(code)
}

// synthesized is one synthesis of the app (stack + cdk-nag), shared by the
// tests that read it.
type synthesized struct {
	stack    *Stack
	tpl      map[string]any // the CloudFormation template
	errors   []string       // cdk-nag (and other) error annotations
	warnings []string
	took     time.Duration
}

// Resources returns the template's resources of type typ, by logical ID.
func (s *synthesized) Resources(typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range s.tpl["Resources"].(map[string]any) {
		r := r.(map[string]any)
		if r["Type"] == typ {
			out[id] = r
		}
	}
	return out
}

var (
	synthMu    sync.Mutex
	synthCache = map[string]*synthesized{}
)

// placeholderAssets writes <dir>/<function>/bootstrap for every function:
// the tests check the stack, not the binaries (make build and the devstack
// tests cover those), and must not depend on `make build` having run.
func placeholderAssets(dir string) error {
	for _, f := range Functions {
		if err := os.MkdirAll(filepath.Join(dir, f.Name), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f.Name, "bootstrap"), []byte("#!/bin/sh\n# placeholder "+f.Name+"\n"), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// synth synthesizes the app for props once per name (synthesis takes
// seconds) and returns it; a CDK panic fails the test.
func synth(t *testing.T, name string, props Props) *synthesized {
	t.Helper()
	synthMu.Lock()
	defer synthMu.Unlock()
	if s, ok := synthCache[name]; ok {
		if s == nil {
			t.Fatalf("synthesis %q failed earlier", name)
		}
		return s
	}
	synthCache[name] = nil
	dir, err := os.MkdirTemp("", "sandbox-broker-cdk-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("synthesis %q panicked: %v", name, r)
		}
	}()
	if err := placeholderAssets(filepath.Join(dir, "assets")); err != nil {
		t.Fatal(err)
	}
	props.AssetDir = filepath.Join(dir, "assets")
	start := time.Now()
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(filepath.Join(dir, "cdk.out"))})
	st := New(app, "SandboxBroker", props)
	ApplyNag(app)
	tpl := assertions.Template_FromStack(st.Stack, nil)
	raw, err := json.Marshal(tpl.ToJSON())
	if err != nil {
		t.Fatal(err)
	}
	s := &synthesized{stack: st, took: time.Since(start)}
	if err := json.Unmarshal(raw, &s.tpl); err != nil {
		t.Fatal(err)
	}
	ann := assertions.Annotations_FromStack(st.Stack)
	for _, m := range *ann.FindError(jsii.String("*"), assertions.Match_AnyValue()) {
		s.errors = append(s.errors, fmt.Sprintf("%s: %v", *m.Id, m.Entry.Data))
	}
	for _, m := range *ann.FindWarning(jsii.String("*"), assertions.Match_AnyValue()) {
		s.warnings = append(s.warnings, fmt.Sprintf("%s: %v", *m.Id, m.Entry.Data))
	}
	// CDK's own template validation (cfn-lint rules) writes its findings to
	// the output directory; unacknowledged ones count as warnings.
	if raw, err := os.ReadFile(filepath.Join(dir, "cdk.out", "validation-report.json")); err == nil {
		var report struct {
			PluginReports []struct {
				PluginName string
				Violations []struct{ RuleName, Description string }
			}
		}
		if err := json.Unmarshal(raw, &report); err != nil {
			t.Fatalf("validation report: %v", err)
		}
		for _, pr := range report.PluginReports {
			for _, v := range pr.Violations {
				s.warnings = append(s.warnings, fmt.Sprintf("%s %s: %s", pr.PluginName, v.RuleName, v.Description))
			}
		}
	}
	sort.Strings(s.errors)
	sort.Strings(s.warnings)
	t.Logf("synthesis %q took %s, %d resources", name, s.took.Round(time.Millisecond), len(s.tpl["Resources"].(map[string]any)))
	os.RemoveAll(dir)
	synthCache[name] = s
	return s
}

// defaultSynth is the stack as `make synth` builds it (JWT auth, defaults).
func defaultSynth(t *testing.T) *synthesized {
	return synth(t, "default", DefaultProps())
}

// variantSynth exercises the options: an existing secret, an existing
// alarm topic, other retention, no deletion protection.
func variantSynth(t *testing.T) *synthesized {
	p := DefaultProps()
	p.ExistingSecretARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:e2b-key-AbCdEf"
	p.AlarmTopicARN = "arn:aws:sns:eu-west-1:123456789012:oncall"
	p.LogRetentionDays = 90
	p.DeletionProtection = false
	return synth(t, "variant", p)
}

// str renders a template value compactly for comparisons and messages.
func str(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// ref is CloudFormation's {"Ref": id}.
func ref(id string) map[string]any { return map[string]any{"Ref": id} }

// getAtt is {"Fn::GetAtt": [id, attr]}.
func getAtt(id, attr string) map[string]any { return map[string]any{"Fn::GetAtt": []any{id, attr}} }

// props returns r["Properties"].
func props(r map[string]any) map[string]any {
	p, _ := r["Properties"].(map[string]any)
	return p
}

func TestNagClean(t *testing.T) {
	for name, s := range map[string]*synthesized{"default": defaultSynth(t), "variant": variantSynth(t)} {
		if len(s.errors) != 0 {
			t.Errorf("%s: %d unsuppressed error annotations (cdk-nag AwsSolutions):\n%s", name, len(s.errors), strings.Join(s.errors, "\n"))
		}
		if len(s.warnings) != 0 {
			t.Errorf("%s: %d warnings:\n%s", name, len(s.warnings), strings.Join(s.warnings, "\n"))
		}
		// Every suppression carries a written reason (cdk-nag records them
		// in the resources' metadata).
		n := 0
		for id, r := range s.tpl["Resources"].(map[string]any) {
			md, _ := r.(map[string]any)["Metadata"].(map[string]any)
			nag, _ := md["cdk_nag"].(map[string]any)
			rules, _ := nag["rules_to_suppress"].([]any)
			for _, rule := range rules {
				rule := rule.(map[string]any)
				n++
				if reason, _ := rule["reason"].(string); len(reason) < 40 {
					t.Errorf("%s: suppression of %v has no real reason: %q", id, rule["id"], reason)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no suppression metadata found: the check above would pass vacuously", name)
		}
	}
}
