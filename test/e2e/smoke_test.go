package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSmokeScript runs scripts/smoke.sh (docs/deploy.md's smoke test of a
// deployed stack) against the local stack: the local token and tenant, the
// local S3 through the AWS SDK's endpoint override, the sbx CLI built from
// this source. It must acquire, exec, release and find the object in S3.
func TestSmokeScript(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	s := startStackWith(t, stackOptions{provider: "e2b", env: []string{"SANDBOX_REPLICAS=2", "LOG_LEVEL=DEBUG"}})
	bin := filepath.Join(t.TempDir(), "sbx")
	buildSbx(t, root, bin)
	cmd := exec.Command("bash", filepath.Join(root, "scripts", "smoke.sh"))
	cmd.Dir = t.TempDir() // no .run/stack.json around: everything comes from the environment
	cmd.Env = append(os.Environ(),
		"API_URL="+s.Info.APIURL, "TOKEN="+tokenA, "TENANT="+tenantA,
		"BUCKET="+s.Info.S3.Bucket, "PREFIX="+s.Info.S3.Prefix, "SBX="+bin,
		"AWS_ENDPOINT_URL_S3="+s.Info.S3.Endpoint, "AWS_ACCESS_KEY_ID="+s.Info.S3.AccessKey,
		"AWS_SECRET_ACCESS_KEY="+s.Info.S3.SecretKey, "AWS_REGION="+s.Info.S3.Region,
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "SBX_STACK=", "SBX_TOKEN=", "SBX_API_URL=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "smoke: ok:") {
		t.Fatalf("smoke.sh: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
