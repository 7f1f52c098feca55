package core

import (
	"context"
	"log/slog"
	"slices"
	"time"
)

// Metrics emitted outside reconcile's pass line (ReconcileStats.Metrics),
// all in MetricsNamespace with the single dimension Deployment (the
// deployment id). The CDK stack's alarms and dashboard read them
// (infra/stack).
const (
	// MetricCapacityUsed is a gauge (Count): slots held, each time the
	// capacity ledger is read (GET /v1/capacity, a 429 refusal).
	MetricCapacityUsed = "CapacityUsed"
	// MetricCapacityLimit is a gauge (Count): the deployment's limit
	// (replicas, plus the burst limit under the burst policy), at the same
	// reads.
	MetricCapacityLimit = "CapacityLimit"
	// MetricCapacityRejected counts (Count) acquires answered 429.
	MetricCapacityRejected = "CapacityRejected"
	// MetricTombstoneOldestAge is a gauge (Seconds), once per reconcile
	// pass: the age of the oldest tombstone, 0 when there is none.
	MetricTombstoneOldestAge = "TombstoneOldestAgeSeconds"
	// MetricSyncDeferred counts (Count) the files a sync pass deferred
	// (not uploaded: caps, deadline, errors), once per pass.
	MetricSyncDeferred = "SyncDeferredFiles"
	// MetricEventsFailed counts (Count) lifecycle events that could not be
	// published (the transitions themselves happened).
	MetricEventsFailed = "EventsPublishFailed"
)

// Metric is one value of an embedded-metric-format record. Unit is a
// CloudWatch unit name ("Count", "Seconds", "Milliseconds").
type Metric struct {
	Name  string
	Unit  string
	Value float64
}

// Dimension is one dimension of an EMF record: its name and value.
type Dimension struct {
	Name  string
	Value string
}

// Dimension names.
const (
	DimensionDeployment = "Deployment"
	DimensionTenant     = "Tenant"
)

// EMFAttrs returns log attributes that make one JSON log line a CloudWatch
// embedded metric format record holding metrics under the dimension set
// [Deployment] (EMFAttrsWith).
func EMFAttrs(deployment string, at time.Time, metrics ...Metric) []slog.Attr {
	return EMFAttrsWith([]Dimension{{DimensionDeployment, deployment}}, at, metrics...)
}

// EMFAttrsWith returns log attributes that make one JSON log line a
// CloudWatch embedded metric format record holding metrics: the "_aws"
// metadata object (timestamp in Unix milliseconds, one directive with
// namespace MetricsNamespace, one dimension set of dims' names in order
// and the metric definitions in order) plus one top-level member per
// dimension and per metric (format per the CloudWatch EMF specification).
// It is the one builder of EMF records: every metrics line goes through it.
func EMFAttrsWith(dims []Dimension, at time.Time, metrics ...Metric) []slog.Attr {
	defs := make([]map[string]string, len(metrics))
	for i, m := range metrics {
		defs[i] = map[string]string{"Name": m.Name, "Unit": m.Unit}
	}
	names := make([]string, len(dims))
	for i, d := range dims {
		names[i] = d.Name
	}
	attrs := make([]slog.Attr, 0, len(metrics)+len(dims)+1)
	attrs = append(attrs,
		slog.Any("_aws", map[string]any{
			"Timestamp": at.UnixMilli(),
			"CloudWatchMetrics": []map[string]any{{
				"Namespace":  MetricsNamespace,
				"Dimensions": [][]string{names},
				"Metrics":    defs,
			}},
		}))
	for _, d := range dims {
		attrs = append(attrs, slog.String(d.Name, d.Value))
	}
	for _, m := range metrics {
		attrs = append(attrs, slog.Float64(m.Name, m.Value))
	}
	return attrs
}

// LogEMF writes one JSON line "metrics" through logger's handler that is
// an EMF record of metrics (EMFAttrs). It bypasses the logger's level:
// alarms depend on these lines, so LOG_LEVEL=WARN or ERROR must not drop
// them. Nothing is written when metrics is empty or logger is nil.
func LogEMF(ctx context.Context, logger *slog.Logger, deployment string, at time.Time, metrics ...Metric) {
	if logger == nil || len(metrics) == 0 {
		return
	}
	logUnfiltered(ctx, logger, slog.LevelInfo, "metrics", at, EMFAttrs(deployment, at, metrics...))
}

