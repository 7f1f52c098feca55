package core

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"regexp"
	"time"
)

// idPattern is the shape of tenant-supplied user and thread ids (docs/api.md).
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// sandboxIDPattern bounds provider sandbox ids accepted from callers. E2B ids
// are lowercase alphanumerics; the local host uses the same alphabet. Dashes
// and underscores are allowed for other providers.
var sandboxIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ThreadKey identifies one agent thread: the unit that owns at most one live
// sandbox. Tenant comes from the authorizer, User and Thread from the caller.
type ThreadKey struct {
	Tenant string
	User   string
	Thread string
}

// Validate reports a *ValidationError naming the first malformed field.
func (k ThreadKey) Validate() error {
	if !idPattern.MatchString(k.Tenant) {
		return &ValidationError{Field: "tenant", Message: "must match ^[A-Za-z0-9_-]{1,64}$"}
	}
	if !idPattern.MatchString(k.User) {
		return &ValidationError{Field: "user_id", Message: "must match ^[A-Za-z0-9_-]{1,64}$"}
	}
	if !idPattern.MatchString(k.Thread) {
		return &ValidationError{Field: "thread_id", Message: "must match ^[A-Za-z0-9_-]{1,64}$"}
	}
	return nil
}

// Seed is the stable seed of the thread: the first 16 bytes of
// SHA-256(tenant \x00 user \x00 thread), hex-encoded (32 chars). It is a
// compact deterministic key for provider metadata; it is user- and
// tenant-scoped: two users' threads of the same name never share it.
func (k ThreadKey) Seed() string {
	h := sha256.Sum256([]byte(k.Tenant + "\x00" + k.User + "\x00" + k.Thread))
	return hex.EncodeToString(h[:16])
}

func (k ThreadKey) String() string { return k.Tenant + "/" + k.User + "/" + k.Thread }

// ValidateSandboxID reports a *ValidationError when id cannot be a sandbox id.
func ValidateSandboxID(id string) error {
	if !sandboxIDPattern.MatchString(id) {
		return &ValidationError{Field: "sandbox_id", Message: "must match ^[A-Za-z0-9_-]{1,128}$"}
	}
	return nil
}

// State is the lifecycle state of a sandbox record.
type State string

// Record states. Every state but StateGone holds capacity: a running slot,
// a paused slot or both (Record.Slots says which).
const (
	StateCreating  State = "creating"  // reservation taken, provider create in flight
	StateActive    State = "active"    // handed out to the thread's agent
	StateReleasing State = "releasing" // release in progress (syncing outputs)
	StateWarm      State = "warm"      // parked for the same thread, idle timeout running
	// StatePausing is a warm sandbox being paused: it holds its running
	// slot and, taken before the provider is asked, a paused slot.
	StatePausing State = "pausing"
	// StatePaused is a sandbox frozen at the provider (memory and files
	// kept) for its thread: it holds a paused slot and no running slot.
	StatePaused State = "paused"
	// StateResuming is a paused sandbox being started again for its
	// thread: it holds a paused slot and, taken before the provider is
	// asked, a running slot.
	StateResuming   State = "resuming"
	StateDestroying State = "destroying" // tombstone: kill requested, not yet confirmed
	StateGone       State = "gone"       // provider confirmed the sandbox is gone; slot freed
)

// Source says how acquire obtained the sandbox it returns.
type Source string

// Acquire sources, as in the acquire response's "source" field.
const (
	SourceReused    Source = "reused"    // the thread's active sandbox, still alive
	SourceReclaimed Source = "reclaimed" // the thread's warm sandbox
	SourceResumed   Source = "resumed"   // the thread's paused sandbox, started again
	SourceCreated   Source = "created"   // freshly created
)

// Sources lists every acquire source the broker produces. (A sandbox the
// store lost track of is found by reconcile, which adopts it warm: the
// thread's next acquire reclaims it.)
func Sources() []Source {
	return []Source{SourceReused, SourceReclaimed, SourceResumed, SourcePool, SourceCreated}
}

