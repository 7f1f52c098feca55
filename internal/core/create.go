package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
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

// create reserves a slot (evicting another thread's warm sandbox, see
// evictOne, when the deployment is full; only one of key's own tenant
// when the tenant holds its fair share, see fairShareBelow), creates and
// bootstraps a sandbox and records it.
func (e *Engine) create(ctx context.Context, key ThreadKey, owner, replaceID, replaceRes string, st *acquireState) (AcquireResult, bool, error) {
	var token string
	reserve := func(now time.Time, from *Record) error {
		token = "res-" + newOwner()[4:]
		return e.took(st, e.store.Reserve(ctx, Reservation{Token: token, ThreadKey: key, Seed: key.Seed(), Limit: e.s.Limit(),
			MaxPerUser: e.s.MaxPerUser, MaxPerTenant: e.s.MaxPerTenant, Now: now, ExpiresAt: e.leaseUntil(ctx),
			ReplaceSandboxID: replaceID, ReplaceReservation: replaceRes, Grant: st.grant, Handover: from}))
	}
	retry, err := e.takeSlot(ctx, key, owner, st, slotTake{over: st.grant == nil, write: func(now time.Time, k *killed) error {
		if k != nil && st.grant == nil {
			switch err := reserve(now, &k.tomb); {
			case err == nil:
				e.ended(ctx, *k)
				return nil
			case errors.Is(err, ErrStoreUnavailable):
				// It may have applied: the tombstone, if it is still
				// there, is freed by the next retry of its kill
				// (freeLost, reconcile), and a reservation no sandbox
				// used by reconcile.
				return err
			}
			// Refused (the tombstone moved, a quota, a lowered limit):
			// free it and reserve as usual. A grant's slot is taken
			// as it is, so with one the evicted slot is freed too.
		}
		return e.freedFirst(ctx, func(now time.Time) error { return reserve(now, nil) }).write(now, k)
	}})
	if err != nil {
		return AcquireResult{}, retry, err
	}
	return e.createReserved(ctx, key, token)
}

// slotTake is a write that takes a running slot for a thread (a
// reservation, a resume claim, a pool claim), given the sandbox an
// eviction killed for it (nil: none), whose tombstone still holds a slot.
// over: the write takes that slot over (Reservation.Handover: a
// reservation holding no grant); otherwise it frees the slot first
// (freedFirst).
type slotTake struct {
	write func(now time.Time, evicted *killed) error
	over  bool
}

// freedFirst is take, a write that cannot take a slot over, as a
// slotTake: it first frees the slot of the sandbox an eviction killed for
// it (one a peer freed first is gone already).
func (e *Engine) freedFirst(ctx context.Context, take func(now time.Time) error) slotTake {
	return slotTake{write: func(now time.Time, k *killed) error {
		if k == nil {
			return take(now)
		}
		if err := e.freeKilled(ctx, *k); err != nil && !errors.Is(err, ErrStaleFence) {
			return err
		}
		return take(e.now())
	}}
}

// handOverable is the sandbox ev killed, for take to take its slot over
// (or free first). Under the wait policy a freed slot goes to the head of
// the wait queue: when a ticket waits, when the queue cannot be read, or
// when take cannot take a slot over, the slot is freed here (and the
// queue dispatched), and an eviction whose free failed made no slot
// (ev.freed false). A ticket queued after the read joined the queue after
// this acquire was refused: the take coming first keeps the order of
// arrival.
func (e *Engine) handOverable(ctx context.Context, ev *eviction, take slotTake) *killed {
	if e.s.Policy != PolicyWait || ev.killed == nil {
		return ev.killed
	}
	if take.over {
		// Optional: any failure frees the slot, so the read gets a short
		// bound of its own rather than the work's time.
		rctx, cancel := context.WithTimeout(ctx, dispatchBudget)
		waiting, err := e.store.AnyWaiting(rctx, e.now())
		cancel()
		if err == nil && !waiting {
			return ev.killed
		}
		if err != nil {
			e.log.WarnContext(ctx, "reading the wait queue failed; the evicted slot goes to the queue", "err", err)
		}
	}
	ev.freed = e.freeEvicted(ctx, *ev)
	return nil
}

