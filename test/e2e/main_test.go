package e2e

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// builds holds the function bootstraps, built once per test process from
// the current source (every stack of the package runs the same code).
var builds struct {
	once sync.Once
	dir  string
	err  error
}

// sharedBuild returns the directory of the bootstraps, building them on
// first use; TestMain removes it.
func sharedBuild(t *testing.T, root string) string {
	t.Helper()
	builds.once.Do(func() {
		builds.dir, builds.err = os.MkdirTemp("", "sandbox-broker-e2e-build-")
		if builds.err == nil {
			builds.err = buildFunctions(root, builds.dir)
		}
	})
	if builds.err != nil {
		t.Fatal(builds.err)
	}
	return builds.dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builds.dir != "" {
		if err := os.RemoveAll(builds.dir); err != nil {
			fmt.Fprintln(os.Stderr, "remove build dir:", err)
		}
	}
	os.Exit(code)
}
