package core_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

func TestTombstoneAgeMetric(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		tombs []core.Record
		want  float64
	}{
		{"none", nil, 0},
		{"oldest wins", []core.Record{{UpdatedAt: now.Add(-90 * time.Second)}, {UpdatedAt: now.Add(-30 * time.Minute)}, {UpdatedAt: now}}, 1800},
		{"future clamps to 0", []core.Record{{UpdatedAt: now.Add(time.Minute)}}, 0},
		{"zero time ignored", []core.Record{{}, {UpdatedAt: now.Add(-2 * time.Second)}}, 2},
		{"first tombstoning counts, not the last retry", []core.Record{{DestroyingSince: now.Add(-10 * time.Minute), UpdatedAt: now.Add(-time.Second)}}, 600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := core.TombstoneAgeMetric(tt.tombs, now)
			if m.Name != core.MetricTombstoneOldestAge || m.Unit != "Seconds" || m.Value != tt.want {
				t.Errorf("got %+v, want %s Seconds %v", m, core.MetricTombstoneOldestAge, tt.want)
			}
		})
	}
}

// TestLogEMFIgnoresLevel: the metrics line is written even when the
// logger's level is above INFO, and it is one EMF record.
func TestLogEMFIgnoresLevel(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})).With("function", "acquire")
	at := time.UnixMilli(1_764_410_400_123)
	core.LogEMF(context.Background(), logger, "prod", at, core.CapacityMetrics(core.CapacityStatus{Limit: 5, Used: 4})...)
	core.LogEMF(context.Background(), logger, "prod", at) // nothing to write
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want 1: %s", len(lines), buf.String())
	}
	var line struct {
		AWS           emfMeta `json:"_aws"`
		Deployment    string
		Function      string  `json:"function"`
		Msg           string  `json:"msg"`
		CapacityUsed  float64 `json:"CapacityUsed"`
		CapacityLimit float64 `json:"CapacityLimit"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil {
		t.Fatalf("not JSON: %v: %s", err, lines[0])
	}
	d := line.AWS.CloudWatchMetrics
	if line.AWS.Timestamp != at.UnixMilli() || len(d) != 1 || d[0].Namespace != core.MetricsNamespace ||
		len(d[0].Dimensions) != 1 || len(d[0].Dimensions[0]) != 1 || d[0].Dimensions[0][0] != "Deployment" {
		t.Fatalf("_aws = %+v, want timestamp %d, one directive in %s with dimension Deployment", line.AWS, at.UnixMilli(), core.MetricsNamespace)
	}
	if got := d[0].Metrics; len(got) != 2 || got[0].Name != core.MetricCapacityUsed || got[1].Name != core.MetricCapacityLimit || got[0].Unit != "Count" {
		t.Errorf("metric definitions %+v", got)
	}
	if line.Deployment != "prod" || line.CapacityUsed != 4 || line.CapacityLimit != 5 || line.Function != "acquire" || line.Msg != "metrics" {
		t.Errorf("line %s: want Deployment prod, CapacityUsed 4, CapacityLimit 5, function acquire, msg metrics", lines[0])
	}
}
