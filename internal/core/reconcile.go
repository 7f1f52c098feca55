package core

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"time"
)

// ReconcileSettings bound and tune one reconcile pass. Build them
// with DefaultReconcileSettings, override, and pass them with
// WithReconcileSettings; Reconcile validates them.
type ReconcileSettings struct {
	// MaxPages bounds the provider inventory pages read per pass
	// (RECONCILE_MAX_PAGES, > 0).
	MaxPages int
	// MaxItems bounds the sandboxes examined per pass (RECONCILE_MAX_ITEMS, > 0).
	MaxItems int
	// MaxDuration bounds a pass's inventory walk in wall time
	// (RECONCILE_MAX_SECONDS, > 0).
	MaxDuration time.Duration
	// Grace is how long a duplicate (or an untracked sandbox of a crashed
	// create) is left alone after reconcile first saw it
	// (RECONCILE_GRACE_SECONDS, >= 0).
	Grace time.Duration
	// OrphanTTL is the age past which a sandbox tagged for this deployment
	// but with no valid tenant/user/thread is killed
	// (RECONCILE_ORPHAN_TTL_SECONDS, > 0).
	OrphanTTL time.Duration
	// PageSize is the provider list page size (1..100, E2B's maximum).
	PageSize int
	// MaxBackoff caps the wait between kill attempts of a tombstone (> 0).
	MaxBackoff time.Duration
	// KnownTenants, when non-empty, lists the tenants this deployment
	// serves (RECONCILE_KNOWN_TENANTS). Tenants come from the authorizer and
	// there is no registry to ask, so this is the operator's word: a
	// sandbox of any other tenant is an orphan (killed after OrphanTTL).
	// Empty: every well-formed tenant counts as existing.
	KnownTenants []string
}

// DefaultReconcileSettings returns the defaults: 10 pages, 1000 items,
// 60 s, 30 s grace, 1 h orphan TTL (a pass only reads inventory, so its
// item budget is generous).
func DefaultReconcileSettings() ReconcileSettings {
	return ReconcileSettings{
		MaxPages:    10,
		MaxItems:    1000,
		MaxDuration: 60 * time.Second,
		Grace:       30 * time.Second,
		OrphanTTL:   time.Hour,
		PageSize:    100,
		MaxBackoff:  time.Hour,
	}
}

// Validate returns every problem, each naming its field.
func (r ReconcileSettings) Validate() error {
	var errs []error
	if r.MaxPages <= 0 {
		errs = append(errs, fmt.Errorf("MaxPages: must be > 0, got %d", r.MaxPages))
	}
	if r.MaxItems <= 0 {
		errs = append(errs, fmt.Errorf("MaxItems: must be > 0, got %d", r.MaxItems))
	}
	if r.MaxDuration <= 0 {
		errs = append(errs, fmt.Errorf("MaxDuration: must be > 0, got %s", r.MaxDuration))
	}
	if r.Grace < 0 {
		errs = append(errs, fmt.Errorf("Grace: must be >= 0, got %s", r.Grace))
	}
	if r.OrphanTTL <= 0 {
		errs = append(errs, fmt.Errorf("OrphanTTL: must be > 0, got %s", r.OrphanTTL))
	}
	if r.PageSize < 1 || r.PageSize > 100 {
		errs = append(errs, fmt.Errorf("PageSize: must be 1..100, got %d", r.PageSize))
	}
	if r.MaxBackoff <= 0 {
		errs = append(errs, fmt.Errorf("MaxBackoff: must be > 0, got %s", r.MaxBackoff))
	}
	return errors.Join(errs...)
}

// PagedLister lists one page of the provider inventory. cursor "" starts
// at the beginning; next "" means there are no more pages. E2B pages with
// nextToken / X-Next-Token (internal/e2b implements it). A provider offers
// it as Capabilities.Pager; without it the inventory is listed in full with
// Provider.List and paged in memory.
type PagedLister interface {
	ListPage(ctx context.Context, f ListFilter, cursor string, limit int) (page []SandboxInfo, next string, err error)
}

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

// ReconcileStore is the store access reconcile needs beyond Store
// (*ddbstore.Store implements it). Errors follow Store's classification:
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
	// RepairCounters compares the counters kept with the slots (used slots
	// and per-state counts of each capacity bucket, the paused slots of
	// each paused bucket, each user's and tenant's slot count) with the records and reservations holding
	// slots, and corrects each difference that the previous call saw
	// unchanged (so a write in flight is never mistaken for drift),
	// without overwriting a concurrent change. It also rebalances the
	// buckets' limits (for the deployment limit) when one holds more than
	// its limit, and drops tenants holding no slot from the fair-share
	// sets.
	RepairCounters(ctx context.Context, limit int) (CounterRepair, error)
}

