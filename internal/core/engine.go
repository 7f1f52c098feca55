package core

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// Metadata keys written to every sandbox the broker creates, so the provider
// inventory can be mapped back to threads and reservations by reconcile.
const (
	MetaTenant      = "sbx_tenant"
	MetaUser        = "sbx_user"
	MetaThread      = "sbx_thread"
	MetaSeed        = "sbx_seed"
	MetaDeployment  = "sbx_deployment"
	MetaCreatedAt   = "sbx_created_at" // RFC 3339
	MetaReservation = "sbx_reservation"
)

// bootstrapMarker is printed by the bootstrap script on success.
const bootstrapMarker = "BOOTSTRAP_OK"

// bootstrapScript prepares the directories agent tools expect:
// workspace/ uploads/ outputs/ acp-workspace/ under the home, /mnt/user-data
// -> home and /mnt/acp-workspace -> home/acp-workspace. The home arrives in
// $SBX_HOME, never interpolated. Links are tried without, then with, sudo.
const bootstrapScript = `set -e
for d in workspace uploads outputs acp-workspace; do mkdir -p "$SBX_HOME/$d"; done
link() { ln -sfn "$1" "$2" 2>/dev/null || sudo -n ln -sfn "$1" "$2"; }
[ -d /mnt ] || mkdir -p /mnt 2>/dev/null || sudo -n mkdir -p /mnt
link "$SBX_HOME" /mnt/user-data
link "$SBX_HOME/acp-workspace" /mnt/acp-workspace
echo ` + bootstrapMarker

// Engine implements Broker over a Store, a Provider and an OutputSyncer.
type Engine struct {
	s     Settings
	store meteredStore // the Store, metering every transition (usage.go)
	prov  Provider
	caps  Capabilities // prov.Capabilities(), read once
	sync  OutputSyncer
	log   *slog.Logger
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
	rc    *reconcileConfig
	// events receives the lifecycle events (nil: none are published).
	events EventSink
	pc     *poolConfig
	// waitObserver hears the wait queue's notes (nil: none).
	waitObserver func(WaitNote)
}

var _ Broker = (*Engine)(nil)

// Option customises an Engine.
type Option func(*Engine)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(e *Engine) { e.log = l } }

// WithClock sets the clock (default time.Now).
func WithClock(now func() time.Time) Option { return func(e *Engine) { e.now = now } }

// WithSleep replaces the back-off sleep (tests); it must return ctx.Err()
// when ctx ends first.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(e *Engine) { e.sleep = sleep }
}

// New validates s and returns an engine. syncer may be nil (no output sync).
func New(s Settings, store Store, prov Provider, syncer OutputSyncer, opts ...Option) (*Engine, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("settings: %w", err)
	}
	if store == nil || prov == nil {
		return nil, errors.New("core: store and provider are required")
	}
	caps := prov.Capabilities()
	if caps.Protocol == "" {
		return nil, fmt.Errorf("core: provider %s declares no endpoint protocol", prov.Name())
	}
	e := &Engine{s: s, prov: prov, caps: caps, sync: syncer, log: slog.Default(), now: time.Now, sleep: sleepCtx}
	e.store = meteredStore{Store: store, e: e}
	for _, o := range opts {
		o(e)
	}
	e.reconcileConfig()
	if err := e.validatePool(); err != nil {
		return nil, fmt.Errorf("pool settings: %w", err)
	}
	return e, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// newOwner returns a fresh lease owner id for one engine call.
func newOwner() string {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return "inv-" + hex.EncodeToString(b[:])
}

// backoff returns the n-th jittered wait (100 ms doubling, capped at 1 s).
func backoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(n, 4)
	d = min(d, time.Second)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// responseMargin is kept free of an invocation's remaining time so that
// an acquire still answers before Lambda or API Gateway gives up.
const responseMargin = time.Second

// maxUnusable bounds the sandboxes one acquire gives up on (dead after
// create, failed bootstrap, wedged) before answering ErrProviderUnavailable.
const maxUnusable = 3

// createBudget is the time kept for create + bootstrap after waiting.
const createBudget = 10 * time.Second

// Acquire hands the thread a live sandbox: its active one if alive (reused),
// else its parked one (reclaimed from warm, resumed from paused), else a
// pool member when a pool is kept (pool, see fromPool), else a new one
// (created). A peer's live lease on the thread's record (a release
// syncing, a create in flight) is waited out up to the acquire timeout,
// capped by ctx's deadline. Under the wait policy it waits for a slot in
// the wait queue: it asks again (AcquireOrWait) with its ticket every
// Waiting.RetryAfter, as the HTTP clients do, and gives its place up when
// ctx ends. A reuse or reclaim whose sandbox does not answer within
// probeTimeout is discarded and replaced; the answer is written before
// ctx's deadline (see begin). Its DynamoDB calls per path are measured by
// BenchmarkAcquireDynamoDBCalls.
//
// Errors: *ValidationError; *CapacityError when no slot frees in time
// (one of RefusalReasons);
// ErrLeaseHeld when a peer holds the thread past the acquire timeout;
// ErrStoreUnavailable or an ambiguous *ProviderError on outages;
// ErrProviderUnavailable when created sandboxes died or failed their
// bootstrap and no retry fitted in the time left.
func (e *Engine) Acquire(ctx context.Context, key ThreadKey) (AcquireResult, error) {
	req := AcquireRequest{Key: key}
	for {
		res, err := e.AcquireOrWait(ctx, req)
		if err != nil || res.Waiting == nil {
			return res, err
		}
		req.Ticket = res.Waiting.Ticket
		if err := e.sleep(ctx, res.Waiting.RetryAfter); err != nil {
			e.giveUpTicket(ctx, req)
			return AcquireResult{}, fmt.Errorf("acquire: %w", err)
		}
	}
}

// AcquireOrWait is one ask of an acquire: it hands req's thread its
// sandbox, or, under the wait policy when no slot is free, answers at
// once with the acquire's place in the wait queue (AcquireResult.Waiting)
// rather than holding the invocation; the caller asks again with its
// ticket. An ask with a ticket reads it first: granted, it takes the
// granted slot; still waiting, it takes its turn (waitTurn) and answers
// Waiting again, until the wait's end (Settings.AcquireTimeout after the
// first ask), when it is refused for capacity.
//
// Errors are Acquire's, and a *ValidationError (field "ticket") for a
// ticket that is malformed or another thread's.
func (e *Engine) AcquireOrWait(ctx context.Context, req AcquireRequest) (AcquireResult, error) {
	key := req.Key
	if err := key.Validate(); err != nil {
		return AcquireResult{}, err
	}
	st := &acquireState{}
	waitEnd := e.now().Add(e.s.AcquireTimeout)
	if req.Ticket != "" {
		t, err := decodeTicket(req.Ticket, key)
		if err != nil {
			return AcquireResult{}, err
		}
		st.wait, waitEnd = &waiting{ticket: t}, t.Until.Add(-ticketGrace)
	}
	ctx, cancel := e.begin(ctx)
	defer cancel()
	owner := newOwner()
	defer e.leaveWait(ctx, st)
	if st.wait != nil {
		if w, err := e.continueWait(ctx, key, owner, st, waitEnd); w != nil || err != nil {
			return e.handOver(st, w), err
		}
	}
	return e.attempt(ctx, key, owner, st, waitEnd)
}

