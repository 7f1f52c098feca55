package core_test

import (
	"flag"
	"log/slog"
	"os"
	"testing"
)

// TestMain keeps the engines' routine logs out of a plain run's output:
// the engines the tests build without a logger of their own log to
// slog's default, and their usage and reconcile lines (thousands a run)
// would bury a failing test's report. Errors still print; -v prints
// everything.
func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Verbose() {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	}
	os.Exit(m.Run())
}