// CounterRepair is what one ReconcileStore.RepairCounters call corrected.
type CounterRepair struct {
	// Slots is the correction applied to the deployment's used slots.
	Slots int
	// Counters is how many other counters were corrected (per-state
	// counts, users' and tenants' slot counts).
	Counters int
	// Rebalanced reports that the buckets' limits were rewritten.
	Rebalanced bool
	// TenantsDropped lists the tenants that left the fair-share sets.
	TenantsDropped []string
	// PausedSlots is the correction applied to the paused slots held
	// (counted with the running slots, in buckets of their own).
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

// reconcileConfig is what the reconcile Options set (Engine.rc).
type reconcileConfig struct {
	settings ReconcileSettings
	store    ReconcileStore
}

// reconcileConfig returns the engine's reconcile configuration, creating
// the default on first use (options run in New, before any concurrency).
func (e *Engine) reconcileConfig() *reconcileConfig {
	if e.rc == nil {
		e.rc = &reconcileConfig{settings: DefaultReconcileSettings()}
	}
	return e.rc
}

// WithReconcileSettings sets the reconcile budgets and periods (default
// DefaultReconcileSettings()). The zero value means the defaults; a zero
// PageSize or MaxBackoff takes its default.
func WithReconcileSettings(rs ReconcileSettings) Option {
	return func(e *Engine) {
		def := DefaultReconcileSettings()
		if reflect.ValueOf(rs).IsZero() {
			rs = def
		}
		if rs.PageSize == 0 {
			rs.PageSize = def.PageSize
		}
		if rs.MaxBackoff == 0 {
			rs.MaxBackoff = def.MaxBackoff
		}
		e.reconcileConfig().settings = rs
	}
}

// inventoryStore is the ReconcileStore: the one set with
// WithReconcileStore, else the Store if it implements it, else nil.
func (e *Engine) inventoryStore() ReconcileStore {
	rst := e.reconcileConfig().store
	if rst == nil {
		rst, _ = e.store.Store.(ReconcileStore)
	}
	if rst == nil {
		return nil
	}
	return meteredReconcileStore{ReconcileStore: rst, e: e}
}

// WithReconcileStore sets the store reconcile uses for inventory work
// (default: the engine's Store, if it implements ReconcileStore).
func WithReconcileStore(rs ReconcileStore) Option {
	return func(e *Engine) { e.reconcileConfig().store = rs }
}

// liveStates are the record states of a sandbox that may be in use
// (paused ones included: the thread's next acquire resumes them).
var liveStates = []State{StateActive, StateReleasing, StateWarm, StateReclaiming, StatePausing, StatePaused, StateResuming,
	StatePooled, StateClaiming}

func isLive(s State) bool {
	for _, l := range liveStates {
		if s == l {
			return true
		}
	}
	return false
}

// pass is one reconcile pass in progress.
type pass struct {
	e        *Engine
	rs       ReconcileSettings
	rst      ReconcileStore
	owner    string
	start    time.Time
	deadline time.Time
	// stopAt is when the invocation must wind down (wall clock): its
	// context's deadline less ReconcileReserve; zero without a deadline.
	stopAt time.Time
	st     ReconcileStats
	seen   []SeenSandbox
	// cursor is the inventory cursor as this pass leaves it (saved once,
	// at the end).
	cursor ReconcileCursor
}

// Reconcile runs one bounded pass: retries tombstones (with
// back-off), expires warm sandboxes idle past the idle timeout (all of them
// while draining), walks the provider inventory of this deployment from
// where the last pass stopped (adopting, deferring or killing), settles
// crashed creates and dead records once a walk completes, and repairs the
// capacity ledger. It never calls anything that extends a sandbox's life
// (List, Info, Capabilities.Discover and Kill only; warm sandboxes are synced through envd before
// they are destroyed). Stats are logged as one JSON line that is also a
// CloudWatch embedded-metric-format record.
//
// Errors: invalid ReconcileSettings; store or provider failures (the stats
// say what was done before).
func (e *Engine) Reconcile(ctx context.Context) (ReconcileStats, error) {
	cfg := e.reconcileConfig()
	if err := cfg.settings.Validate(); err != nil {
		return ReconcileStats{}, fmt.Errorf("reconcile settings: %w", err)
	}
	ctx, flush := e.withPublisher(ctx) // a stalled event bus costs the pass one bound, at its end
	defer flush()
	start := e.now()
	p := &pass{e: e, rs: cfg.settings, rst: e.inventoryStore(), owner: newOwner(), start: start, deadline: start.Add(cfg.settings.MaxDuration)}
	if dl, ok := ctx.Deadline(); ok {
		p.stopAt = dl.Add(-ReconcileReserve)
	}
	var errs []error
	draining := false
	if look, err := e.store.Lookup(ctx, ThreadKey{}, e.s.Limit()); err == nil {
		draining = look.Draining
	} else {
		// Expiry then runs as if not draining; the pass reports the error.
		errs = append(errs, fmt.Errorf("read ledger: %w", err))
	}
	if err := p.tombstones(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := p.releases(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := p.expireWarm(ctx, draining); err != nil {
		errs = append(errs, err)
	}
	if err := p.parkPaused(ctx, draining); err != nil {
		errs = append(errs, err)
	}
	if err := p.pool(ctx, draining); err != nil {
		errs = append(errs, err)
	}
	if p.rst != nil {
		if err := p.reconcileStore(ctx); err != nil {
			errs = append(errs, err)
		}
	} else {
		e.log.WarnContext(ctx, "reconcile: store has no inventory support; only expiry and tombstones run")
	}
	if err := p.waitQueue(ctx); err != nil {
		errs = append(errs, err)
	}
	e.emitCapacity(ctx)
	p.st.Duration = e.now().Sub(start)
	err := errors.Join(errs...)
	if err != nil {
		p.st.Errors++
	}
	p.emit(ctx, err)
	return p.st, err
}

// reconcileBatch bounds the tombstones and idle warm records one pass handles.
const reconcileBatch = 100

// tombstones retries kills whose lease lapsed, each after a back-off that
// doubles with the attempts reconcile made (LeaseDuration << attempts,
// at most MaxBackoff), measured from the last attempt.
func (p *pass) tombstones(ctx context.Context) error {
	e := p.e
	tombs, err := e.store.Tombstones(ctx, reconcileBatch)
	if err != nil {
		return fmt.Errorf("list tombstones: %w", err)
	}
	e.emitTombstoneAge(ctx, tombs)
	for _, rec := range tombs {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			break
		}
		now := e.now()
		wait := e.s.LeaseDuration << min(rec.KillAttempts, 20)
		if wait > p.rs.MaxBackoff || wait <= 0 {
			wait = p.rs.MaxBackoff
		}
		if now.Before(rec.UpdatedAt.Add(wait)) {
			continue // backing off
		}
		claimed, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateDestroying},
			Owner: p.owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)})
		if err != nil {
			p.skip(ctx, "claim tombstone", rec.SandboxID, err) // usually a peer holds its lease
			continue
		}
		p.st.TombstonesRetried++
		tomb, err := e.applyRecord(ctx, Update{SandboxID: claimed.SandboxID, Fence: claimed.Fence, State: StateDestroying,
			KeepLease: true, Now: e.now(), KillAttempt: true, Slot: claimed.Slot})
		if err != nil {
			p.fail(ctx, "count kill attempt", claimed.SandboxID, err)
			continue
		}
		if e.destroyClaimed(ctx, tomb, EventReasonKillRetried) {
			p.st.Killed++
		} else {
			p.st.Errors++
		}
	}
	return nil
}