// attempt acquires for key's thread, trying again after retryable
// failures until the work's end (see workEnd), and queueing under the
// wait policy until waitEnd.
func (e *Engine) attempt(ctx context.Context, key ThreadKey, owner string, st *acquireState, waitEnd time.Time) (AcquireResult, error) {
	deadline := e.workEnd(ctx, waitEnd)
	failures := 0 // sandboxes the provider handed out that proved unusable
	for attempt := 0; ; attempt++ {
		res, retry, err := e.acquireOnce(ctx, key, owner, st)
		if err == nil {
			return res, nil
		}
		if errors.Is(err, ErrProviderUnavailable) {
			if failures++; failures >= maxUnusable {
				return AcquireResult{}, err
			}
		}
		if !retry {
			return AcquireResult{}, err
		}
		if errors.Is(err, ErrGrantLost) {
			// The grant lapsed and was passed on before it was taken:
			// leave the queue (what is still ours) and try again at once,
			// as a new arrival. Nothing to back off from, and no busy
			// loop (no grant is held until the next wait); past the
			// deadline the attempt's refusal is the capacity refusal a
			// waiter that timed out gets, never the lost grant.
			e.leaveWait(ctx, st)
			continue
		}
		wait := backoff(attempt)
		var ce *CapacityError
		switch {
		case !errors.As(err, &ce):
		case e.s.Policy != PolicyWait || ce.Reason != api.RefusalCapacity || !e.now().Before(waitEnd):
			return AcquireResult{}, err
		default:
			if st.grant != nil {
				// Refused holding a grant: a take that could not use it.
				// Pass it on rather than wait for it again.
				e.leaveWait(ctx, st)
			}
			switch w, werr := e.queue(ctx, key, owner, st, waitEnd, ce.Status); {
			case werr == nil && w == nil:
				continue // granted: the next attempt takes the slot
			case werr == nil:
				return e.handOver(st, w), nil
			case errors.Is(werr, errTicketGone):
				continue // look again (and queue again if still full)
			default:
				return AcquireResult{}, werr
			}
		}
		if !e.now().Add(wait).Before(deadline) {
			return AcquireResult{}, contended(err)
		}
		if serr := e.sleep(ctx, wait); serr != nil {
			return AcquireResult{}, fmt.Errorf("acquire: %w", serr)
		}
	}
}

// workEnd is when an ask stops trying again: waitEnd, or earlier, so
// that the create which follows a freed slot can finish inside the
// invocation (a create cut short by the deadline is ambiguous and would
// keep its reservation). ctx's deadline (the work's end, see begin) is
// wall-clock; it is translated onto the engine's clock.
func (e *Engine) workEnd(ctx context.Context, waitEnd time.Time) time.Time {
	dl, ok := ctx.Deadline()
	if !ok {
		return waitEnd
	}
	left := time.Until(dl)
	left -= min(createBudget, left/2)
	if end := e.now().Add(left); end.Before(waitEnd) {
		return end
	}
	return waitEnd
}

// contended is what an acquire whose time ran out on a race returns: a
// thread whose binding or record moved under every attempt is being
// changed by peers, which is the retryable conflict of a held lease, not
// the conflict or absence the last attempt happened to meet.
func contended(err error) error {
	if errors.Is(err, ErrThreadBound) || errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrStaleFence) {
		return fmt.Errorf("acquire: the thread changed under every attempt (last: %v): %w", err, ErrLeaseHeld)
	}
	return err
}

// acquireState is what one Acquire remembers across its attempts.
type acquireState struct {
	// wait is this acquire's ticket in the wait queue (nil: not waiting).
	wait *waiting
	// grant is the slot held in trust for the ticket, once granted: the
	// next take consumes it.
	grant *Grant
	// deadChecked: the slots of dead sandboxes were looked for (once per
	// acquire: it costs a query per state).
	deadChecked bool
	// tenantUsed is the slots the thread's tenant held at the lookup;
	// atShare: an eviction found it holding its fair share since.
	tenantUsed int
	atShare    bool
	// poolTries counts the pool members this acquire claimed.
	poolTries int
}

// acquireOnce makes one attempt. retry reports whether waiting and trying
// again may succeed (lease held, capacity full, a concurrent create).
func (e *Engine) acquireOnce(ctx context.Context, key ThreadKey, owner string, st *acquireState) (res AcquireResult, retry bool, err error) {
	look, err := e.store.Lookup(ctx, key, e.s.Limit())
	if err != nil {
		return res, false, fmt.Errorf("lookup thread: %w", err)
	}
	if look.Draining {
		return res, false, e.drainingError()
	}
	var replaceID, replaceRes string
	b := look.Binding
	switch {
	case !look.Bound:
	case b.SandboxID != "":
		// One conditional write hands the thread's sandbox back, whether
		// it was active (reuse) or parked (reclaim, including one whose
		// releaser died); a live lease of a peer (a release syncing) is
		// waited out. The refusal carries the record as it is.
		now := e.now()
		rec, err := e.store.Claim(ctx, Claim{SandboxID: b.SandboxID, Tenant: key.Tenant,
			From: []State{StateActive, StateWarm, StateReleasing, StateReclaiming}, To: StateActive,
			Owner: owner, Now: now})
		switch {
		case err == nil && rec.PrevState == StateActive:
			return e.reuse(ctx, rec, owner)
		case err == nil && rec.PrevState == StateReleasing:
			// A release died mid-way and its lease lapsed: take it over,
			// copying the outputs first, then hand the sandbox back.
			e.syncTakenOver(ctx, rec)
			return e.reclaim(ctx, rec, owner)
		case err == nil:
			return e.reclaim(ctx, rec, owner)
		case errors.Is(err, ErrLeaseHeld):
			return res, true, fmt.Errorf("thread %s: %w", key, err)
		case errors.Is(err, ErrConflict) && rec.State == StateClaiming:
			return e.takeOverClaim(ctx, rec, owner)
		case errors.Is(err, ErrConflict) && holdsPausedSlot(rec.State) && e.pauseStore() != nil:
			// Parked paused (or on the way in or out): resume it.
			st.tenantUsed, st.atShare = look.TenantUsed, false
			return e.resumeParked(ctx, key, rec, owner, st)
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict):
			// The binding names a record that is gone or being destroyed:
			// the thread needs a new sandbox.
			replaceID = b.SandboxID
		default:
			return res, false, fmt.Errorf("claim thread's sandbox: %w", err)
		}
	case b.Reservation != "":
		if e.now().Before(b.ReservationExpiresAt) {
			return res, true, fmt.Errorf("thread %s: create in flight: %w", key, ErrLeaseHeld)
		}
		replaceRes = b.Reservation
	}
	st.tenantUsed, st.atShare = look.TenantUsed, false
	if res, handled, retry, err := e.fromPool(ctx, key, owner, replaceID, replaceRes, st); handled {
		return res, retry, err
	}
	return e.create(ctx, key, owner, replaceID, replaceRes, st)
}

// takeoverSyncShare is the part of the work time left that an acquire
// taking over a dead release spends copying the outputs.
const takeoverSyncShare = 3

