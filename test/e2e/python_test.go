package e2e

import (
	"context"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// python3 returns the interpreter the Python client's tests run on.
func python3(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 (3.10 or newer) is needed for the Python client's tests: apt-get install -y python3")
	}
	return py
}

// TestPythonClient runs the Python client's unittest suite
// (clients/python/tests) against the local stack on each backend (one
// slot, overflow policy reject, two tenants), its broker calls checked
// against the OpenAPI document on the way.
func TestPythonClient(t *testing.T) {
	py := python3(t)
	dir := filepath.Join(repoRoot(t), "clients", "python")
	for _, provider := range []string{"e2b", "provisioner"} {
		t.Run(provider, func(t *testing.T) {
			s := startStack(t, provider)
			// The client's calls go through a proxy that checks each
			// request and reply against the OpenAPI document.
			target, err := url.Parse(s.Info.APIURL)
			if err != nil {
				t.Fatal(err)
			}
			proxy := httputil.NewSingleHostReverseProxy(target)
			proxy.Transport = newContractTransport(t, s.Info.APIURL)
			front := httptest.NewServer(proxy)
			defer front.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, py, "-m", "unittest", "discover", "-v", "-s", "tests")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(),
				"SANDBOX_BROKER_URL="+front.URL,
				"SANDBOX_BROKER_TOKEN="+tokenA,
				"SANDBOX_BROKER_OTHER_TOKEN="+tokenB,
				"SANDBOX_BROKER_BACKEND="+provider,
				"PYTHONDONTWRITEBYTECODE=1",
			)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("python3 -m unittest: %v\n%s", err, out)
			}
			// The stack tests skip themselves without the environment
			// above; here every test must have run.
			if strings.Contains(string(out), "skipped") {
				t.Fatalf("some Python tests were skipped:\n%s", out)
			}
			t.Logf("python3 -m unittest (%s):\n%s", provider, lastLines(string(out), 4))
		})
	}
}

// TestPythonClientInstalls checks that `pip install ./clients/python` works
// offline: the build backend is in the package's own directory and needs
// only the standard library, so nothing is fetched (--no-index).
func TestPythonClientInstalls(t *testing.T) {
	py := python3(t)
	if out, err := exec.Command(py, "-m", "pip", "--version").CombinedOutput(); err != nil {
		t.Fatalf("pip is needed for the install check (make deps installs python3-pip as root): %v\n%s", err, out)
	}
	target := filepath.Join(t.TempDir(), "site")
	env := append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1")
	install := exec.Command(py, "-m", "pip", "install", "--quiet", "--no-index", "--target", target, filepath.Join(repoRoot(t), "clients", "python"))
	install.Env = env
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	check := exec.Command(py, "-c", "import sandbox_broker, sandbox_broker.deerflow; print(sandbox_broker.__file__)")
	check.Dir = t.TempDir()
	check.Env = append(env, "PYTHONPATH="+target)
	out, err := check.CombinedOutput()
	if err != nil {
		t.Fatalf("import the installed package: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, target+string(filepath.Separator)) {
		t.Errorf("imported sandbox_broker from %s, want it under the install target %s", got, target)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
