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
	"sync"
	"sync/atomic"
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
	// lostCheck is when freeLost may next look (Unix nanoseconds).
	lostCheck atomic.Int64
	// drain is the draining flag as this engine last read or set it.
	drain drainView
}

// drainCheckInterval is how long a release trusts the draining flag it
// read (drainingNow): one read per interval per engine instead of one per
// release. A release in another engine in the interval after a drain
// begins parks its sandbox warm, and reconcile destroys it on its next
// pass, as every warm sandbox of a draining deployment.
const drainCheckInterval = 5 * time.Second

// drainView is a read of the draining flag and when it was made.
type drainView struct {
	mu       sync.Mutex
	at       time.Time // zero: never read
	draining bool
}

// drainingNow reports whether the deployment drains, as read at most
// drainCheckInterval ago (by the engine's clock). A failed read answers
// false: the sandbox parks, and reconcile destroys it if the deployment
// drains.
func (e *Engine) drainingNow(ctx context.Context) bool {
	now := e.now()
	e.drain.mu.Lock()
	defer e.drain.mu.Unlock()
	if !e.drain.at.IsZero() && now.Sub(e.drain.at) < drainCheckInterval && now.After(e.drain.at.Add(-time.Second)) {
		return e.drain.draining
	}
	cctx, cancel := settle(ctx)
	defer cancel()
	draining, err := e.store.Draining(cctx)
	if err != nil {
		e.log.InfoContext(ctx, "draining flag not read; parking", "err", err)
		return false
	}
	e.drain.at, e.drain.draining = now, draining
	return draining
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

// applyRecord makes the fenced update u and returns the record as stored
// (read back when the store returned none).
func (e *Engine) applyRecord(ctx context.Context, u Update) (Record, error) {
	rec, err := e.store.Apply(ctx, u)
	if err != nil || rec.SandboxID != "" {
		return rec, err
	}
	return e.store.Get(ctx, u.SandboxID)
}

// leaseSafety is the least lease time left for a lease holder to still
// make provider calls that a peer's takeover would contradict.
const leaseSafety = 10 * time.Second

// unavailable wraps a failure of the sandboxes the provider handed out as
// ErrProviderUnavailable, hiding the cause's kind (a dead sandbox is not
// the caller's "not found").
func unavailable(cause error) error {
	return fmt.Errorf("%w: %v", ErrProviderUnavailable, cause)
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
	if e.poolStore() != nil {
		// The refill's failures, when a pool is kept and its creates fail.
		if b, err := e.store.RefillBackoff(ctx); err != nil {
			return st, fmt.Errorf("capacity: %w", err)
		} else if b.Failures > 0 {
			st.PoolRefill = &b
		}
	}
	return st, nil
}

// SetDraining starts (true) or ends (false) draining: while draining,
// acquires are refused with reason "draining", releases destroy instead of
// parking, and reconcile destroys warm sandboxes.
func (e *Engine) SetDraining(ctx context.Context, draining bool) error {
	if err := e.store.SetDraining(ctx, draining); err != nil {
		return fmt.Errorf("set draining: %w", err)
	}
	e.drain.mu.Lock()
	e.drain.at, e.drain.draining = e.now(), draining
	e.drain.mu.Unlock()
	e.log.InfoContext(ctx, "draining changed", "draining", draining)
	return nil
}

// metricsTimeout bounds a provider's metrics read.
const metricsTimeout = 10 * time.Second

// Metrics passes through the provider's figures for the tenant's own
// sandbox, handed out or parked, between start and end (zero: the
// provider's default interval). It reads the record only: no lease, no
// change.
//
// Errors: *ValidationError, ErrNotFound (unknown, another tenant's, or
// ending), ErrNotOffered (the provider declares no Capabilities.Metrics),
// ErrSandboxGone (the provider no longer has it), ErrProviderUnavailable.
func (e *Engine) Metrics(ctx context.Context, tenant, sandboxID string, start, end time.Time) ([]SandboxMetric, error) {
	rec, err := e.Get(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(TenantListed(), rec.State) {
		return nil, ErrNotFound
	}
	if e.caps.Metrics == nil {
		return nil, ErrNotOffered
	}
	cctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	ms, err := e.caps.Metrics(cctx, sandboxID, start, end)
	switch {
	case err == nil:
		return ms, nil
	case errors.Is(err, ErrSandboxGone), errors.Is(err, ErrNotOffered):
		return nil, err
	}
	return nil, unavailable(fmt.Errorf("metrics of %s: %v", sandboxID, err))
}
