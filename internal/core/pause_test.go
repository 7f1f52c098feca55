package core_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// newPauseHarness is newHarness over a fake provider that can pause.
func newPauseHarness(t *testing.T, mutate func(*core.Settings), opts ...core.Option) *harness {
	t.Helper()
	prov := coretest.NewFakeProvider()
	prov.Pausable = true
	h := newHarnessWith(t, prov, mutate, opts...)
	t.Cleanup(func() {
		if m := prov.Misuse(); len(m) > 0 {
			t.Errorf("calls on paused sandboxes that use or extend them: %v", m)
		}
	})
	return h
}

// park acquires a sandbox for thread and releases it warm.
func (h *harness) park(t *testing.T, thread string) core.Record {
	t.Helper()
	rec := h.acquire(t, key(thread), core.SourceCreated)
	res, err := h.eng.Release(context.Background(), "acme", rec.SandboxID)
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	if res.State != string(core.StateWarm) {
		t.Fatalf("Release = %s, want warm", res.State)
	}
	return rec
}

func (h *harness) reconcile(t *testing.T) core.ReconcileStats {
	t.Helper()
	st, err := h.eng.Reconcile(context.Background())
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return st
}

func (h *harness) state(t *testing.T, id string) core.Record {
	t.Helper()
	rec, err := h.store.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return rec
}

func (h *harness) pausedSlots(t *testing.T) int {
	t.Helper()
	st, err := h.store.Capacity(context.Background())
	if err != nil {
		t.Fatalf("Capacity: %v", err)
	}
	return st.Paused
}

func TestIdleWarmSandboxIsPausedThenResumedByItsThread(t *testing.T) {
	h := newPauseHarness(t, nil)
	rec := h.park(t, "t1")
	h.clock.advance(299 * time.Second)
	if st := h.reconcile(t); st.Paused != 0 || h.prov.Paused(rec.SandboxID) {
		t.Fatalf("before SANDBOX_PAUSE_AFTER_SECONDS: paused %d (provider %v), want none", st.Paused, h.prov.Paused(rec.SandboxID))
	}
	syncs := h.sync.count(rec.SandboxID)
	h.clock.advance(2 * time.Second)
	if st := h.reconcile(t); st.Paused != 1 {
		t.Fatalf("reconcile paused %d, want 1 (stats %+v)", st.Paused, st)
	}
	if !h.prov.Paused(rec.SandboxID) || h.state(t, rec.SandboxID).State != core.StatePaused {
		t.Fatalf("after the pass: provider paused %v, record %s; want paused both", h.prov.Paused(rec.SandboxID), h.state(t, rec.SandboxID).State)
	}
	if h.sync.count(rec.SandboxID) != syncs+1 {
		t.Errorf("sync passes before the pause = %d, want 1 (outputs copied while it can be read)", h.sync.count(rec.SandboxID)-syncs)
	}
	if c := h.capacity(t); c.Used != 0 || c.Paused != 1 || c.PausedLimit != 30 || c.Warm != 0 {
		t.Errorf("capacity while paused = %+v, want used 0, paused 1 of 30, warm 0", c)
	}
	h.clock.advance(time.Hour) // past the idle timeout: a paused sandbox is not a warm one about to expire
	if st := h.reconcile(t); st.Expired != 0 || st.PausedExpired != 0 || !h.prov.Paused(rec.SandboxID) {
		t.Fatalf("an hour later: expired %d, paused expired %d, provider paused %v; want it kept paused", st.Expired, st.PausedExpired, h.prov.Paused(rec.SandboxID))
	}
	if n := h.prov.Count("resume"); n != 0 {
		t.Errorf("reconcile resumed %d times, want never", n)
	}
	got := h.acquire(t, key("t1"), core.SourceResumed)
	if got.SandboxID != rec.SandboxID || h.prov.Paused(rec.SandboxID) {
		t.Errorf("resumed %s (provider paused %v), want %s running", got.SandboxID, h.prov.Paused(rec.SandboxID), rec.SandboxID)
	}
	if want := h.clock.now().Add(time.Hour); got.ExpiresAt.Before(want.Add(-time.Minute)) || h.prov.Timeout(rec.SandboxID) != time.Hour+core.TimerMargin {
		t.Errorf("resumed expires %s with provider timeout %s, want about %s (the active timeout)", got.ExpiresAt, h.prov.Timeout(rec.SandboxID), want)
	}
	if stored := h.state(t, rec.SandboxID); stored.State != core.StateActive || stored.PausedFor < time.Hour {
		t.Errorf("record after resume = %s, paused for %s; want active, at least 1h paused", stored.State, stored.PausedFor)
	}
	if c := h.capacity(t); c.Used != 1 || c.Paused != 0 || c.Active != 1 {
		t.Errorf("capacity after resume = %+v, want used 1, active 1, paused 0", c)
	}
	h.acquire(t, key("t1"), core.SourceReused)
}

