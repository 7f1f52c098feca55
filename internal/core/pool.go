package core

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// Pool states and source. A pool member is a generic, bootstrapped sandbox
// of the deployment's template that no thread owns; a thread with no
// sandbox claims one instead of creating.
const (
	// StatePooled is a pool member waiting to be claimed. It holds a slot
	// and one of the pool's places; its record names no thread.
	StatePooled State = "pooled"
	// StateClaiming is a pool member claimed by a thread (bound to it, its
	// tenant's and user's slots taken) whose hand-out is in progress under
	// the claimer's lease: checked (resumed first when it was parked
	// paused), outputs restored, then active. A claimer that died leaves
	// it for the thread's next acquire, which finishes the hand-out, or,
	// once the lease lapsed, for reconcile, which destroys it.
	StateClaiming State = "claiming"

	// SourcePool: a pool member claimed by the thread.
	SourcePool Source = "pool"
)

// MetaPool marks a sandbox created for the pool (value MetaPoolMember).
// Provider metadata is written once, at create (a provider need not let
// it change later), so a claimed member keeps it: which thread a claimed
// member serves is the store's word, never its metadata.
const (
	MetaPool       = "sbx_pool"
	MetaPoolMember = "member"
)

// PoolParking is how pool members wait to be claimed.
type PoolParking string

// Pool parkings (PoolSettings.Parked).
const (
	// PoolParkedDefault: paused when the provider can pause
	// (Capabilities.Pause), running otherwise.
	PoolParkedDefault PoolParking = ""
	// PoolParkedPaused: members are paused after their bootstrap and hold
	// paused slots (Settings.PausedLimit); a claim resumes its member.
	PoolParkedPaused PoolParking = "paused"
	// PoolParkedRunning: members keep running and hold running slots.
	PoolParkedRunning PoolParking = "running"
)

// PoolSettings configure the pre-warmed pool (WithPool).
type PoolSettings struct {
	// Size is how many members are kept (SANDBOX_POOL_SIZE, >= 0; 0 = no
	// pool: every first acquire creates).
	Size int
	// MaxAge is how long a member may wait before it is recycled
	// (SANDBOX_POOL_MAX_AGE_SECONDS, > 0), so a template change rolls
	// through the pool.
	MaxAge time.Duration
	// Parked is how members wait (SANDBOX_POOL_PARKED; default
	// PoolParkedDefault). PoolParkedPaused with a provider that cannot
	// pause is refused by New.
	Parked PoolParking
}

// DefaultPoolSettings returns no pool and a one-hour maximum age.
func DefaultPoolSettings() PoolSettings { return PoolSettings{Size: 0, MaxAge: time.Hour} }

// Validate returns every problem, each naming its field.
func (p PoolSettings) Validate() error {
	var errs []error
	if p.Size < 0 {
		errs = append(errs, fmt.Errorf("Size: must be >= 0, got %d", p.Size))
	}
	if p.MaxAge <= 0 {
		errs = append(errs, fmt.Errorf("MaxAge: must be > 0, got %s", p.MaxAge))
	}
	switch p.Parked {
	case PoolParkedDefault, PoolParkedPaused, PoolParkedRunning:
	default:
		errs = append(errs, fmt.Errorf("Parked: must be %q or %q, got %q", PoolParkedPaused, PoolParkedRunning, p.Parked))
	}
	return errors.Join(errs...)
}

// validatePool checks the pool settings against the provider: members
// parked paused need one that can pause.
func (e *Engine) validatePool() error {
	set := e.poolConfig().settings
	if err := set.Validate(); err != nil {
		return err
	}
	if set.Parked == PoolParkedPaused && e.pauseStore() == nil {
		return fmt.Errorf("Parked: %q, but provider %s cannot pause (or the store keeps no paused slots)", set.Parked, e.prov.Name())
	}
	return nil
}

// membersPaused reports whether new pool members are parked paused.
func (e *Engine) membersPaused() bool {
	return e.poolConfig().settings.Parked != PoolParkedRunning && e.pauseStore() != nil
}

// WithPool sets the pool (default DefaultPoolSettings: none). The engine's
// Store must implement PoolStore for a pool to be kept.
func WithPool(p PoolSettings) Option { return func(e *Engine) { e.poolConfig().settings = p } }