// releases finishes the releases whose invocation died midway: records
// left releasing after their lease lapsed are claimed, their outputs
// synced, then parked warm (or destroyed, as a release would).
func (p *pass) releases(ctx context.Context) error {
	if p.rst == nil {
		return nil
	}
	e := p.e
	now := e.now()
	var stale []Record
	err := p.rst.ScanState(ctx, StateReleasing, func(r Record) bool {
		if !r.LeaseExpiresAt.After(now) {
			stale = append(stale, r)
		}
		return len(stale) < reconcileBatch
	})
	if err != nil {
		return fmt.Errorf("scan releasing records: %w", err)
	}
	for _, rec := range stale {
		if p.timeUp() {
			break
		}
		now := e.now()
		claimed, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateReleasing},
			To: StateReleasing, Owner: p.owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)})
		if err != nil {
			p.skip(ctx, "claim interrupted release", rec.SandboxID, err) // usually a peer took it over (a retried release, an acquire)
			continue
		}
		e.log.InfoContext(ctx, "reconcile: finishing an interrupted release", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
		if _, err := e.finishRelease(ctx, claimed, false); err != nil {
			p.st.Errors++
			e.log.WarnContext(ctx, "reconcile: finishing a release failed", "sandbox_id", rec.SandboxID, "err", err)
			continue
		}
		p.st.ReleasesTakenOver++
	}
	return nil
}

// ReconcileReserve is the time a pass keeps, before its invocation's
// deadline, for what it must still write (the sandbox it is on, the
// cursor, its stats): the walk, the tombstone retries and the expiries
// stop starting new work past it, and a sync before expiry ends by it.
const ReconcileReserve = 10 * time.Second

// outOfTime reports that the invocation's remaining time is spent (see
// ReconcileReserve); the walk also stops at its own budget (timeUp).
func (p *pass) outOfTime() bool { return !p.stopAt.IsZero() && !time.Now().Before(p.stopAt) }

