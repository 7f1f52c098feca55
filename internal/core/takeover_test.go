package core_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/httpapi"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// stallProvider wraps the fake: the calls named in stalls ("create", or
// "run <sandbox id>") block until their ctx ends, as a provider or a
// daemon that stopped answering.
type stallProvider struct {
	*coretest.FakeProvider
	mu     sync.Mutex
	stalls map[string]bool
}

func (p *stallProvider) stall(op string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalls[op] = on
}

func (p *stallProvider) wait(ctx context.Context, op string) error {
	p.mu.Lock()
	on := p.stalls[op]
	p.mu.Unlock()
	if !on {
		return nil
	}
	<-ctx.Done()
	return &core.ProviderError{Op: op, Message: ctx.Err().Error(), Ambiguous: true}
}

func (p *stallProvider) Create(ctx context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	if err := p.wait(ctx, "create"); err != nil {
		return core.SandboxRef{}, err
	}
	return p.FakeProvider.Create(ctx, spec)
}

func (p *stallProvider) Run(ctx context.Context, ref core.SandboxRef, cmd core.Command) (core.CommandResult, error) {
	if err := p.wait(ctx, "run "+ref.ID); err != nil {
		return core.CommandResult{}, err
	}
	return p.FakeProvider.Run(ctx, ref, cmd)
}

