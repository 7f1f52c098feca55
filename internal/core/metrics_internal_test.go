package core

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// TestEmitTombstoneAge: the reconcile hook logs one EMF line with the
// oldest tombstone's age under the engine's deployment.
func TestEmitTombstoneAge(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	e := &Engine{s: Settings{Deployment: "blue"}, log: slog.New(slog.NewJSONHandler(&buf, nil)), now: func() time.Time { return now }}
	e.emitTombstoneAge(context.Background(), []Record{{State: StateDestroying, UpdatedAt: now.Add(-75 * time.Second)}})
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %v: %s", err, buf.String())
	}
	if line[MetricTombstoneOldestAge] != 75.0 || line["Deployment"] != "blue" || line["_aws"] == nil {
		t.Errorf("line %s: want %s 75, Deployment blue and an _aws member", buf.String(), MetricTombstoneOldestAge)
	}
}
