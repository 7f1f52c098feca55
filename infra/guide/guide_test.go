package guide

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// stubbed are the commands the guide's blocks run that the test replaces
// with testdata/stub.sh (make delegates to the real make, which then runs
// the stubbed go, npm and cdk).
var stubbed = []string{"aws", "cdk", "sam", "npm", "go", "curl", "make"}

// repoRoot is the repository, two levels up.
func repoRoot() string { return filepath.Join("..", "..") }

// readGuide returns docs/deploy.md.
func readGuide(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// copyFile copies src to dst with mode.
func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// runGuide runs md's shell blocks, in order, in one bash process with
// errexit, nounset and pipefail, in a directory holding the repository's
// Makefile and cdk.json, with the stubs first on PATH and AWS_REGION
// unset (the region comes from the profile). It returns the stubs' log
// and the shell's output and error.
func runGuide(t *testing.T, md string) (log, output string, err error) {
	t.Helper()
	realMake, lookErr := exec.LookPath("make")
	if lookErr != nil {
		t.Skip("make is not installed")
	}
	dir := t.TempDir()
	work, bin := filepath.Join(dir, "repo"), filepath.Join(dir, "bin")
	stub, err := filepath.Abs(filepath.Join("testdata", "stub.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range stubbed {
		copyFile(t, stub, filepath.Join(bin, name), 0o755)
	}
	for _, f := range []string{"Makefile", "cdk.json"} {
		copyFile(t, filepath.Join(repoRoot(), f), filepath.Join(work, f), 0o644)
	}
	for _, s := range []string{"install-deps.sh", "smoke.sh"} {
		copyFile(t, stub, filepath.Join(work, "scripts", s), 0o755)
	}
	script := "set -euo pipefail\n" + strings.Join(ShellBlocks(md), "")
	logFile := filepath.Join(dir, "calls.log")
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = work
	cmd.Env = []string{
		"PATH=" + bin + string(os.PathListSeparator) + "/usr/bin:/bin",
		"HOME=" + dir,
		"STUB_LOG=" + logFile,
		"REAL_MAKE=" + realMake,
	}
	out, err := cmd.CombinedOutput()
	b, _ := os.ReadFile(logFile)
	return string(b), string(out), err
}

// TestGuideRunsAsWritten: every shell block of docs/deploy.md runs in a
// shell without an error, and the tools get what a real deploy needs.
func TestGuideRunsAsWritten(t *testing.T) {
	log, out, err := runGuide(t, readGuide(t))
	if err != nil {
		t.Fatalf("the guide's commands failed: %v\n%s\ncalls:\n%s", err, out, log)
	}
	want := []struct {
		what string
		re   string
	}{
		{"bootstrap of the profile's account and region", `(?m)^cdk bootstrap aws://123456789012/eu-west-1$`},
		{"make deploy's cdk deploy with every parameter", `(?m)^cdk deploy --app cdk\.out --parameters JwtIssuer=https://\S+ --parameters JwtAudience=\S+ --parameters JwtTenantClaim=custom:tenant --parameters AlarmEmail=\S+ SandboxBroker$`},
		{"a bare cdk deploy", `(?m)^cdk deploy SandboxBroker --parameters JwtIssuer=https://\S+ --parameters JwtAudience=\S+$`},
		{"the arm64 bootstraps built", `(?m)^go build (.* )?-o \.build/deploy/acquire/bootstrap \./functions/acquire$`},
		{"the app synthesized", `(?m)^go run \./infra$`},
		{"the key put into the stack's secret", `(?m)^aws secretsmanager put-secret-value --secret-id arn:aws:secretsmanager:\S+ --secret-string`},
		{"the API called at its URL", `(?m)^curl .*https://abc123\.execute-api\.eu-west-1\.amazonaws\.com/v1/capacity`},
		{"the smoke test against the stack", `(?m)^smoke\.sh env API_URL=https://abc123\.execute-api\S+ BUCKET=sandboxbroker-outputbucket-1a2b3c$`},
		{"sam build and deploy", `(?ms)^sam build$.*^sam deploy --guided$`},
		{"the read-only preflight", `(?m)^go run \./cmd/preflight$`},
	}
	for _, w := range want {
		if !regexp.MustCompile(w.re).MatchString(log) {
			t.Errorf("no %s (%s) in the calls:\n%s", w.what, w.re, log)
		}
	}
	// A bare cdk deploy runs cdk.json's app: it builds the bootstraps and
	// synthesizes the app.
	_, after, _ := strings.Cut(log, "\ncdk deploy SandboxBroker ")
	if !regexp.MustCompile(`(?ms)^go build (.* )?-o \.build/deploy/.*^go run \./infra$`).MatchString(after) {
		t.Errorf("the bare cdk deploy built no bootstraps or synthesized nothing:\n%s", after)
	}
}

// TestGuideCatchesBrokenLines: the runner fails on the faults a reader
// would meet (so TestGuideRunsAsWritten can fail): parameters broken over
// lines inside make's variable, a region read from an unset AWS_REGION, a
// placeholder left for a value the shell must supply.
func TestGuideCatchesBrokenLines(t *testing.T) {
	md := readGuide(t)
	tests := []struct{ name, old, new string }{
		{"parameters over two lines", " --parameters JwtAudience=1a2b3c4d5e6f7g8h9i0j --parameters JwtTenantClaim", "\n  --parameters JwtAudience=1a2b3c4d5e6f7g8h9i0j --parameters JwtTenantClaim"},
		{"region from AWS_REGION only", "REGION=${AWS_REGION:-$(aws configure get region)}", "REGION=${AWS_REGION-}"},
		{"a placeholder", `--secret-id "$SECRET"`, "--secret-id E2BApiKeySecretArn"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(md, tt.old) {
				t.Fatalf("the guide has no %q to break", tt.old)
			}
			if log, out, err := runGuide(t, strings.Replace(md, tt.old, tt.new, 1)); err == nil {
				t.Errorf("the broken guide ran without an error:\n%s\ncalls:\n%s", out, log)
			}
		})
	}
}

func TestShellBlocks(t *testing.T) {
	md := "text\n```sh\na\nb\n```\n```json\n{}\n```\n  ```bash\nc\n  ```\n```sh\nd"
	got := ShellBlocks(md)
	want := []string{"a\nb\n", "c\n", "d\n"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("ShellBlocks = %q, want %q", got, want)
	}
}
