package core_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// eventLog is an EventSink that keeps what it is given; err, when set,
// makes Publish fail after recording; block makes it wait for its
// context to end (a stalled event bus).
type eventLog struct {
	mu        sync.Mutex
	events    []core.Event
	deadlines []time.Time
	err       error
	block     bool
	// timedOut counts blocked publishes that ended; afterTimeout counts
	// publishes started after one had (a wait for the event bus that
	// followed another).
	timedOut, afterTimeout int
}

func (l *eventLog) Publish(ctx context.Context, ev core.Event) error {
	l.mu.Lock()
	dl, _ := ctx.Deadline()
	l.events = append(l.events, ev)
	l.deadlines = append(l.deadlines, dl)
	if l.timedOut > 0 {
		l.afterTimeout++
	}
	err, block := l.err, l.block
	l.mu.Unlock()
	if block {
		<-ctx.Done()
		l.mu.Lock()
		l.timedOut++
		l.mu.Unlock()
		return ctx.Err()
	}
	return err
}

// stall makes the sink stall from now on, forgetting what it was given.
func (l *eventLog) stall() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events, l.deadlines, l.block, l.timedOut, l.afterTimeout = nil, nil, true, 0, 0
}

// waits returns how many publishes were started and how many of them
// began after another had timed out.
func (l *eventLog) waits() (started, afterTimeout int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events), l.afterTimeout
}

// seen returns "kind from->to reason" of every event for sandbox id, in order.
func (l *eventLog) seen(id string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ev := range l.events {
		if ev.SandboxID == id {
			out = append(out, fmt.Sprintf("%s %s->%s %s", ev.Kind, ev.From, ev.To, ev.Reason))
		}
	}
	return out
}

func (l *eventLog) all() []core.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]core.Event(nil), l.events...)
}

func sameList(got, want []string) bool {
	return strings.Join(got, "\n") == strings.Join(want, "\n")
}

// sameEvents reports whether got and want hold the same events in any
// order: the events of one operation are published concurrently, so
// they may arrive in any order.
func sameEvents(got, want []string) bool {
	return sameList(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want)))
}

// TestLifecycleEventsOfOneThread: create, reuse, release, reclaim, release
// and idle expiry each publish one event, in order, with the thread's
// identity, the transition and the running time so far.
func TestLifecycleEventsOfOneThread(t *testing.T) {
	events := &eventLog{}
	h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = time.Minute }, core.WithEventSink(events))
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(10 * time.Second)
	h.acquire(t, key("t1"), core.SourceReused)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.clock.advance(5 * time.Second)
	h.acquire(t, key("t1"), core.SourceReclaimed)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.clock.advance(2 * time.Minute)
	if st, err := h.eng.Reconcile(ctx); err != nil || st.Expired != 1 {
		t.Fatalf("Reconcile = %+v, %v; want 1 expired", st, err)
	}
	want := []string{
		"created creating->active ",
		"reused active->active ",
		"released active->warm ",
		"reclaimed warm->active ",
		"released active->warm ",
		"destroyed warm->gone idle_expired",
	}
	if got := events.seen(rec.SandboxID); !sameList(got, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	all := events.all()
	var last float64
	for i, ev := range all {
		if ev.Tenant != "acme" || ev.User != "alice" || ev.Thread != "t1" || ev.Backend != "fake" || ev.Deployment != "test" {
			t.Errorf("event %d identity = %+v, want acme/alice/t1 on fake in deployment test", i, ev)
		}
		if ev.Time.IsZero() || ev.Time.Location() != time.UTC {
			t.Errorf("event %d time = %v, want UTC", i, ev.Time)
		}
		if ev.RunningSeconds < last || ev.PausedSeconds != 0 {
			t.Errorf("event %d running %.1f s (previous %.1f s), paused %.1f s: want non-decreasing running, no pause", i, ev.RunningSeconds, last, ev.PausedSeconds)
		}
		last = ev.RunningSeconds
	}
	if last < (2*time.Minute + 15*time.Second).Seconds() {
		t.Errorf("running seconds at destruction = %.1f, want at least the %v the clock moved", last, 2*time.Minute+15*time.Second)
	}
}

