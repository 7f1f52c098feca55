package core

import (
	"context"
	"time"
)

// AcquireResult is a sandbox handed out to a thread.
type AcquireResult struct {
	Record Record
	Source Source
}

// ReleaseResult is the outcome of a release.
type ReleaseResult struct {
	SandboxID string
	// State is "warm" (parked for the thread) or "destroyed" (it was dead,
	// or the deployment is draining).
	State string
	Sync  *SyncResult // nil when no sync ran
	// SyncError describes why sync failed, if it did (the release still parks
	// or destroys; the result says what was deferred).
	SyncError string
}

// ReconcileStats summarise one reconcile pass.
type ReconcileStats struct {
	Expired  int           `json:"expired"`
	Killed   int           `json:"killed"`
	Dead     int           `json:"dead"`
	Errors   int           `json:"errors"`
	Duration time.Duration `json:"duration_ns"`
}

// Broker is what the HTTP layer and the Lambda functions call. *Engine
// implements it.
type Broker interface {
	Acquire(ctx context.Context, key ThreadKey) (AcquireResult, error)
	Release(ctx context.Context, tenant, sandboxID string) (ReleaseResult, error)
	Sync(ctx context.Context, tenant, sandboxID string) (SyncResult, error)
	Get(ctx context.Context, tenant, sandboxID string) (Record, error)
	Capacity(ctx context.Context) (CapacityStatus, error)
	Reconcile(ctx context.Context) (ReconcileStats, error)
}