// newStallHarness is newHarness over a stallProvider.
func newStallHarness(t *testing.T, mutate func(*core.Settings)) (*harness, *stallProvider) {
	t.Helper()
	client := testenv.DynamoClient(t)
	table := freshTable(t, client, "takeover")
	s := core.DefaultSettings()
	s.Deployment = "test"
	s.AcquireTimeout = 5 * time.Second
	if mutate != nil {
		mutate(&s)
	}
	fake := coretest.NewFakeProvider()
	sp := &stallProvider{FakeProvider: fake, stalls: map[string]bool{}}
	h := &harness{store: ddbstore.New(client, table, s.Deployment), prov: fake, sync: &fakeSyncer{}, clock: &clock{}}
	rs := core.DefaultReconcileSettings()
	rs.Grace = 0
	eng, err := core.New(s, h.store, sp, h.sync, core.WithClock(h.clock.now), core.WithReconcileSettings(rs),
		core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	h.eng = eng
	return h, sp
}

// invocation is a ctx with a Lambda-like deadline.
func invocation(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A sandbox that stopped answering (its processes stopped) is never handed
// out again: reuse and reclaim probe it under a short timeout, discard it
// and give the thread a fresh one inside the invocation's time.
func TestWedgedSandboxIsDiscardedNotHandedOut(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		release bool
		want    core.Source
	}{
		{"reuse of an active sandbox", false, core.SourceCreated},
		{"reclaim of a warm sandbox", true, core.SourceCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, sp := newStallHarness(t, nil)
			old := h.acquire(t, key("t1"), core.SourceCreated)
			if tc.release {
				if _, err := h.eng.Release(context.Background(), "acme", old.SandboxID); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
			synced := h.sync.count(old.SandboxID)
			sp.stall("run "+old.SandboxID, true)
			ctx := invocation(t, 29*time.Second)
			res, err := h.eng.Acquire(ctx, key("t1"))
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if res.Record.SandboxID == old.SandboxID || res.Source != tc.want {
				t.Errorf("got %s (%s), want a fresh sandbox (%s), not the wedged %s", res.Record.SandboxID, res.Source, tc.want, old.SandboxID)
			}
			if dl, _ := ctx.Deadline(); time.Now().After(dl) {
				t.Errorf("acquire answered after its deadline")
			}
			// An active sandbox was never released: its outputs are copied
			// (as far as it still answers) before it is discarded. A warm
			// one was synced by its release, and is not synced again.
			wantSalvage := 0
			if !tc.release {
				wantSalvage = 1
			}
			if got := h.sync.count(old.SandboxID) - synced; got != wantSalvage {
				t.Errorf("sync passes of the wedged sandbox during acquire = %d, want %d", got, wantSalvage)
			}
			if got, err := h.store.Get(context.Background(), old.SandboxID); err != nil || got.State != core.StateGone {
				t.Errorf("wedged record = %s, %v; want gone (discarded under its destroy claim)", got.State, err)
			}
			if st := h.capacity(t); st.Used != 1 {
				t.Errorf("used = %d, want 1", st.Used)
			}
		})
	}
}

// A stalled provider: the acquire answers 503 retryable before its
// deadline, and the reservation it leaves is settled by reconcile.
func TestStalledProviderAnswers503BeforeDeadlineAndReconcileSettles(t *testing.T) {
	t.Parallel()
	h, sp := newStallHarness(t, nil)
	sp.stall("create", true)
	handler := httpapi.NewHandler(h.eng, slog.New(slog.DiscardHandler))
	ctx := invocation(t, 8*time.Second)
	dl, _ := ctx.Deadline()
	resp, _ := handler(ctx, events.APIGatewayV2HTTPRequest{
		RouteKey: httpapi.RouteAcquire, Body: `{"user_id":"alice","thread_id":"t1"}`,
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			Authorizer: &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{Lambda: map[string]any{"tenant": "acme"}}},
	})
	if answered := time.Now(); answered.After(dl) {
		t.Errorf("answered %s after the deadline", answered.Sub(dl))
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Headers["Retry-After"] == "" {
		t.Fatalf("got %d %s (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Body, resp.Headers["Retry-After"])
	}
	sp.stall("create", false)
	// The reservation is kept (the create may have applied) until its
	// lease lapses; then two passes settle it.
	h.clock.advance(core.DefaultSettings().LeaseDuration + time.Second)
	for range 2 {
		if _, err := h.eng.Reconcile(context.Background()); err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
	}
	if st := h.capacity(t); st.Used != 0 || st.Reserved != 0 || st.Transitioning != 0 {
		t.Errorf("capacity = %+v, want nothing held", st)
	}
	h.acquire(t, key("t1"), core.SourceCreated)
}

// crashRelease leaves rec as a release that died after its claim: state
// releasing under a lease of an owner that never comes back.
func crashRelease(t *testing.T, h *harness, rec core.Record) {
	t.Helper()
	now := h.clock.now()
	if _, err := h.store.Claim(context.Background(), core.Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant,
		From: []core.State{core.StateActive}, To: core.StateReleasing, Owner: "inv-dead", Now: now,
		LeaseUntil: now.Add(core.DefaultSettings().LeaseDuration)}); err != nil {
		t.Fatalf("crash release: %v", err)
	}
}

// A release whose invocation died is finished by whoever comes next once
// its lease lapsed (a retried release, an acquire of the thread, or
// reconcile), outputs synced first; retrying a finished release is
// idempotent.
func TestInterruptedReleaseIsTakenOver(t *testing.T) {
	for _, tc := range []struct {
		name string
		next func(t *testing.T, h *harness, rec core.Record) core.State
	}{
		{"retried release", func(t *testing.T, h *harness, rec core.Record) core.State {
			res, err := h.eng.Release(context.Background(), "acme", rec.SandboxID)
			if err != nil || res.State != "warm" || res.Sync == nil {
				t.Fatalf("Release = %+v, %v; want warm with a sync result", res, err)
			}
			again, err := h.eng.Release(context.Background(), "acme", rec.SandboxID)
			if err != nil || again.State != "warm" {
				t.Errorf("second Release = %+v, %v; want warm (idempotent)", again, err)
			}
			return core.StateWarm
		}},
		{"acquire of the thread", func(t *testing.T, h *harness, rec core.Record) core.State {
			got := h.acquire(t, key("t1"), core.SourceReclaimed)
			if got.SandboxID != rec.SandboxID {
				t.Errorf("acquire got %s, want %s back", got.SandboxID, rec.SandboxID)
			}
			return core.StateActive
		}},
		{"reconcile", func(t *testing.T, h *harness, rec core.Record) core.State {
			st, err := h.eng.Reconcile(context.Background())
			if err != nil || st.ReleasesTakenOver != 1 {
				t.Errorf("Reconcile = %+v, %v; want 1 release taken over", st, err)
			}
			return core.StateWarm
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := newStallHarness(t, nil)
			rec := h.acquire(t, key("t1"), core.SourceCreated)
			crashRelease(t, h, rec)
			if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); !errors.Is(err, core.ErrLeaseHeld) {
				t.Fatalf("Release during the dead release's lease = %v, want ErrLeaseHeld", err)
			}
			h.clock.advance(core.DefaultSettings().LeaseDuration + time.Second)
			passes := len(h.sync.passes)
			want := tc.next(t, h, rec)
			if len(h.sync.passes) == passes {
				t.Error("the outputs were not synced by the takeover")
			}
			if got, err := h.store.Get(context.Background(), rec.SandboxID); err != nil || got.State != want {
				t.Errorf("record = %s, %v; want %s", got.State, err, want)
			}
		})
	}
}