// WithPoolRefill sets what a claim calls, after its hand-out, to start a
// refill without delaying the reply (for instance an asynchronous
// invocation of whatever runs reconcile). It must return quickly; its failure is logged
// and left to the reconcile schedule. Default: none.
func WithPoolRefill(kick func(ctx context.Context) error) Option {
	return func(e *Engine) { e.poolConfig().kick = kick }
}

// poolConfig is what the pool options set (Engine.pc), and the tenants
// holding slots as a claim last read them (see poolShareBelow).
type poolConfig struct {
	settings PoolSettings
	kick     func(ctx context.Context) error

	mu        sync.Mutex
	tenants   []string
	tenantsAt time.Time
}

func (e *Engine) poolConfig() *poolConfig {
	if e.pc == nil {
		e.pc = &poolConfig{settings: DefaultPoolSettings()}
	}
	return e.pc
}

// ErrPoolFull: every place of the pool is taken (members and refills in
// flight); nothing was written.
var ErrPoolFull = errors.New("pool full")

// PoolReservation takes a slot and a place of the pool, atomically, for a
// refill's create.
type PoolReservation struct {
	Token string
	// Limit is the deployment's slot limit, Size the pool's.
	Limit int
	Size  int
	Now   time.Time
	// ExpiresAt bounds the create; after it reconcile may settle the
	// reservation.
	ExpiresAt time.Time
}

// PoolClaim binds a pool member to a thread.
type PoolClaim struct {
	// Member is the pooled record as listed.
	Member Record
	ThreadKey
	Owner      string
	Now        time.Time
	LeaseUntil time.Time
	// MaxPerUser and MaxPerTenant cap the thread's user's and tenant's
	// slots (0 = no cap), as for a reservation.
	MaxPerUser   int
	MaxPerTenant int
	// ReplaceSandboxID and ReplaceReservation: what the thread's binding
	// must still name (both empty: there must be none), as for a
	// reservation.
	ReplaceSandboxID   string
	ReplaceReservation string
	// Limit is the deployment's slot limit: a member parked paused takes
	// a running slot within it.
	Limit int
	// Grant, for a member parked paused, is Reservation.Grant: the slot
	// it takes is the one held in trust for the waiter's ticket.
	Grant *Grant
	// Below, when set, makes the claim also conditional on the thread's
	// tenant (Below.Tenant) holding fewer than Below.Slots slots
	// (ErrAtFairShare when it does not, nothing written): a tenant at its
	// fair share leaves the pool's members to the others.
	Below *TenantBelow
}

// PoolStore is the store access the pool needs beyond Store
// (*ddbstore.Store implements it). Pool records name no thread (empty
// ThreadKey); Store.Free and Store.FreeReservation of such a record or
// reservation give its pool place back with its slot. Errors follow
// Store's classification.
type PoolStore interface {
	// ReservePool takes a slot (a *CapacityError when r.Limit are held or
	// the deployment drains) and a pool place (ErrPoolFull when r.Size are
	// taken) for a refill's create.
	ReservePool(ctx context.Context, r PoolReservation) error
	// FinalizePool turns reservation token into the pooled record rec.
	// ErrConflict if the reservation no longer exists.
	FinalizePool(ctx context.Context, token string, rec Record) (Record, error)
	// PoolMembers lists up to limit pooled records, oldest first.
	PoolMembers(ctx context.Context, limit int) ([]Record, error)
	// SomePoolMembers lists up to limit pooled records in no particular
	// order, as cheaply as the store can (an acquire's candidates).
	SomePoolMembers(ctx context.Context, limit int) ([]Record, error)
	// ClaimPoolMember moves c.Member from pooled to claiming for c's
	// thread under c.Owner's lease, binds the thread to it and takes the
	// user's and tenant's slots (a running member's deployment slot
	// becomes the thread's; a paused one takes a running slot within
	// c.Limit and keeps its paused slot until SettleResume), in one
	// write. It returns the claimed record. Errors: ErrConflict (the
	// member is no longer pooled), ErrThreadBound, a *CapacityError
	// (RefusalUserQuota, RefusalTenantQuota, RefusalDraining, and for a
	// paused member RefusalCapacity), ErrAtFairShare (c.Below; checked
	// after the quotas).
	ClaimPoolMember(ctx context.Context, c PoolClaim) (Record, error)
	// ClaimPoolPause moves a pooled member holding a running slot to
	// StatePausing under c's lease (c.From, c.To and c.Tenant are
	// implied) and takes a paused slot, as PauseStore.ClaimPause:
	// ErrPausedFull when limit paused slots are held.
	ClaimPoolPause(ctx context.Context, c Claim, limit int) (Record, error)
	// SettlePoolPause moves a member being paused (fenced by rec.Fence)
	// back to StatePooled holding its paused slot only (its running slot
	// freed), its lease cleared.
	SettlePoolPause(ctx context.Context, rec Record, now time.Time) (Record, error)
	// AbortPoolPause moves a member being paused (fenced) back to
	// StatePooled holding its running slot only (its paused slot freed).
	AbortPoolPause(ctx context.Context, rec Record, now time.Time) (Record, error)
	// AdoptPoolSandbox records an untracked pool sandbox as rec (a
	// tombstone leased to the caller, for its kill): consuming
	// reservation's slot and place when set, else taking new ones without
	// a limit check. ErrConflict when a condition failed.
	AdoptPoolSandbox(ctx context.Context, rec Record, reservation string) (Record, error)
}

