package core_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// TestReconcileLogsOneEMFLine: a pass logs its stats as one JSON line that
// is also a CloudWatch embedded-metric-format record (an _aws object
// declaring the metrics, each a top-level member), whatever the logger's
// level: the ReconcileFailing alarm reads it at LOG_LEVEL=WARN too.
func TestReconcileLogsOneEMFLine(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		t.Run(level.String(), func(t *testing.T) {
			buf, _ := reconcileLogs(t, level)
			line := passLine(t, buf.String())
			for _, name := range []string{"Errors", "BudgetExhausted", "Killed", "Expired", "Discovered"} {
				if _, ok := line[name].(float64); !ok {
					t.Errorf("pass record lacks %s: %v", name, line)
				}
			}
			if line["Discovered"] != 1.0 || line["Adopted"] != 1.0 {
				t.Errorf("Discovered %v Adopted %v, want 1 1", line["Discovered"], line["Adopted"])
			}
			if stats, _ := line["stats"].(map[string]any); stats["discovered"] != 1.0 {
				t.Errorf("stats = %v, want discovered 1", line["stats"])
			}
		})
	}
}

// reconcileLogs runs one pass over a deployment with one untracked sandbox,
// logging at level, and returns what it logged (JSON lines) and the
// harness.
func reconcileLogs(t *testing.T, level slog.Level) (*bytes.Buffer, *recHarness) {
	t.Helper()
	h := newRecHarness(t, nil)
	h.untracked(t, h.threadMeta("t1", 0))
	var buf bytes.Buffer
	eng, err := core.New(h.s, h.store, h.prov, nil, core.WithClock(h.clock.now), core.WithReconcileSettings(h.rs),
		core.WithLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level}))))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	if _, err := eng.Reconcile(context.Background()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return &buf, h
}

// passLine finds the one "reconcile pass" line in logs and checks its EMF
// envelope: namespace, Deployment "test", every declared metric a
// top-level number.
func passLine(t *testing.T, logs string) map[string]any {
	t.Helper()
	var line map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		if strings.Contains(l, `"msg":"reconcile pass"`) {
			if line != nil {
				t.Fatal("more than one stats line")
			}
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatalf("stats line is not JSON: %v: %s", err, l)
			}
		}
	}
	if line == nil {
		t.Fatalf("no stats line in %s", logs)
	}
	aws, _ := line["_aws"].(map[string]any)
	metrics, _ := aws["CloudWatchMetrics"].([]any)
	if aws["Timestamp"] == nil || len(metrics) != 1 {
		t.Fatalf("_aws = %v, want a timestamp and one metric directive", line["_aws"])
	}
	dir := metrics[0].(map[string]any)
	if dir["Namespace"] != core.MetricsNamespace || line["Deployment"] != "test" {
		t.Errorf("namespace %v deployment %v", dir["Namespace"], line["Deployment"])
	}
	for _, m := range dir["Metrics"].([]any) {
		name := m.(map[string]any)["Name"].(string)
		if _, ok := line[name].(float64); !ok {
			t.Errorf("metric %s has no numeric top-level value", name)
		}
	}
	return line
}

// TestReconcileWritesCapacityGauge: every pass writes CapacityUsed and
// CapacityLimit (the saturation alarm's inputs), whether or not any
// acquire was refused.
func TestReconcileWritesCapacityGauge(t *testing.T) {
	buf, h := reconcileLogs(t, slog.LevelInfo)
	found := 0
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) != nil || line[core.MetricCapacityLimit] == nil {
			continue
		}
		found++
		// The pass adopted the one untracked sandbox: it holds a slot.
		if line[core.MetricCapacityUsed] != 1.0 || line[core.MetricCapacityLimit] != float64(h.s.Limit()) || line["_aws"] == nil {
			t.Errorf("capacity line %s: want %s 1, %s %d and an _aws member", l, core.MetricCapacityUsed, core.MetricCapacityLimit, h.s.Limit())
		}
	}
	if found != 1 {
		t.Errorf("%d capacity gauge lines, want 1:\n%s", found, buf.String())
	}
}

func TestReconcileDrainingExpiresEveryWarmSandbox(t *testing.T) {
	h := newRecHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, "t1")
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if st := h.pass(t); st.Expired != 0 {
		t.Fatalf("expired a fresh warm sandbox: %+v", st)
	}
	if err := h.eng.SetDraining(ctx, true); err != nil {
		t.Fatalf("SetDraining: %v", err)
	}
	if st := h.pass(t); st.Expired != 1 || h.fake.Alive(rec.SandboxID) {
		t.Errorf("pass while draining = %+v, alive %v; want the warm sandbox destroyed", st, h.fake.Alive(rec.SandboxID))
	}
}
