package core

import (
	"context"
	"time"
)

// Binding is the thread -> sandbox pointer. Exactly one of SandboxID and
// Reservation is set: a reservation while a create is in flight.
type Binding struct {
	ThreadKey
	SandboxID   string
	Reservation string
	// ReservationExpiresAt is when an in-flight create is presumed crashed
	// and a peer may take the binding over (its slot stays held until
	// reconcile settles the reservation).
	ReservationExpiresAt time.Time
}

// Claim asks the store to move a record into a leased state.
type Claim struct {
	SandboxID string
	// Tenant must own the record, else ErrNotFound.
	Tenant string
	// From lists the states the record may be in.
	From []State
	// To is the new state; "" keeps the current one (a lease only).
	To    State
	Owner string
	Now   time.Time
	// LeaseUntil is the end of the lease taken; zero takes none (and clears
	// an expired one): the record moves straight into a stable state.
	LeaseUntil time.Time
	// Below, when set, makes the claim also conditional on a tenant's slot
	// count (ErrAtFairShare when it is not below).
	Below *TenantBelow
}

// TenantBelow is a condition on a tenant's slot count: Tenant holds fewer
// than Slots slots (its count as SANDBOX_MAX_PER_TENANT keeps it). An
// eviction of another tenant's warm sandbox carries it, so that a tenant
// never evicts past its fair share, however many of its acquires run at
// once.
type TenantBelow struct {
	Tenant string
	Slots  int
}

// Update is a fenced write by a lease holder: it applies only if the record's
// fence still equals Fence (else ErrStaleFence), then increments the fence.
type Update struct {
	SandboxID string
	Fence     int64
	State     State
	// KeepLease leaves the lease in place (the caller goes on); otherwise the
	// lease is cleared.
	KeepLease bool
	Now       time.Time
	// ParkedAt is set when State is StateWarm.
	ParkedAt time.Time
	// ExpiresAt, when non-zero, records the provider timeout set.
	ExpiresAt time.Time
	// KillAttempt increments the record's kill attempt counter.
	KillAttempt bool
	// UnlessDraining makes the write conditional on the deployment not
	// draining (else ErrDraining, nothing written).
	UnlessDraining bool
	// Slot is the record's Slot as the caller read it (the fence makes it
	// current): when its Counted differs from State the write moves the
	// record's count in its bucket too (then, as with UnlessDraining, it
	// returns the zero Record). The zero Slot moves no count.
	Slot Slot
}

// Reservation takes a capacity slot and binds the thread to an in-flight
// create, atomically.
type Reservation struct {
	Token string
	ThreadKey
	Seed  string
	Limit int
	// MaxPerUser, when > 0, caps the slots one (tenant, user) may hold; the
	// per-user count moves in the same transaction as the deployment's.
	MaxPerUser int
	// MaxPerTenant, when > 0, caps the slots one tenant may hold across its
	// users; the tenant's count moves in the same transaction.
	MaxPerTenant int
	Now          time.Time
	// ExpiresAt bounds the create; after it peers may replace the binding.
	ExpiresAt time.Time
	// ReplaceSandboxID, when set, is the dead or destroying sandbox the
	// binding currently names; the reservation replaces it only if the
	// binding still names it. ReplaceReservation likewise names an expired
	// reservation to take over. Both empty: the binding must not exist.
	ReplaceSandboxID   string
	ReplaceReservation string
	// Freed, when not nil, is the slot the caller just freed for this
	// reservation (an eviction): the store tries its bucket first, where
	// a slot is free unless a peer took it.
	Freed *Slot
}

// Waiter is one acquire waiting for a slot: it holds one of its tenant's
// Max waiter places until it leaves or Until passes (an invocation that
// dies never holds a place past its own wait).
type Waiter struct {
	Tenant string
	Ticket string
	Max    int
	Now    time.Time
	Until  time.Time
}