// expireWarm destroys warm sandboxes parked longer than the idle timeout
// less Settings.ExpiryLead, while the provider still runs them (every warm
// sandbox while draining), syncing their outputs first. It
// holds a lease on the warm record while it syncs, and destroys the
// sandbox only when every output is in S3 (or the provider already ended
// it): an incomplete or failed sync leaves it warm, counted Deferred, for
// the next pass. Syncs end by the invocation's stop time.
func (p *pass) expireWarm(ctx context.Context, draining bool) error {
	e := p.e
	before, reason := p.start.Add(-(e.s.IdleTimeout - e.s.ExpiryLead())), EventReasonIdleExpired
	if draining {
		before, reason = p.start.Add(time.Millisecond), EventReasonDraining
	}
	idle, err := e.store.WarmParkedBefore(ctx, before, reconcileBatch)
	if err != nil {
		return fmt.Errorf("list idle warm sandboxes: %w", err)
	}
	for _, rec := range idle {
		if p.outOfTime() {
			p.st.BudgetExhausted = true
			break
		}
		now := e.now()
		claimed, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateWarm},
			Owner: p.owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)})
		if err != nil {
			p.skip(ctx, "claim idle warm sandbox", rec.SandboxID, err) // usually a peer took it (reclaim or another pass)
			continue
		}
		if complete, gone := p.syncParked(ctx, claimed, "expiry"); !complete && !gone {
			p.st.Deferred++
			e.unleaseWarm(ctx, claimed) // back to plain warm, still idle: the next pass retries
			continue
		}
		tomb, err := e.applyRecord(ctx, Update{SandboxID: claimed.SandboxID, Fence: claimed.Fence, State: StateDestroying,
			KeepLease: true, Now: e.now(), Slot: claimed.Slot})
		if err != nil {
			p.st.Errors++
			continue
		}
		tomb.PrevState = StateWarm // the state it left: the claim only took a lease
		if e.destroyClaimed(ctx, tomb, reason) {
			p.st.Expired++
		} else {
			p.st.Errors++
		}
	}
	return nil
}