// Record is the broker's durable view of one sandbox. Times are UTC.
type Record struct {
	SandboxID string
	ThreadKey
	Seed  string
	State State
	// PrevState is the state before the last Claim that changed it (how a
	// claim found the record: "active" means reuse, "warm" reclaim).
	PrevState State
	Backend   string // provider name, e.g. "e2b"

	// Fence is the fencing token: incremented by every transition; a write
	// carrying an older value is refused with ErrStaleFence.
	Fence int64
	// LeaseOwner and LeaseExpiresAt describe the current lease, if any: the
	// invocation that may move the record out of a transitional state.
	LeaseOwner     string
	LeaseExpiresAt time.Time

	// Endpoint is how the agent reaches the sandbox (its access token is
	// a credential).
	Endpoint Endpoint

	ReservationToken string
	CreatedAt        time.Time
	UpdatedAt        time.Time
	// ParkedAt is when the record last became warm (zero unless warm), or,
	// for a paused record, when it was paused.
	ParkedAt time.Time
	// Slots says which capacity slots the record holds.
	Slots Slots
	// PausedFor is the time the sandbox spent paused before its current
	// pause (usage accounting; a paused record adds now - ParkedAt).
	PausedFor time.Duration
	// ExpiresAt is when the provider will end the sandbox on its own (its
	// timeout), as last set by the broker.
	ExpiresAt time.Time
	// DestroyingSince is when the record first became a tombstone (zero
	// unless destroying); kill retries keep it, so tombstone age is honest.
	DestroyingSince time.Time
	KillAttempts    int
	// EndReason is why the sandbox ended (one of EventReasons), set with
	// its tombstone or when it is gone; "" while it lives.
	EndReason string
	// ExpiringSentFor is the end (ExpiresAt) a sandbox.expiring event was
	// sent for: reconcile warns once per end (Store.MarkExpiring).
	ExpiringSentFor time.Time

	// Usage metering. Every write that moves the record (a claim to
	// another state, a fenced update, the free) sets MeteredAt to its time
	// and PrevMeteredAt to the MeteredAt it replaced: it accounts for the
	// usage of [PrevMeteredAt, MeteredAt), spent in MeteredState. The
	// engine meters exactly that interval after the write succeeds, so the
	// intervals of one sandbox never overlap and leave no gap.
	MeteredAt     time.Time
	PrevMeteredAt time.Time
	MeteredState  State

	// Slot is where the store keeps the record's capacity slot: the store
	// fills it on every read, and the fenced writes that need it
	// (Update.Slot, Free) hand it back as read.
	Slot Slot
}

// SlotRef says where the store counts a slot. It is the store's to
// choose and to read: the engine only carries it from the read or write
// that took the slot to the one that frees it. NoSlotRef: not known.
type SlotRef int

// NoSlotRef is a SlotRef that names no place.
const NoSlotRef SlotRef = -1

// Slot locates a record's (or reservation's) running slot in the store.
type Slot struct {
	// Ref is where the store counts the slot.
	Ref SlotRef
	// Quota reports that the slot is counted in its user's and tenant's
	// slot counts (false for a pool member's, which no thread holds).
	Quota bool
}

// Slots says which capacity slots a record holds. The zero value is the
// usual one: a running slot only.
type Slots struct {
	// NoRunning: the record holds no running slot (a paused sandbox, or
	// the tombstone of one).
	NoRunning bool
	// Paused: the record holds a paused slot (pausing, paused, resuming,
	// or the tombstone of one of those).
	Paused bool
	// PausedRef is where the store counts the paused slot (when Paused).
	PausedRef SlotRef
	// TenantPaused reports that the paused slot is counted in its
	// tenant's paused count (PauseStore.TenantsPaused): false for a pool
	// member's.
	TenantPaused bool
}