func TestPauseAtReleaseAndNever(t *testing.T) {
	tests := []struct {
		name       string
		pausable   bool
		pauseAfter time.Duration
		want       string
	}{
		{"at release", true, 0, "paused"},
		{"never", true, core.PauseNever, "warm"},
		{"provider cannot pause", false, 0, "warm"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prov := coretest.NewFakeProvider()
			prov.Pausable = tc.pausable
			h := newHarnessWith(t, prov, func(s *core.Settings) { s.PauseAfter = tc.pauseAfter })
			rec := h.acquire(t, key("t1"), core.SourceCreated)
			res, err := h.eng.Release(context.Background(), "acme", rec.SandboxID)
			if err != nil || res.State != tc.want {
				t.Fatalf("Release = %+v, %v; want state %s", res, err, tc.want)
			}
			h.clock.advance(24 * time.Hour)
			h.reconcile(t)
			if got := h.prov.Paused(rec.SandboxID); got != (tc.want == "paused") {
				t.Errorf("provider paused = %v after a day, want %v", got, tc.want == "paused")
			}
		})
	}
}

// TestAReleasePausedAtReleaseIsDoneOnce: a release that paused its
// sandbox, sent again (its answer lost), answers paused and changes
// nothing; the thread's next acquire resumes the sandbox.
func TestAReleasePausedAtReleaseIsDoneOnce(t *testing.T) {
	h := newPauseHarness(t, func(s *core.Settings) { s.PauseAfter = 0 })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	for i := range 2 {
		res, err := h.eng.Release(ctx, "acme", rec.SandboxID)
		if err != nil || res.State != "paused" {
			t.Fatalf("Release #%d = %+v, %v; want paused", i+1, res, err)
		}
	}
	if n := h.prov.Count("pause"); n != 1 {
		t.Errorf("provider pauses = %d, want 1", n)
	}
	if got := h.state(t, rec.SandboxID); got.State != core.StatePaused || got.LeaseOwner != "" {
		t.Errorf("record = %s (lease %q), want paused with no lease", got.State, got.LeaseOwner)
	}
	h.acquire(t, key("t1"), core.SourceResumed)
}

func TestActiveSandboxIsNeverPaused(t *testing.T) {
	h := newPauseHarness(t, func(s *core.Settings) { s.PauseAfter = 0 })
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(10 * time.Minute)
	if st := h.reconcile(t); st.Paused != 0 || h.prov.Count("pause") != 0 {
		t.Fatalf("reconcile paused %d (provider calls %d), want an active sandbox left alone", st.Paused, h.prov.Count("pause"))
	}
	if h.state(t, rec.SandboxID).State != core.StateActive {
		t.Errorf("record = %s, want active", h.state(t, rec.SandboxID).State)
	}
}

// pauseThread parks a sandbox for thread and pauses it through reconcile.
func (h *harness) pauseThread(t *testing.T, thread string) core.Record {
	t.Helper()
	rec := h.park(t, thread)
	h.clock.advance(301 * time.Second) // SANDBOX_PAUSE_AFTER_SECONDS's default, and a second
	h.reconcile(t)
	if !h.prov.Paused(rec.SandboxID) {
		t.Fatalf("%s not paused", rec.SandboxID)
	}
	return rec
}

