package core

import (
	"context"
	"log/slog"
	"time"
)

// Usage metrics: the sandbox-seconds a deployment's tenants use, so that a
// platform can bill its own tenants (and see what pausing saves). Each is
// written (Seconds) on every metering write of a record (Record.MeteredAt)
// with the dimensions Deployment and Tenant: summed over any period they
// are the tenant's running and paused sandbox-seconds in it. Under
// TenantUsageEvents the dimension is Deployment alone (the deployment's
// totals), and a tenant's usage is in its events and usage log lines.
const (
	// MetricRunningSeconds: time sandboxes ran (every state but paused:
	// active, warm, and the transitions and tombstones around them).
	MetricRunningSeconds = "SandboxRunningSeconds"
	// MetricPausedSeconds: time sandboxes were paused at the provider.
	MetricPausedSeconds = "SandboxPausedSeconds"
)

// UsagePoolTenant is the Tenant dimension of the usage of pool members
// while no thread owns them (the deployment's own overhead). It cannot be
// a tenant id (those match ^[A-Za-z0-9_-]{1,64}$).
const UsagePoolTenant = "(pool)"

// UsageMetrics are the usage metrics, at zero (their names and units).
func UsageMetrics() []Metric {
	return []Metric{{Name: MetricRunningSeconds, Unit: "Seconds"}, {Name: MetricPausedSeconds, Unit: "Seconds"}}
}

// usageMetric is the metric of d spent in state s.
func usageMetric(s State, d time.Duration) Metric {
	name := MetricRunningSeconds
	if s == StatePaused {
		name = MetricPausedSeconds
	}
	return Metric{Name: name, Unit: "Seconds", Value: d.Seconds()}
}

// meter writes the usage rec's last write accounted for: one EMF line
// (dimensions as usageAttrs says) with the seconds of
// [PrevMeteredAt, MeteredAt) as running or paused time, and the sandbox,
// thread and interval as plain members (for per-sandbox audits; final
// marks the sandbox's last interval, metered when its slot is freed).
// Every metering write leaves one line, empty intervals included; records
// written before metering (no interval) write nothing.
//
// Each write takes its time before it reaches the store, so a write that
// lands just after a peer's may carry an earlier time: its interval is
// then a small negative correction, which keeps the sum of a sandbox's
// intervals exactly its metered life (they telescope: each starts where
// the write before it, in store order, ended).
func (e *Engine) meter(ctx context.Context, rec Record) {
	e.meterFinal(ctx, rec, false)
}

// metered meters rec when err is nil (a store write that returned the
// record it wrote), and returns both.
func (e *Engine) metered(ctx context.Context, rec Record, err error) (Record, error) {
	if err == nil {
		e.meter(ctx, rec)
	}
	return rec, err
}

func (e *Engine) meterFinal(ctx context.Context, rec Record, final bool) {
	// Milliseconds, as stored: an interval ends where the next one starts.
	rec.PrevMeteredAt, rec.MeteredAt = rec.PrevMeteredAt.Truncate(time.Millisecond), rec.MeteredAt.Truncate(time.Millisecond)
	if rec.PrevMeteredAt.IsZero() {
		return
	}
	d := rec.MeteredAt.Sub(rec.PrevMeteredAt)
	tenant := rec.Tenant
	if tenant == "" || rec.MeteredState == StatePooled {
		tenant = UsagePoolTenant
	}
	metered := rec.MeteredState
	if metered == StatePooled && rec.Slots.Paused {
		metered = StatePaused // a member parked paused: its time in the pool was paused time
	}
	attrs := e.usageAttrs(tenant, rec.MeteredAt, usageMetric(metered, d))
	attrs = append(attrs, slog.String("sandbox_id", rec.SandboxID), slog.String("user_id", rec.User),
		slog.String("thread_id", rec.Thread), slog.String("state", string(rec.MeteredState)),
		slog.Time("from", rec.PrevMeteredAt.UTC()), slog.Time("to", rec.MeteredAt.UTC()), slog.Bool("final", final))
	logUnfiltered(ctx, e.log, slog.LevelInfo, "usage", rec.MeteredAt, attrs)
}

// usageAttrs are the EMF attributes of one usage line of tenant: under
// the dimensions Deployment and Tenant, or, under TenantUsageEvents,
// Deployment alone with Tenant a plain member (a tenant's pair of custom
// metrics costs per month; the log line still names the tenant).
func (e *Engine) usageAttrs(tenant string, at time.Time, m Metric) []slog.Attr {
	dep := Dimension{DimensionDeployment, e.s.Deployment}
	if e.s.TenantUsage != TenantUsageEvents {
		return EMFAttrsWith([]Dimension{dep, {DimensionTenant, tenant}}, at, m)
	}
	return append(EMFAttrsWith([]Dimension{dep}, at, m), slog.String(DimensionTenant, tenant))
}

// meteredStore is the engine's Store: every write that moves a record's
// metering interval (Record.MeteredAt) is followed by its usage line, so
// no transition, whoever writes it, goes unmetered. A write the store
// makes without returning the record (a transaction) does not meter; its interval is metered by the record's
// next write (it must not change whether the sandbox runs).
type meteredStore struct {
	Store
	e *Engine
}

// Claim meters a claim that moved the record to another state.
func (m meteredStore) Claim(ctx context.Context, c Claim) (Record, error) {
	rec, err := m.Store.Claim(ctx, c)
	if err == nil && c.To != "" {
		m.e.meter(ctx, rec)
	}
	return rec, err
}

