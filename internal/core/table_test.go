package core_test

import (
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// freshTable creates a uniquely named broker table on DynamoDB Local
// (the one db reaches) and returns its name.
func freshTable(t testing.TB, _ ddbstore.TableAdmin, prefix string) string {
	t.Helper()
	_, table := testenv.DynamoTable(t, prefix)
	return table
}