func TestFailedResumeGivesTheThreadAFreshSandbox(t *testing.T) {
	ambiguous := &core.ProviderError{Op: "connect", StatusCode: 504, Ambiguous: true, Message: "timeout"}
	tests := []struct {
		name  string
		fault func(p *coretest.FakeProvider, id string)
	}{
		{"gone", func(p *coretest.FakeProvider, id string) { p.ResumeErr = core.ErrSandboxGone }},
		{"error", func(p *coretest.FakeProvider, _ string) { p.ResumeErr = ambiguous }},
		{"applied, reply lost", func(p *coretest.FakeProvider, _ string) { p.ResumeErr, p.ResumeApplies = ambiguous, true }},
		{"refused", func(p *coretest.FakeProvider, _ string) {
			p.ResumeErr = &core.ProviderError{Op: "connect", StatusCode: 409, Message: "cannot resume"}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newPauseHarness(t, nil)
			rec := h.pauseThread(t, "t1")
			h.prov.Set(func(p *coretest.FakeProvider) { tc.fault(p, rec.SandboxID) })
			res, err := h.eng.Acquire(context.Background(), key("t1"))
			if err != nil || res.Source != core.SourceCreated || res.Record.SandboxID == rec.SandboxID {
				t.Fatalf("Acquire = %s %s, %v; want a fresh sandbox, created", res.Source, res.Record.SandboxID, err)
			}
			if h.prov.Alive(rec.SandboxID) {
				t.Errorf("the paused sandbox %s still exists, want it discarded", rec.SandboxID)
			}
			if c := h.capacity(t); c.Used != 1 || c.Paused != 0 || h.pausedSlots(t) != 0 {
				t.Errorf("capacity = %+v, want used 1 and no paused slot", c)
			}
		})
	}
}

func TestResumeTakesARunningSlotLikeACreate(t *testing.T) {
	h := newPauseHarness(t, func(s *core.Settings) { s.Replicas, s.Policy = 1, core.PolicyReject })
	paused := h.pauseThread(t, "t1")
	other := h.acquire(t, key("t2"), core.SourceCreated) // the one running slot, active
	var ce *core.CapacityError
	if _, err := h.eng.Acquire(context.Background(), key("t1")); !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
		t.Fatalf("resume with every running slot active = %v, want a capacity refusal", err)
	}
	if !h.prov.Paused(paused.SandboxID) || h.state(t, paused.SandboxID).State != core.StatePaused {
		t.Fatalf("after the refusal the sandbox is not left paused")
	}
	if _, err := h.eng.Release(context.Background(), "acme", other.SandboxID); err != nil {
		t.Fatal(err)
	}
	got := h.acquire(t, key("t1"), core.SourceResumed) // evicts t2's warm sandbox, as a create would
	if got.SandboxID != paused.SandboxID || h.prov.Alive(other.SandboxID) {
		t.Errorf("resumed %s, t2's warm sandbox alive %v; want %s resumed and t2's evicted", got.SandboxID, h.prov.Alive(other.SandboxID), paused.SandboxID)
	}
	if c := h.capacity(t); c.Used != 1 || c.Paused != 0 {
		t.Errorf("capacity = %+v, want used 1, paused 0", c)
	}
}

func TestFullPausedSlotsEvictTheLeastRecentlyPaused(t *testing.T) {
	h := newPauseHarness(t, func(s *core.Settings) { s.MaxPaused = 2 })
	first := h.pauseThread(t, "t1")
	second := h.pauseThread(t, "t2")
	third := h.pauseThread(t, "t3")
	if h.prov.Alive(first.SandboxID) || !h.prov.Paused(second.SandboxID) || !h.prov.Paused(third.SandboxID) {
		t.Errorf("alive t1 %v, paused t2 %v t3 %v; want t1's (least recently paused) destroyed, t2 and t3 paused",
			h.prov.Alive(first.SandboxID), h.prov.Paused(second.SandboxID), h.prov.Paused(third.SandboxID))
	}
	if c := h.capacity(t); c.Paused != 2 || c.Used != 0 {
		t.Errorf("capacity = %+v, want 2 paused, none running", c)
	}
	h.acquire(t, key("t1"), core.SourceCreated)
}

