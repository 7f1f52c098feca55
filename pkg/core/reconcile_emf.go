package core

import (
	"context"
	"log/slog"
	"time"
)

// MetricsNamespace is the CloudWatch namespace of reconcile's metrics.
const MetricsNamespace = "SandboxBroker"

// emfMetrics names the metrics of a pass, in the order they are declared.
var emfMetrics = []struct{ name, unit string }{
	{"Discovered", "Count"}, {"Adopted", "Count"}, {"Duplicates", "Count"}, {"Orphans", "Count"},
	{"Deferred", "Count"}, {"Killed", "Count"}, {"Dead", "Count"}, {"Expired", "Count"},
	{"TombstonesRetried", "Count"}, {"ReservationsSettled", "Count"}, {"LedgerRepaired", "Count"},
	{"Pages", "Count"}, {"BudgetExhausted", "Count"}, {"Errors", "Count"}, {"DurationMs", "Milliseconds"},
}

func (s ReconcileStats) metricValues() map[string]float64 {
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	return map[string]float64{
		"Discovered": float64(s.Discovered), "Adopted": float64(s.Adopted), "Duplicates": float64(s.Duplicates),
		"Orphans": float64(s.Orphans), "Deferred": float64(s.Deferred), "Killed": float64(s.Killed),
		"Dead": float64(s.Dead), "Expired": float64(s.Expired), "TombstonesRetried": float64(s.TombstonesRetried),
		"ReservationsSettled": float64(s.ReservationsSettled), "LedgerRepaired": float64(s.LedgerRepaired),
		"Pages": float64(s.Pages), "BudgetExhausted": b2f(s.BudgetExhausted), "Errors": float64(s.Errors),
		"DurationMs": float64(s.Duration.Milliseconds()),
	}
}

// EMFAttrs returns log attributes that make one JSON log line a CloudWatch
// embedded metric format record (the "_aws" metadata object plus one
// top-level member per metric and dimension; format per the CloudWatch
// EMF specification): namespace MetricsNamespace, dimension Deployment.
func (s ReconcileStats) EMFAttrs(deployment string, at time.Time) []slog.Attr {
	defs := make([]map[string]string, len(emfMetrics))
	for i, m := range emfMetrics {
		defs[i] = map[string]string{"Name": m.name, "Unit": m.unit}
	}
	attrs := []slog.Attr{
		slog.Any("_aws", map[string]any{
			"Timestamp": at.UnixMilli(),
			"CloudWatchMetrics": []map[string]any{{
				"Namespace":  MetricsNamespace,
				"Dimensions": [][]string{{"Deployment"}},
				"Metrics":    defs,
			}},
		}),
		slog.String("Deployment", deployment),
	}
	vals := s.metricValues()
	for _, m := range emfMetrics {
		attrs = append(attrs, slog.Float64(m.name, vals[m.name]))
	}
	return attrs
}

// emit logs the pass's stats as one JSON line: the stats (snake_case, as
// returned to callers) and the same numbers as EMF metrics.
func (p *pass) emit(ctx context.Context, err error) {
	attrs := append(p.st.EMFAttrs(p.e.s.Deployment, p.e.now()), slog.Any("stats", p.st))
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	p.e.log.LogAttrs(ctx, level, "reconcile pass", attrs...)
}