// syncParked copies a parked sandbox's outputs to S3 before it is
// destroyed or paused (what names the step, for logs): complete when every
// output is in S3, gone when the provider already ended the sandbox
// (nothing left to copy). The sync ends by the invocation's stop time.
func (p *pass) syncParked(ctx context.Context, rec Record, what string) (complete, gone bool) {
	e := p.e
	if e.sync == nil {
		return true, false
	}
	ctx, cancel := p.workContext(ctx)
	defer cancel()
	// Envd reads only: they do not extend the sandbox's life. A sandbox
	// the provider already ended answers ErrSandboxGone.
	res, err := e.sync.Sync(ctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
	switch {
	case errors.Is(err, ErrSandboxGone):
		return false, true
	case err != nil:
		e.log.WarnContext(ctx, "reconcile: sync before "+what+" failed; kept warm for the next pass", "sandbox_id", rec.SandboxID, "err", err)
		return false, false
	case !res.Complete:
		e.log.WarnContext(ctx, "reconcile: sync before "+what+" incomplete; kept warm for the next pass", "sandbox_id", rec.SandboxID, "deferred", len(res.Deferred))
		return false, false
	}
	return true, false
}

func (p *pass) timeUp() bool { return !p.e.now().Before(p.deadline) || p.outOfTime() }

// skip accounts for an item the pass leaves alone because a write or read
// about it failed. Contention (a peer holds or moved the record, or settled
// it first) is expected and not an error; anything else is logged once
// here and counted in Errors, never dropped.
func (p *pass) skip(ctx context.Context, what, id string, err error) {
	if errors.Is(err, ErrLeaseHeld) || errors.Is(err, ErrConflict) || errors.Is(err, ErrStaleFence) || errors.Is(err, ErrNotFound) {
		return
	}
	p.fail(ctx, what, id, err)
}

// fail logs a failed step of the pass and counts it in Errors.
func (p *pass) fail(ctx context.Context, what, id string, err error) {
	p.st.Errors++
	p.e.log.WarnContext(ctx, "reconcile: "+what+" failed", "sandbox_id", id, "err", err)
}

// reconcileStore runs the inventory walk and the ledger repair, then saves
// the cursor (one conditional write; a concurrent pass that saved first
// wins and this pass's position is dropped).
func (p *pass) reconcileStore(ctx context.Context) error {
	cur, err := p.rst.Cursor(ctx)
	if err != nil {
		return fmt.Errorf("read reconcile cursor: %w", err)
	}
	p.cursor = cur
	errs := []error{p.inventory(ctx)}
	if !p.timeUp() || p.st.InventoryComplete {
		errs = append(errs, p.ledger(ctx))
	}
	if err := p.rst.SaveCursor(ctx, p.cursor); err != nil && !errors.Is(err, ErrConflict) {
		errs = append(errs, fmt.Errorf("save reconcile cursor: %w", err))
	}
	return errors.Join(errs...)
}

// inventory walks the provider inventory from the cursor.
func (p *pass) inventory(ctx context.Context) error {
	e := p.e
	cur := p.cursor
	if cur.Cycle == "" {
		cur.Cycle = strconv.FormatInt(p.start.UnixMilli(), 10) + "-" + p.owner[4:12]
		cur.CycleStart = p.start
		cur.Token, cur.Pass = "", 0
	}
	lister := e.caps.Pager
	if lister == nil {
		lister = &memLister{prov: e.prov}
	}
	// Paused sandboxes too: they are the threads' and hold paused slots.
	filter := ListFilter{Metadata: map[string]string{MetaDeployment: e.s.Deployment}, States: []string{SandboxRunning, SandboxPaused}}
	complete := false
	var walkErr error
	for {
		if p.st.Pages >= p.rs.MaxPages || p.st.Discovered >= p.rs.MaxItems || p.timeUp() {
			p.st.BudgetExhausted = true
			break
		}
		limit := min(p.rs.PageSize, p.rs.MaxItems-p.st.Discovered)
		infos, next, err := lister.ListPage(ctx, filter, cur.Token, limit)
		p.st.Pages++
		if err != nil {
			walkErr = fmt.Errorf("list provider inventory: %w", err)
			if cur.Token != "" && !IsAmbiguous(err) {
				// The provider refused the cursor (expired token): start over.
				cur.Cycle = ""
			}
			break
		}
		done, err := p.processPage(ctx, infos)
		if err != nil {
			// Nothing decided for this page: it is read again next pass, and
			// the walk stays incomplete (an incomplete inventory frees nothing).
			walkErr = err
			break
		}
		if !done {
			p.st.BudgetExhausted = true // stopped mid-page: the page is read again
			break
		}
		cur.Token = next
		if next == "" {
			complete = true
			break
		}
	}
	cur.Pass++
	if complete {
		p.st.InventoryComplete = true
		seen := p.seen
		if cur.Pass > 1 {
			earlier, err := p.rst.Seen(ctx, cur.Cycle)
			if err != nil {
				return errors.Join(walkErr, fmt.Errorf("read cycle inventory: %w", err))
			}
			seen = append(seen, earlier...)
		}
		if err := p.completeChecks(ctx, cur.CycleStart, seen); err != nil {
			walkErr = errors.Join(walkErr, err)
		}
		cur.Cycle, cur.Token, cur.Pass, cur.CycleStart = "", "", 0, time.Time{}
	} else if len(p.seen) > 0 && cur.Cycle != "" {
		part := fmt.Sprintf("%06d-%s", cur.Pass, p.owner[4:])
		if err := p.rst.SaveSeen(ctx, cur.Cycle, part, p.seen); err != nil {
			return errors.Join(walkErr, fmt.Errorf("save cycle inventory: %w", err))
		}
	}
	p.cursor = cur
	return walkErr
}

// tenantKnown reports whether tenant is one this deployment serves (every
// tenant when ReconcileSettings.KnownTenants is empty).
func (p *pass) tenantKnown(tenant string) bool {
	return len(p.rs.KnownTenants) == 0 || slices.Contains(p.rs.KnownTenants, tenant)
}

// validKey reports the thread key a sandbox's metadata names, if valid.
func validKey(md map[string]string) (ThreadKey, bool) {
	k := ThreadKey{Tenant: md[MetaTenant], User: md[MetaUser], Thread: md[MetaThread]}
	return k, k.Validate() == nil
}

// age is how long ago the sandbox started, as far as anyone knows.
func startedAt(in SandboxInfo) time.Time {
	t := in.StartedAt
	if c, err := time.Parse(time.RFC3339, in.Metadata[MetaCreatedAt]); err == nil && (t.IsZero() || c.Before(t)) {
		t = c
	}
	return t
}

// processPage examines one page. It returns false when the wall-clock
// budget ran out before the page was done, and an error when the store
// could not be read (nothing was decided then).
func (p *pass) processPage(ctx context.Context, infos []SandboxInfo) (bool, error) {
	ids := make([]string, 0, len(infos))
	var keys []ThreadKey
	keySeen := map[ThreadKey]bool{}
	for _, in := range infos {
		ids = append(ids, in.ID)
		if k, ok := validKey(in.Metadata); ok && !keySeen[k] {
			keySeen[k] = true
			keys = append(keys, k)
		}
	}
	look, err := p.rst.LookupMany(ctx, ids, keys, nil)
	if err != nil {
		return false, fmt.Errorf("look up inventory page: %w", err)
	}
	// Second round: the records bindings name, and reservations.
	var more []string
	var tokens []string
	for _, b := range look.Bindings {
		if b.SandboxID != "" {
			if _, ok := look.Records[b.SandboxID]; !ok {
				more = append(more, b.SandboxID)
			}
		}
		if b.Reservation != "" {
			tokens = append(tokens, b.Reservation)
		}
	}
	for _, in := range infos {
		if t := in.Metadata[MetaReservation]; t != "" {
			tokens = append(tokens, t)
		}
	}
	if len(more) > 0 || len(tokens) > 0 {
		look2, err := p.rst.LookupMany(ctx, more, nil, tokens)
		if err != nil {
			return false, fmt.Errorf("look up inventory page: %w", err)
		}
		for id, r := range look2.Records {
			look.Records[id] = r
		}
		look.Reservations = look2.Reservations
	}
	if look.Reservations == nil {
		look.Reservations = map[string]PendingReservation{}
	}

	groups := map[ThreadKey][]SandboxInfo{}
	var order []ThreadKey
	for _, in := range infos {
		if p.timeUp() {
			return false, nil
		}
		p.st.Discovered++
		p.seen = append(p.seen, SeenSandbox{ID: in.ID, Reservation: in.Metadata[MetaReservation]})
		if in.Metadata[MetaPool] == MetaPoolMember {
			p.poolSandbox(ctx, in, look)
			continue
		}
		k, ok := validKey(in.Metadata)
		if !ok || !p.tenantKnown(k.Tenant) {
			p.orphan(ctx, in, look)
			continue
		}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], in)
	}
	for _, k := range order {
		g := groups[k]
		sort.SliceStable(g, func(i, j int) bool {
			ti, tj := startedAt(g[i]), startedAt(g[j])
			if !ti.Equal(tj) {
				return ti.Before(tj)
			}
			return g[i].ID < g[j].ID
		})
		p.group(ctx, k, g, look)
	}
	return true, nil
}