func TestPausedSandboxesExpireAfterTheirTTLAndWhileDraining(t *testing.T) {
	h := newPauseHarness(t, func(s *core.Settings) { s.PausedTTL = 24 * time.Hour })
	old := h.pauseThread(t, "t1")
	h.clock.advance(12 * time.Hour)
	young := h.pauseThread(t, "t2")
	h.clock.advance(12 * time.Hour)
	if st := h.reconcile(t); st.PausedExpired != 1 || h.prov.Alive(old.SandboxID) || !h.prov.Paused(young.SandboxID) {
		t.Fatalf("paused expired %d, old alive %v, young paused %v; want the old one destroyed only", st.PausedExpired, h.prov.Alive(old.SandboxID), h.prov.Paused(young.SandboxID))
	}
	if err := h.eng.SetDraining(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if st := h.reconcile(t); st.PausedExpired != 1 || h.prov.Alive(young.SandboxID) {
		t.Fatalf("draining: paused expired %d, young alive %v; want every paused sandbox destroyed", st.PausedExpired, h.prov.Alive(young.SandboxID))
	}
	if c := h.capacity(t); c.Paused != 0 || c.Used != 0 || c.Tombstones != 0 {
		t.Errorf("capacity = %+v, want nothing held", c)
	}
}

func TestInterruptedPauseIsFinished(t *testing.T) {
	t.Parallel()
	ambiguous := &core.ProviderError{Op: "pause", StatusCode: 502, Ambiguous: true, Message: "bad gateway"}
	tests := []struct {
		name    string
		applies bool
		// next finishes the pause: reconcile pauses, an acquire resumes.
		byAcquire bool
	}{
		{"lost reply, reconcile finishes", true, false},
		{"failed, reconcile finishes", false, false},
		{"lost reply, acquire resumes", true, true},
		{"failed, acquire resumes", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newPauseHarness(t, nil)
			rec := h.park(t, "t1")
			h.prov.Set(func(p *coretest.FakeProvider) { p.PauseErr, p.PauseApplies = ambiguous, tc.applies })
			h.clock.advance(301 * time.Second)
			if st := h.reconcile(t); st.Paused != 0 || st.Deferred == 0 {
				t.Fatalf("pass with a failing pause: paused %d deferred %d, want 0 and a deferral", st.Paused, st.Deferred)
			}
			if got := h.state(t, rec.SandboxID); got.State != core.StatePausing || got.Slots != (core.Slots{Paused: true, PausedRef: got.Slots.PausedRef, TenantPaused: true}) {
				t.Fatalf("record = %s %+v, want pausing holding both slots, counted for its tenant", got.State, got.Slots)
			}
			h.prov.Set(func(p *coretest.FakeProvider) { p.PauseErr = nil })
			if c := h.capacity(t); c.Used != 1 || c.Paused != 1 {
				t.Errorf("capacity while pausing = %+v, want one running and one paused slot", c)
			}
			// A peer's live lease is waited out, not broken. The wait is
			// bounded by the acquire timeout (on the engine's clock), not
			// by a context deadline: a deadline cuts whatever store call
			// is in flight when it comes, which on a loaded machine may be
			// any of them, and the acquire then answers that call's error.
			short := newHarnessEngine(t, h, func(s *core.Settings) { s.AcquireTimeout = time.Second })
			_, err := short.Acquire(context.Background(), key("t1"))
			if !errors.Is(err, core.ErrLeaseHeld) {
				t.Fatalf("acquire during the pausing lease = %v, want ErrLeaseHeld", err)
			}
			h.clock.advance(3 * time.Minute) // the lease lapses
			if tc.byAcquire {
				got := h.acquire(t, key("t1"), core.SourceResumed)
				if got.SandboxID != rec.SandboxID || h.prov.Paused(rec.SandboxID) {
					t.Errorf("acquire took %s (paused %v), want %s resumed", got.SandboxID, h.prov.Paused(rec.SandboxID), rec.SandboxID)
				}
				if c := h.capacity(t); c.Used != 1 || c.Paused != 0 {
					t.Errorf("capacity = %+v, want one running slot", c)
				}
				return
			}
			if st := h.reconcile(t); st.PausesFinished != 1 {
				t.Fatalf("pauses finished = %d, want 1", st.PausesFinished)
			}
			if !h.prov.Paused(rec.SandboxID) || h.state(t, rec.SandboxID).State != core.StatePaused {
				t.Errorf("after the pass: provider paused %v, record %s; want paused", h.prov.Paused(rec.SandboxID), h.state(t, rec.SandboxID).State)
			}
			if c := h.capacity(t); c.Used != 0 || c.Paused != 1 {
				t.Errorf("capacity = %+v, want one paused slot only", c)
			}
		})
	}
}

func TestRefusedPauseKeepsTheSandboxWarm(t *testing.T) {
	h := newPauseHarness(t, nil)
	rec := h.park(t, "t1")
	h.prov.Set(func(p *coretest.FakeProvider) {
		p.PauseErr = &core.ProviderError{Op: "pause", StatusCode: 409, Message: "cannot pause"}
	})
	h.clock.advance(301 * time.Second)
	h.reconcile(t)
	if got := h.state(t, rec.SandboxID); got.State != core.StateWarm || got.Slots != (core.Slots{}) || h.prov.Paused(rec.SandboxID) {
		t.Fatalf("record = %s %+v (provider paused %v), want warm with its running slot only", got.State, got.Slots, h.prov.Paused(rec.SandboxID))
	}
	if c := h.capacity(t); c.Used != 1 || c.Paused != 0 {
		t.Errorf("capacity = %+v, want the running slot only", c)
	}
	h.acquire(t, key("t1"), core.SourceReclaimed)
}

