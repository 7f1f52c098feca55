package core

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"
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

// bootstrapScript prepares the directories agent tools expect, as the
// reference bootstrap does (test_bootstrap_sandbox_paths_emits_expected_script):
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
	store Store
	prov  Provider
	sync  OutputSyncer
	log   *slog.Logger
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
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
	e := &Engine{s: s, store: store, prov: prov, sync: syncer, log: slog.Default(), now: time.Now, sleep: sleepCtx}
	for _, o := range opts {
		o(e)
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

// Acquire hands the thread a live sandbox: its active one if alive (reused),
// else its warm one (reclaimed), else a new one (created). A peer's live
// lease on the thread's record (a release syncing, a reclaim) is waited out
// up to the acquire timeout.
//
// Errors: *ValidationError; *CapacityError when no slot frees in time;
// ErrLeaseHeld when a peer holds the thread past the acquire timeout;
// ErrStoreUnavailable or an ambiguous *ProviderError on outages.
func (e *Engine) Acquire(ctx context.Context, key ThreadKey) (AcquireResult, error) {
	if err := key.Validate(); err != nil {
		return AcquireResult{}, err
	}
	owner := newOwner()
	deadline := e.now().Add(e.s.AcquireTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	for attempt := 0; ; attempt++ {
		res, retry, err := e.acquireOnce(ctx, key, owner)
		if err == nil {
			return res, nil
		}
		if !retry {
			return AcquireResult{}, err
		}
		wait := backoff(attempt)
		var ce *CapacityError
		if errors.As(err, &ce) {
			if e.s.Policy != PolicyWait {
				return AcquireResult{}, err
			}
			wait = max(wait, 250*time.Millisecond)
		}
		if !e.now().Add(wait).Before(deadline) {
			return AcquireResult{}, err
		}
		if serr := e.sleep(ctx, wait); serr != nil {
			return AcquireResult{}, fmt.Errorf("acquire: %w", serr)
		}
	}
}

// acquireOnce makes one attempt. retry reports whether waiting and trying
// again may succeed (lease held, capacity full, a concurrent create).
func (e *Engine) acquireOnce(ctx context.Context, key ThreadKey, owner string) (res AcquireResult, retry bool, err error) {
	var replaceID, replaceRes string
	b, err := e.store.Binding(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return res, false, fmt.Errorf("read binding: %w", err)
	case b.SandboxID != "":
		rec, err := e.store.Get(ctx, b.SandboxID)
		if errors.Is(err, ErrNotFound) {
			replaceID = b.SandboxID
			break
		}
		if err != nil {
			return res, false, fmt.Errorf("read record: %w", err)
		}
		switch rec.State {
		case StateActive:
			return e.reuse(ctx, rec, owner)
		case StateWarm, StateReleasing, StateReclaiming:
			return e.reclaim(ctx, rec, owner)
		default: // destroying, gone: the thread needs a new sandbox
			replaceID = rec.SandboxID
		}
	case b.Reservation != "":
		if e.now().Before(b.ReservationExpiresAt) {
			return res, true, fmt.Errorf("thread %s: create in flight: %w", key, ErrLeaseHeld)
		}
		replaceRes = b.Reservation
	}
	return e.create(ctx, key, replaceID, replaceRes)
}

// reuse returns the thread's active sandbox if the provider still runs it.
// The liveness probe is a read (Provider.Info) that never extends its life.
func (e *Engine) reuse(ctx context.Context, rec Record, owner string) (AcquireResult, bool, error) {
	_, err := e.prov.Info(ctx, rec.SandboxID)
	switch {
	case err == nil:
		return AcquireResult{Record: rec, Source: SourceReused}, false, nil
	case errors.Is(err, ErrSandboxGone):
		e.log.InfoContext(ctx, "active sandbox gone; replacing", "sandbox_id", rec.SandboxID, "thread", rec.ThreadKey.String())
		claimed, cerr := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{StateActive},
			To: StateDestroying, Owner: owner, Now: e.now(), LeaseUntil: e.now().Add(e.s.LeaseDuration)})
		if cerr != nil {
			// A peer moved it first; look again.
			return AcquireResult{}, true, fmt.Errorf("claim dead sandbox: %w", cerr)
		}
		e.destroyClaimed(ctx, claimed)
		return AcquireResult{}, true, fmt.Errorf("sandbox %s was gone: %w", rec.SandboxID, ErrSandboxGone)
	default:
		return AcquireResult{}, false, fmt.Errorf("probe sandbox: %w", err)
	}
}