// crashed reports whether a reservation's create is presumed dead.
func (p *pass) crashed(r PendingReservation, now time.Time) bool {
	return !now.Before(r.ExpiresAt.Add(p.rs.Grace))
}

// group decides for the sandboxes of one thread (oldest first): the
// canonical one is the one the binding names, else the oldest live one,
// which is adopted; the others are duplicates.
func (p *pass) group(ctx context.Context, key ThreadKey, g []SandboxInfo, look ReconcileLookup) {
	e := p.e
	now := e.now()
	b, bound := look.Bindings[key]
	canonical := ""
	inflight := false
	switch {
	case bound && b.SandboxID != "":
		if r, ok := look.Records[b.SandboxID]; ok && isLive(r.State) {
			canonical = b.SandboxID
		}
	case bound && b.Reservation != "":
		if r, ok := look.Reservations[b.Reservation]; ok && !p.crashed(r, now) {
			inflight = true
		}
	}
	for _, in := range g {
		rec, tracked := look.Records[in.ID]
		if tracked && !isLive(rec.State) {
			continue // tombstone (retried above) or gone (a sandbox killed late is found again later)
		}
		if in.ID == canonical {
			continue
		}
		token := in.Metadata[MetaReservation]
		res, hasRes := look.Reservations[token]
		if !tracked && hasRes && !p.crashed(res, now) {
			p.st.Deferred++ // its create is still in flight
			continue
		}
		if inflight {
			p.st.Deferred++ // the thread's create is in flight; decide once it settled
			continue
		}
		if canonical == "" {
			var err error
			if tracked {
				err = p.rst.Rebind(ctx, key, in.ID, b, bound)
			} else {
				a := Adoption{Record: p.adoptedRecord(in, key, p.adoptedState(in)), Bind: true, From: b, FromBound: bound}
				if hasRes {
					a.Reservation = token
				}
				var adopted Record
				adopted, err = p.rst.Adopt(ctx, a)
				if err == nil {
					p.adopted(ctx, adopted, hasRes)
				}
			}
			if err != nil {
				p.st.Deferred++
				e.log.InfoContext(ctx, "reconcile: adoption deferred", "sandbox_id", in.ID, "thread", key.String(), "err", err)
				continue
			}
			e.log.InfoContext(ctx, "reconcile: adopted", "sandbox_id", in.ID, "thread", key.String(), "tracked", tracked)
			p.st.Adopted++
			canonical = in.ID
			b, bound = Binding{ThreadKey: key, SandboxID: in.ID}, true
			continue
		}
		p.st.Duplicates++
		p.killDuplicate(ctx, listed{in: in, rec: rec, tracked: tracked, token: token, hasRes: hasRes}, key, canonical)
	}
}

// adoptedRecord is the record written for an untracked sandbox. Warm: the
// thread's next acquire reclaims it (and idle expiry ends it if unused).
func (p *pass) adoptedRecord(in SandboxInfo, key ThreadKey, state State) Record {
	now := p.e.now()
	created := startedAt(in)
	if created.IsZero() {
		created = now
	}
	r := Record{SandboxID: in.ID, ThreadKey: key, Seed: key.Seed(), State: state, Backend: p.e.prov.Name(),
		ReservationToken: in.Metadata[MetaReservation], CreatedAt: created, UpdatedAt: now, ExpiresAt: in.EndAt,
		PrevMeteredAt: created, MeteredAt: now} // it ran untracked since its start
	if p.e.caps.Locate != nil {
		r.Endpoint = p.e.caps.Locate(in.ID)
	}
	switch state {
	case StateWarm:
		r.ParkedAt = now
	case StatePaused:
		r.ParkedAt, r.Slots = now, Slots{NoRunning: true, Paused: true}
	case StateDestroying:
		r.LeaseOwner, r.LeaseExpiresAt = p.owner, now.Add(p.e.s.LeaseDuration)
	}
	return r
}

// adopted accounts for a sandbox adopted for its thread and publishes
// EventAdopted (from creating when it took over its create's reservation).
func (p *pass) adopted(ctx context.Context, rec Record, hadReservation bool) {
	from := State("")
	if hadReservation {
		p.st.ReservationsSettled++
		from = StateCreating
	}
	p.e.emit(ctx, rec, from, rec.State, EventAdopted, EventReasonUntracked)
}

// adoptedState is the state a canonical sandbox reconcile adopts gets:
// paused when the provider lists it paused and the broker can resume it
// (it takes a paused slot), else warm (the thread's next acquire
// reclaims it, and idle expiry ends it if unused).
func (p *pass) adoptedState(in SandboxInfo) State {
	if in.State == SandboxPaused && p.e.pauseStore() != nil {
		return StatePaused
	}
	return StateWarm
}

