package sandboxhost

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestOfficialE2BSDK is the acceptance check of the sandbox host: the
// official E2B JS SDK (npm e2b, pinned in test/e2b-sdk/package.json)
// drives this host through test/e2b-sdk/sdk-check.mjs: create with
// metadata, run commands (stdout, exit codes, stdin, attaching), write,
// read, list and watch files (metadata, owner, signed URLs), metrics, list
// by metadata, pause (a background command and files survive, isRunning is
// false, and connect resumes it), set a timeout, kill (a running command
// fails as killed), and a real timeout expiry.
func TestOfficialE2BSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("drives the official E2B SDK, which make deps installs: skipped under -short")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "test", "e2b-sdk"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		t.Fatalf("the E2B SDK is not installed in %s (run make deps): %v", dir, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found (install Node.js 20+, then run make deps): %v", err)
	}
	mode := IsolationNone
	if _, err := exec.LookPath("bwrap"); err == nil {
		mode = IsolationBwrap
	} else {
		// sdk-check expects `pwd` to print /home/user, which needs bwrap.
		t.Fatalf("bubblewrap is needed for the SDK check (apt-get install -y bubblewrap): %v", err)
	}
	srv := startHost(t, mode)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "sdk-check.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+srv.APIURL,
		"E2B_SANDBOX_URL="+srv.EnvdURL,
		"E2B_API_KEY="+testAPIKey,
		"E2B_DEBUG=",
	)
	out, err := cmd.CombinedOutput()
	t.Logf("sdk-check output:\n%s", out)
	if err != nil {
		t.Fatalf("sdk-check failed: %v", err)
	}
	if n := len(srv.Host.list()); n != 0 {
		t.Errorf("%d sandboxes left after sdk-check, want 0", n)
	}
}