// Lookup is what acquire reads first: the thread's binding (Bound false if
// none), whether the deployment drains and the tenant's slot count, in one
// round trip.
type Lookup struct {
	Binding  Binding
	Bound    bool
	Draining bool
	// TenantUsed is the number of slots the thread's tenant holds.
	TenantUsed int
}

// Store is the durable state of the broker (DynamoDB in production).
//
// Write errors are classified: ErrNotFound, ErrConflict, ErrLeaseHeld,
// ErrStaleFence, ErrThreadBound, ErrDraining and *CapacityError mean the
// write certainly did not apply; an error wrapping ErrStoreUnavailable
// means it may have; any other error (a bug or a misconfiguration, such as
// a missing table) certainly did not apply.
type Store interface {
	// Lookup reads the thread's binding, the draining flag and the tenant's
	// slot count (strongly consistent).
	Lookup(ctx context.Context, key ThreadKey) (Lookup, error)
	// Get reads a record (strongly consistent); ErrNotFound if none.
	Get(ctx context.Context, sandboxID string) (Record, error)
	// Claim applies c if the record belongs to c.Tenant (else ErrNotFound),
	// is in one of c.From (else ErrConflict) and carries no live lease of
	// another owner at c.Now (else ErrLeaseHeld), and, with c.Below, the
	// tenant it names holds fewer than c.Below.Slots slots (else
	// ErrAtFairShare). It returns the new record, and with ErrConflict or
	// ErrLeaseHeld the record as it was found.
	Claim(ctx context.Context, c Claim) (Record, error)
	// Apply makes a fenced update and returns the new record.
	Apply(ctx context.Context, u Update) (Record, error)
	// Reserve takes a slot (a *CapacityError when Limit slots are held) and
	// binds the thread to the reservation (ErrThreadBound when the binding is
	// not what r expects).
	// The *CapacityError's reason is RefusalCapacity when Limit slots are
	// held (with the deployment's counts and Tenants filled in),
	// RefusalDraining when the deployment drains, RefusalUserQuota when the
	// user's cap is reached, RefusalTenantQuota when the tenant's.
	Reserve(ctx context.Context, r Reservation) error
	// Finalize turns reservation token into the record rec (state active),
	// moving the binding to rec.SandboxID. ErrConflict if the reservation is
	// no longer the thread's.
	Finalize(ctx context.Context, token string, rec Record) (Record, error)
	// FreeReservation drops a reservation whose create certainly failed (or
	// whose sandbox was confirmed killed) and frees its slot.
	FreeReservation(ctx context.Context, token string, key ThreadKey) error
	// Free marks rec gone (fenced by rec.Fence) and frees its slot (and its
	// user's and tenant's): call only after the provider confirmed the sandbox is gone.
	Free(ctx context.Context, rec Record, now time.Time) error
	// EnterWait takes one of w.Tenant's w.Max waiter places (one that is
	// free, or whose holder's Until has passed) and returns it; a
	// *CapacityError with RefusalTooManyWaiters when every place is held.
	EnterWait(ctx context.Context, w Waiter) (place int, err error)
	// LeaveWait gives back the place if w.Ticket still holds it.
	LeaveWait(ctx context.Context, w Waiter, place int) error
	// SetDraining marks the deployment draining (or not).
	SetDraining(ctx context.Context, draining bool) error
	// Capacity reports the deployment's slots by state from counters kept
	// with the slots (a constant number of reads whatever the fleet size).
	Capacity(ctx context.Context) (CapacityStatus, error)
	// WarmParkedBefore lists up to limit warm records parked before t,
	// oldest first.
	WarmParkedBefore(ctx context.Context, t time.Time, limit int) ([]Record, error)
	// Sample lists up to limit records in state, oldest first, of a random
	// part of them (at least a quarter; all of them when that part holds
	// fewer than four): eviction's candidates, found in fewer reads than
	// the exact order of all costs. Empty only when none is in state.
	Sample(ctx context.Context, state State, limit int) ([]Record, error)
	// Tombstones lists up to limit records in StateDestroying.
	Tombstones(ctx context.Context, limit int) ([]Record, error)
}
