package core

import (
	"context"
	"time"
)

// AcquireResult is a sandbox handed out to a thread.
type AcquireResult struct {
	Record Record
	Source Source
	// Restore reports the outputs restored into a created sandbox (nil
	// when nothing ran: reuse, reclaim, or no restorer configured).
	Restore *SyncResult
	// Waiting, set by AcquireOrWait instead of a sandbox, is the
	// acquire's place in the wait queue.
	Waiting *Waiting
	// Previous names the thread's earlier sandbox and why it ended, when
	// this acquire replaced one that ended without the thread asking.
	// Only the acquire that moves the thread's binding off it answers it.
	Previous *Previous
}

// ReleaseResult is the outcome of a release.
type ReleaseResult struct {
	SandboxID string
	// State is "warm" (parked for the thread), "paused" (parked paused:
	// SANDBOX_PAUSE_AFTER_SECONDS=0) or "destroyed" (it was dead, or the
	// deployment is draining).
	State string
	Sync  *SyncResult // nil when no sync ran
	// SyncError describes why sync failed, if it did (the release still parks
	// or destroys; the result says what was deferred).
	SyncError string
}

// ReconcileStats summarise one reconcile pass.
type ReconcileStats struct {
	// Discovered: provider sandboxes of this deployment examined.
	Discovered int `json:"discovered"`
	// Adopted: canonical sandboxes whose binding or record was restored.
	Adopted int `json:"adopted"`
	// Duplicates: sandboxes of a thread besides its canonical one.
	Duplicates int `json:"duplicates"`
	// Orphans: sandboxes with no valid tenant/user/thread.
	Orphans int `json:"orphans"`
	// Deferred: decisions postponed (peer lease, grace, TTL, create in flight).
	Deferred int `json:"deferred"`
	// Killed: confirmed kills of duplicates, orphans and retried tombstones.
	Killed int `json:"killed"`
	// Dead: records whose sandbox was absent from a complete inventory, freed.
	Dead int `json:"dead"`
	// Expired: warm sandboxes destroyed after the idle timeout (or draining).
	Expired int `json:"expired"`
	// ReleasesTakenOver: releases whose invocation died midway (lease
	// lapsed), finished by the pass: outputs synced, then parked or destroyed.
	ReleasesTakenOver int `json:"releases_taken_over"`
	// Paused: idle warm sandboxes paused (pause-parking).
	Paused int `json:"paused"`
	// PausedExpired: paused sandboxes destroyed past SANDBOX_PAUSED_TTL_SECONDS
	// (or while draining).
	PausedExpired int `json:"paused_expired"`
	// PausesFinished: records left pausing or resuming by an invocation
	// that died (lease lapsed), paused by the pass.
	PausesFinished int `json:"pauses_finished"`
	// ExpiringSent: sandbox.expiring events sent (leases ending within
	// Settings.ExpiringLead, not renewed).
	ExpiringSent int `json:"expiring_sent"`
	// LeasesEnded: active sandboxes taken back because their lease ended
	// without a renewal or a release (outputs copied, then destroyed).
	LeasesEnded int `json:"leases_ended"`
	// TombstonesRetried: tombstones whose kill was attempted again.
	TombstonesRetried int `json:"tombstones_retried"`
	// ReservationsSettled: crashed creates adopted, killed or freed.
	ReservationsSettled int `json:"reservations_settled"`
	// PoolCreated: pool members created by the pass's refill.
	PoolCreated int `json:"pool_created"`
	// PoolRecycled: pool members destroyed for their age, an excess of the
	// pool's size, draining, or an interrupted hand-out.
	PoolRecycled int `json:"pool_recycled"`
	// PoolRefillFailures: the pool refill's failed creates in a row, as
	// the pass's refill left them (0 once a create succeeds); while it is
	// not 0 the refill backs off (RefillBackoff).
	PoolRefillFailures int `json:"pool_refill_failures"`
	// TimersExtended: provider timers moved later by the pass, of active
	// sandboxes whose timer would end before their end, and of warm ones
	// kept running until their outputs are stored.
	TimersExtended int `json:"timers_extended"`
	// OutputsStored: warm sandboxes whose outputs a release left
	// deferred, all stored by the pass.
	OutputsStored int `json:"outputs_stored"`
	// OutputsAbandoned: sandboxes destroyed before their outputs were all
	// stored (kept running MaxOutputsWait past their idle timeout, or
	// ended by the provider); each is logged as an error.
	OutputsAbandoned int `json:"outputs_abandoned"`
	// LedgerRepaired is the correction applied to the ledger's used count.
	LedgerRepaired int `json:"ledger_repaired"`
	// Pages: provider inventory pages read.
	Pages int `json:"pages"`
	// BudgetExhausted: a page, item or time budget stopped the walk, or the
	// invocation's remaining time stopped the pass (ReconcileReserve); the
	// next pass continues where this one stopped.
	BudgetExhausted bool `json:"budget_exhausted"`
	// InventoryComplete: this pass read the last page of a walk.
	InventoryComplete bool          `json:"inventory_complete"`
	Errors            int           `json:"errors"`
	Duration          time.Duration `json:"duration_ns"`
}

// Broker is what the HTTP layer and the Lambda functions call. *Engine
// implements it.
type Broker interface {
	AcquireOrWait(ctx context.Context, req AcquireRequest) (AcquireResult, error)
	Release(ctx context.Context, tenant, sandboxID string) (ReleaseResult, error)
	ReleaseWith(ctx context.Context, tenant, sandboxID string, opts ReleaseOptions) (ReleaseResult, error)
	Sandboxes(ctx context.Context, tenant, cursor string, limit int) ([]Record, string, error)
	Sync(ctx context.Context, tenant, sandboxID string) (SyncResult, error)
	Renew(ctx context.Context, tenant, sandboxID string, d time.Duration) (RenewResult, error)
	Get(ctx context.Context, tenant, sandboxID string) (Record, error)
	Metrics(ctx context.Context, tenant, sandboxID string, start, end time.Time) ([]SandboxMetric, error)
	Capacity(ctx context.Context) (CapacityStatus, error)
	Reconcile(ctx context.Context) (ReconcileStats, error)
	SetDraining(ctx context.Context, draining bool) error
}
