package core

import (
	"context"
	"errors"
	"sync"
	"time"
)

// EventKind names a lifecycle transition of a sandbox record: the
// detail-type of its published event.
type EventKind string

// Lifecycle event kinds.
const (
	// EventCreated: a new sandbox was created and handed to its thread
	// (creating -> active), or created for the pool (creating -> pooled,
	// no thread).
	EventCreated EventKind = "created"
	// EventPoolClaimed: a pool member was claimed by a thread's first
	// acquire instead of a create.
	EventPoolClaimed EventKind = "pool-claimed"
	// EventReused: the thread's active sandbox was handed out again
	// (active -> active).
	EventReused EventKind = "reused"
	// EventReclaimed: the thread's warm sandbox was handed back to it
	// (warm -> active; releasing -> active when an interrupted release
	// was taken over).
	EventReclaimed EventKind = "reclaimed"
	// EventResumed: the thread's paused sandbox was resumed and handed
	// back to it (paused -> active).
	EventResumed EventKind = "resumed"
	// EventReleased: the thread released its sandbox, parked warm
	// (active -> warm; releasing -> warm when a release is finished by
	// another invocation).
	EventReleased EventKind = "released"
	// EventPaused: a warm sandbox was paused at the provider (warm -> paused).
	EventPaused EventKind = "paused"
	// EventEvicted: a warm or paused sandbox was taken from its thread to
	// free a slot for another thread (-> destroying); its destruction
	// follows as EventDestroyed.
	EventEvicted EventKind = "evicted"
	// EventAdopted: reconcile found a sandbox of this deployment that the
	// store did not track (a create whose invocation died) and recorded
	// it for its thread (-> warm).
	EventAdopted EventKind = "adopted"
	// EventDestroyed: the provider confirmed the sandbox gone and its slot
	// was freed (-> gone). Reason says why it was destroyed.
	EventDestroyed EventKind = "destroyed"
	// EventExpiring: the sandbox's lease ends within
	// Settings.ExpiringLead and has not been renewed (active -> active);
	// sent once per end, by reconcile. Event.ExpiresAt is the end.
	EventExpiring EventKind = "expiring"
	// EventLost: a sandbox vanished while its thread held it (active ->
	// gone), for one of LostReasons; its EventDestroyed follows.
	EventLost EventKind = "lost"
)

// EventKinds lists every lifecycle event kind.
func EventKinds() []EventKind {
	return []EventKind{EventCreated, EventPoolClaimed, EventReused, EventReclaimed, EventResumed, EventReleased,
		EventPaused, EventEvicted, EventAdopted, EventDestroyed, EventExpiring, EventLost}
}

// Event reasons: why a sandbox was evicted or destroyed (Event.Reason).
const (
	// EventReasonProviderTimeout: the provider ended the sandbox at the
	// timer the broker set (the lease, or the idle time, ran out).
	EventReasonProviderTimeout = "provider_timeout"
	// EventReasonProviderKilled: the provider ended the sandbox before its
	// timer (killed at the provider, or it died).
	EventReasonProviderKilled = "provider_killed"
	// EventReasonMaxLifetime: the provider ended the sandbox at its
	// lifetime bound (Settings.MaxLifetime), which no renewal passes.
	EventReasonMaxLifetime = "max_lifetime"
	// EventReasonUnresponsive: the sandbox exists but did not answer (a
	// failed probe, bootstrap or reconnect) and was discarded.
	EventReasonUnresponsive = "unresponsive"
	// EventReasonNotResumable: the provider reports the sandbox paused and
	// it could not be resumed.
	EventReasonNotResumable = "not_resumable"
	// EventReasonDraining: the deployment drains and keeps nothing warm.
	EventReasonDraining = "draining"
	// EventReasonCapacity: evicted to free a slot for another thread.
	EventReasonCapacity = "capacity"
	// EventReasonQuota: evicted to free a slot of its user's or tenant's
	// quota (SANDBOX_MAX_PER_USER, SANDBOX_MAX_PER_TENANT) for another
	// thread of the same user or tenant.
	EventReasonQuota = "quota"
	// EventReasonIdleExpired: warm longer than the idle timeout.
	EventReasonIdleExpired = "idle_expired"
	// EventReasonDuplicate: a second live sandbox of a thread, killed by
	// reconcile.
	EventReasonDuplicate = "duplicate"
	// EventReasonOrphan: a sandbox of this deployment with no valid or
	// known thread, killed by reconcile.
	EventReasonOrphan = "orphan"
	// EventReasonKillRetried: a tombstone whose earlier kill was uncertain,
	// confirmed gone by a retry.
	EventReasonKillRetried = "kill_retried"
	// EventReasonKilled: destroyed at its release, as the caller asked
	// (ReleaseOptions.Destroy: an E2B kill of a one-off sandbox).
	EventReasonKilled = "killed"
	// EventReasonUntracked: an adopted sandbox (EventAdopted).
	EventReasonUntracked = "untracked"
)

