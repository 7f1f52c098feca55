package core

import "context"

// SyncTarget is the sandbox whose outputs are copied and the thread whose
// object prefix they go to.
type SyncTarget struct {
	Ref SandboxRef
	ThreadKey
}

// DeferredFile is a file a sync pass did not copy, and why.
type DeferredFile struct {
	Path   string `json:"path"`
	Reason string `json:"reason"` // e.g. "max_files", "max_total_bytes", "file_too_large", "deadline", "unsafe_path", "error"
}

// SyncResult reports one sync pass (POST /v1/sandboxes/{id}/sync body).
type SyncResult struct {
	Uploaded int `json:"uploaded"`
	Skipped  int `json:"skipped"`
	// Deferred lists files a later pass may still copy (caps, deadline,
	// errors), with their reasons.
	Deferred []DeferredFile `json:"deferred"`
	// Excluded lists files no pass will copy as they are (policy: over the
	// per-file cap, unsafe or too long a name), with their reasons. They do
	// not make a pass incomplete.
	Excluded []DeferredFile `json:"excluded"`
	Bytes    int64          `json:"bytes"`
	// Complete is true when a later pass would copy nothing more: every
	// listed file is in the sink unchanged or excluded.
	Complete bool `json:"complete"`
	// Remaining (restores only): files left for a later pass because a
	// cap (files, bytes, time) stopped this one.
	Remaining int `json:"remaining,omitempty"`
}

// OutputSyncer copies a thread's output directories from its sandbox to
// durable storage. It returns ErrSandboxGone (wrapped) when the sandbox
// turned out dead during the pass.
type OutputSyncer interface {
	Sync(ctx context.Context, t SyncTarget) (SyncResult, error)
}

// OutputRestorer copies a thread's synced outputs back into a freshly
// created sandbox before it is handed out, and seeds the manifest so they
// are not uploaded again. An OutputSyncer may implement it. Only
// ErrSandboxGone (wrapped) or the context ending fail it; storage trouble
// is reported in the result's Deferred list.
type OutputRestorer interface {
	Restore(ctx context.Context, t SyncTarget) (SyncResult, error)
}

// RestoreResumer continues a restore that a cap cut short, into the same
// sandbox, never overwriting a file the agent wrote since. ran is false
// (and nothing is done) when no restore of this sandbox is pending. The
// engine calls it when it hands a thread's sandbox out again (reuse,
// reclaim); an OutputRestorer may implement it.
type RestoreResumer interface {
	ResumeRestore(ctx context.Context, t SyncTarget) (res SyncResult, ran bool, err error)
}

// Stored is what the output sink holds as the store records it: the bytes
// of one thread's objects, and its tenant's total over all its threads.
type Stored struct {
	Thread int64
	Tenant int64
}

// StoredChange sets the bytes recorded for a thread.
type StoredChange struct {
	ThreadKey
	// Prev is the thread's bytes as read (Stored.Thread): the change
	// applies only while they are still recorded (else ErrConflict).
	Prev int64
	// Bytes is what the thread's bytes become; its tenant's total moves
	// by Bytes-Prev.
	Bytes int64
	// TenantLimit, when > 0 and Bytes > Prev, caps the tenant's total
	// after the move (ErrStorageFull when it would pass it).
	TenantLimit int64
}

// StorageStore records what each thread and tenant stores in the output
// sink, so that a tenant's cap holds over all its threads: a sync pass
// lists only its own thread's objects. The tenant's total is the sum of
// its threads' recorded bytes, moved in the same transaction as each of
// them. Errors follow Store's classification, ErrStorageFull included.
type StorageStore interface {
	// StoredBytes reads what is recorded for key's thread and for its
	// tenant (zero when nothing is), strongly consistent.
	StoredBytes(ctx context.Context, key ThreadKey) (Stored, error)
	// RecordStored applies c: the thread's bytes and its tenant's total,
	// in one transaction.
	RecordStored(ctx context.Context, c StoredChange) error
}
