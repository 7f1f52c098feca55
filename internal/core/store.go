package core

import (
	"context"
	"slices"
	"strings"
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
	// PausedBelow, when set, makes the claim also conditional on two
	// tenants' paused counts (ErrAtFairShare when they are not as it says).
	PausedBelow *PausedBelow
}

// PausedBelow is a condition on paused counts: Tenant holds at most Held
// paused slots and the claimed record's tenant (Claim.Tenant) at least
// Held+2. A pause that evicts another tenant's paused sandbox carries it,
// so that after the eviction and the pause the evicting tenant still
// holds no more paused slots than the tenant it took one from.
type PausedBelow struct {
	Tenant string
	Held   int
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
	// EndReason, when set, records why the sandbox ends (Record.EndReason).
	EndReason string
	// Owner is the record's thread: with State StateWarm the record is
	// listed among its user's and tenant's warm records (Store.OwnWarm);
	// zero lists it nowhere.
	Owner ThreadKey
	// Slot is the record's Slot as the caller read it (the fence makes it
	// current).
	Slot Slot
}

// Renewal extends an active record's end (Record.ExpiresAt).
type Renewal struct {
	SandboxID string
	// Tenant must own the record, else ErrNotFound.
	Tenant string
	Now    time.Time
	// Until is the end asked for.
	Until time.Time
	// MaxLifetime, when > 0, cuts Until to the record's CreatedAt plus
	// MaxLifetime.
	MaxLifetime time.Duration
}

// Renewed is what a renewal found and left: Record as stored after it,
// Prev the end it had before. The end moved when Record.ExpiresAt is after
// Prev; otherwise nothing was written.
type Renewed struct {
	Record Record
	Prev   time.Time
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
	// Grant, when set, is the slot a dispatch holds in trust for this
	// acquire's ticket: the reservation takes it over (the slots held
	// unchanged, Limit not checked) and the ticket and its place
	// leave the queue, in the same transaction; ErrGrantLost when the
	// ticket no longer holds it.
	Grant *Grant
	// Handover, when set, is the tombstone of another thread's sandbox
	// whose kill the caller confirmed, under its lease (its Fence
	// current): its running slot passes to the reservation in the same
	// write, as if freed and taken again at once. The record ends gone,
	// its user's and tenant's counts give the slot up, and the
	// reservation's quotas, Limit and draining are checked as for a free
	// slot. ErrStaleFence when the record moved; ErrConflict when the slot
	// cannot change holder (a lowered limit: free it and take one as
	// usual), with Grant, or for a record of no tenant.
	Handover *Record
}

// Waiter is one acquire about to wait for a slot: it holds one of its
// tenant's Max waiter places, and a ticket in the deployment's wait queue,
// until it leaves or Until passes (an invocation that dies never holds a
// place past its own wait).
type Waiter struct {
	Tenant string
	Ticket string
	Max    int
	Now    time.Time
	Until  time.Time
}

// Ticket is a waiter's entry in the deployment's wait queue. The queue is
// served in the order of Key: the ticket's round, then its arrival. A
// tenant's first waiter joins the round of the queue's head; each further
// waiter it has at once, one round later than the latest round it holds
// (round-robin across tenants).
type Ticket struct {
	ID     string
	Tenant string
	// Place is the tenant's waiter place the ticket holds.
	Place int
	Round int
	// Key is the ticket's sort key in the queue: round, arrival, ID.
	Key string
	// Arrived is the waiter's Now at EnterWait; Until its Until.
	Arrived time.Time
	Until   time.Time
}

// Grant is a running slot a dispatch holds in trust for a waiting ticket:
// counted where Slot says, so no other acquire takes it, until the
// ticket's waiter consumes it (Reservation.Grant, ResumeClaim.Grant), or
// gives it back (LeaveWait), or it lapses at Until and a dispatch passes
// it on to the next waiter (or frees it).
type Grant struct {
	Ticket Ticket
	Slot   SlotRef
	Until  time.Time
}

// TicketState is a ticket as PollTicket reads it.
type TicketState struct {
	// Gone: the ticket is no longer in the queue (served, left, or lapsed
	// and removed by a dispatch).
	Gone bool
	// Granted: a slot is held in trust for it (Grant).
	Granted bool
	Grant   Grant
	// Draining: the deployment started draining while it waited.
	Draining bool
}

// Dispatch asks the store to serve the wait queue in order: lapsed
// tickets are removed, lapsed grants passed on to the next live waiting
// ticket (or their slot freed when none waits), and the first live
// waiting tickets are granted the slots there is room for.
type Dispatch struct {
	Now   time.Time
	Limit int
	// Freed is where a slot was just freed, the place to try first
	// (NoSlotRef: none).
	Freed SlotRef
	// Scan looks for room anywhere when Freed has none (reconcile; a free
	// that does not know its place). Self, when set, is the dispatching
	// waiter's ticket: capacity is read only when it is the first live
	// waiting ticket (so waiting does not read capacity, except the
	// head's own turn).
	Scan bool
	Self string
	// GrantFor is how long a grant stays its ticket's before it lapses.
	GrantFor time.Duration
}