// syncTakenOver copies the outputs of a sandbox whose release died before
// its sync finished. Best effort: the sandbox goes back to its thread,
// whose next release syncs again.
func (e *Engine) syncTakenOver(ctx context.Context, rec Record) {
	e.log.InfoContext(ctx, "taking over an interrupted release", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
	e.salvage(ctx, rec, "taken-over release")
}

// salvage copies what it can of rec's outputs, under a share of the work
// time left, before the sandbox changes hands or is discarded. Best
// effort: an incomplete copy is logged, and the thread's next sync or
// release (or its restore into a fresh sandbox) goes on from the manifest.
func (e *Engine) salvage(ctx context.Context, rec Record, why string) {
	if e.sync == nil {
		return
	}
	sctx, cancel := shareOf(ctx, takeoverSyncShare)
	defer cancel()
	res, err := e.sync.Sync(sctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
	if err != nil || !res.Complete {
		e.log.WarnContext(ctx, "sync incomplete", "why", why, "sandbox_id", rec.SandboxID, "deferred", len(res.Deferred), "err", err)
	}
}

// fairShareBelow is the condition under which an acquire of key's thread
// may evict another tenant's warm sandbox: its tenant holds fewer slots
// than its fair share (Settings.FairShare), checked by the eviction's
// claim itself, since the count read at the lookup (st.tenantUsed) may be
// stale by then. It is nil when the tenant held its share or more at the
// lookup, or an eviction found it so since (st.atShare): its acquires
// then evict only its own tenant's warm sandboxes. The tenants holding
// slots are those a capacity refusal names (CapacityError.Tenants: they
// may still name tenants that just freed their last slot, until reconcile
// drops them: the share is then smaller, never larger) plus key's tenant.
func (e *Engine) fairShareBelow(key ThreadKey, st *acquireState, tenants []string) *TenantBelow {
	n := len(tenants)
	if !slices.Contains(tenants, key.Tenant) {
		n++
	}
	share := e.s.FairShare(n)
	if st.atShare || st.tenantUsed >= share {
		return nil
	}
	return &TenantBelow{Tenant: key.Tenant, Slots: share}
}

func (e *Engine) drainingError() *CapacityError {
	return &CapacityError{Reason: api.RefusalDraining, RetryAfter: 30 * time.Second,
		Status: CapacityStatus{Limit: e.s.Limit(), Policy: string(e.s.Policy), Draining: true}}
}

// reuse returns the thread's active sandbox if the provider still runs it
// and it answers. The checks are a read (Provider.Info) that never extends
// its life and a trivial command under probeTimeout; a sandbox that does
// not answer is discarded and the thread gets a fresh one. A sandbox the
// provider reports paused is resumed first (Capabilities.Pause), or
// discarded when it cannot be.
func (e *Engine) reuse(ctx context.Context, rec Record, owner string) (AcquireResult, bool, error) {
	info, err := e.prov.Info(ctx, rec.SandboxID)
	if err == nil && info.State == SandboxPaused {
		if rerr := e.resume(ctx, rec.SandboxID); rerr != nil {
			e.log.WarnContext(ctx, "active sandbox is paused and was not resumed; discarding", "sandbox_id", rec.SandboxID, "err", rerr)
			e.destroy(ctx, rec, owner, StateActive, EventReasonNotResumable)
			return AcquireResult{}, true, unavailable(fmt.Errorf("sandbox %s is paused: %v", rec.SandboxID, rerr))
		}
		info.EndAt = e.now().Add(e.s.ActiveTimeout)
	}
	if err == nil {
		if perr := e.probe(ctx, rec.Ref()); perr != nil {
			// The thread has not released it: its outputs may not be in
			// S3 yet. A slow but living sandbox may still hand them over.
			e.log.WarnContext(ctx, "active sandbox does not answer; copying its outputs, then discarding", "sandbox_id", rec.SandboxID, "err", perr)
			e.salvage(ctx, rec, "unresponsive active sandbox")
			e.destroy(ctx, rec, owner, StateActive, EventReasonUnresponsive)
			return AcquireResult{}, true, unavailable(fmt.Errorf("sandbox %s does not answer: %v", rec.SandboxID, perr))
		}
	}
	switch {
	case err == nil:
		if !info.EndAt.IsZero() {
			rec.ExpiresAt = info.EndAt // the provider's word; reuse does not extend it
		}
		e.emit(ctx, rec, StateActive, StateActive, EventReused, "")
		return AcquireResult{Record: rec, Source: SourceReused, Restore: e.resumeRestore(ctx, rec)}, false, nil
	case errors.Is(err, ErrSandboxGone):
		e.log.InfoContext(ctx, "active sandbox gone; replacing", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
		e.destroy(ctx, rec, owner, StateActive, EventReasonGone)
		return AcquireResult{}, true, unavailable(fmt.Errorf("sandbox %s was gone", rec.SandboxID))
	default:
		return AcquireResult{}, false, fmt.Errorf("probe sandbox: %w", err)
	}
}

// resume starts a paused sandbox again for ActiveTimeout, through
// Capabilities.Pause.
//
// Errors: errCannotResume when the provider declares no Pause; the
// provider's error.
func (e *Engine) resume(ctx context.Context, id string) error {
	if e.caps.Pause == nil {
		return errCannotResume
	}
	return e.caps.Pause.Resume(ctx, id, e.s.ActiveTimeout)
}

// errCannotResume: the provider reports a sandbox paused but declares no
// Capabilities.Pause.
var errCannotResume = errors.New("the provider cannot resume paused sandboxes")

// reclaim finishes taking a warm sandbox back (rec is already active):
// extend its timeout and re-run bootstrap. If either fails the sandbox is
// discarded (destroyed, or left as a tombstone) and acquire tries again.
// The discard is fenced by rec's claim: if a concurrent acquire for the
// thread took the sandbox meanwhile (reused it), the fence is stale and
// nothing is killed (invariant 3).
func (e *Engine) reclaim(ctx context.Context, rec Record, owner string) (AcquireResult, bool, error) {
	if err := e.prov.SetTimeout(ctx, rec.SandboxID, e.s.ActiveTimeout); err != nil {
		e.log.WarnContext(ctx, "warm sandbox reconnect failed; discarding", "sandbox_id", rec.SandboxID, "err", err)
		e.destroyClaimed(ctx, rec, EventReasonUnresponsive)
		return AcquireResult{}, true, unavailable(fmt.Errorf("reconnect warm sandbox: %v", err))
	}
	rec.ExpiresAt = e.now().Add(e.s.ActiveTimeout)
	// The bootstrap, under the probe's short timeout, is the check that
	// the sandbox answers: a wedged one is discarded, not handed out.
	if err := e.bootstrap(ctx, rec.Ref(), probeTimeout); err != nil {
		e.log.WarnContext(ctx, "warm sandbox bootstrap failed; discarding", "sandbox_id", rec.SandboxID, "err", err)
		e.destroyClaimed(ctx, rec, EventReasonUnresponsive)
		return AcquireResult{}, true, unavailable(err)
	}
	rec = e.recordExpiry(ctx, rec)
	e.emit(ctx, rec, rec.PrevState, StateActive, EventReclaimed, "")
	return AcquireResult{Record: rec, Source: SourceReclaimed, Restore: e.resumeRestore(ctx, rec)}, false, nil
}

// recordExpiry stores the provider timeout reclaim set, so that the record
// (GET /v1/sandboxes/{id}, the dead-slot check) agrees with the acquire
// reply instead of keeping the warm idle deadline. The write is fenced by
// the take-back claim: a peer that moved the record since wins, and a
// failed or lost write only leaves the older deadline, which every reader
// confirms with the provider before acting on it.
func (e *Engine) recordExpiry(ctx context.Context, rec Record) Record {
	cctx, cancel := settle(ctx)
	defer cancel()
	updated, err := e.store.Apply(cctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateActive,
		Now: e.now(), ExpiresAt: rec.ExpiresAt, Slot: rec.Slot})
	if err != nil {
		e.log.InfoContext(ctx, "reclaimed sandbox's expiry not recorded", "sandbox_id", rec.SandboxID, "err", err)
		return rec
	}
	if updated.SandboxID == "" {
		// The write also moved the record's count (warm to active) and
		// returned no record; the reply needs nothing else it changed,
		// and the store keeps times to the millisecond.
		rec.ExpiresAt = rec.ExpiresAt.Truncate(time.Millisecond).UTC()
		return rec
	}
	updated.Endpoint = rec.Endpoint
	return updated
}

// applyRecord makes the fenced update u and returns the record as stored:
// read back when the write moved the record's count and returned none.
func (e *Engine) applyRecord(ctx context.Context, u Update) (Record, error) {
	rec, err := e.store.Apply(ctx, u)
	if err != nil || rec.SandboxID != "" {
		return rec, err
	}
	return e.store.Get(ctx, u.SandboxID)
}

// destroy claims rec for destruction (from state from) and destroys it,
// for reason (one of EventReasons). A peer that moved the record first
// wins; nothing is killed then.
func (e *Engine) destroy(ctx context.Context, rec Record, owner string, from State, reason string) bool {
	now := e.now()
	cctx, cancel := settle(ctx)
	defer cancel()
	claimed, err := e.store.Claim(cctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{from},
		To: StateDestroying, Owner: owner, Now: now, LeaseUntil: e.leaseUntil(ctx)})
	if err != nil {
		e.log.InfoContext(ctx, "destroy claim lost", "sandbox_id", rec.SandboxID, "err", err)
		return false
	}
	return e.destroyClaimed(ctx, claimed, reason)
}

// leaseSafety is the least lease time left for a lease holder to still
// make provider calls that a peer's takeover would contradict.
const leaseSafety = 10 * time.Second

// maxEvictions bounds how many slots one acquire frees by eviction.
const maxEvictions = 3

// create reserves a slot (evicting another thread's warm sandbox, see
// evictOne, when the deployment is full; only one of key's own tenant
// when the tenant holds its fair share, see fairShareBelow), creates and
// bootstraps a sandbox and records it.
func (e *Engine) create(ctx context.Context, key ThreadKey, owner, replaceID, replaceRes string, st *acquireState) (AcquireResult, bool, error) {
	var token string
	retry, err := e.takeSlot(ctx, key, owner, st, func(now time.Time) error {
		token = "res-" + newOwner()[4:]
		return e.took(st, e.store.Reserve(ctx, Reservation{Token: token, ThreadKey: key, Seed: key.Seed(), Limit: e.s.Limit(),
			MaxPerUser: e.s.MaxPerUser, MaxPerTenant: e.s.MaxPerTenant, Now: now, ExpiresAt: e.leaseUntil(ctx),
			ReplaceSandboxID: replaceID, ReplaceReservation: replaceRes, Grant: st.grant}))
	})
	if err != nil {
		return AcquireResult{}, retry, err
	}
	return e.createReserved(ctx, key, token)
}

// takeSlot runs take, a write that takes a running slot for key's thread
// (a reservation, a resume claim), until it applies: when the deployment
// is full it evicts (see evictOne), else frees the slots of sandboxes the provider has ended,
// and otherwise returns the refusal (retry: the wait policy may poll).
// Store outages fail closed.
func (e *Engine) takeSlot(ctx context.Context, key ThreadKey, owner string, st *acquireState, take func(now time.Time) error) (retry bool, _ error) {
	for evictions := 0; ; evictions++ {
		err := take(e.now())
		var ce *CapacityError
		switch {
		case err == nil:
			return false, nil
		case errors.Is(err, ErrGrantLost):
			return true, fmt.Errorf("take slot: %w", err)
		case errors.As(err, &ce) && ce.Reason == api.RefusalDraining:
			return false, e.drainingError()
		case errors.As(err, &ce):
			if quotaRefusal(ce.Reason) && evictions < maxEvictions {
				// The quota counts the caller's warm sandboxes too: evict
				// its own least recently parked one, whatever the policy
				// (a quota bounds the caller's slots, not the deployment's).
				if e.evictForQuota(ctx, key, owner, ce.Reason) {
					continue
				}
			}
			// burst with a zero burst limit behaves as reject, eviction included.
			evicting := e.s.Policy != PolicyBurst || e.s.BurstLimit == 0
			if ce.Reason == api.RefusalCapacity && evicting && evictions < maxEvictions {
				ok, atShare := e.evictOne(ctx, key, owner, e.fairShareBelow(key, st, ce.Tenants), ce.Status)
				if ok {
					continue
				}
				if atShare && !st.atShare {
					// The tenant reached its share since its lookup: try
					// again, evicting only its own.
					st.atShare = true
					continue
				}
			}
			if ce.Reason == api.RefusalCapacity && !st.deadChecked {
				// Nothing may be evicted: before refusing, free the slots
				// of sandboxes the provider has already ended. Last, as it
				// reads every index shard of two states (reconcile frees
				// them too, every pass).
				st.deadChecked = true
				if e.freeDead(ctx, owner) > 0 {
					continue
				}
			}
			return true, e.refused(ce)
		case errors.Is(err, ErrThreadBound), errors.Is(err, ErrLeaseHeld), errors.Is(err, ErrConflict), errors.Is(err, ErrNotFound):
			// The binding or the record moved under us: look again.
			return true, fmt.Errorf("take slot: %w", err)
		case errors.Is(err, ErrStoreUnavailable):
			// Fail closed: the ledger could not decide, so nothing is
			// created. The write may have applied; reconcile frees a
			// reservation whose token is in no sandbox (and a resume claim
			// left resuming is finished by the thread's next acquire).
			return false, &CapacityError{Reason: api.RefusalCapacityBackend, RetryAfter: 2 * time.Second,
				Status: CapacityStatus{Limit: e.s.Limit(), Policy: string(e.s.Policy)}}
		default:
			return false, fmt.Errorf("take slot: %w", err)
		}
	}
}

// refused is ce, a capacity refusal of a take, with the deployment's
// policy and limit and a retry time.
func (e *Engine) refused(ce *CapacityError) *CapacityError {
	ce.Status.Policy = string(e.s.Policy)
	ce.Status.Limit = e.s.Limit()
	if ce.RetryAfter == 0 {
		ce.RetryAfter = 5 * time.Second
	}
	return ce
}

// evictCandidates is how many of the least recently parked warm sandboxes
// (of the sample, see Store.Sample) one eviction considers;
// ownTenantCandidates, of the whole pool, when only the acquiring
// tenant's own may be taken and the sample holds none of them.
const (
	evictCandidates     = 10
	ownTenantCandidates = 50
)

// evictOne frees one slot for key's thread: first by retrying a tombstone
// whose lease lapsed, else a pool member, else by destroying the least
// recently parked warm sandbox of another thread among a random quarter
// of the warm pool (Store.Sample: the whole pool when small; on
// average the fourth oldest of a large one, one of its 16 oldest with
// probability 1 - (3/4)^16 > 99%): of another tenant only under below,
// which the claim checks (key's tenant holds fewer slots than its fair
// share), of key's own tenant only when below is nil (a tenant at or over
// its fair share never takes another tenant's warm sandbox; when the
// sample holds none of its own, the pool's exact order is read). It
// reports whether a slot was freed, and atShare when a claim found the tenant at its fair share. A kill that
// fails leaves a tombstone holding the slot and stops the eviction.
//
// counts (the refusal's) spares the index queries of a kind the counters
// say there is none of (each query reads every index shard).
func (e *Engine) evictOne(ctx context.Context, key ThreadKey, owner string, below *TenantBelow, counts CapacityStatus) (freed, atShare bool) {
	now := e.now()
	if counts.Tombstones > 0 {
		// Any whose retry lease lapsed will do: a sample of them.
		if tombs, err := e.store.Sample(ctx, StateDestroying, 5); err == nil {
			for _, rec := range tombs {
				claimed, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateDestroying},
					Owner: owner, Now: now, LeaseUntil: e.leaseUntil(ctx)})
				if err != nil {
					continue // a peer holds its retry lease
				}
				return e.destroyClaimed(ctx, claimed, EventReasonKillRetried), false
			}
		}
	}
	if e.evictPoolMember(ctx, owner, false) {
		return true, false
	}
	if counts.Warm == 0 {
		return false, false
	}
	ownTenant := below == nil
	may := func(rec Record) bool {
		return rec.ThreadKey != key && (!ownTenant || rec.Tenant == key.Tenant)
	}
	// The least recently parked of a random quarter of the pool (all of
	// it when small), see Store.Sample.
	warm, err := e.store.Sample(ctx, StateWarm, evictCandidates)
	if err == nil && ownTenant && !slices.ContainsFunc(warm, may) {
		// None of the tenant's own among them: the pool's exact order,
		// deep enough to find its own among other tenants'.
		warm, err = e.store.WarmParkedBefore(ctx, now.Add(time.Millisecond), ownTenantCandidates)
	}
	if err != nil {
		e.log.WarnContext(ctx, "list warm pool for eviction failed", "err", err)
		return false, false
	}
	return e.evictParked(ctx, key, owner, warm, may, evictGuard{below: below}, EventReasonCapacity)
}