// PoolPlaceStore keeps the pool's place count and its refill's back-off,
// which reconcile repairs and reads.
type PoolPlaceStore interface {
	// PoolCount reads the pool's taken places (members, refills in flight
	// and members being destroyed).
	PoolCount(ctx context.Context) (int, error)
	// RepairPoolPlaces sets the pool's place count to counted if its
	// revision is still revision (else ErrConflict).
	RepairPoolPlaces(ctx context.Context, revision int64, counted int) error
	// RefillBackoff reads the refill's back-off state, kept with the
	// pool's place count (the zero value when none was set).
	RefillBackoff(ctx context.Context) (RefillBackoff, error)
	// SetRefillBackoff replaces the refill's back-off state (the zero
	// value clears it), leaving the place count and its revision alone.
	SetRefillBackoff(ctx context.Context, b RefillBackoff) error
}

// poolStore is the PoolStore when a pool is configured, else nil.
func (e *Engine) poolStore() PoolStore {
	if e.poolConfig().settings.Size <= 0 {
		return nil
	}
	return e.store.poolStore()
}

// maxPoolTries bounds the pool members one acquire takes (a member found
// dead is discarded and the next tried); past it the acquire creates. A
// discarded member counts among the acquire's unusable sandboxes
// (maxUnusable), so the create always gets its turn.
const maxPoolTries = maxUnusable - 1

// poolCandidates is how many members one claim lists; it tries them in a
// random order so concurrent claims spread over the pool.
const poolCandidates = 8

// fromPool hands the thread a pool member when a pool is kept and has one
// (the thread has no usable sandbox: replaceID / replaceRes name what its
// binding holds, as for a create). handled is false when the caller should
// create instead: no pool, an empty pool, every member taken by peers,
// maxPoolTries members already found dead, or the thread's tenant at its
// fair share (see poolShareBelow).
func (e *Engine) fromPool(ctx context.Context, key ThreadKey, owner, replaceID, replaceRes string, st *acquireState) (res AcquireResult, handled, retry bool, err error) {
	ps := e.poolStore()
	if ps == nil || st.poolTries >= maxPoolTries || st.atShare {
		return res, false, false, nil
	}
	members, err := ps.SomePoolMembers(ctx, poolCandidates)
	if err != nil {
		e.log.WarnContext(ctx, "listing pool members failed; creating", "err", err)
		return res, false, false, nil
	}
	if len(members) == 0 {
		return res, false, false, nil
	}
	below := e.poolShareBelow(ctx, key, st)
	if below == nil {
		return res, false, false, nil
	}
	rand.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
	// Running members first: a paused one costs the claim a resume.
	slices.SortStableFunc(members, func(a, b Record) int { return cmpBool(a.Slots.Paused, b.Slots.Paused) })
	set := e.poolConfig().settings
	oldest := e.now().Add(-(set.MaxAge - set.poolLead()))
	for _, m := range members {
		if m.CreatedAt.Before(oldest) {
			continue // reconcile recycles it
		}
		rec, err := e.claimMember(ctx, ps, m, key, owner, replaceID, replaceRes, st, below)
		var ce *CapacityError
		switch {
		case err == nil:
			st.poolTries++
			// The refill starts now, alongside the hand-out, and is
			// waited for before the reply (an invocation's goroutines
			// do not outlive it).
			kicked := e.kickRefill(ctx)
			res, retry, err = e.finishClaim(ctx, rec)
			<-kicked
			return res, true, retry, err
		case errors.Is(err, ErrConflict):
			continue // a peer claimed or discarded it
		case errors.Is(err, ErrAtFairShare):
			st.atShare = true // the tenant's peers took its share since the lookup
			return res, false, false, nil
		case errors.As(err, &ce) && ce.Reason == api.RefusalDraining:
			return res, true, false, e.drainingError()
		case errors.As(err, &ce):
			return res, true, true, e.refused(ce)
		case errors.Is(err, ErrThreadBound), errors.Is(err, ErrGrantLost):
			return res, true, true, fmt.Errorf("claim pool member: %w", err)
		default:
			return res, true, false, fmt.Errorf("claim pool member: %w", err)
		}
	}
	return res, false, false, nil
}