// graceOver reports whether reconcile first saw id at least d ago (and
// records the first sighting when this is it). since, when non-zero, is
// an earlier known start.
func (p *pass) graceOver(ctx context.Context, id string, d time.Duration, since time.Time) (bool, error) {
	now := p.e.now()
	first, err := p.rst.FirstSeen(ctx, id, now)
	if err != nil {
		return false, err
	}
	if !since.IsZero() && since.Before(first) {
		first = since
	}
	return !now.Before(first.Add(d)), nil
}

// graceWaited is graceOver for a decision to kill: false, counted
// Deferred (or as a failure when the sighting could not be recorded),
// until d has passed.
func (p *pass) graceWaited(ctx context.Context, id string, d time.Duration, since time.Time) bool {
	over, err := p.graceOver(ctx, id, d, since)
	if err != nil {
		p.fail(ctx, "record first sighting", id, err)
		return false
	}
	if !over {
		p.st.Deferred++
	}
	return over
}

// killClaimed destroys a sandbox the pass holds the destroy claim on, for
// reason (one of EventReasons), counting it Killed, or in Errors when the
// kill is not confirmed.
func (p *pass) killClaimed(ctx context.Context, claimed Record, reason string) {
	if p.e.destroyClaimed(ctx, claimed, reason) {
		p.st.Killed++
	} else {
		p.st.Errors++
	}
}

// listed is one sandbox of the provider's inventory with what the store
// knows of it.
type listed struct {
	in      SandboxInfo
	rec     Record // its record, when tracked
	tracked bool
	token   string // the reservation token in its metadata
	hasRes  bool   // that reservation still exists
}

// killDuplicate destroys a duplicate once its grace period is over and no
// peer holds it, under a destroy claim conditional on the binding still
// naming canonical.
func (p *pass) killDuplicate(ctx context.Context, l listed, key ThreadKey, canonical string) {
	e := p.e
	in, rec, tracked, token, hasRes := l.in, l.rec, l.tracked, l.token, l.hasRes
	now := e.now()
	if tracked && rec.Leased(p.owner, now) {
		p.st.Deferred++
		return
	}
	if !p.graceWaited(ctx, in.ID, p.rs.Grace, time.Time{}) {
		return
	}
	var claimed Record
	var err error
	if tracked {
		claimed, err = p.rst.ClaimDuplicate(ctx, Claim{SandboxID: in.ID, Tenant: rec.Tenant, From: liveStates, To: StateDestroying,
			Owner: p.owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)}, key, canonical)
	} else {
		a := Adoption{Record: p.adoptedRecord(in, key, StateDestroying), Canonical: canonical}
		if hasRes {
			a.Reservation = token
		}
		claimed, err = p.rst.Adopt(ctx, a)
		if err == nil && hasRes {
			p.st.ReservationsSettled++
		}
	}
	if err != nil {
		p.st.Deferred++
		e.log.InfoContext(ctx, "reconcile: duplicate claim lost", "sandbox_id", in.ID, "err", err)
		return
	}
	e.log.InfoContext(ctx, "reconcile: killing duplicate", "sandbox_id", in.ID, "thread", key.String(), "canonical", canonical)
	p.killClaimed(ctx, claimed, EventReasonDuplicate)
}

// orphan handles a sandbox tagged for this deployment without a valid
// thread key: killed once older than OrphanTTL.
func (p *pass) orphan(ctx context.Context, in SandboxInfo, look ReconcileLookup) {
	e := p.e
	p.st.Orphans++
	if rec, ok := look.Records[in.ID]; ok && rec.State != StateGone {
		return // tracked (a tombstone being retried)
	}
	if !p.graceWaited(ctx, in.ID, p.rs.OrphanTTL, startedAt(in)) {
		return
	}
	key := ThreadKey{Tenant: in.Metadata[MetaTenant], User: in.Metadata[MetaUser], Thread: in.Metadata[MetaThread]}
	a := Adoption{Record: p.adoptedRecord(in, key, StateDestroying)}
	if t := in.Metadata[MetaReservation]; t != "" {
		if _, ok := look.Reservations[t]; ok {
			a.Reservation = t
		}
	}
	claimed, err := p.rst.Adopt(ctx, a)
	if err != nil {
		p.st.Deferred++
		p.skip(ctx, "adopt orphan", in.ID, err)
		return
	}
	e.log.InfoContext(ctx, "reconcile: killing orphan", "sandbox_id", in.ID)
	p.killClaimed(ctx, claimed, EventReasonOrphan)
}