// TestEvictionEvents: a warm sandbox evicted for another thread publishes
// evicted, then destroyed, both with reason capacity.
func TestEvictionEvents(t *testing.T) {
	events := &eventLog{}
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject }, core.WithEventSink(events))
	old := h.acquire(t, key("old"), core.SourceCreated)
	if _, err := h.eng.Release(context.Background(), "acme", old.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.acquire(t, key("new"), core.SourceCreated)
	want := []string{"created creating->active ", "released active->warm ",
		"evicted warm->destroying capacity", "destroyed warm->gone capacity"}
	if got := events.seen(old.SandboxID); !sameEvents(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestDestroyEventReasons: each way a sandbox is discarded names its reason.
func TestDestroyEventReasons(t *testing.T) {
	release := func(t *testing.T, h *harness, rec core.Record) {
		if res, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); err != nil || res.State != "destroyed" {
			t.Fatalf("Release = %+v, %v; want destroyed", res, err)
		}
	}
	for _, tc := range []struct {
		name  string
		fault func(t *testing.T, h *harness, rec core.Record)
		act   func(t *testing.T, h *harness, rec core.Record)
		want  []string
	}{
		{"found dead at release", func(t *testing.T, h *harness, _ core.Record) {
			h.sync.set(func(s *fakeSyncer) { s.err = fmt.Errorf("envd: %w", core.ErrSandboxGone) })
		}, release, []string{"destroyed releasing->gone provider_killed"}},
		{"released while draining", func(t *testing.T, h *harness, _ core.Record) {
			if err := h.eng.SetDraining(context.Background(), true); err != nil {
				t.Fatalf("SetDraining: %v", err)
			}
		}, release, []string{"destroyed releasing->gone draining"}},
		{"killed behind the broker's back", func(t *testing.T, h *harness, rec core.Record) {
			if err := h.prov.Kill(context.Background(), rec.SandboxID); err != nil {
				t.Fatalf("Kill: %v", err)
			}
		}, func(t *testing.T, h *harness, _ core.Record) { h.acquire(t, key("t1"), core.SourceCreated) },
			[]string{"lost active->gone provider_killed", "destroyed active->gone provider_killed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := &eventLog{}
			h := newHarness(t, nil, core.WithEventSink(events))
			rec := h.acquire(t, key("t1"), core.SourceCreated)
			tc.fault(t, h, rec)
			tc.act(t, h, rec)
			want := append([]string{"created creating->active "}, tc.want...)
			if got := events.seen(rec.SandboxID); !sameEvents(got, want) {
				t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestFailingEventSinkNeverFailsAcquireOrRelease: a sink that errors, or
// stalls, leaves acquire and release answering as without one; each lost
// event is logged and counted (EventsPublishFailed), and a stalled publish
// is cut at its own short deadline inside the invocation's time.
func TestFailingEventSinkNeverFailsAcquireOrRelease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sink *eventLog
	}{
		{"errors", &eventLog{err: errors.New("event bus unavailable")}},
		{"stalls", &eventLog{block: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			logger := slog.New(slog.NewJSONHandler(&logs, nil))
			h := newHarness(t, nil, core.WithEventSink(tc.sink), core.WithLogger(logger))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := h.eng.Acquire(ctx, key("t1"))
			if err != nil || res.Source != core.SourceCreated {
				t.Fatalf("Acquire = %v, %v; want created", res.Source, err)
			}
			rel, err := h.eng.Release(ctx, "acme", res.Record.SandboxID)
			if err != nil || rel.State != "warm" {
				t.Fatalf("Release = %+v, %v; want warm", rel, err)
			}
			if _, err := h.eng.Acquire(ctx, key("t1")); err != nil {
				t.Fatalf("reclaim: %v", err)
			}
			dl, _ := ctx.Deadline()
			tc.sink.mu.Lock()
			published, deadlines := len(tc.sink.events), tc.sink.deadlines
			tc.sink.mu.Unlock()
			if published != 3 {
				t.Errorf("publish attempts = %d, want 3 (created, released, reclaimed)", published)
			}
			for i, d := range deadlines {
				if d.IsZero() || d.After(dl) {
					t.Errorf("publish %d deadline = %v, want one before the invocation's %v", i, d, dl)
				}
			}
			if n := strings.Count(logs.String(), `"EventsPublishFailed":1`); n != 3 {
				t.Errorf("EventsPublishFailed records = %d, want 3; log:\n%s", n, logs.String())
			}
		})
	}
}

// TestReconcileEvents: what reconcile adopts and kills is published: an
// untracked sandbox of a thread adopted warm, a duplicate and an orphan
// destroyed, each with its reason.
func TestReconcileEvents(t *testing.T) {
	events := &eventLog{}
	h := newRecHarness(t, func(_ *core.Settings, rs *core.ReconcileSettings) {
		rs.Grace = time.Second
		rs.OrphanTTL = time.Second
	})
	h.opts = []core.Option{core.WithEventSink(events)}
	h.eng = h.engine(t)
	canonical := h.acquire(t, "t1")
	dup := h.untracked(t, h.threadMeta("t1", 0))
	lost := h.untracked(t, h.threadMeta("t2", 0))
	orphan := h.untracked(t, map[string]string{core.MetaDeployment: h.s.Deployment})
	h.pass(t)
	h.clock.advance(2 * time.Second)
	h.pass(t)
	for _, tc := range []struct {
		id   string
		want []string
	}{
		{canonical.SandboxID, []string{"created creating->active "}},
		{dup, []string{"destroyed ->gone duplicate"}},
		{lost, []string{"adopted ->warm untracked"}},
		{orphan, []string{"destroyed ->gone orphan"}},
	} {
		if got := events.seen(tc.id); !sameList(got, tc.want) {
			t.Errorf("events of %s:\n%s\nwant:\n%s", tc.id, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
		}
	}
}

// TestStalledEventBusCostsOneBound: against a stalled event bus, an
// acquire that evicts a warm sandbox and creates one (three events) and a
// reconcile pass that expires many sandboxes each wait for the bus once:
// no publish starts after another timed out (a synchronous publish waits
// once per event), every expiry is still done, and every lost event is
// counted.
func TestStalledEventBusCostsOneBound(t *testing.T) {
	t.Parallel()
	t.Run("acquire", func(t *testing.T) {
		events := &eventLog{}
		var logs bytes.Buffer // the handler serialises writes; the engine logs nothing after an operation returns
		h := newHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject },
			core.WithEventSink(events), core.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		old := h.acquire(t, key("old"), core.SourceCreated)
		if _, err := h.eng.Release(context.Background(), "acme", old.SandboxID); err != nil {
			t.Fatalf("Release: %v", err)
		}
		events.stall()
		logs.Reset()
		h.acquire(t, key("new"), core.SourceCreated)
		started, after := events.waits()
		if started == 0 || after != 0 {
			t.Errorf("publishes started = %d, %d of them after a timeout; want at least 1, none after a timeout", started, after)
		}
		if got := strings.Count(logs.String(), `"EventsPublishFailed":1`); got != 3 {
			t.Errorf("EventsPublishFailed records = %d, want 3 (evicted, destroyed, created)", got)
		}
	})
	t.Run("reconcile", func(t *testing.T) {
		const n = 6
		events := &eventLog{}
		h := newHarness(t, func(s *core.Settings) { s.IdleTimeout, s.Replicas = time.Minute, n }, core.WithEventSink(events))
		for i := range n {
			rec := h.acquire(t, key(fmt.Sprintf("t%d", i)), core.SourceCreated)
			if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
		h.clock.advance(2 * time.Minute)
		events.stall()
		ctx, cancel := context.WithTimeout(context.Background(), core.ReconcileReserve+time.Minute)
		defer cancel()
		st, err := h.eng.Reconcile(ctx)
		if err != nil || st.Expired != n || st.BudgetExhausted {
			t.Fatalf("Reconcile = %+v, %v; want %d expired", st, err, n)
		}
		if started, after := events.waits(); started == 0 || after != 0 {
			t.Errorf("publishes started = %d, %d of them after a timeout; want at least 1, none after a timeout", started, after)
		}
	})
}