// logUnfiltered writes one record through logger's handler whatever the
// handler's level.
func logUnfiltered(ctx context.Context, logger *slog.Logger, level slog.Level, msg string, at time.Time, attrs []slog.Attr) {
	if logger == nil {
		return
	}
	r := slog.NewRecord(at, level, msg, 0)
	r.AddAttrs(attrs...)
	_ = logger.Handler().Handle(ctx, r) // a log write that fails has nowhere to be reported
}

// CapacityMetrics are the gauges of one capacity read: CapacityUsed and
// CapacityLimit.
func CapacityMetrics(st CapacityStatus) []Metric {
	return []Metric{
		{Name: MetricCapacityUsed, Unit: "Count", Value: float64(st.Used)},
		{Name: MetricCapacityLimit, Unit: "Count", Value: float64(st.Limit)},
	}
}

// RejectedMetric counts one acquire answered 429.
func RejectedMetric() Metric {
	return Metric{Name: MetricCapacityRejected, Unit: "Count", Value: 1}
}

// SyncMetrics are the metrics of one sync pass: SyncDeferredFiles.
func SyncMetrics(res SyncResult) []Metric {
	return []Metric{{Name: MetricSyncDeferred, Unit: "Count", Value: float64(len(res.Deferred))}}
}

// EventsFailedMetric counts one lifecycle event not published.
func EventsFailedMetric() Metric {
	return Metric{Name: MetricEventsFailed, Unit: "Count", Value: 1}
}

// TombstoneAgeMetric is TombstoneOldestAgeSeconds for the tombstones
// tombs at now: now minus the earliest DestroyingSince among them (kill
// retries keep it; UpdatedAt for records written before the field
// existed); 0 when there are none; never negative.
func TombstoneAgeMetric(tombs []Record, now time.Time) Metric {
	var age time.Duration
	for _, r := range tombs {
		if r.UpdatedAt.IsZero() {
			continue
		}
		since := r.DestroyingSince
		if since.IsZero() {
			since = r.UpdatedAt // records tombstoned before the field existed
		}
		age = max(age, now.Sub(since))
	}
	return Metric{Name: MetricTombstoneOldestAge, Unit: "Seconds", Value: age.Seconds()}
}

// emitTombstoneAge logs TombstoneOldestAgeSeconds for tombs (the list a
// reconcile pass read) as one EMF line. Reconcile calls it once per pass,
// right after listing the tombstones.
func (e *Engine) emitTombstoneAge(ctx context.Context, tombs []Record) {
	now := e.now()
	LogEMF(ctx, e.log, e.s.Deployment, now, TombstoneAgeMetric(tombs, now))
}

// emitCapacity logs the capacity gauges (CapacityUsed, CapacityLimit) once
// per reconcile pass, so a deployment that stays full while its waiters
// still get slots reaches the saturation alarm (the HTTP functions write
// them only on capacity reads and refusals). A failed read writes nothing.
func (e *Engine) emitCapacity(ctx context.Context) {
	st, err := e.Capacity(ctx)
	if err != nil {
		e.log.WarnContext(ctx, "reconcile: capacity read for metrics failed", "err", err)
		return
	}
	LogEMF(ctx, e.log, e.s.Deployment, e.now(), CapacityMetrics(st)...)
}

// EmittedMetrics lists the names of every metric the broker emits:
// reconcile's pass stats (ReconcileStats.Metrics) and the metrics above,
// for checks that every metric an alarm reads is emitted.
func EmittedMetrics() []string {
	var names []string
	for _, m := range slices.Concat((ReconcileStats{}).Metrics(), CapacityMetrics(CapacityStatus{}),
		[]Metric{RejectedMetric(), TombstoneAgeMetric(nil, time.Time{}), EventsFailedMetric()}, SyncMetrics(SyncResult{}),
		UsageMetrics()) {
		names = append(names, m.Name)
	}
	return names
}