// Apply meters the fenced update.
func (m meteredStore) Apply(ctx context.Context, u Update) (Record, error) {
	rec, err := m.Store.Apply(ctx, u)
	return m.e.metered(ctx, rec, err)
}

// Finalize meters the create: from the time it was asked of the provider
// (rec.PrevMeteredAt) to the record's write.
func (m meteredStore) Finalize(ctx context.Context, token string, rec Record) (Record, error) {
	out, err := m.Store.Finalize(ctx, token, rec)
	if err == nil {
		m.e.meter(ctx, rec)
	}
	return out, err
}

// Free meters the last interval: from rec's last metering write (rec is
// current: the free is fenced by its fence) to now. A running slot freed
// is then offered to the wait queue (dispatchFreed).
func (m meteredStore) Free(ctx context.Context, rec Record, now time.Time) error {
	err := m.Store.Free(ctx, rec, now)
	if err == nil {
		m.meterEnd(ctx, rec, now)
	}
	if err == nil && rec.Slots.Running() {
		m.e.dispatchFreed(ctx, rec.Slot.Ref)
	}
	return err
}

// Reserve meters the last interval of the tombstone whose slot the
// reservation took over (Reservation.Handover), as Free does; the slot
// changed holder, so there is nothing to offer the wait queue.
func (m meteredStore) Reserve(ctx context.Context, r Reservation) error {
	err := m.Store.Reserve(ctx, r)
	if err == nil && r.Handover != nil {
		m.meterEnd(ctx, *r.Handover, r.Now)
	}
	return err
}

// meterEnd meters rec's last interval, from its last metering write to
// now, when rec ended (gone) at now.
func (m meteredStore) meterEnd(ctx context.Context, rec Record, now time.Time) {
	if rec.MeteredAt.IsZero() {
		return
	}
	rec.PrevMeteredAt, rec.MeteredAt, rec.MeteredState = rec.MeteredAt, now, rec.State
	m.e.meterFinal(ctx, rec, true)
}

// FreeReservation frees the reservation's slot, then offers it to the
// wait queue (where it was is the store's to know: capacity is read
// when someone waits).
func (m meteredStore) FreeReservation(ctx context.Context, token string, key ThreadKey) error {
	err := m.Store.FreeReservation(ctx, token, key)
	if err == nil {
		m.e.dispatchFreed(ctx, -1)
	}
	return err
}

// meteredReconcileStore is reconcile's store, metered as meteredStore:
// adoptions (from the sandbox's start) and duplicate claims.
type meteredReconcileStore struct {
	ReconcileStore
	e *Engine
}

// Adopt meters the adopted sandbox's time before the adoption.
func (m meteredReconcileStore) Adopt(ctx context.Context, a Adoption) (Record, error) {
	rec, err := m.ReconcileStore.Adopt(ctx, a)
	return m.e.metered(ctx, rec, err)
}

// ClaimDuplicate meters as Claim does.
func (m meteredReconcileStore) ClaimDuplicate(ctx context.Context, c Claim, key ThreadKey, canonical string) (Record, error) {
	rec, err := m.ReconcileStore.ClaimDuplicate(ctx, c, key, canonical)
	return m.e.metered(ctx, rec, err)
}

// poolStore is the metered PoolStore.
func (m meteredStore) poolStore() PoolStore {
	return meteredPoolStore{PoolStore: m.Store, e: m.e}
}

// meteredPoolStore is the pool's store, metered as meteredStore: a
// member's create, its claim by a thread (its time in the pool is the
// pool's) and an adoption.
type meteredPoolStore struct {
	PoolStore
	e *Engine
}

// FinalizePool meters the member's create.
func (m meteredPoolStore) FinalizePool(ctx context.Context, token string, rec Record) (Record, error) {
	out, err := m.PoolStore.FinalizePool(ctx, token, rec)
	if err == nil {
		m.e.meter(ctx, rec)
	}
	return out, err
}

// ClaimPoolMember meters the member's time in the pool.
func (m meteredPoolStore) ClaimPoolMember(ctx context.Context, c PoolClaim) (Record, error) {
	rec, err := m.PoolStore.ClaimPoolMember(ctx, c)
	return m.e.metered(ctx, rec, err)
}

// AdoptPoolSandbox meters the adopted member's time before the adoption.
func (m meteredPoolStore) AdoptPoolSandbox(ctx context.Context, rec Record, reservation string) (Record, error) {
	out, err := m.PoolStore.AdoptPoolSandbox(ctx, rec, reservation)
	return m.e.metered(ctx, out, err)
}

// ClaimPoolPause meters the member's running time before its pause.
func (m meteredPoolStore) ClaimPoolPause(ctx context.Context, c Claim, limit int) (Record, error) {
	rec, err := m.PoolStore.ClaimPoolPause(ctx, c, limit)
	return m.e.metered(ctx, rec, err)
}

// SettlePoolPause meters the pausing time.
func (m meteredPoolStore) SettlePoolPause(ctx context.Context, rec Record, now time.Time) (Record, error) {
	out, err := m.PoolStore.SettlePoolPause(ctx, rec, now)
	return m.e.metered(ctx, out, err)
}

// AbortPoolPause meters the pausing time.
func (m meteredPoolStore) AbortPoolPause(ctx context.Context, rec Record, now time.Time) (Record, error) {
	out, err := m.PoolStore.AbortPoolPause(ctx, rec, now)
	return m.e.metered(ctx, out, err)
}