// Running reports whether the record holds a running slot.
func (s Slots) Running() bool { return !s.NoRunning }

// LogValue keeps the endpoint's access token out of logs (it is a credential).
func (r Record) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("sandbox_id", r.SandboxID), slog.String("thread", r.ThreadKey.String()),
		slog.String("state", string(r.State)), slog.Int64("fence", r.Fence),
		slog.String("lease_owner", r.LeaseOwner), slog.Time("lease_expires_at", r.LeaseExpiresAt))
}

// Leased reports whether a lease other than owner's is live at now.
func (r Record) Leased(owner string, now time.Time) bool {
	return r.LeaseOwner != "" && r.LeaseOwner != owner && now.Before(r.LeaseExpiresAt)
}

// Ref is the handle the provider needs to reach the sandbox.
func (r Record) Ref() SandboxRef {
	return SandboxRef{ID: r.SandboxID, Endpoint: r.Endpoint}
}

// CapacityStatus is the deployment-wide slot usage (GET /v1/capacity).
// Used, Granted, Paused and Draining are the ledger's, read at once. The
// counts by state (Active, Warm, Reserved, Transitioning, Tombstones,
// Pool) are the last counter repair's (reconcile counts them once a pass,
// never on a read), taken at CountedAt.
type CapacityStatus struct {
	Limit         int `json:"limit"`
	Used          int `json:"used"`
	Active        int `json:"active"`
	Warm          int `json:"warm"`
	Reserved      int `json:"reserved"`
	Transitioning int `json:"transitioning"` // releasing, pausing, claiming (a resuming record counts active)
	Tombstones    int `json:"tombstones"`    // destroying: kill not yet confirmed
	// Pool counts the pre-warmed pool's members waiting to be claimed
	// (their running slots are in Used).
	Pool int `json:"pool"`
	// Granted counts the running slots held in trust for waiting acquires
	// (the wait policy's queue; they are in Used).
	Granted int `json:"granted"`
	// Paused counts paused sandboxes (holding paused slots, not running
	// ones); PausedLimit bounds them.
	Paused      int    `json:"paused"`
	PausedLimit int    `json:"paused_limit"`
	Policy      string `json:"policy"`
	Draining    bool   `json:"draining"`
	// PoolRefill is the pool refill's back-off after failed creates (nil
	// when no pool is kept or its last create succeeded).
	PoolRefill *RefillBackoff `json:"pool_refill,omitempty"`
	// CountedAt is when the counts by state were taken: zero when no
	// repair has counted yet, or when the store counts on every read.
	CountedAt time.Time `json:"counted_at,omitzero"`
}

// AddState counts n records holding running slots in state st under
// the field that reports st.
func (s *CapacityStatus) AddState(st State, n int) {
	switch st {
	case StateCreating:
		s.Reserved += n
	case StateActive, StateResuming:
		s.Active += n
	case StateWarm:
		s.Warm += n
	case StateDestroying:
		s.Tombstones += n
	case StatePooled:
		s.Pool += n
	default:
		s.Transitioning += n
	}
}

func (s CapacityStatus) String() string {
	return fmt.Sprintf("limit=%d used=%d active=%d warm=%d reserved=%d paused=%d", s.Limit, s.Used, s.Active, s.Warm, s.Reserved, s.Paused)
}

// HandOut is the source of the acquire that last handed out an active
// record, read from the state its claim found (PrevState): reused from
// active, reclaimed from warm (or from a release that died), resumed from
// paused, taken from the pool,
// else created (a record created active has none; one reconcile adopted
// reads as created too). "" when the record is not active.
func (r Record) HandOut() Source {
	if r.State != StateActive {
		return ""
	}
	switch r.PrevState {
	case StateActive:
		return SourceReused
	case StateWarm, StateReleasing:
		return SourceReclaimed
	case StatePaused, StateResuming:
		return SourceResumed
	case StatePooled, StateClaiming:
		return SourcePool
	}
	return SourceCreated
}
