package core

import (
	"context"
	"time"
)

// ResumeClaim asks the store to move a paused record to StateResuming
// under a lease, taking a running slot as a reservation does.
type ResumeClaim struct {
	// Claim names the record, its tenant, the lease owner, now and the
	// lease's end (From and To are implied: paused to resuming).
	Claim
	// Key is the record's thread: its user's and tenant's counters take
	// the slot (the record must belong to it, else ErrNotFound).
	Key ThreadKey
	// Limit, MaxPerUser and MaxPerTenant are Reservation's.
	Limit        int
	MaxPerUser   int
	MaxPerTenant int
	// Grant is Reservation's.
	Grant *Grant
}

// PauseStore moves records through pause-parking. A record pausing, paused or resuming
// holds a paused slot (Record.Slots.Paused), bounded by a limit of its
// own; a paused one holds no running slot. Every method moves a record
// and its slots together, in one write; errors are classified as Store's.
type PauseStore interface {
	// ClaimPause moves a warm record (c.From and c.To are implied) to
	// StatePausing under c's lease, keeping its park time, and takes a
	// paused slot: ErrPausedFull when limit paused slots are held;
	// ErrNotFound, ErrConflict or ErrLeaseHeld as Claim.
	ClaimPause(ctx context.Context, c Claim, limit int) (Record, error)
	// ClaimReleasePause moves a record its release holds (releasing under
	// r.Claim's lease at r.Fence) straight to StatePausing, parked at
	// r.Claim.Now and ending at r.ExpiresAt should the pause be given up,
	// and takes a paused slot as ClaimPause does, so that the release
	// writes its running slot's count once (when the settle frees the
	// running slot) rather than also when it parks warm. ErrDraining when the
	// deployment drains; otherwise as ClaimPause.
	ClaimReleasePause(ctx context.Context, r ReleasePause) (Record, error)
	// SettlePause moves rec (pausing or resuming, fenced by rec.Fence:
	// else ErrStaleFence) to StatePaused, parked at now, with no provider
	// end time (ExpiresAt: the provider does not end a paused sandbox),
	// and frees its running slot (its user's and tenant's too). The lease
	// is cleared.
	SettlePause(ctx context.Context, rec Record, now time.Time) (Record, error)
	// AbortPause moves rec (pausing, fenced) back to StateWarm, parked when
	// it was, and frees its paused slot. The lease is cleared.
	AbortPause(ctx context.Context, rec Record, now time.Time) (Record, error)
	// ClaimResume moves a paused record to StateResuming under the lease
	// and takes a running slot: *CapacityError as Reserve's; ErrNotFound,
	// ErrConflict or ErrLeaseHeld as Claim.
	ClaimResume(ctx context.Context, r ResumeClaim) (Record, error)
	// SettleResume moves rec (resuming, or a paused pool member claiming
	// for its thread: fenced) to StateActive ending at
	// expiresAt, stores rec.PausedFor (the caller added the pause that
	// ends) and frees its paused slot. The lease is cleared.
	SettleResume(ctx context.Context, rec Record, now, expiresAt time.Time) (Record, error)
	// PausedParkedBefore lists up to limit paused records paused before t,
	// oldest first.
	PausedParkedBefore(ctx context.Context, t time.Time, limit int) ([]Record, error)
	// TenantsPaused reads how many paused slots each of tenants holds
	// (those of records with Slots.TenantPaused; absent tenants hold 0).
	TenantsPaused(ctx context.Context, tenants []string) (map[string]int, error)
}

// ReleasePause is a release's claim into pausing: see
// PauseStore.ClaimReleasePause. Claim.From and Claim.To are implied.
type ReleasePause struct {
	Claim Claim
	// Fence is the fence the release's claim left on the record.
	Fence int64
	// ExpiresAt is when the provider ends the sandbox should it stay
	// running (the idle timeout the release set).
	ExpiresAt time.Time
	// Limit is the paused slots' limit (Settings.PausedLimit).
	Limit int
}

// pauseStore is the metered PauseStore: each of its writes moves the
// record's metering interval and is metered, as meteredStore's are.
func (m meteredStore) pauseStore() PauseStore {
	return meteredPauseStore{PauseStore: m.Store, e: m.e}
}

// meteredPauseStore meters every pause-parking write (the time before
// it, spent in the state the record left).
type meteredPauseStore struct {
	PauseStore
	e *Engine
}

// ClaimPause meters the warm time before the pause.
func (m meteredPauseStore) ClaimPause(ctx context.Context, c Claim, limit int) (Record, error) {
	rec, err := m.PauseStore.ClaimPause(ctx, c, limit)
	return m.e.metered(ctx, rec, err)
}

// ClaimReleasePause meters the releasing time before the pause.
func (m meteredPauseStore) ClaimReleasePause(ctx context.Context, r ReleasePause) (Record, error) {
	rec, err := m.PauseStore.ClaimReleasePause(ctx, r)
	return m.e.metered(ctx, rec, err)
}

// SettlePause meters the pausing time, and offers the running slot it
// freed to the wait queue.
func (m meteredPauseStore) SettlePause(ctx context.Context, rec Record, now time.Time) (Record, error) {
	out, err := m.PauseStore.SettlePause(ctx, rec, now)
	if err == nil && rec.Slots.Running() {
		m.e.dispatchFreed(ctx, rec.Slot.Ref)
	}
	return m.e.metered(ctx, out, err)
}

// AbortPause meters the pausing time.
func (m meteredPauseStore) AbortPause(ctx context.Context, rec Record, now time.Time) (Record, error) {
	out, err := m.PauseStore.AbortPause(ctx, rec, now)
	return m.e.metered(ctx, out, err)
}

// ClaimResume meters the paused time.
func (m meteredPauseStore) ClaimResume(ctx context.Context, r ResumeClaim) (Record, error) {
	rec, err := m.PauseStore.ClaimResume(ctx, r)
	return m.e.metered(ctx, rec, err)
}

// SettleResume meters the resuming time.
func (m meteredPauseStore) SettleResume(ctx context.Context, rec Record, now, expiresAt time.Time) (Record, error) {
	out, err := m.PauseStore.SettleResume(ctx, rec, now, expiresAt)
	return m.e.metered(ctx, out, err)
}
