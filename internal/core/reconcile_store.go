package core

import (
	"context"
	"time"
)

// PendingReservation is a reservation (a slot taken for a create) as
// reconcile sees it.
type PendingReservation struct {
	Token string
	ThreadKey
	CreatedAt time.Time
	// ExpiresAt is the create's deadline; after it the create is presumed
	// crashed.
	ExpiresAt time.Time
}

// ReconcileLookup is the stored state of a batch of sandboxes, threads and
// reservations. Missing keys are absent from the maps.
type ReconcileLookup struct {
	Records      map[string]Record
	Bindings     map[ThreadKey]Binding
	Reservations map[string]PendingReservation
}

// Adoption asks the store to record a sandbox it does not track.
type Adoption struct {
	// Record is written as is (Fence 1); it must not exist yet.
	Record Record
	// Reservation, when set, is consumed (it must still exist): its slot
	// becomes the record's. Otherwise a new slot is taken, without a limit
	// check (the sandbox exists and uses capacity whatever the ledger says).
	Reservation string
	// Bind points the thread's binding at the record; the binding must
	// still be From (FromBound false: there must be none).
	Bind      bool
	From      Binding
	FromBound bool
	// Canonical, when set, requires the thread's binding to still name
	// this sandbox (a duplicate is adopted only to be killed).
	Canonical string
}

// ReconcileCursor is where the inventory walk stands, kept between passes.
type ReconcileCursor struct {
	// Cycle names the walk in progress ("" = start a new one); CycleStart
	// is when it began. A cycle is complete when its last page was read.
	Cycle      string
	CycleStart time.Time
	// Token is the provider cursor of the next page to read.
	Token string
	// Pass counts the passes of this cycle so far.
	Pass int
	// Version fences cursor writes (compare and swap).
	Version int64
	// Pool is what the last pass saw of the pool's place count.
	Pool NotedCount
}

// NotedCount is what a reconcile pass saw of a count kept with its
// holders (the pool's places): a repair needs two
// passes that saw the same count, holders and revision.
type NotedCount struct {
	// Used is the count as stored, Counted its holders as counted.
	Used    int
	Counted int
	// Revision is the count's revision (every move of it moves it).
	Revision int64
	// Noted: the pass saw the count.
	Noted bool
}

// SeenSandbox is one sandbox of a cycle's inventory.
type SeenSandbox struct {
	ID          string
	Reservation string
}

// ReconcileStore is the store access reconcile's inventory walk needs:
// records, bindings and reservations by id, adoption, and the walk's
// cursor and sightings. Errors follow Store's classification:
// ErrConflict means a condition did not hold and nothing was written.
type ReconcileStore interface {
	// LookupMany reads records, bindings and reservations (strongly consistent).
	LookupMany(ctx context.Context, ids []string, keys []ThreadKey, tokens []string) (ReconcileLookup, error)
	// Adopt writes a record for an untracked sandbox (see Adoption).
	Adopt(ctx context.Context, a Adoption) (Record, error)
	// Rebind points key's binding at sandboxID, if the binding is still
	// from (fromBound false: absent) and the record is in a live state.
	Rebind(ctx context.Context, key ThreadKey, sandboxID string, from Binding, fromBound bool) error
	// ClaimDuplicate is Store.Claim, applied only if key's binding still
	// names canonical (else ErrConflict).
	ClaimDuplicate(ctx context.Context, c Claim, key ThreadKey, canonical string) (Record, error)
	// FirstSeen records now as the first sighting of sandboxID unless one
	// is recorded, and returns the first sighting.
	FirstSeen(ctx context.Context, sandboxID string, now time.Time) (time.Time, error)
	// Cursor reads the inventory cursor (zero value if none).
	Cursor(ctx context.Context) (ReconcileCursor, error)
	// SaveCursor writes c if the stored version is still c.Version (else
	// ErrConflict) and increments the version.
	SaveCursor(ctx context.Context, c ReconcileCursor) error
	// SaveSeen stores part of a cycle's inventory; Seen reads all of it.
	SaveSeen(ctx context.Context, cycle, part string, seen []SeenSandbox) error
	Seen(ctx context.Context, cycle string) ([]SeenSandbox, error)
	// ScanState calls fn for every record in state (for StateCreating:
	// every reservation, as a Record with ReservationToken, ThreadKey,
	// CreatedAt and ExpiresAt), until fn returns false.
	ScanState(ctx context.Context, state State, fn func(Record) bool) error
}

// OwedOutputsStore notes the sandboxes whose outputs a release left
// partly uncopied, until reconcile has copied them.
type OwedOutputsStore interface {
	// NoteOutputsOwed records that sandboxID's outputs are not all stored
	// (a release deferred some), so that reconcile copies the rest at
	// its next pass; noting it again changes nothing.
	NoteOutputsOwed(ctx context.Context, sandboxID string, now time.Time) error
	// OutputsOwed lists up to limit sandboxes noted by NoteOutputsOwed
	// and not forgotten since, oldest note first (strongly consistent).
	OutputsOwed(ctx context.Context, limit int) ([]string, error)
	// ForgetOutputsOwed drops sandboxID's note (nothing to do when there
	// is none).
	ForgetOutputsOwed(ctx context.Context, sandboxID string) error
}

// CounterRepair is what one CapacityStore.RepairCounters call corrected.
type CounterRepair struct {
	// Slots is the correction applied to the deployment's used slots.
	Slots int
	// Counters is how many other counters were corrected (users' and
	// tenants' slot counts, tenants' paused counts, the slots held in
	// trust for waiters).
	Counters int
	// Rebalanced reports that the limit's split was rewritten.
	Rebalanced bool
	// TenantsDropped lists the tenants that left the fair-share sets.
	TenantsDropped []string
	// PausedSlots is the correction applied to the paused slots held
	// (counted apart from the running slots).
	PausedSlots int
	// Pool is the pool place count as this call read it, with the holders
	// it counted: an exact count when it sees a difference the second time
	// at the same revision (nil when it did not get that far, or that count
	// failed); the reconcile pass repairs it on two passes' equal figures.
	Pool *HolderCount
}

// HolderCount is a count kept with its holders: the count and its
// revision (strongly consistent; every take and give-back moves the
// revision), read before the holders were counted from the state index
// (eventually consistent).
type HolderCount struct {
	Used     int
	Revision int64
	Counted  int
}
