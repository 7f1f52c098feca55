package core

import (
	"context"
	"log/slog"
	"time"
)

// MetricsNamespace is the CloudWatch namespace of the broker's metrics.
const MetricsNamespace = "SandboxBroker"

// Metrics returns the pass's stats as metrics (all Count but DurationMs),
// in a fixed order: the members of the pass's EMF record.
func (s ReconcileStats) Metrics() []Metric {
	count := func(name string, v int) Metric { return Metric{Name: name, Unit: "Count", Value: float64(v)} }
	exhausted := 0
	if s.BudgetExhausted {
		exhausted = 1
	}
	return []Metric{
		count("Discovered", s.Discovered), count("Adopted", s.Adopted), count("Duplicates", s.Duplicates),
		count("Orphans", s.Orphans), count("Deferred", s.Deferred), count("Killed", s.Killed),
		count("Dead", s.Dead), count("Expired", s.Expired), count("ReleasesTakenOver", s.ReleasesTakenOver),
		count("Paused", s.Paused), count("PausedExpired", s.PausedExpired), count("PausesFinished", s.PausesFinished),
		count("TombstonesRetried", s.TombstonesRetried), count("ExpiringSent", s.ExpiringSent),
		count("LeasesEnded", s.LeasesEnded),
		count("ReservationsSettled", s.ReservationsSettled), count("PoolCreated", s.PoolCreated),
		count("PoolRecycled", s.PoolRecycled), count("PoolRefillFailures", s.PoolRefillFailures),
		count("TimersExtended", s.TimersExtended),
		count("OutputsStored", s.OutputsStored), count("OutputsAbandoned", s.OutputsAbandoned),
		count("LedgerRepaired", s.LedgerRepaired),
		count("Pages", s.Pages), count("BudgetExhausted", exhausted), count("Errors", s.Errors),
		{Name: "DurationMs", Unit: "Milliseconds", Value: float64(s.Duration.Milliseconds())},
	}
}

// EMFAttrs returns the attributes that make one JSON log line the pass's
// CloudWatch embedded-metric-format record (EMFAttrs of Metrics).
func (s ReconcileStats) EMFAttrs(deployment string, at time.Time) []slog.Attr {
	return EMFAttrs(deployment, at, s.Metrics()...)
}

// LogReconcilePass writes a pass's one JSON line "reconcile pass": the
// stats (snake_case, as returned to callers), the error that ended the
// pass if any (the line is then at WARN), and the same numbers as an EMF
// record. Like LogEMF it bypasses the logger's level: the ReconcileFailing
// alarm reads these lines, so LOG_LEVEL=WARN or ERROR must not drop them.
func LogReconcilePass(ctx context.Context, logger *slog.Logger, deployment string, at time.Time, st ReconcileStats, err error) {
	attrs := append(st.EMFAttrs(deployment, at), slog.Any("stats", st))
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	logUnfiltered(ctx, logger, level, "reconcile pass", at, attrs)
}

// emit logs the pass's line (LogReconcilePass).
func (p *pass) emit(ctx context.Context, err error) {
	LogReconcilePass(ctx, p.e.log, p.e.s.Deployment, p.e.now(), p.st, err)
}
