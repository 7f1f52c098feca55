package stack

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// lintAccepted are the cfn-lint warnings the templates keep, by rule and
// template, each with the reason. Errors are never accepted.
var lintAccepted = map[string]string{}

// lintFinding is one cfn-lint match (its JSON output).
type lintFinding struct {
	Rule struct {
		ID string `json:"Id"`
	} `json:"Rule"`
	Level    string `json:"Level"`
	Message  string `json:"Message"`
	Location struct {
		Path []any `json:"Path"`
	} `json:"Location"`
}

func (f lintFinding) String() string {
	return fmt.Sprintf("%s %s at %v: %s", f.Level, f.Rule.ID, f.Location.Path, f.Message)
}

// cfnLint runs cfn-lint on file and returns its findings; the test is
// skipped when cfn-lint is not installed.
func cfnLint(t *testing.T, file string) []lintFinding {
	t.Helper()
	bin, err := exec.LookPath("cfn-lint")
	if err != nil {
		t.Skip("cfn-lint is not installed (pip install cfn-lint): the templates are not linted")
	}
	out, err := exec.Command(bin, "--format", "json", "--non-zero-exit-code", "none", "--", file).Output()
	if err != nil {
		t.Fatalf("cfn-lint %s: %v\n%s", file, err, out)
	}
	var found []lintFinding
	if err := json.Unmarshal(out, &found); err != nil {
		t.Fatalf("cfn-lint %s: output is not JSON: %v\n%s", file, err, out)
	}
	return found
}

// checkLint fails the test on every error and on every warning not in
// lintAccepted for name; it returns the accepted rules it met.
func checkLint(t *testing.T, name string, found []lintFinding) map[string]bool {
	t.Helper()
	met := map[string]bool{}
	for _, f := range found {
		key := f.Rule.ID + " " + name
		switch {
		case f.Level == "Error":
			t.Errorf("%s: %s", name, f)
		case f.Level == "Warning" && lintAccepted[key] == "":
			t.Errorf("%s: %s (fix it, or add %q to lintAccepted with the reason)", name, f, key)
		case f.Level == "Warning":
			met[key] = true
		}
	}
	return met
}

// TestCfnLint lints template.yaml and the synthesized CDK template (the
// default and the variant synthesis): no errors, and no warning that is
// not accepted with a reason.
func TestCfnLint(t *testing.T) {
	met := checkLint(t, "template.yaml", cfnLint(t, repoTemplate()))
	dir := t.TempDir()
	for name, s := range map[string]*synthesized{"cdk-default": defaultSynth(t), "cdk-variant": variantSynth(t)} {
		file := filepath.Join(dir, name+".json")
		raw, err := json.Marshal(s.tpl)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		for k := range checkLint(t, name, cfnLint(t, file)) {
			met[k] = true
		}
	}
	var stale []string
	for k, reason := range lintAccepted {
		if len(reason) < 40 {
			t.Errorf("lintAccepted[%q] has no real reason: %q", k, reason)
		}
		if !met[k] {
			stale = append(stale, k)
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 {
		t.Errorf("lintAccepted lists warnings cfn-lint no longer reports: %s", strings.Join(stale, ", "))
	}
}

// TestCfnLintFindsErrors: the lint reports an error in a broken template
// (so TestCfnLint can fail).
func TestCfnLintFindsErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.yaml")
	bad := "Resources:\n  Fn:\n    Type: AWS::Lambda::Function\n    Properties:\n      Runtime: provided.al2023\n      Timeout: thirty\n"
	if err := os.WriteFile(file, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	errs := 0
	for _, f := range cfnLint(t, file) {
		if f.Level == "Error" {
			errs++
		}
	}
	if errs == 0 {
		t.Error("cfn-lint found no error in a function without code or role and a non-numeric timeout")
	}
}

// TestFunctionDependsOnItsPolicy: each function waits for its policy (it
// reads the secret at cold start) and names no dependency its properties
// already imply.
func TestFunctionDependsOnItsPolicy(t *testing.T) {
	s := defaultSynth(t)
	policies := s.Resources("AWS::IAM::Policy")
	for _, f := range Functions {
		deps, _ := s.Resources("AWS::Lambda::Function")[f.LogicalID]["DependsOn"].([]any)
		if len(deps) != 1 || !strings.HasPrefix(fmt.Sprint(deps[0]), f.LogicalID+"Policy") || policies[fmt.Sprint(deps[0])] == nil {
			t.Errorf("%s: DependsOn %v, want its policy only", f.Name, deps)
		}
	}
}