// quotaRefusal reports whether reason is a refusal for one of the
// caller's own quotas (SANDBOX_MAX_PER_USER, SANDBOX_MAX_PER_TENANT).
func quotaRefusal(reason api.RefusalReason) bool {
	return reason == api.RefusalUserQuota || reason == api.RefusalTenantQuota
}

// quotaCandidates is how many of the caller's own least recently parked
// warm sandboxes one eviction for a quota considers (a peer may take some
// first).
const quotaCandidates = 5

// evictForQuota frees one slot of the quota that refused key's thread
// (reason): it destroys the least recently parked warm sandbox of key's
// user (RefusalUserQuota) or of key's tenant, any of its users
// (RefusalTenantQuota), never another tenant's, never key's own thread's,
// never one in use: the claim applies only to a record still warm and
// unleased (Store.OwnWarm lists the candidates from the tenant's or
// user's own entries, never the warm pool). It reports whether one was
// destroyed (its slot freed).
func (e *Engine) evictForQuota(ctx context.Context, key ThreadKey, owner string, reason api.RefusalReason) bool {
	user := key.User
	if reason == api.RefusalTenantQuota {
		user = "" // any of the tenant's users
	}
	warm, err := e.store.OwnWarm(ctx, key.Tenant, user, quotaCandidates)
	if err != nil {
		e.log.WarnContext(ctx, "list own warm sandboxes for a quota failed", "err", err, "reason", reason)
		return false
	}
	may := func(rec Record) bool { return rec.Tenant == key.Tenant && (user == "" || rec.User == user) }
	evicted, _ := e.evictParked(ctx, key, owner, warm, may, evictGuard{}, EventReasonQuota)
	return evicted
}