// LostReasons lists the reasons of EventLost: why a sandbox its thread
// held ended without the thread asking.
func LostReasons() []string {
	return []string{EventReasonProviderTimeout, EventReasonProviderKilled, EventReasonUnresponsive, EventReasonMaxLifetime}
}

// Event is one lifecycle transition of a sandbox record, as published
// (the JSON is the event's body on the event bus).
type Event struct {
	Kind       EventKind `json:"kind"`
	Deployment string    `json:"deployment"`
	Tenant     string    `json:"tenant"`
	User       string    `json:"user_id"`
	Thread     string    `json:"thread_id"`
	SandboxID  string    `json:"sandbox_id"`
	Backend    string    `json:"backend"`
	// From is the record's state before the transition (for destroyed:
	// before it became a tombstone); "" when the broker had no record of
	// the sandbox (one reconcile adopted or killed). To is the state after.
	From   State     `json:"from_state"`
	To     State     `json:"to_state"`
	Reason string    `json:"reason,omitempty"`
	Time   time.Time `json:"time"`
	// RunningSeconds and PausedSeconds are the sandbox's running and
	// paused time from its creation to Time.
	RunningSeconds float64 `json:"running_seconds"`
	PausedSeconds  float64 `json:"paused_seconds"`
	// ExpiresAt is the lease's end, on EventExpiring only.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// EventSink publishes lifecycle events to an event bus (or a JSON-lines
// file). The engine calls it concurrently, in the background of the
// operation that made the transitions, each call with a short deadline of
// its own; an error is logged and counted (MetricEventsFailed), never
// returned to the caller of the transition.
type EventSink interface {
	Publish(ctx context.Context, ev Event) error
}

// WithEventSink sets where lifecycle events are published (default: not
// published).
func WithEventSink(s EventSink) Option { return func(e *Engine) { e.events = s } }

// publishTimeout bounds one publish, and the wait of an operation for
// the publishes it started: a slow event bus never holds an acquire, a
// release or a reconcile pass for longer than that once.
const publishTimeout = time.Second

// maxPublishing bounds the publishes one operation has in flight; an
// event beyond it is dropped and counted.
const maxPublishing = 16

// errPublishStalled is why an event is dropped without being published:
// an earlier publish of the same operation timed out (or too many are in
// flight), so the event bus is taken as stalled until the next operation.
var errPublishStalled = errors.New("event bus stalled: event dropped")

type publisherKey struct{}

// publisher publishes the events of one operation (an Acquire, a Release,
// a Sync, a pool refill, a reconcile pass) in the background, so a
// transition never waits for the event bus. The operation waits for them
// once, at its end (flush), because the runtime may freeze the process as
// soon as the invocation answers.
type publisher struct {
	e *Engine
	// ctx is the publishes' context: not canceled with the operation's
	// (the transitions happened; their events are still due), it ends at
	// the invocation's end, or when flush stops waiting.
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu       sync.Mutex
	inflight map[int]Event // by start order
	started  int
	stalled  bool // a publish timed out: drop the rest
	closed   bool // flush counted what is still in flight
}

// withPublisher returns ctx carrying a publisher for the operation it
// starts, and the flush to defer. Inside an operation that already has
// one, the flush is a no-op: the outer operation waits.
func (e *Engine) withPublisher(ctx context.Context) (context.Context, func()) {
	if e.events == nil {
		return ctx, func() {}
	}
	if _, ok := ctx.Value(publisherKey{}).(*publisher); ok {
		return ctx, func() {}
	}
	end, ok := invocationEnd(ctx)
	if !ok {
		end, ok = ctx.Deadline()
	}
	p := &publisher{e: e}
	if ok {
		p.ctx, p.stop = context.WithDeadline(context.WithoutCancel(ctx), end)
	} else {
		p.ctx, p.stop = context.WithCancel(context.WithoutCancel(ctx))
	}
	return context.WithValue(ctx, publisherKey{}, p), p.flush
}

// start publishes ev in the background, or drops and counts it when the
// event bus stalled earlier in the operation or too many are in flight.
func (p *publisher) start(ev Event) {
	p.mu.Lock()
	if p.stalled || p.closed || len(p.inflight) >= maxPublishing {
		p.failed(ev, errPublishStalled)
		p.mu.Unlock()
		return
	}
	if p.inflight == nil {
		p.inflight = make(map[int]Event)
	}
	p.started++
	id := p.started
	p.inflight[id] = ev
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		pctx, cancel := context.WithTimeout(p.ctx, publishTimeout)
		err := p.e.events.Publish(pctx, ev)
		timedOut := err != nil && pctx.Err() != nil
		cancel()
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.inflight, id)
		if timedOut {
			p.stalled = true
		}
		if err != nil && !p.closed {
			p.failed(ev, err)
		}
	}()
}