func TestIncompleteCopyIsNotPaused(t *testing.T) {
	h := newPauseHarness(t, nil)
	rec := h.park(t, "t1")
	h.sync.set(func(s *fakeSyncer) { s.incomplete = true })
	h.clock.advance(301 * time.Second)
	if st := h.reconcile(t); st.Paused != 0 || h.prov.Paused(rec.SandboxID) || h.state(t, rec.SandboxID).State != core.StateWarm {
		t.Fatalf("paused %d; want a sandbox whose outputs are not all in S3 kept warm", st.Paused)
	}
	if h.pausedSlots(t) != 0 {
		t.Errorf("paused slots = %d, want the claimed one given back", h.pausedSlots(t))
	}
}

func TestReconcileAdoptsAnUntrackedPausedSandboxPaused(t *testing.T) {
	h := newPauseHarness(t, nil)
	ctx := context.Background()
	// A sandbox of the thread the store does not know (a create whose
	// invocation died before recording it), paused since.
	k := key("t1")
	ref, err := h.prov.Create(ctx, core.CreateSpec{Metadata: map[string]string{core.MetaTenant: k.Tenant, core.MetaUser: k.User,
		core.MetaThread: k.Thread, core.MetaDeployment: "test", core.MetaCreatedAt: h.clock.now().UTC().Format(time.RFC3339)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.prov.Pause(ctx, ref.ID); err != nil {
		t.Fatal(err)
	}
	st := h.reconcile(t)
	if st.Adopted != 1 {
		t.Fatalf("adopted %d, want the paused sandbox adopted (stats %+v)", st.Adopted, st)
	}
	if got := h.state(t, ref.ID); got.State != core.StatePaused || got.Slots != (core.Slots{NoRunning: true, Paused: true, PausedRef: got.Slots.PausedRef, TenantPaused: true}) {
		t.Errorf("adopted record = %s %+v, want paused holding a paused slot", got.State, got.Slots)
	}
	if c := h.capacity(t); c.Used != 0 || c.Paused != 1 {
		t.Errorf("capacity = %+v, want one paused slot", c)
	}
	if h.prov.Count("resume") > 0 || h.prov.Count("timeout") > 0 {
		t.Errorf("reconcile resumed or extended the paused sandbox")
	}
	got := h.acquire(t, k, core.SourceResumed)
	if got.SandboxID != ref.ID {
		t.Errorf("resumed %s, want the adopted %s", got.SandboxID, ref.ID)
	}
}

// TestPauseAndResumeAreMeteredAndPublished: the pause and the resume are
// lifecycle events, the time in between is metered as paused
// (SandboxPausedSeconds) and reported in the events' paused seconds, and
// the sandbox's intervals still tile its life.
func TestPauseAndResumeAreMeteredAndPublished(t *testing.T) {
	var logs bytes.Buffer
	events := &eventLog{}
	h := newPauseHarness(t, nil, core.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))), core.WithEventSink(events))
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.clock.advance(17 * time.Second)
	if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); err != nil {
		t.Fatal(err)
	}
	h.clock.advance(301 * time.Second)
	h.reconcile(t)
	h.clock.advance(time.Hour)
	h.acquire(t, key("t1"), core.SourceResumed)
	h.clock.advance(10 * time.Second)
	if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); err != nil {
		t.Fatal(err)
	}
	h.clock.advance(31 * time.Minute) // idle expiry comes before a second pause
	if st := h.reconcile(t); st.Expired != 1 {
		t.Fatalf("expired %d, want 1", st.Expired)
	}
	want := []string{
		"created creating->active ",
		"released active->warm ",
		"paused warm->paused ",
		"resumed paused->active ",
		"released active->warm ",
		"destroyed warm->gone idle_expired",
	}
	if got := events.seen(rec.SandboxID); !sameList(got, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The harness clock is real time shifted: the test's own run time
	// (seconds on a loaded machine) adds to the hour it advanced.
	const slip = 60.0
	resumed := false
	for _, ev := range events.all() {
		resumed = resumed || ev.Kind == core.EventResumed
		want := 0.0 // until the resume; from it on, the hour it was paused
		if resumed {
			want = time.Hour.Seconds()
		}
		if ev.PausedSeconds < want || ev.PausedSeconds > want+slip {
			t.Errorf("%s event: paused %.1f s, want %.0f s", ev.Kind, ev.PausedSeconds, want)
		}
	}
	lines := usageLines(t, logs.Bytes())
	meteredLife(t, lines)
	paused := 0.0
	for _, l := range lines {
		if l.Paused != nil {
			if l.State != string(core.StatePaused) {
				t.Errorf("paused seconds metered in state %s, want paused only", l.State)
			}
			paused += *l.Paused
		}
	}
	if paused < time.Hour.Seconds() || paused > time.Hour.Seconds()+slip {
		t.Errorf("metered paused seconds = %.1f, want the hour it was paused", paused)
	}
}