// evictGuard is what the claim of another tenant's record carries in an
// eviction (Claim.Below, Claim.PausedBelow); the zero value, nothing.
type evictGuard struct {
	below  *TenantBelow
	paused *PausedBelow
}

// evictParked destroys the first of parked (warm or paused records, least
// recently parked first) that belongs to another thread than key's and
// that may passes, for key's thread; the claim of another tenant's record
// carries guard (a claim finding key's tenant at its share reports
// atShare, and the other tenants' records are then skipped). It reports
// whether one was destroyed (a peer that moved a record first wins it; a
// kill that fails leaves a tombstone holding its slot and stops the
// eviction). reason (one of EventReasons) is why.
func (e *Engine) evictParked(ctx context.Context, key ThreadKey, owner string, parked []Record, may func(Record) bool, guard evictGuard, reason string) (evicted, atShare bool) {
	for _, rec := range parked {
		other := rec.Tenant != key.Tenant
		if rec.ThreadKey == key || !may(rec) || (other && atShare) {
			continue
		}
		c := Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{rec.State},
			To: StateDestroying, Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)}
		if other {
			c.Below, c.PausedBelow = guard.below, guard.paused
		}
		claimed, err := e.store.Claim(ctx, c)
		if errors.Is(err, ErrAtFairShare) {
			atShare = true
			continue // its own tenant's may still be taken
		}
		if err != nil {
			continue // taken back or evicted by a peer
		}
		claimed = keepPause(claimed, rec)
		e.log.InfoContext(ctx, "evicting "+string(rec.State)+" sandbox", "sandbox_id", rec.SandboxID, "parked_at", rec.ParkedAt, "for_thread", key.String())
		e.emit(ctx, claimed, rec.State, StateDestroying, EventEvicted, reason)
		return e.destroyClaimed(ctx, claimed, reason), atShare
	}
	return false, atShare
}