// failed logs and counts a lost event; p.mu is held, so nothing is
// logged after flush returns.
func (p *publisher) failed(ev Event, err error) {
	e := p.e
	e.log.WarnContext(p.ctx, "lifecycle event not published", "kind", ev.Kind, "sandbox_id", ev.SandboxID, "err", err)
	LogEMF(p.ctx, e.log, e.s.Deployment, e.now(), EventsFailedMetric())
}

// flush waits for the operation's publishes under one bound: at most
// publishTimeout and never past the invocation's end. What is still in
// flight then is canceled and counted as lost.
func (p *publisher) flush() {
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	bound := time.NewTimer(publishTimeout)
	defer bound.Stop()
	select {
	case <-done:
	case <-bound.C:
	case <-p.ctx.Done():
	}
	p.mu.Lock()
	p.closed = true
	for _, ev := range p.inflight {
		p.failed(ev, context.DeadlineExceeded)
	}
	p.mu.Unlock()
	p.stop()
}

// usageSoFar is rec's running and paused time from its creation to now:
// its paused time is PausedFor plus, while it is paused (or destroyed from
// paused: it is not resumed to be killed), the time since it was paused;
// the rest of its life it ran.
func (r Record) usageSoFar(now time.Time) (running, paused time.Duration) {
	if r.CreatedAt.IsZero() || now.Before(r.CreatedAt) {
		return 0, 0
	}
	paused = r.PausedFor
	inPause := r.State == StatePaused || r.State == StateDestroying && r.PrevState == StatePaused
	if inPause && !r.ParkedAt.IsZero() && r.ParkedAt.Before(now) {
		paused += now.Sub(r.ParkedAt)
	}
	life := now.Sub(r.CreatedAt)
	paused = min(paused, life)
	return life - paused, paused
}

// keepPause returns claimed, a record just claimed to destroying from
// rec, with rec's pause start when rec was paused: the store clears it
// with the claim, but the sandbox stays paused until it is gone, and its
// evicted and destroyed events count that time as paused.
func keepPause(claimed, rec Record) Record {
	if rec.State == StatePaused && claimed.ParkedAt.IsZero() {
		claimed.ParkedAt = rec.ParkedAt
	}
	return claimed
}

// emit publishes the transition of rec (the record as written) from from
// to to, in the background of the operation of ctx (see publisher). It
// never fails or holds the transition: a publish that fails, outlives its
// deadline or is dropped is logged and counted.
func (e *Engine) emit(ctx context.Context, rec Record, from, to State, kind EventKind, reason string) {
	if e.events == nil {
		return
	}
	e.publish(ctx, e.event(rec, from, to, kind, reason))
}

// event is the Event of rec's transition from from to to, now.
func (e *Engine) event(rec Record, from, to State, kind EventKind, reason string) Event {
	now := e.now()
	running, paused := rec.usageSoFar(now)
	ev := Event{Kind: kind, Deployment: e.s.Deployment, Tenant: rec.Tenant, User: rec.User, Thread: rec.Thread,
		SandboxID: rec.SandboxID, Backend: rec.Backend, From: from, To: to, Reason: reason, Time: now.UTC(),
		RunningSeconds: running.Seconds(), PausedSeconds: paused.Seconds()}
	if ev.Backend == "" {
		ev.Backend = e.prov.Name()
	}
	return ev
}

// publish publishes ev in the background of the operation of ctx (see
// emit).
func (e *Engine) publish(ctx context.Context, ev Event) {
	if p, ok := ctx.Value(publisherKey{}).(*publisher); ok {
		p.start(ev)
		return
	}
	// Outside an operation: publish now, under the same bound.
	ctx, flush := e.withPublisher(ctx)
	ctx.Value(publisherKey{}).(*publisher).start(ev)
	flush()
}