// takeSlot runs take, a write that takes a running slot for key's thread
// (a reservation, a resume claim), until it applies: when the deployment
// is full it evicts (see evictOne) and runs take again with the evicted
// sandbox, whose tombstone holds the slot, else frees the slots no
// sandbox uses (freeLost), and otherwise returns the refusal (retry: the
// wait policy may poll). Store outages fail closed.
func (e *Engine) takeSlot(ctx context.Context, key ThreadKey, owner string, st *acquireState, take slotTake) (retry bool, _ error) {
	var evicted *killed
	for evictions := 0; ; evictions++ {
		err := take.write(e.now(), evicted)
		evicted = nil
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
				ev := e.evictForQuota(ctx, key, owner, ce.Reason)
				if evicted = e.handOverable(ctx, &ev, take); ev.freed {
					continue
				}
				st.notePendingKill(ev.killErr)
			}
			// burst with a zero burst limit behaves as reject, eviction included.
			evicting := e.s.Policy != PolicyBurst || e.s.BurstLimit == 0
			if ce.Reason == api.RefusalCapacity && evicting && evictions < maxEvictions {
				ev := e.evictOne(ctx, key, owner, e.fairShareBelow(key, st, ce.Tenants))
				if evicted = e.handOverable(ctx, &ev, take); ev.freed {
					continue
				}
				st.notePendingKill(ev.killErr)
				if ev.atShare && !st.atShare {
					// The tenant reached its share since its lookup: try
					// again, evicting only its own.
					st.atShare = true
					continue
				}
			}
			if ce.Reason == api.RefusalCapacity && !st.lostChecked {
				// Nothing may be evicted: before refusing, free the slots
				// no sandbox uses (freeLost).
				st.lostChecked = true
				freed, killErr := e.freeLost(ctx, owner)
				if freed {
					continue
				}
				st.notePendingKill(killErr)
			}
			if st.killErr != nil {
				// The slot an eviction freed is held by a kill the provider
				// did not confirm: the refusal is the provider's outage,
				// not a full deployment.
				return false, unavailable(fmt.Errorf("no slot freed for %s (%s): %w", key, ce.Reason, st.killErr))
			}
			if ce.Reason == api.RefusalCapacity && st.freeing {
				// A peer is freeing the slot of the thread's own ended
				// sandbox: look again once it is done (the refusal stands
				// if the acquire's time runs out first).
				st.refusal = e.refused(ce)
				return true, fmt.Errorf("thread %s: its ended sandbox is being freed: %w", key, ErrLeaseHeld)
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

// createReserved creates and bootstraps a sandbox under reservation token.
func (e *Engine) createReserved(ctx context.Context, key ThreadKey, token string) (AcquireResult, bool, error) {
	now := e.now()
	asked := now // the sandbox runs, and is metered, from its create
	ref, err := e.prov.Create(ctx, CreateSpec{
		Template: e.s.Template,
		Timeout:  e.activeTimer(),
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
	// An uncertain kill keeps the slot, and stops: a retry would strand
	// another slot the same way.
	if err := e.bootstrap(ctx, ref, bootstrapTimeout); err != nil {
		freed, err := e.discardCreated(ctx, ref.ID, token, key, err)
		return AcquireResult{}, freed, unavailable(err)
	}
	restored, err := e.restore(ctx, key, ref)
	if err != nil {
		freed, err := e.discardCreated(ctx, ref.ID, token, key, err)
		return AcquireResult{}, freed, unavailable(err)
	}
	// Finalize settles the create: it runs even if the work time ran out.
	now = e.now()
	fctx, cancel := settle(ctx)
	defer cancel()
	rec, err := e.store.Finalize(fctx, token, Record{
		SandboxID: ref.ID, ThreadKey: key, Seed: key.Seed(), State: StateActive, Backend: e.prov.Name(),
		Endpoint: ref.Endpoint, ReservationToken: token,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: asked.Add(e.s.ActiveTimeout),
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

// discardCreated kills a sandbox created under reservation token (of key's
// thread; none for a pool member) that is not handed out because of err,
// then frees the reservation: freed reports it. An uncertain kill keeps
// the slot (invariant 4) until reconcile confirms the sandbox gone.
func (e *Engine) discardCreated(ctx context.Context, id, token string, key ThreadKey, err error) (freed bool, _ error) {
	if kerr := e.kill(ctx, id); kerr != nil {
		return false, fmt.Errorf("%w (cleanup kill uncertain, slot kept: %v)", err, kerr)
	}
	return true, errors.Join(err, e.freeReservation(ctx, token, key))
}

// restoreShare is the part of the remaining invocation time restore may use.
const restoreShare = 2

// restore brings the thread's earlier outputs into a new sandbox when the
// syncer can. Only a dead sandbox fails it; anything else is logged and the
// sandbox is handed out with what was restored.
func (e *Engine) restore(ctx context.Context, key ThreadKey, ref SandboxRef) (*SyncResult, error) {
	r, ok := e.sync.(OutputRestorer)
	if !ok {
		return nil, nil
	}
	rctx, cancel := shareOf(ctx, restoreShare)
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
	rctx, cancel := shareOf(ctx, restoreShare)
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
	// checkDetail bounds the output a failed check's error quotes.
	checkDetail = 256
)

// probe checks that a sandbox answers: a trivial command must exit 0
// within probeTimeout.
func (e *Engine) probe(ctx context.Context, ref SandboxRef) error {
	return e.runCheck(ctx, ref, "probe", Command{Script: "true", Timeout: probeTimeout},
		func(out CommandResult) bool { return out.ExitCode == 0 })
}

// bootstrap runs the bootstrap script; it must print the marker and exit 0
// within timeout.
func (e *Engine) bootstrap(ctx context.Context, ref SandboxRef, timeout time.Duration) error {
	cmd := Command{Script: bootstrapScript, Env: map[string]string{"SBX_HOME": e.s.Home}, Timeout: timeout}
	return e.runCheck(ctx, ref, "bootstrap", cmd, func(out CommandResult) bool {
		return out.ExitCode == 0 && strings.Contains(string(out.Stdout), bootstrapMarker)
	})
}

// runCheck runs cmd in ref, bounded by cmd.Timeout; its result must
// pass ok, else the error, named what, gives the exit code and the start
// of the output, stderr else stdout (an error may reach a log line or an
// answer, so it stays short).
func (e *Engine) runCheck(ctx context.Context, ref SandboxRef, what string, cmd Command, ok func(CommandResult) bool) error {
	ctx, cancel := context.WithTimeout(ctx, cmd.Timeout)
	defer cancel()
	out, err := e.prov.Run(ctx, ref, cmd)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if !ok(out) {
		detail := bytes.TrimSpace(out.Stderr)
		if len(detail) == 0 {
			detail = bytes.TrimSpace(out.Stdout)
		}
		return fmt.Errorf("%s: exit code %d: %q", what, out.ExitCode, detail[:min(len(detail), checkDetail)])
	}
	return nil
}
