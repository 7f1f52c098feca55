package core_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/ddbstore"
)

// freshTable creates a uniquely named broker table on DynamoDB Local
// (the one db reaches) and returns its name.
func freshTable(t testing.TB, _ ddbstore.TableAdmin, prefix string) string {
	t.Helper()
	_, table := testenv.DynamoTable(t, prefix)
	return table
}

// parallelTests are the tests parallel has marked.
var parallelTests sync.Map

// parallel marks t parallel (once) when it is a top-level test. The
// harness tests spend most of their time waiting on DynamoDB Local and the
// fake provider, each on its own table, so they overlap those waits with
// one another's; the stress tests, which build no harness, stay
// sequential and so run before them, alone. A subtest is left sequential:
// its parent may check what its subtests did once they return.
func parallel(t *testing.T) {
	if strings.Contains(t.Name(), "/") {
		return
	}
	if _, marked := parallelTests.LoadOrStore(t, true); !marked {
		t.Parallel()
	}
}