// reclaim takes the thread's warm sandbox back: claim it (waiting out a
// peer's release), extend its timeout, re-run bootstrap, mark it active.
// A reclaim that fails destroys the sandbox and tries again (create).
func (e *Engine) reclaim(ctx context.Context, rec Record, owner string) (AcquireResult, bool, error) {
	now := e.now()
	claimed, err := e.store.Claim(ctx, Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant,
		From: []State{StateWarm, StateReleasing, StateReclaiming}, To: StateReclaiming,
		Owner: owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)})
	if err != nil {
		if errors.Is(err, ErrLeaseHeld) || errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
			return AcquireResult{}, true, fmt.Errorf("claim warm sandbox: %w", err)
		}
		return AcquireResult{}, false, fmt.Errorf("claim warm sandbox: %w", err)
	}
	if err := e.prov.SetTimeout(ctx, claimed.SandboxID, e.s.ActiveTimeout); err != nil {
		e.log.WarnContext(ctx, "warm sandbox reconnect failed; discarding", "sandbox_id", claimed.SandboxID, "err", err)
		e.destroyClaimed(ctx, claimed)
		return AcquireResult{}, true, fmt.Errorf("reconnect warm sandbox: %w", err)
	}
	if err := e.bootstrap(ctx, claimed.Ref()); err != nil {
		e.log.WarnContext(ctx, "warm sandbox bootstrap failed; discarding", "sandbox_id", claimed.SandboxID, "err", err)
		e.destroyClaimed(ctx, claimed)
		return AcquireResult{}, true, err
	}
	now = e.now()
	active, err := e.store.Apply(ctx, Update{SandboxID: claimed.SandboxID, Fence: claimed.Fence, State: StateActive,
		Now: now, ExpiresAt: now.Add(e.s.ActiveTimeout)})
	if err != nil {
		return AcquireResult{}, false, fmt.Errorf("activate reclaimed sandbox: %w", err)
	}
	return AcquireResult{Record: active, Source: SourceReclaimed}, false, nil
}

// create reserves a slot, creates and bootstraps a sandbox and records it.
func (e *Engine) create(ctx context.Context, key ThreadKey, replaceID, replaceRes string) (AcquireResult, bool, error) {
	now := e.now()
	token := "res-" + newOwner()[4:]
	err := e.store.Reserve(ctx, Reservation{Token: token, ThreadKey: key, Seed: key.Seed(), Limit: e.s.Limit(),
		Now: now, ExpiresAt: now.Add(e.s.LeaseDuration), ReplaceSandboxID: replaceID, ReplaceReservation: replaceRes})
	var ce *CapacityError
	switch {
	case errors.As(err, &ce):
		// Only on refusal: the detailed counts cost a few reads.
		if st, serr := e.store.Capacity(ctx); serr == nil {
			ce.Status = st
		}
		ce.Status.Policy = string(e.s.Policy)
		ce.Status.Limit = e.s.Limit()
		if ce.RetryAfter == 0 {
			ce.RetryAfter = 5 * time.Second
		}
		return AcquireResult{}, true, ce
	case errors.Is(err, ErrThreadBound):
		return AcquireResult{}, true, fmt.Errorf("reserve: %w", err)
	case err != nil:
		// Maybe applied: the slot may be held by a reservation nobody
		// finishes; reconcile settles it (its token is in no sandbox).
		return AcquireResult{}, false, fmt.Errorf("reserve: %w", err)
	}

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
	if err := e.bootstrap(ctx, ref); err != nil {
		if kerr := e.prov.Kill(ctx, ref.ID); kerr != nil {
			// Uncertain kill: keep the slot (invariant 4).
			return AcquireResult{}, false, fmt.Errorf("%w (cleanup kill uncertain, slot kept: %v)", err, kerr)
		}
		return AcquireResult{}, false, errors.Join(err, e.freeReservation(ctx, token, key))
	}
	now = e.now()
	rec, err := e.store.Finalize(ctx, token, Record{
		SandboxID: ref.ID, ThreadKey: key, Seed: key.Seed(), State: StateActive, Backend: e.prov.Name(),
		EnvdURL: ref.EnvdURL, EnvdAccessToken: ref.AccessToken, ReservationToken: token,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(e.s.ActiveTimeout),
	})
	if errors.Is(err, ErrConflict) {
		// Our reservation was taken over (we were presumed crashed). Nobody
		// else knows this sandbox: kill it; its slot went with the takeover.
		if kerr := e.prov.Kill(ctx, ref.ID); kerr != nil {
			e.log.WarnContext(ctx, "kill of superseded sandbox failed; reconcile will find it", "sandbox_id", ref.ID, "err", kerr)
		}
		return AcquireResult{}, true, fmt.Errorf("finalize: %w", err)
	}
	if err != nil {
		return AcquireResult{}, false, fmt.Errorf("finalize: %w", err)
	}
	return AcquireResult{Record: rec, Source: SourceCreated}, false, nil
}

func (e *Engine) freeReservation(ctx context.Context, token string, key ThreadKey) error {
	if err := e.store.FreeReservation(ctx, token, key); err != nil {
		return fmt.Errorf("free reservation: %w", err)
	}
	return nil
}