// createReserved creates and bootstraps a sandbox under reservation token.
func (e *Engine) createReserved(ctx context.Context, key ThreadKey, token string) (AcquireResult, bool, error) {
	now := e.now()
	asked := now // the sandbox runs, and is metered, from its create
	ref, err := e.prov.Create(ctx, CreateSpec{
		Template: e.s.Template,
		Timeout:  e.s.ActiveTimeout,
		Metadata: map[string]string{
			MetaTenant: key.Tenant, MetaUser: key.User, MetaThread: key.Thread, MetaSeed: key.Seed(),
			MetaDeployment: e.s.Deployment, MetaCreatedAt: now.UTC().Format(time.RFC3339), MetaReservation: token,
		},
	})
	if err != nil {
		if IsAmbiguous(err) {
			// Invariant 5: an ambiguous create keeps its reservation; the
			// token in the sandbox's metadata lets reconcile settle it.
			return AcquireResult{}, false, fmt.Errorf("create sandbox (reservation kept): %w", err)
		}
		return AcquireResult{}, false, errors.Join(fmt.Errorf("create sandbox: %w", err), e.freeReservation(ctx, token, key))
	}
	// A sandbox that dies or fails its bootstrap right after its create is
	// the provider's failure, not the caller's: acquire tries again while
	// time allows, else answers ErrProviderUnavailable.
	if err := e.bootstrap(ctx, ref, bootstrapTimeout); err != nil {
		if kerr := e.kill(ctx, ref.ID); kerr != nil {
			// Uncertain kill: keep the slot (invariant 4), and stop: a
			// retry would strand another slot the same way.
			return AcquireResult{}, false, unavailable(fmt.Errorf("%w (cleanup kill uncertain, slot kept: %v)", err, kerr))
		}
		return AcquireResult{}, true, unavailable(errors.Join(err, e.freeReservation(ctx, token, key)))
	}
	restored, err := e.restore(ctx, key, ref)
	if err != nil {
		if kerr := e.kill(ctx, ref.ID); kerr != nil {
			return AcquireResult{}, false, unavailable(fmt.Errorf("%w (cleanup kill uncertain, slot kept: %v)", err, kerr))
		}
		return AcquireResult{}, true, unavailable(errors.Join(err, e.freeReservation(ctx, token, key)))
	}
	// Finalize settles the create: it runs even if the work time ran out.
	now = e.now()
	fctx, cancel := settle(ctx)
	defer cancel()
	rec, err := e.store.Finalize(fctx, token, Record{
		SandboxID: ref.ID, ThreadKey: key, Seed: key.Seed(), State: StateActive, Backend: e.prov.Name(),
		Endpoint: ref.Endpoint, ReservationToken: token,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(e.s.ActiveTimeout),
		PrevMeteredAt: asked, MeteredAt: now, MeteredState: StateCreating,
	})
	if errors.Is(err, ErrConflict) {
		// Our reservation was taken over (we were presumed crashed). If
		// reconcile adopted the sandbox it has a record now: it belongs to
		// the thread and the next attempt reclaims it; never kill it.
		if _, gerr := e.store.Get(fctx, ref.ID); gerr == nil || !errors.Is(gerr, ErrNotFound) {
			return AcquireResult{}, true, fmt.Errorf("finalize (sandbox %s adopted or unknown): %w", ref.ID, err)
		}
		// Nobody else knows this sandbox: kill it, then return the slot.
		if kerr := e.kill(ctx, ref.ID); kerr != nil {
			e.log.WarnContext(ctx, "kill of superseded sandbox failed; reconcile will find it", "sandbox_id", ref.ID, "err", kerr)
			return AcquireResult{}, true, fmt.Errorf("finalize: %w", err)
		}
		return AcquireResult{}, true, errors.Join(fmt.Errorf("finalize: %w", err), e.freeReservation(ctx, token, key))
	}
	if err != nil {
		return AcquireResult{}, false, fmt.Errorf("finalize: %w", err)
	}
	e.emit(ctx, rec, StateCreating, StateActive, EventCreated, "")
	return AcquireResult{Record: rec, Source: SourceCreated, Restore: restored}, false, nil
}

// restoreShare is the part of the remaining invocation time restore may use.
const restoreShare = 2

// restoreContext bounds a restore to restoreShare of ctx's remaining time.
func restoreContext(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/restoreShare))
}

// restore brings the thread's earlier outputs into a new sandbox when the
// syncer can. Only a dead sandbox fails it; anything else is logged and the
// sandbox is handed out with what was restored.
func (e *Engine) restore(ctx context.Context, key ThreadKey, ref SandboxRef) (*SyncResult, error) {
	r, ok := e.sync.(OutputRestorer)
	if !ok {
		return nil, nil
	}
	rctx, cancel := restoreContext(ctx)
	defer cancel()
	res, err := r.Restore(rctx, SyncTarget{Ref: ref, ThreadKey: key})
	if errors.Is(err, ErrSandboxGone) {
		return &res, fmt.Errorf("restore outputs: %w", err)
	}
	if err != nil {
		e.log.WarnContext(ctx, "restore incomplete; handing out the sandbox", "sandbox_id", ref.ID, "err", err)
	}
	return &res, nil
}

// resumeRestore continues a restore into rec's sandbox that a cap cut
// short, when the syncer can (RestoreResumer), with the same share of the
// invocation's time as a first restore. It reports nil when none was
// pending. Failures are logged: the sandbox is handed out either way (a
// later acquire or sync pass continues).
func (e *Engine) resumeRestore(ctx context.Context, rec Record) *SyncResult {
	r, ok := e.sync.(RestoreResumer)
	if !ok {
		return nil
	}
	rctx, cancel := restoreContext(ctx)
	defer cancel()
	res, ran, err := r.ResumeRestore(rctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
	if err != nil {
		e.log.WarnContext(ctx, "resuming restore failed; handing out the sandbox", "sandbox_id", rec.SandboxID, "err", err)
	}
	if !ran {
		return nil
	}
	return &res
}

// unavailable wraps a failure of the sandboxes the provider handed out as
// ErrProviderUnavailable, hiding the cause's kind (a dead sandbox is not
// the caller's "not found").
func unavailable(cause error) error {
	return fmt.Errorf("%w: %v", ErrProviderUnavailable, cause)
}

func (e *Engine) freeReservation(ctx context.Context, token string, key ThreadKey) error {
	ctx, cancel := settle(ctx)
	defer cancel()
	if err := e.store.FreeReservation(ctx, token, key); err != nil {
		return fmt.Errorf("free reservation: %w", err)
	}
	return nil
}

// Command timeouts (each also bounded by the work time left, see begin).
const (
	// bootstrapTimeout bounds the bootstrap of a new sandbox.
	bootstrapTimeout = 10 * time.Second
	// probeTimeout bounds the check that a sandbox about to be handed out
	// again answers (a trivial command on reuse, the bootstrap on reclaim).
	probeTimeout = 3 * time.Second
)

// probe checks that a sandbox answers: a trivial command must exit 0
// within probeTimeout.
func (e *Engine) probe(ctx context.Context, ref SandboxRef) error {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	out, err := e.prov.Run(pctx, ref, Command{Script: "true", Timeout: probeTimeout})
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("probe: exit code %d", out.ExitCode)
	}
	return nil
}

// kill is a settle step: Provider.Kill under settle's time.
func (e *Engine) kill(ctx context.Context, id string) error {
	ctx, cancel := settle(ctx)
	defer cancel()
	return e.prov.Kill(ctx, id)
}

// bootstrap runs the bootstrap script; it must print the marker and exit 0
// within timeout.
func (e *Engine) bootstrap(ctx context.Context, ref SandboxRef, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := e.prov.Run(ctx, ref, Command{Script: bootstrapScript, Env: map[string]string{"SBX_HOME": e.s.Home}, Timeout: timeout})
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if out.ExitCode != 0 || !strings.Contains(string(out.Stdout), bootstrapMarker) {
		return fmt.Errorf("bootstrap: exit code %d: %s", out.ExitCode, strings.TrimSpace(string(out.Stderr)))
	}
	return nil
}