// poolShareBelow is the condition a pool claim of key's thread carries:
// its tenant holds fewer slots than its fair share (Settings.FairShare
// among the tenants holding slots, key's counted), as an eviction of
// another tenant's sandbox does (fairShareBelow), so that one tenant
// cannot claim every member. It is nil when the tenant held its share at
// the lookup: the acquire creates instead.
func (e *Engine) poolShareBelow(ctx context.Context, key ThreadKey, st *acquireState) *TenantBelow {
	return e.fairShareBelow(key, st, e.tenantsHolding(ctx))
}

// tenantsFor is how long the engine reuses the tenants holding slots it
// read for a claim: the read costs as much as the rest of the claim, and
// a burst of claims needs it once. A tenant that starts holding slots
// within it is not counted yet: the shares are larger for that long.
const tenantsFor = 2 * time.Second

// tenantsHolding returns the tenants holding slots (Store.TenantsHolding),
// read at most once per tenantsFor. When the read fails the last set read
// is kept (none at first: the share is then the deployment's limit, and
// the claim's condition still bounds the tenant by it).
func (e *Engine) tenantsHolding(ctx context.Context) []string {
	pc := e.poolConfig()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	now := e.now()
	if !pc.tenantsAt.IsZero() && now.Sub(pc.tenantsAt) < tenantsFor && !now.Before(pc.tenantsAt) {
		return pc.tenants
	}
	tenants, err := e.store.TenantsHolding(ctx)
	if err != nil {
		e.log.WarnContext(ctx, "reading the tenants holding slots failed; the last set read bounds the pool claim", "err", err)
		return pc.tenants
	}
	pc.tenants, pc.tenantsAt = tenants, now
	return tenants
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// claimMember claims member m for key's thread (ClaimPoolMember), reading
// the member back when the write's outcome is unknown. A member parked
// paused takes a running slot: as for a create's reservation, the slots
// of sandboxes the provider ended are freed and a sandbox evicted when
// the deployment is full (see takeSlot). ErrConflict: a peer took m.
func (e *Engine) claimMember(ctx context.Context, ps PoolStore, m Record, key ThreadKey, owner, replaceID, replaceRes string, st *acquireState, below *TenantBelow) (Record, error) {
	var grant *Grant // a waiter's granted slot, for a member that takes one
	if m.Slots.Paused {
		grant = st.grant
	}
	claim := func(now time.Time) (Record, error) {
		rec, err := ps.ClaimPoolMember(ctx, PoolClaim{Member: m, ThreadKey: key, Owner: owner, Now: now,
			LeaseUntil: e.leaseUntil(ctx), MaxPerUser: e.s.MaxPerUser, MaxPerTenant: e.s.MaxPerTenant,
			ReplaceSandboxID: replaceID, ReplaceReservation: replaceRes, Limit: e.s.Limit(), Grant: grant, Below: below})
		if errors.Is(err, ErrStoreUnavailable) {
			// Maybe applied: the record says whether the member is ours.
			rec, err = e.claimOutcome(ctx, m.SandboxID, key, owner, err)
		}
		return rec, err
	}
	if !m.Slots.Paused {
		return claim(e.now())
	}
	var (
		rec  Record
		lost error
	)
	_, err := e.takeSlot(ctx, key, owner, st, e.freedFirst(ctx, func(now time.Time) error {
		var err error
		rec, err = claim(now)
		_ = e.took(st, err)
		if errors.Is(err, ErrConflict) {
			lost = err // a peer took the member: no slot to wait for
			return nil
		}
		return err
	}))
	if lost != nil {
		return Record{}, lost
	}
	return rec, err
}

// claimOutcome reads the member after a claim whose outcome is unknown:
// the claimed record when the claim applied (claiming, the thread's, under
// owner's lease), ErrConflict when it certainly did not (still pooled, or
// a peer's), else the claim's error.
func (e *Engine) claimOutcome(ctx context.Context, id string, key ThreadKey, owner string, claimErr error) (Record, error) {
	rec, err := e.store.Get(ctx, id)
	switch {
	case err != nil:
		return Record{}, claimErr
	case rec.State == StateClaiming && rec.ThreadKey == key && rec.LeaseOwner == owner:
		return rec, nil
	case rec.State == StatePooled:
		return Record{}, fmt.Errorf("pool member %s not claimed: %w", id, ErrConflict)
	default:
		return Record{}, fmt.Errorf("pool member %s is %s: %w", id, rec.State, ErrConflict)
	}
}

// finishClaim hands out a member claimed for its thread (rec is claiming
// under this invocation's lease, or under a lapsed lease of a claimer
// that died): the active timeout is set and, side by side, checkMember
// checks that it answers (the member ran the bootstrap when the refill
// created it), the thread's outputs are restored as for a create, and the
// record becomes active. A member that
// fails is discarded (its slots freed once the kill is confirmed) and the
// acquire tries again (the next member, then a create).
func (e *Engine) finishClaim(ctx context.Context, rec Record) (AcquireResult, bool, error) {
	discard := func(why string, cause error) (AcquireResult, bool, error) {
		e.log.WarnContext(ctx, "pool member "+why+"; discarding", "sandbox_id", rec.SandboxID, "err", cause)
		e.destroyClaimed(ctx, rec, EventReasonUnresponsive)
		return AcquireResult{}, true, unavailable(fmt.Errorf("pool member %s %s: %v", rec.SandboxID, why, cause))
	}
	pauses := e.pauseStore()
	if rec.Slots.Paused {
		// Parked paused: the resume sets the active timeout, then the
		// check reads the marker back.
		if pauses == nil {
			return discard("cannot be resumed", errors.New("the provider cannot resume"))
		}
		cctx, cancel, ok := e.leaseCall(ctx, rec)
		if !ok {
			return AcquireResult{}, true, fmt.Errorf("resume pool member %s: lease too short: %w", rec.SandboxID, ErrLeaseHeld)
		}
		err := e.caps.Pause.Resume(cctx, rec.SandboxID, e.activeTimer())
		cancel()
		if err != nil {
			// Failed or maybe applied: either way the member is given up.
			return discard("did not resume", err)
		}
		if err := e.checkMember(ctx, rec.Ref()); err != nil {
			return discard("failed its check", err)
		}
	} else {
		// The timeout and the check are independent: they run side by
		// side, so a claim waits for one provider round trip, not two.
		timeoutErr := make(chan error, 1)
		go func() { timeoutErr <- e.prov.SetTimeout(ctx, rec.SandboxID, e.activeTimer()) }()
		checkErr := e.checkMember(ctx, rec.Ref())
		if err := <-timeoutErr; err != nil {
			return discard("does not take its timeout", err)
		}
		if checkErr != nil {
			return discard("failed its check", checkErr)
		}
	}
	restored, err := e.restore(ctx, rec.ThreadKey, rec.Ref())
	if err != nil {
		return discard("died during restore", err)
	}
	now := e.now()
	fctx, cancel := settle(ctx)
	defer cancel()
	var active Record
	if rec.Slots.Paused {
		// Active, its paused slot freed: the running slot is the claim's.
		active, err = pauses.SettleResume(fctx, rec, now, now.Add(e.s.ActiveTimeout))
	} else {
		active, err = e.applyRecord(fctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateActive,
			Now: now, ExpiresAt: now.Add(e.s.ActiveTimeout), Slot: rec.Slot})
	}
	if err != nil {
		// A peer took the hand-out over (our lease lapsed) or the write
		// was lost: the record stays the thread's; the next attempt
		// finds it.
		return AcquireResult{}, true, fmt.Errorf("activate pool member %s: %w", rec.SandboxID, err)
	}
	if active.Endpoint.URL == "" {
		active.Endpoint = rec.Endpoint
	}
	e.emit(ctx, active, StatePooled, StateActive, EventPoolClaimed, "")
	return AcquireResult{Record: active, Source: SourcePool, Restore: restored}, false, nil
}