// bootstrap runs the bootstrap script; it must print the marker and exit 0.
func (e *Engine) bootstrap(ctx context.Context, ref SandboxRef) error {
	out, err := e.prov.Run(ctx, ref, Command{Script: bootstrapScript, Env: map[string]string{"SBX_HOME": e.s.Home}, Timeout: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if out.ExitCode != 0 || !strings.Contains(string(out.Stdout), bootstrapMarker) {
		return fmt.Errorf("bootstrap: exit code %d: %s", out.ExitCode, strings.TrimSpace(string(out.Stderr)))
	}
	return nil
}

// destroyClaimed turns a record this invocation holds the lease on into a
// tombstone, kills the sandbox and frees its slot once the kill is confirmed.
// An uncertain kill leaves the tombstone (and its slot) for a later retry.
// It reports whether the sandbox is confirmed gone.
func (e *Engine) destroyClaimed(ctx context.Context, rec Record) bool {
	if rec.State != StateDestroying {
		tomb, err := e.store.Apply(ctx, Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: StateDestroying,
			KeepLease: true, Now: e.now(), KillAttempt: true})
		if err != nil {
			e.log.WarnContext(ctx, "tombstone write failed", "sandbox_id", rec.SandboxID, "err", err)
			return false
		}
		rec = tomb
	}
	if err := e.prov.Kill(ctx, rec.SandboxID); err != nil {
		e.log.WarnContext(ctx, "kill uncertain; tombstone keeps its slot", "sandbox_id", rec.SandboxID, "err", err)
		return false
	}
	if err := e.store.Free(ctx, rec.SandboxID, rec.Fence, e.now()); err != nil {
		e.log.WarnContext(ctx, "free slot after kill failed", "sandbox_id", rec.SandboxID, "err", err)
		return false
	}
	return true
}

// Release syncs the sandbox's outputs and parks it warm for its thread; a
// sandbox found dead (or whose timeout cannot be set because it is gone) is
// destroyed instead. Releasing a warm sandbox again is a no-op.
//
// Errors: *ValidationError, ErrNotFound (unknown or another tenant's),
// ErrConflict (not active), ErrLeaseHeld (a peer is moving it).
func (e *Engine) Release(ctx context.Context, tenant, sandboxID string) (ReleaseResult, error) {
	if err := ValidateSandboxID(sandboxID); err != nil {
		return ReleaseResult{}, err
	}
	owner := newOwner()
	now := e.now()
	rec, err := e.store.Claim(ctx, Claim{SandboxID: sandboxID, Tenant: tenant, From: []State{StateActive},
		To: StateReleasing, Owner: owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)})
	if errors.Is(err, ErrConflict) {
		if cur, gerr := e.store.Get(ctx, sandboxID); gerr == nil && cur.Tenant == tenant && cur.State == StateWarm {
			return ReleaseResult{SandboxID: sandboxID, State: string(StateWarm)}, nil
		}
	}
	if err != nil {
		return ReleaseResult{}, fmt.Errorf("claim for release: %w", err)
	}
	out := ReleaseResult{SandboxID: sandboxID}
	dead := false
	if e.sync != nil {
		res, serr := e.sync.Sync(ctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
		out.Sync = &res
		if serr != nil {
			out.SyncError = serr.Error()
			dead = errors.Is(serr, ErrSandboxGone)
		}
	}
	if !dead {
		err := e.prov.SetTimeout(ctx, sandboxID, e.s.IdleTimeout)
		dead = errors.Is(err, ErrSandboxGone)
		if err != nil && !dead {
			e.log.WarnContext(ctx, "set idle timeout failed; parking with the active timeout", "sandbox_id", sandboxID, "err", err)
		}
	}
	if dead {
		e.destroyClaimed(ctx, rec)
		out.State = "destroyed"
		return out, nil
	}
	now = e.now()
	if _, err := e.store.Apply(ctx, Update{SandboxID: sandboxID, Fence: rec.Fence, State: StateWarm, Now: now,
		ParkedAt: now, ExpiresAt: now.Add(e.s.IdleTimeout)}); err != nil {
		return out, fmt.Errorf("park warm: %w", err)
	}
	out.State = string(StateWarm)
	return out, nil
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
	owner := newOwner()
	now := e.now()
	rec, err := e.store.Claim(ctx, Claim{SandboxID: sandboxID, Tenant: tenant, From: []State{StateActive, StateWarm},
		Owner: owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)})
	if err != nil {
		return SyncResult{}, fmt.Errorf("claim for sync: %w", err)
	}
	res, serr := e.sync.Sync(ctx, SyncTarget{Ref: rec.Ref(), ThreadKey: rec.ThreadKey})
	if errors.Is(serr, ErrSandboxGone) {
		e.destroyClaimed(ctx, rec)
		return res, fmt.Errorf("sync: %w", serr)
	}
	if _, err := e.store.Apply(ctx, Update{SandboxID: sandboxID, Fence: rec.Fence, State: rec.State, Now: e.now(),
		ParkedAt: rec.ParkedAt, ExpiresAt: rec.ExpiresAt}); err != nil {
		return res, errors.Join(serr, fmt.Errorf("drop sync lease: %w", err))
	}
	if serr != nil {
		return res, fmt.Errorf("sync: %w", serr)
	}
	return res, nil
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
	st.Policy = string(e.s.Policy)
	return st, nil
}