// completeChecks runs once a cycle's inventory is complete: records whose
// sandbox is in no page are dead (confirmed with a read, then freed under a
// destroy claim) and crashed reservations whose token is in no sandbox are
// freed. Only what predates the cycle is judged.
func (p *pass) completeChecks(ctx context.Context, cycleStart time.Time, seen []SeenSandbox) error {
	e := p.e
	ids := make(map[string]bool, len(seen))
	tokens := make(map[string]bool, len(seen))
	for _, s := range seen {
		ids[s.ID] = true
		if s.Reservation != "" {
			tokens[s.Reservation] = true
		}
	}
	var candidates []Record
	for _, st := range liveStates {
		err := p.rst.ScanState(ctx, st, func(r Record) bool {
			if !ids[r.SandboxID] && r.CreatedAt.Before(cycleStart) {
				candidates = append(candidates, r)
			}
			return len(candidates) < p.rs.MaxItems
		})
		if err != nil {
			return fmt.Errorf("scan %s records: %w", st, err)
		}
	}
	for _, r := range candidates {
		if p.timeUp() {
			break
		}
		if gone, err := e.confirmedGone(ctx, r.SandboxID); !gone {
			if err != nil {
				p.fail(ctx, "confirm dead sandbox", r.SandboxID, err) // unknown: never free on doubt
			}
			continue // alive after all (listed late)
		}
		now := e.now()
		claimed, err := e.store.Claim(ctx, Claim{SandboxID: r.SandboxID, Tenant: r.Tenant, From: liveStates, To: StateDestroying,
			Owner: p.owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)})
		if errors.Is(err, ErrLeaseHeld) {
			p.st.Deferred++
			continue
		}
		if err != nil {
			p.skip(ctx, "claim dead record", r.SandboxID, err)
			continue
		}
		if e.destroyClaimed(ctx, claimed, EventReasonGone) {
			p.st.Dead++
		} else {
			p.st.Errors++
		}
	}
	var crashed []Record
	now := e.now()
	err := p.rst.ScanState(ctx, StateCreating, func(r Record) bool {
		if !tokens[r.ReservationToken] && r.ExpiresAt.Add(p.rs.Grace).Before(cycleStart) && !now.Before(r.ExpiresAt.Add(p.rs.Grace)) {
			crashed = append(crashed, r)
		}
		return len(crashed) < p.rs.MaxItems
	})
	if err != nil {
		return fmt.Errorf("scan reservations: %w", err)
	}
	for _, r := range crashed {
		if err := e.store.FreeReservation(ctx, r.ReservationToken, r.ThreadKey); err != nil {
			p.skip(ctx, "free crashed reservation "+r.ReservationToken, "", err) // ErrNotFound: a peer freed it
			continue
		}
		e.log.InfoContext(ctx, "reconcile: freed crashed reservation", "reservation", r.ReservationToken, "thread", r.ThreadKey.String())
		p.st.ReservationsSettled++
	}
	return nil
}

// ledger repairs the counters kept with the slots (RepairCounters): the
// capacity buckets' used and per-state counts, the paused buckets, the
// users' and tenants' slot counts, the buckets' limits and the fair-share
// tenant sets.
func (p *pass) ledger(ctx context.Context) error {
	// The repair may read the whole table (its exact count): it ends by
	// the stop time, leaving the reserve for the cursor's save.
	wctx, cancel := p.workContext(ctx)
	defer cancel()
	rep, err := p.rst.RepairCounters(wctx, p.e.s.Limit())
	p.st.LedgerRepaired = rep.Slots
	if rep.Slots != 0 || rep.PausedSlots != 0 || rep.Counters != 0 || rep.Rebalanced {
		p.e.log.WarnContext(ctx, "reconcile: slot counters repaired", "slots", rep.Slots, "paused_slots", rep.PausedSlots,
			"counters", rep.Counters, "rebalanced", rep.Rebalanced)
	}
	if perr := p.poolLedger(ctx, rep.Pool); perr != nil {
		err = errors.Join(err, perr)
	}
	if len(rep.TenantsDropped) > 0 {
		p.e.log.InfoContext(ctx, "reconcile: idle tenants dropped from the fair-share set", "tenants", rep.TenantsDropped)
	}
	if err != nil {
		return fmt.Errorf("repair counters: %w", err)
	}
	return nil
}

// waitQueue serves the wait queue as a backstop of the dispatches that
// follow frees and the waiters' own turns: lapsed tickets are removed,
// lapsed grants passed on or freed, and the room there is (a slot freed
// by a repair, a raised limit) granted to the first waiters.
func (p *pass) waitQueue(ctx context.Context) error {
	res, err := p.e.store.Dispatch(ctx, Dispatch{Now: p.e.now(), Limit: p.e.s.Limit(), Bucket: -1, Scan: true,
		GrantFor: grantFor})
	if err != nil {
		return fmt.Errorf("serve the wait queue: %w", err)
	}
	if len(res.Granted) > 0 || res.Cleaned > 0 {
		p.e.log.InfoContext(ctx, "reconcile: wait queue served", "granted", len(res.Granted), "cleaned", res.Cleaned, "head", res.Head)
	}
	return nil
}

// memLister pages a provider's full listing in memory (providers without
// PagedLister): the cursor is the last id returned.
type memLister struct{ prov Provider }

func (m *memLister) ListPage(ctx context.Context, f ListFilter, cursor string, limit int) ([]SandboxInfo, string, error) {
	all, err := m.prov.List(ctx, f)
	if err != nil {
		return nil, "", err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	i := sort.Search(len(all), func(i int) bool { return all[i].ID > cursor })
	if cursor == "" {
		i = 0
	}
	end := min(i+limit, len(all))
	next := ""
	if end < len(all) {
		next = all[end-1].ID
	}
	return all[i:end], next, nil
}