// destroyClaimed turns a record this invocation holds the lease on into a
// tombstone, kills the sandbox and frees its slot once the kill is confirmed,
// publishing EventDestroyed with reason (one of EventReasons).
// An uncertain kill leaves the tombstone (and its slot) for a later retry.
// It reports whether the sandbox is confirmed gone.
func (e *Engine) destroyClaimed(ctx context.Context, rec Record, reason string) bool {
	from := rec.State // the state the sandbox left to be destroyed
	if from == StateDestroying {
		from = rec.PrevState // "": recorded as a tombstone (an untracked sandbox)
	}
	if rec.State != StateDestroying {
		tctx, cancel := settle(ctx)
		tomb, err := e.applyRecord(tctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateDestroying,
			KeepLease: true, Now: e.now(), KillAttempt: true, Slot: rec.Slot})
		cancel()
		if err != nil {
			e.log.WarnContext(ctx, "tombstone write failed", "sandbox_id", rec.SandboxID, "err", err)
			return false
		}
		rec = tomb
	}
	if err := e.kill(ctx, rec.SandboxID); err != nil {
		e.log.WarnContext(ctx, "kill uncertain; tombstone keeps its slot", "sandbox_id", rec.SandboxID, "err", err)
		if rec.Slot.Counted != "" && rec.Slot.Counted != StateDestroying {
			// Claimed straight into a tombstone (an eviction): count it as one
			// while it keeps its slot. Best effort: reconcile recounts.
			tctx, cancel := settle(ctx)
			_, _ = e.store.Apply(tctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateDestroying,
				KeepLease: true, Now: e.now(), Slot: rec.Slot})
			cancel()
		}
		return false
	}
	fctx, cancel := settle(ctx)
	defer cancel()
	if err := e.store.Free(fctx, rec, e.now()); err != nil {
		e.log.WarnContext(ctx, "free slot after kill failed", "sandbox_id", rec.SandboxID, "err", err)
		return false
	}
	e.emit(ctx, rec, from, StateGone, EventDestroyed, reason)
	return true
}

// Release syncs the sandbox's outputs and parks it warm for its thread; a
// sandbox found dead (or whose timeout cannot be set because it is gone),
// or released while the deployment drains, is destroyed instead.
// Releasing again is idempotent: a warm sandbox answers "warm", a
// destroyed one "destroyed", and a release whose invocation died midway
// (its lease lapsed) is taken over and finished, outputs synced first.
//
// Worst case (see begin): the sync pass ends setTimeoutReserve before the
// work time does; setting the idle timeout takes the rest of the work
// time; the park (or the tombstone, kill and free) takes the settle
// reserve.
//
// Errors: *ValidationError, ErrNotFound (unknown or another tenant's),
// ErrConflict (not active), ErrLeaseHeld (a peer is moving it),
// ErrProviderUnavailable when the sync pass failed outright (the release
// is left to a retry or to reconcile, the sandbox not parked).
func (e *Engine) Release(ctx context.Context, tenant, sandboxID string) (ReleaseResult, error) {
	return e.ReleaseWith(ctx, tenant, sandboxID, ReleaseOptions{})
}

// ReleaseWith is Release, parking or destroying the sandbox as opts say.
func (e *Engine) ReleaseWith(ctx context.Context, tenant, sandboxID string, opts ReleaseOptions) (ReleaseResult, error) {
	if err := ValidateSandboxID(sandboxID); err != nil {
		return ReleaseResult{}, err
	}
	ctx, cancel := e.begin(ctx)
	defer cancel()
	owner := newOwner()
	rec, err := e.store.Claim(ctx, Claim{SandboxID: sandboxID, Tenant: tenant, From: []State{StateActive, StateReleasing},
		To: StateReleasing, Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)})
	if errors.Is(err, ErrConflict) {
		if cur, gerr := e.store.Get(ctx, sandboxID); gerr == nil && cur.Tenant == tenant {
			switch cur.State {
			case StateWarm:
				return ReleaseResult{SandboxID: sandboxID, State: string(StateWarm)}, nil
			case StatePausing, StatePaused:
				// Released already, and parked paused (or being paused).
				return ReleaseResult{SandboxID: sandboxID, State: string(StatePaused)}, nil
			case StateDestroying, StateGone:
				return ReleaseResult{SandboxID: sandboxID, State: releaseDestroyed}, nil
			}
		}
	}
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("claim for release: %w", err)
	}
	if rec.PrevState == StateReleasing {
		e.log.InfoContext(ctx, "taking over an interrupted release", "sandbox_id", sandboxID, "thread", rec.ThreadKey.String())
	}
	return e.finishReleaseAs(ctx, rec, true, opts)
}

// releaseDestroyed is ReleaseResult.State for a sandbox destroyed, not parked.
const releaseDestroyed = "destroyed"

// setTimeoutReserve is the work time a release keeps after its sync pass
// for setting the idle timeout.
const setTimeoutReserve = 2 * time.Second

// finishRelease completes a release of rec (claimed releasing under this
// invocation's lease): sync, idle timeout, park (or destroy). When strict,
// a sync pass that failed outright (the sandbox or S3 unreachable, not
// gone) stops the release before the park: the record stays releasing, so
// the outputs are not left in a parked sandbox whose idle timeout may end
// it first; the caller retries, or reconcile takes the release over once
// the lease lapses (not strict: it parks whatever the sync did, so no
// record stays releasing).
func (e *Engine) finishRelease(ctx context.Context, rec Record, strict bool) (ReleaseResult, error) {
	return e.finishReleaseAs(ctx, rec, strict, ReleaseOptions{})
}

// finishReleaseAs is finishRelease, parking (or destroying) as opts say.
func (e *Engine) finishReleaseAs(ctx context.Context, rec Record, strict bool, opts ReleaseOptions) (ReleaseResult, error) {
	sandboxID := rec.SandboxID
	out := ReleaseResult{SandboxID: sandboxID}
	dead := false
	if e.sync != nil {
		sctx, cancel := reserveEnd(ctx, setTimeoutReserve)
		res, serr := e.sync.Sync(sctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
		cancel()
		out.Sync = &res
		if serr != nil {
			out.SyncError = serr.Error()
			dead = errors.Is(serr, ErrSandboxGone)
			if !dead && strict {
				return out, unavailable(fmt.Errorf("sync before park (the release is retried or taken over): %v", serr))
			}
		}
	}
	if !dead && opts.Destroy && (out.Sync == nil || out.Sync.Complete) && out.SyncError == "" {
		e.destroyClaimed(ctx, rec, EventReasonKilled)
		out.State = releaseDestroyed
		return out, nil
	}
	if !dead && e.now().Add(leaseSafety).After(rec.LeaseExpiresAt) {
		// The lease (nearly) lapsed: a peer may have reclaimed the sandbox,
		// and shortening its timeout now would cut the peer's run short.
		// The fenced park below tells whether we still own it.
		e.log.WarnContext(ctx, "release outlived its lease; not touching the timeout", "sandbox_id", sandboxID)
	} else if !dead {
		err := e.prov.SetTimeout(ctx, sandboxID, e.s.IdleTimeout)
		dead = errors.Is(err, ErrSandboxGone)
		if err != nil && !dead {
			e.log.WarnContext(ctx, "set idle timeout failed; parking with the active timeout", "sandbox_id", sandboxID, "err", err)
		}
	}
	if dead {
		e.destroyClaimed(ctx, rec, EventReasonGone)
		out.State = releaseDestroyed
		return out, nil
	}
	if (e.s.PauseAfter == 0 || opts.Pause) && e.pauseParking() && (out.Sync == nil || out.Sync.Complete) && out.SyncError == "" {
		// Pause at release, the outputs just copied (an incomplete copy
		// parks it warm: reconcile copies the rest before pausing it).
		if done, err := e.pauseAtRelease(ctx, rec, &out); done {
			return out, err
		}
	}
	now := e.now()
	pctx, cancel := settle(ctx)
	_, err := e.store.Apply(pctx, Update{SandboxID: sandboxID, Fence: rec.Fence, State: StateWarm, Now: now,
		ParkedAt: now, ExpiresAt: now.Add(e.s.IdleTimeout), UnlessDraining: true, Slot: rec.Slot, Owner: rec.ThreadKey})
	cancel()
	if errors.Is(err, ErrDraining) {
		// A draining deployment keeps nothing warm.
		e.destroyClaimed(ctx, rec, EventReasonDraining)
		out.State = releaseDestroyed
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("park warm: %w", err)
	}
	e.emit(ctx, rec, rec.PrevState, StateWarm, EventReleased, "")
	out.State = string(StateWarm)
	return out, nil
}

// reserveEnd returns ctx ending d before ctx's deadline (unchanged without
// one; at once when less than d is left).
func reserveEnd(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, dl.Add(-d))
}