// TestReconcileKillsPausedDuplicatesAndOrphans: among paused sandboxes a
// thread's second one is a duplicate and one naming no valid thread an
// orphan, as among running ones; the thread's own stays paused, untouched.
func TestReconcileKillsPausedDuplicatesAndOrphans(t *testing.T) {
	h := newPauseHarness(t, nil)
	ctx := context.Background()
	canonical := h.pauseThread(t, "t1")
	k := key("t1")
	pausedAtProvider := func(md map[string]string) string {
		md[core.MetaDeployment] = "test"
		md[core.MetaCreatedAt] = h.clock.now().UTC().Format(time.RFC3339)
		ref, err := h.prov.Create(ctx, core.CreateSpec{Metadata: md})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.prov.Pause(ctx, ref.ID); err != nil {
			t.Fatal(err)
		}
		return ref.ID
	}
	dup := pausedAtProvider(map[string]string{core.MetaTenant: k.Tenant, core.MetaUser: k.User, core.MetaThread: k.Thread})
	orphan := pausedAtProvider(map[string]string{core.MetaTenant: "acme", core.MetaUser: "no such user!"})
	h.reconcile(t) // first sightings
	h.clock.advance(2 * time.Hour)
	h.reconcile(t)
	if h.prov.Alive(dup) || h.prov.Alive(orphan) {
		t.Errorf("after the grace and the orphan TTL: duplicate alive %v, orphan alive %v; want both killed", h.prov.Alive(dup), h.prov.Alive(orphan))
	}
	if !h.prov.Paused(canonical.SandboxID) || h.state(t, canonical.SandboxID).State != core.StatePaused {
		t.Errorf("the thread's own paused sandbox was not left paused")
	}
	if c := h.capacity(t); c.Used != 0 || c.Paused != 1 || c.Tombstones != 0 {
		t.Errorf("capacity = %+v, want the one paused slot of the thread's sandbox", c)
	}
	if h.prov.Count("resume") > 0 {
		t.Errorf("reconcile resumed a paused sandbox")
	}
}

// TestResumeLeftByADeadInvocationIsFinished: an acquire that died right
// after its resume claim leaves the record resuming, holding both slots;
// once the lease lapses the thread's next acquire resumes it, or
// reconcile pauses it again.
func TestResumeLeftByADeadInvocationIsFinished(t *testing.T) {
	for _, byAcquire := range []bool{true, false} {
		t.Run(map[bool]string{true: "acquire resumes", false: "reconcile pauses"}[byAcquire], func(t *testing.T) {
			h := newPauseHarness(t, nil)
			rec := h.pauseThread(t, "t1")
			now := h.clock.now()
			if _, err := h.store.ClaimResume(context.Background(), core.ResumeClaim{Claim: core.Claim{SandboxID: rec.SandboxID,
				Tenant: "acme", Owner: "dead-invocation", Now: now, LeaseUntil: now.Add(time.Minute)}, Key: key("t1"), Limit: 3}); err != nil {
				t.Fatalf("ClaimResume: %v", err)
			}
			if c := h.capacity(t); c.Used != 1 || c.Paused != 1 {
				t.Fatalf("capacity while resuming = %+v, want a running and a paused slot", c)
			}
			h.clock.advance(2 * time.Minute)
			if byAcquire {
				got := h.acquire(t, key("t1"), core.SourceResumed)
				if got.SandboxID != rec.SandboxID || h.prov.Paused(rec.SandboxID) {
					t.Errorf("acquire got %s (paused %v), want %s resumed", got.SandboxID, h.prov.Paused(rec.SandboxID), rec.SandboxID)
				}
				if c := h.capacity(t); c.Used != 1 || c.Paused != 0 {
					t.Errorf("capacity = %+v, want the running slot only", c)
				}
				return
			}
			if st := h.reconcile(t); st.PausesFinished != 1 {
				t.Fatalf("pauses finished = %d, want 1", st.PausesFinished)
			}
			if got := h.state(t, rec.SandboxID); got.State != core.StatePaused || !h.prov.Paused(rec.SandboxID) {
				t.Errorf("record %s (provider paused %v), want paused", got.State, h.prov.Paused(rec.SandboxID))
			}
			if c := h.capacity(t); c.Used != 0 || c.Paused != 1 {
				t.Errorf("capacity = %+v, want the paused slot only", c)
			}
		})
	}
}

