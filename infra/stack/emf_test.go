package stack

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

// TestDeclaredMetricsAreInRecords writes the records the functions write,
// through core's own writers and at LOG_LEVEL=WARN (a level the stack
// accepts), and checks that every metric this stack declares is in one of
// them: declared by the record's EMF directive under the stack's
// namespace and dimension, and present as a top-level number. A metric
// dropped from a record, or a record dropped by the log level, fails here.
func TestDeclaredMetricsAreInRecords(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, at := context.Background(), time.Unix(1_800_000_000, 0)
	core.LogReconcilePass(ctx, logger, "prod", at, core.ReconcileStats{}, nil)
	core.LogEMF(ctx, logger, "prod", at, core.CapacityMetrics(core.CapacityStatus{Limit: 2, Used: 1})...)
	core.LogEMF(ctx, logger, "prod", at, core.RejectedMetric())
	core.LogEMF(ctx, logger, "prod", at, core.TombstoneAgeMetric(nil, at))
	core.LogEMF(ctx, logger, "prod", at, core.SyncMetrics(core.SyncResult{})...)

	inRecord := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec struct {
			AWS struct {
				CloudWatchMetrics []struct {
					Namespace  string
					Dimensions [][]string
					Metrics    []struct{ Name, Unit string }
				}
			} `json:"_aws"`
		}
		var members map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("record is not JSON: %v: %s", err, l)
		}
		_ = json.Unmarshal([]byte(l), &members)
		if members[DimensionDeployment] != "prod" {
			t.Errorf("record without the %s dimension value: %s", DimensionDeployment, l)
		}
		for _, d := range rec.AWS.CloudWatchMetrics {
			if d.Namespace != MetricNamespace || len(d.Dimensions) != 1 || strings.Join(d.Dimensions[0], ",") != DimensionDeployment {
				t.Errorf("record directive namespace %q dimensions %v, the stack reads %s [%s]", d.Namespace, d.Dimensions, MetricNamespace, DimensionDeployment)
			}
			for _, m := range d.Metrics {
				if _, ok := members[m.Name].(float64); ok {
					inRecord[m.Name] = true
				} else {
					t.Errorf("record declares %s but has no numeric member for it: %s", m.Name, l)
				}
			}
		}
	}
	for _, m := range []string{MetricReconcileBudgetExhausted, MetricReconcileErrors, MetricReconcileKilled, MetricReconcileExpired,
		MetricCapacityUsed, MetricCapacityLimit, MetricCapacityRejected, MetricTombstoneOldestAge, MetricSyncDeferred} {
		if !inRecord[m] {
			t.Errorf("the stack declares metric %s; no record carries it", m)
		}
	}
}
