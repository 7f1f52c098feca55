package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/ddbstore"
)

// freshTable creates a uniquely named broker table on DynamoDB Local
// through db and returns its name.
func freshTable(t testing.TB, db ddbstore.TableAdmin, prefix string) string {
	t.Helper()
	table := testenv.UniqueName(t, prefix)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ddbstore.CreateTable(ctx, db, table); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	return table
}