// kickRefill starts a refill after a claim, when WithPoolRefill set how,
// in a goroutine; the channel closes when the kick returned.
func (e *Engine) kickRefill(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	kick := e.poolConfig().kick
	if kick == nil {
		close(done)
		return done
	}
	kctx, cancel := settle(ctx)
	go func() {
		defer close(done)
		defer cancel()
		if err := kick(kctx); err != nil {
			e.log.WarnContext(ctx, "starting a pool refill failed; the reconcile schedule refills", "err", err)
		}
	}()
	return done
}

// evictPoolMember gives up one pool member to free its slot for a thread
// (a member goes before any thread's warm or paused sandbox): one holding
// a paused slot when paused, else one holding a running slot. It reports
// whether a slot was freed.
func (e *Engine) evictPoolMember(ctx context.Context, owner string, paused bool) bool {
	ps := e.poolStore()
	if ps == nil {
		return false
	}
	members, err := ps.SomePoolMembers(ctx, poolCandidates)
	if err != nil {
		return false
	}
	for _, m := range members {
		if m.Slots.Paused != paused {
			continue
		}
		if e.destroyPoolMember(ctx, m, owner, EventReasonCapacity) {
			e.log.InfoContext(ctx, "gave up a pool member for a thread", "sandbox_id", m.SandboxID, "paused", paused)
			return true
		}
	}
	return false
}

