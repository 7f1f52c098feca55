package core

import "context"

// ReleaseOptions change how a release parks the sandbox. The zero value
// is Release's: parked warm, or paused at once when
// SANDBOX_PAUSE_AFTER_SECONDS=0.
type ReleaseOptions struct {
	// Destroy ends the sandbox instead of parking it, once its outputs
	// are stored: a sandbox no thread comes back to (an E2B kill of a
	// one-off sandbox). When the copy is incomplete or failed it is
	// parked as usual, so reconcile copies the rest before it expires.
	Destroy bool
	// Pause parks it paused at once, as SANDBOX_PAUSE_AFTER_SECONDS=0
	// does, where the provider can pause (an E2B pause or kill); else warm.
	Pause bool
}

// Sandboxes lists up to limit of tenant's sandboxes (active, warm and
// paused), from cursor ("" = the first page); next is the following
// page's cursor, "" after the last. Records carry their access tokens:
// callers show them to their tenant only.
func (e *Engine) Sandboxes(ctx context.Context, tenant, cursor string, limit int) (recs []Record, next string, err error) {
	return e.store.TenantSandboxes(ctx, tenant, cursor, limit)
}