// Releasing a sandbox that was destroyed answers 200 "destroyed", not 409.
func TestReleaseOfDestroyedSandboxIsIdempotent(t *testing.T) {
	h, _ := newStallHarness(t, nil)
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	if err := h.eng.SetDraining(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"destroyed", "destroyed"} {
		res, err := h.eng.Release(context.Background(), "acme", rec.SandboxID)
		if err != nil || res.State != want {
			t.Errorf("release %d = %+v, %v; want %s", i+1, res, err, want)
		}
	}
}

// A full deployment frees the slots of sandboxes the provider already
// ended before refusing a new thread.
func TestDeadSlotsAreFreedBeforeRefusing(t *testing.T) {
	h, _ := newStallHarness(t, func(s *core.Settings) { s.Replicas = 1; s.Policy = core.PolicyReject })
	dead := h.acquire(t, key("t1"), core.SourceCreated)
	h.prov.Drop(dead.SandboxID) // the provider ended it at its timeout
	h.clock.advance(core.DefaultSettings().ActiveTimeout + time.Second)
	h.acquire(t, key("t2"), core.SourceCreated)
	if got, err := h.store.Get(context.Background(), dead.SandboxID); err != nil || got.State != core.StateGone {
		t.Errorf("dead record = %s, %v; want gone", got.State, err)
	}
	// A live sandbox past its recorded end (extended at the provider)
	// keeps its slot: the next thread is refused.
	h.clock.advance(core.DefaultSettings().ActiveTimeout + time.Second)
	var ce *core.CapacityError
	if _, err := h.eng.Acquire(context.Background(), key("t3")); !errors.As(err, &ce) {
		t.Errorf("Acquire(t3) = %v, want a capacity refusal", err)
	}
}

// A release whose sync pass fails outright (S3 or the sandbox unreachable)
// does not park the sandbox with its outputs unsynced: it answers
// ErrProviderUnavailable and leaves the record releasing, and reconcile
// finishes it (outputs synced first) once the lease lapsed.
func TestReleaseWithFailedSyncIsFinishedLater(t *testing.T) {
	h, _ := newStallHarness(t, nil)
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.sync.mu.Lock()
	h.sync.err = errors.New("s3: connection refused")
	h.sync.mu.Unlock()
	if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); !errors.Is(err, core.ErrProviderUnavailable) {
		t.Fatalf("Release = %v, want ErrProviderUnavailable", err)
	}
	if got, _ := h.store.Get(context.Background(), rec.SandboxID); got.State != core.StateReleasing {
		t.Fatalf("record = %s, want releasing (not parked with unsynced outputs)", got.State)
	}
	h.sync.mu.Lock()
	h.sync.err = nil
	h.sync.mu.Unlock()
	h.clock.advance(core.DefaultSettings().LeaseDuration + time.Second)
	st, err := h.eng.Reconcile(context.Background())
	if err != nil || st.ReleasesTakenOver != 1 {
		t.Errorf("Reconcile = %+v, %v; want the release taken over", st, err)
	}
	if got, _ := h.store.Get(context.Background(), rec.SandboxID); got.State != core.StateWarm {
		t.Errorf("record = %s, want warm", got.State)
	}
}