// Event reasons of the pool.
const (
	// EventReasonPoolRecycled: a pool member destroyed for its age or
	// because the pool is larger than its size.
	EventReasonPoolRecycled = "pool_recycled"
	// EventReasonClaimInterrupted: a claimed member whose hand-out was
	// interrupted (its claimer's lease lapsed), destroyed by reconcile.
	EventReasonClaimInterrupted = "claim_interrupted"
)

// destroyPoolMember claims a pooled member for destruction and destroys
// it for reason (one of EventReasons); false when a peer took it first
// or the kill is uncertain.
func (e *Engine) destroyPoolMember(ctx context.Context, m Record, owner, reason string) bool {
	now := e.now()
	claimed, err := e.store.Claim(ctx, Claim{SandboxID: m.SandboxID, Tenant: "", From: []State{StatePooled},
		To: StateDestroying, Owner: owner, Now: now, LeaseUntil: e.leaseUntil(ctx)})
	if err != nil {
		return false
	}
	return e.destroyClaimed(ctx, claimed, reason)
}

// takeOverClaim finishes the hand-out of a member claimed for the thread
// by an acquire that died (its lease lapsed); a live lease is waited out.
func (e *Engine) takeOverClaim(ctx context.Context, rec Record, owner string) (AcquireResult, bool, error) {
	now := e.now()
	claimed, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateClaiming},
		To: StateClaiming, Owner: owner, Now: now, LeaseUntil: e.leaseUntil(ctx)})
	if err != nil {
		return AcquireResult{}, true, fmt.Errorf("thread %s: pool member %s being handed out: %w", rec.ThreadKey, rec.SandboxID, err)
	}
	e.log.InfoContext(ctx, "taking over an interrupted pool claim", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
	return e.finishClaim(ctx, claimed)
}

// poolMarker is the file a refill writes into every member after its
// bootstrap, holding the member's id; checkMember reads it back.
const poolMarker = "/tmp/.sbx-pool-member"

// checkMember checks, under the probe's timeout, that a claimed member
// answers as a warm reclaim's probe does, with a command: a process
// must start and print the member's marker (poolMarker), its id. A
// member whose processes are stopped (wedged) fails it, even if its
// daemon still serves files. One round trip to the sandbox.
func (e *Engine) checkMember(ctx context.Context, ref SandboxRef) error {
	return e.runCheck(ctx, ref, "check", Command{Script: "cat -- " + poolMarker, Timeout: probeTimeout},
		func(out CommandResult) bool { return out.ExitCode == 0 && string(out.Stdout) == ref.ID })
}