// DispatchResult is what a Dispatch did and saw.
type DispatchResult struct {
	// Granted lists the tickets granted a slot (handed-on grants included).
	Granted []Ticket
	// Head is the first live waiting ticket left without a grant ("": none).
	// A waiter's turn that finds another live waiting ticket ahead of its
	// own in the part of the queue it reads first stops there: Head is
	// that ticket, ahead of the waiter's though not always the queue's
	// first.
	Head string
	// Read reports that capacity was read: Status and Tenants are as a
	// capacity refusal's.
	Read    bool
	Status  CapacityStatus
	Tenants []string
	// Cleaned counts lapsed tickets removed and lapsed grants passed on or
	// freed.
	Cleaned int
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

// Store is the durable state of the broker (DynamoDB in production, in
// memory in tests: one conformance suite holds both to this contract),
// split by concern.
//
// Write errors are classified: ErrNotFound, ErrConflict, ErrLeaseHeld,
// ErrStaleFence, ErrThreadBound, ErrDraining, ErrGrantLost and *CapacityError mean the
// write certainly did not apply; an error wrapping ErrStoreUnavailable
// means it may have; any other error (a bug or a misconfiguration, such as
// a missing table) certainly did not apply.
type Store interface {
	RecordStore
	CapacityStore
	WaitStore
	PauseStore
	PoolStore
	PoolPlaceStore
	ReconcileStore
	OwedOutputsStore
	WebhookStore
}

// WebhookStore remembers the provider webhooks applied, so that a replay
// is refused.
type WebhookStore interface {
	// SeenWebhook records the webhook event id as seen until until, in one
	// conditional write: ErrConflict when it was recorded before and that
	// record has not lapsed at now (a replay). The store may forget it
	// after until.
	SeenWebhook(ctx context.Context, id string, now, until time.Time) error
}

// RecordStore reads and moves sandbox records and thread bindings.
type RecordStore interface {
	// Lookup reads the thread's binding, the draining flag and the
	// tenant's slot count, in a deployment of limit slots (strongly
	// consistent).
	Lookup(ctx context.Context, key ThreadKey, limit int) (Lookup, error)
	// Get reads a record (strongly consistent); ErrNotFound if none.
	Get(ctx context.Context, sandboxID string) (Record, error)
	// Claim applies c if the record belongs to c.Tenant (else ErrNotFound),
	// is in one of c.From (else ErrConflict) and carries no live lease of
	// another owner at c.Now (else ErrLeaseHeld), and, with c.Below, the
	// tenant it names holds fewer than c.Below.Slots slots (else
	// ErrAtFairShare). It returns the new record, and with ErrConflict or
	// ErrLeaseHeld the record as it was found.
	Claim(ctx context.Context, c Claim) (Record, error)
	// Renew moves an active record's end later: if it belongs to r.Tenant
	// (else ErrNotFound) and is active (else ErrConflict, with the record
	// as found in Renewed.Record), its ExpiresAt becomes r.Until (cut by
	// r.MaxLifetime) when that is later than the one it has, with its
	// fence incremented and its lease and state untouched; an end already
	// as late is left as it is (nothing written, no error). One
	// conditional write (two when the cut applies).
	Renew(ctx context.Context, r Renewal) (Renewed, error)
	// Apply makes a fenced update and returns the new record.
	Apply(ctx context.Context, u Update) (Record, error)
	// MarkExpiring notes that a sandbox.expiring event is due for the end
	// end of the active record sandboxID (Record.ExpiringSentFor): it
	// applies only when the record is active, ends at end and was not
	// marked for it yet (else ErrConflict; ErrNotFound when there is no
	// record). One conditional write that leaves the fence as it is (it
	// moves nothing a lease holder relies on); the caller whose write
	// applied sends the event, so it is sent once per end.
	MarkExpiring(ctx context.Context, sandboxID string, end time.Time) error
	// WarmParkedBefore lists up to limit warm records parked before t,
	// oldest first.
	WarmParkedBefore(ctx context.Context, t time.Time, limit int) ([]Record, error)
	// Sample lists up to limit records in state, oldest first, of a random
	// part of them (at least a quarter; all of them when that part holds
	// fewer than four): eviction's candidates, found in fewer reads than
	// the exact order of all costs. Empty only when none is in state.
	Sample(ctx context.Context, state State, limit int) ([]Record, error)
	// OwnWarm lists up to limit warm records of tenant (of its user only
	// when user is not empty), least recently parked first, reading only
	// that tenant's (user's) warm records, never the whole warm pool: the
	// candidates of an eviction for a quota. The list may lag the records
	// by a moment (a record just parked missing, one just taken back still
	// listed: a claim decides), and its records carry their id, thread,
	// state and park time only.
	OwnWarm(ctx context.Context, tenant, user string, limit int) ([]Record, error)
	// Tombstones lists up to limit records in StateDestroying.
	Tombstones(ctx context.Context, limit int) ([]Record, error)
	// TenantSandboxes lists up to limit of tenant's records in
	// TenantListed states (its own sandboxes, as E2B's list shows them),
	// from cursor ("" = the first page). next is the cursor of the
	// following page, "" after the last. The order is the store's; a
	// record moving state between pages may be listed twice or not at all.
	TenantSandboxes(ctx context.Context, tenant, cursor string, limit int) (recs []Record, next string, err error)
}

// TenantListed are the states Store.TenantSandboxes lists: a sandbox
// handed out, or parked for its thread (warm or paused).
func TenantListed() []State { return []State{StateActive, StateWarm, StatePaused} }

// PageTenant builds one page of Store.TenantSandboxes for a store: walk
// yields the tenant's records in state st after position after ("" = all),
// each with its position, in the store's order, until yield returns
// false. It reads the cursor, walks the states from the cursor's and
// stops at limit+1 records to know whether a next page exists.
func PageTenant(cursor string, limit int, walk func(st State, after string, yield func(rec Record, at string) bool) error) ([]Record, string, error) {
	if limit <= 0 {
		return nil, "", nil
	}
	states := TenantListed()
	from, after := 0, ""
	if cursor != "" {
		st, at, ok := strings.Cut(cursor, "|")
		from = slices.Index(states, State(st))
		if !ok || from < 0 || at == "" {
			return nil, "", &ValidationError{Field: "cursor", Message: "is not a cursor this store handed out"}
		}
		after = at
	}
	var recs []Record
	var ats []string
	for i := from; i < len(states) && len(recs) <= limit; i++ {
		if i > from {
			after = ""
		}
		err := walk(states[i], after, func(rec Record, at string) bool {
			recs, ats = append(recs, rec), append(ats, string(states[i])+"|"+at)
			return len(recs) <= limit
		})
		if err != nil {
			return nil, "", err
		}
	}
	if len(recs) <= limit {
		return recs, "", nil
	}
	return recs[:limit], ats[limit-1], nil
}

// CapacityStore takes and frees running slots, with the bindings and
// records they move together with.
type CapacityStore interface {
	// Reserve takes a slot (a *CapacityError when Limit slots are held),
	// or the slot of r.Handover's tombstone, and binds the thread to the
	// reservation (ErrThreadBound when the binding is not what r expects).
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
	// Capacity reports the deployment's slots: those held and granted,
	// read now, and the records holding running slots by state as the
	// last RepairCounters counted them (a store may count on every read),
	// in reads whose number does not grow with the fleet.
	Capacity(ctx context.Context) (CapacityStatus, error)
	// TenantsHolding lists, sorted, the tenants holding running slots as
	// a capacity refusal names them (CapacityError.Tenants: a tenant that
	// just freed its last slot may stay listed until reconcile drops it).
	// One read of the counters, eventually consistent.
	TenantsHolding(ctx context.Context) ([]string, error)
	// SetDraining marks the deployment draining (or not); starting a
	// drain also marks every waiting ticket (TicketState.Draining).
	SetDraining(ctx context.Context, draining bool) error
	// Draining reports whether the deployment drains (a read that may
	// lag a SetDraining by up to a second).
	Draining(ctx context.Context) (bool, error)
	// RepairCounters compares the counters kept with the slots (running
	// and paused slots held, each user's and tenant's slot count) with the records and
	// reservations holding slots, and corrects each difference that the
	// previous call saw unchanged (so a write in flight is never mistaken
	// for drift), without overwriting a concurrent change. It keeps the
	// counts by state it read for Capacity. It also splits the limit
	// afresh when one part holds more than its share (an adopted
	// sandbox), and drops tenants holding no slot from the fair-share
	// sets.
	RepairCounters(ctx context.Context, limit int) (CounterRepair, error)
}

// WaitStore keeps the wait queue: its tickets, waiter places and grants
// (see Ticket, Grant).
type WaitStore interface {
	// EnterWait takes one of w.Tenant's w.Max waiter places (one that is
	// free, or whose holder's Until has passed) and queues w.Ticket (see
	// Ticket for its round), in one transaction; a *CapacityError with
	// RefusalTooManyWaiters when every place is held.
	EnterWait(ctx context.Context, w Waiter) (Ticket, error)
	// PollTicket reads the ticket (strongly consistent).
	PollTicket(ctx context.Context, t Ticket) (TicketState, error)
	// LeaveWait takes the ticket out of the queue and gives back its
	// place: a grant it holds is passed on to the next live waiting
	// ticket, for grantFor (or its slot freed). Nothing to do when it is
	// gone.
	LeaveWait(ctx context.Context, t Ticket, now time.Time, grantFor time.Duration) error
	// Dispatch serves the wait queue (see Dispatch).
	Dispatch(ctx context.Context, d Dispatch) (DispatchResult, error)
	// AnyWaiting reports whether a live ticket waits for a slot at now
	// (queued, neither granted nor lapsed), strongly consistent. It
	// answers true when it cannot tell (a queue too long to read in one
	// call).
	AnyWaiting(ctx context.Context, now time.Time) (bool, error)
}