// TestReconcileRepairsThePausedSlotCount: a paused bucket whose count
// drifted from the records holding its paused slots is set back by
// reconcile once two passes saw the same count and the same records.
func TestReconcileRepairsThePausedSlotCount(t *testing.T) {
	t.Parallel()
	prov := coretest.NewFakeProvider()
	prov.Pausable = true
	h := newDDBHarnessWith(t, prov, nil) // it corrupts a DynamoDB item
	rec := h.pauseThread(t, "t1")
	pk := "PAU#test"
	if b := h.state(t, rec.SandboxID).Slots.PausedRef; b > 0 {
		pk += fmt.Sprint("#", b)
	}
	if _, err := h.db.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{TableName: &h.table,
		Key:                       map[string]types.AttributeValue{ddbstore.AttrPK: &types.AttributeValueMemberS{Value: pk}, ddbstore.AttrSK: &types.AttributeValueMemberS{Value: "R"}},
		UpdateExpression:          aws.String("ADD used :n, revision :one"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "4"}, ":one": &types.AttributeValueMemberN{Value: "1"}}}); err != nil {
		t.Fatalf("drift %s: %v", pk, err) // as a bug would leave it
	}
	h.reconcile(t)
	if n := h.pausedSlots(t); n != 5 {
		t.Fatalf("after one pass the paused count is %d, want 5 kept (one sighting is not enough)", n)
	}
	h.reconcile(t)
	if n := h.pausedSlots(t); n != 1 {
		t.Errorf("after two passes the paused count is %d, want 1 (the one paused sandbox)", n)
	}
}

// TestResumeWaitsForARunningSlot: under the wait policy a resume that
// finds every running slot held waits as a create would, and resumes once
// a slot frees (here: the holder's release, which it then evicts).
func TestResumeWaitsForARunningSlot(t *testing.T) {
	var h *harness
	var holder core.Record
	var once sync.Once
	released := make(chan error, 1)
	sleep := func(ctx context.Context, d time.Duration) error {
		// The resume is waiting: the holder releases its sandbox now.
		once.Do(func() {
			_, err := h.eng.Release(context.Background(), "acme", holder.SandboxID)
			released <- err
		})
		return ctx.Err()
	}
	h = newPauseHarness(t, func(s *core.Settings) { s.Replicas, s.Policy = 1, core.PolicyWait }, core.WithSleep(sleep))
	paused := h.pauseThread(t, "t1")
	holder = h.acquire(t, key("t2"), core.SourceCreated)
	got := h.acquire(t, key("t1"), core.SourceResumed)
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("release during the wait: %v", err)
		}
	default:
		t.Fatal("the resume did not wait: the slot was never held")
	}
	if got.SandboxID != paused.SandboxID || h.prov.Alive(holder.SandboxID) {
		t.Errorf("resumed %s (holder alive %v), want %s resumed and the released holder evicted", got.SandboxID, h.prov.Alive(holder.SandboxID), paused.SandboxID)
	}
}

// A pause copies the outputs while the record is still warm: were the
// invocation to die during the copy, nothing would be left pausing (a
// later pass finishes a pausing record by pausing it, its copy unknown),
// and no paused slot is held.
func TestPauseCopiesTheOutputsBeforeItClaimsThePause(t *testing.T) {
	h := newPauseHarness(t, nil)
	rec := h.park(t, "t1")
	var during core.Record
	var duringErr error
	var pausedDuring int
	h.sync.set(func(s *fakeSyncer) {
		s.hook = func() {
			during, duringErr = h.store.Get(context.Background(), rec.SandboxID)
			st, _ := h.store.Capacity(context.Background())
			pausedDuring = st.Paused
		}
	})
	h.clock.advance(301 * time.Second)
	if st := h.reconcile(t); st.Paused != 1 {
		t.Fatalf("paused %d, want 1", st.Paused)
	}
	if duringErr != nil || during.State != core.StateWarm || pausedDuring != 0 {
		t.Errorf("during the copy: record %s (err %v) with %d paused slots held; want warm with none", during.State, duringErr, pausedDuring)
	}
}