// Sync copies the sandbox's outputs now. The sandbox must be active or warm
// and not held by a peer (else ErrConflict / ErrLeaseHeld).
func (e *Engine) Sync(ctx context.Context, tenant, sandboxID string) (SyncResult, error) {
	if err := ValidateSandboxID(sandboxID); err != nil {
		return SyncResult{}, err
	}
	if e.sync == nil {
		return SyncResult{}, errors.New("sync: no output sink configured")
	}
	ctx, cancel := e.begin(ctx)
	defer cancel()
	owner := newOwner()
	rec, err := e.store.Claim(ctx, Claim{SandboxID: sandboxID, Tenant: tenant, From: []State{StateActive, StateWarm},
		Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)})
	if err != nil {
		return SyncResult{}, fmt.Errorf("claim for sync: %w", err)
	}
	res, serr := e.sync.Sync(ctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
	if errors.Is(serr, ErrSandboxGone) {
		e.destroyClaimed(ctx, rec, EventReasonGone)
		return res, fmt.Errorf("sync: %w", serr)
	}
	dctx, dcancel := settle(ctx)
	defer dcancel()
	if _, err := e.store.Apply(dctx, Update{SandboxID: sandboxID, Fence: rec.Fence, State: rec.State, Now: e.now(),
		ParkedAt: rec.ParkedAt, ExpiresAt: rec.ExpiresAt, Slot: rec.Slot, Owner: rec.ThreadKey}); err != nil {
		return res, errors.Join(serr, fmt.Errorf("drop sync lease: %w", err))
	}
	if serr != nil {
		return res, fmt.Errorf("sync: %w", serr)
	}
	return res, nil
}

// deadBatch bounds the dead sandboxes one acquire frees, and deadSample
// the active records it examines to find them.
const (
	deadBatch  = 5
	deadSample = 50
)

// confirmedGone reports whether the provider says the sandbox no longer
// exists: Capabilities.Discover's PresenceAbsent when declared, else
// Provider.Info's ErrSandboxGone. Found is a plain false.
//
// Errors: why the answer is not known (an unknown presence, a failed
// read); never proof either way.
func (e *Engine) confirmedGone(ctx context.Context, id string) (bool, error) {
	if e.caps.Discover == nil {
		_, err := e.prov.Info(ctx, id)
		if errors.Is(err, ErrSandboxGone) {
			return true, nil
		}
		return false, err
	}
	switch p, err := e.caps.Discover(ctx, id); {
	case p == PresenceAbsent:
		return true, nil
	case p == PresenceFound:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("sandbox presence unknown: %w", err)
	default:
		return false, errPresenceUnknown
	}
}

// errPresenceUnknown: the provider's discovery could not say whether a
// sandbox exists.
var errPresenceUnknown = errors.New("sandbox presence unknown")

// freeDead frees the slots of records whose provider end time has passed,
// once the provider confirms the sandbox is gone (a read, as the kill
// path's confirmation): warm ones parked longer than the idle timeout and
// active ones past their recorded end. It returns the slots freed.
func (e *Engine) freeDead(ctx context.Context, owner string) int {
	now := e.now()
	var cands []Record
	if warm, err := e.store.WarmParkedBefore(ctx, now.Add(-e.s.IdleTimeout), deadBatch); err == nil {
		cands = append(cands, warm...)
	}
	// The active ones: the least recently updated of a random part of the
	// active index (see Store.Sample), a read bounded whatever the fleet's
	// size. One the sample misses is found by a later refusal's sample, or
	// freed by reconcile's pass.
	if active, err := e.store.Sample(ctx, StateActive, deadSample); err == nil {
		for _, r := range active {
			if !r.ExpiresAt.IsZero() && r.ExpiresAt.Before(now) && len(cands) < 2*deadBatch {
				cands = append(cands, r)
			}
		}
	}
	freed := 0
	for _, r := range cands {
		if freed >= deadBatch || ctx.Err() != nil {
			break
		}
		if gone, _ := e.confirmedGone(ctx, r.SandboxID); !gone {
			continue // alive (its end was extended) or unknown: never free on doubt
		}
		claimed, err := e.store.Claim(ctx, Claim{SandboxID: r.SandboxID, Tenant: r.Tenant, From: []State{r.State},
			To: StateDestroying, Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)})
		if err != nil {
			continue // a peer moved it
		}
		e.log.InfoContext(ctx, "freeing the slot of a sandbox the provider ended", "sandbox_id", r.SandboxID, "state", r.State)
		if e.destroyClaimed(ctx, claimed, EventReasonGone) {
			freed++
		}
	}
	return freed
}

// Get returns the tenant's record; another tenant's answers ErrNotFound.
func (e *Engine) Get(ctx context.Context, tenant, sandboxID string) (Record, error) {
	if err := ValidateSandboxID(sandboxID); err != nil {
		return Record{}, err
	}
	rec, err := e.store.Get(ctx, sandboxID)
	if err != nil {
		return Record{}, err
	}
	if rec.Tenant != tenant {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

// Capacity reports slot usage with the configured limit and policy.
func (e *Engine) Capacity(ctx context.Context) (CapacityStatus, error) {
	st, err := e.store.Capacity(ctx)
	if err != nil {
		return st, fmt.Errorf("capacity: %w", err)
	}
	st.Limit = e.s.Limit()
	st.PausedLimit = e.s.PausedLimit()
	st.Policy = string(e.s.Policy)
	return st, nil
}

// SetDraining starts (true) or ends (false) draining: while draining,
// acquires are refused with reason "draining", releases destroy instead of
// parking, and reconcile destroys warm sandboxes.
func (e *Engine) SetDraining(ctx context.Context, draining bool) error {
	if err := e.store.SetDraining(ctx, draining); err != nil {
		return fmt.Errorf("set draining: %w", err)
	}
	e.log.InfoContext(ctx, "draining changed", "draining", draining)
	return nil
}