// A copy that fails clears the lease it was made under: the thread's
// acquire reclaims the sandbox at once instead of waiting for the lease.
func TestFailedCopyBeforePauseLeavesTheSandboxReclaimable(t *testing.T) {
	h := newPauseHarness(t, nil)
	rec := h.park(t, "t1")
	h.sync.set(func(s *fakeSyncer) { s.err = errors.New("copy failed") })
	h.clock.advance(301 * time.Second)
	h.reconcile(t)
	if got := h.state(t, rec.SandboxID); got.State != core.StateWarm || got.LeaseOwner != "" {
		t.Fatalf("record = %s leased by %q, want warm without a lease", got.State, got.LeaseOwner)
	}
}

// TestDestroyedFromPausedCountsThePauseAsPaused: a paused sandbox that is
// evicted (another pause needs its paused slot) or expires (PausedTTL)
// is destroyed without being resumed: its evicted and destroyed events
// count the pause it was in as paused time, not running time.
func TestDestroyedFromPausedCountsThePauseAsPaused(t *testing.T) {
	const pausedFor = time.Hour
	for _, tc := range []struct {
		name   string
		mutate func(*core.Settings)
		act    func(t *testing.T, h *harness)
		want   []string
	}{
		{"evicted", func(s *core.Settings) { s.Replicas, s.MaxPaused = 2, 1 }, func(t *testing.T, h *harness) {
			h.pauseThread(t, "t2") // needs t1's paused slot
		}, []string{"evicted paused->destroying capacity", "destroyed paused->gone capacity"}},
		{"expired", func(s *core.Settings) { s.PausedTTL = pausedFor }, func(t *testing.T, h *harness) {
			h.clock.advance(time.Second)
			if st := h.reconcile(t); st.PausedExpired != 1 {
				t.Fatalf("paused expired %d, want 1", st.PausedExpired)
			}
		}, []string{"destroyed paused->gone idle_expired"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := &eventLog{}
			h := newPauseHarness(t, tc.mutate, core.WithEventSink(events))
			rec := h.pauseThread(t, "t1")
			h.clock.advance(pausedFor)
			tc.act(t, h)
			var got []string
			for _, ev := range events.all() {
				if ev.SandboxID != rec.SandboxID || (ev.Kind != core.EventEvicted && ev.Kind != core.EventDestroyed) {
					continue
				}
				got = append(got, string(ev.Kind)+" "+string(ev.From)+"->"+string(ev.To)+" "+ev.Reason)
				if ev.PausedSeconds < pausedFor.Seconds() {
					t.Errorf("%s event: paused %.1f s (running %.1f s), want at least the %v it was paused", ev.Kind, ev.PausedSeconds, ev.RunningSeconds, pausedFor)
				}
			}
			if !sameEvents(got, tc.want) { // one operation's events, published concurrently
				t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestEvictionTakesAWarmSandboxWhosePauseWasRefused: under pause at
// release a sandbox is never warm while its release pauses it (the
// release claims it from releasing straight into pausing), so a warm one
// is one whose pause was refused, and a full deployment's acquire evicts
// it at once, as when sandboxes pause only after an idle time.
func TestEvictionTakesAWarmSandboxWhosePauseWasRefused(t *testing.T) {
	tests := []struct {
		name       string
		pauseAfter time.Duration
	}{
		{"pause at release", 0},
		{"pause when idle", 300 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newPauseHarness(t, func(s *core.Settings) {
				s.Replicas, s.Policy, s.PauseAfter = 1, core.PolicyReject, tc.pauseAfter
			})
			h.prov.Set(func(p *coretest.FakeProvider) {
				p.PauseErr = &core.ProviderError{Op: "pause", StatusCode: 409, Message: "cannot pause"}
			})
			rec := h.park(t, "t1") // its pause refused: it stays warm
			if _, err := h.eng.Acquire(context.Background(), key("t2")); err != nil {
				t.Fatalf("Acquire(t2) = %v, want t1's warm sandbox evicted for it", err)
			}
			if got := h.state(t, rec.SandboxID).State; got == core.StateWarm {
				t.Errorf("t1's sandbox is %s, want it evicted", got)
			}
		})
	}
}
