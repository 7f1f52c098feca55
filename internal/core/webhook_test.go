package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// killedEvent is the provider's webhook that sandbox id was killed now.
func killedEvent(h *harness, eventID, id string) core.ProviderEvent {
	return core.ProviderEvent{ID: eventID, Kind: core.ProviderKilled, SandboxID: id, At: h.clock.now()}
}

// A killed webhook frees the slot of the thread's active sandbox at once,
// without a reconcile pass, names the loss, and its replay changes nothing.
func TestWebhookKilledFreesSlotOnce(t *testing.T) {
	log := &eventLog{}
	h := newHarness(t, nil, core.WithEventSink(log))
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	h.prov.Drop(rec.SandboxID) // killed behind the broker's back
	out, err := h.eng.ApplyProviderEvent(ctx, killedEvent(h, "ev1", rec.SandboxID))
	if err != nil || out != core.WebhookApplied {
		t.Fatalf("ApplyProviderEvent = %s, %v; want applied", out, err)
	}
	if used := h.capacity(t).Used; used != 0 {
		t.Errorf("used = %d after the killed webhook, want 0", used)
	}
	if got, _ := h.store.Get(ctx, rec.SandboxID); got.State != core.StateGone || got.EndReason != core.EventReasonProviderKilled {
		t.Errorf("record = %s/%q; want gone, provider_killed", got.State, got.EndReason)
	}
	if !log.has(rec.SandboxID, "lost active->gone provider_killed") {
		t.Errorf("events = %v; want lost provider_killed", log.seen(rec.SandboxID))
	}
	h.acquire(t, key("t2"), core.SourceCreated) // the slot is usable
	before := h.capacity(t)
	if _, err := h.eng.ApplyProviderEvent(ctx, killedEvent(h, "ev1", rec.SandboxID)); !errors.Is(err, core.ErrReplayed) {
		t.Errorf("replay = %v, want ErrReplayed", err)
	}
	if after := h.capacity(t); after != before {
		t.Errorf("a replay changed capacity: %+v -> %+v", before, after)
	}
}

// A webhook outside the timestamp tolerance, or about another
// deployment's sandbox, changes nothing.
func TestWebhookStaleOrUnknownChangesNothing(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	for _, at := range []time.Time{h.clock.now().Add(-6 * time.Minute), h.clock.now().Add(6 * time.Minute)} {
		ev := core.ProviderEvent{ID: "old", Kind: core.ProviderKilled, SandboxID: rec.SandboxID, At: at}
		var ve *core.ValidationError
		if _, err := h.eng.ApplyProviderEvent(ctx, ev); !errors.As(err, &ve) || ve.Field != "timestamp" {
			t.Errorf("stale webhook at %s = %v, want a timestamp ValidationError", at, err)
		}
	}
	if out, err := h.eng.ApplyProviderEvent(ctx, killedEvent(h, "ev2", "elsewhere1")); err != nil || out != core.WebhookIgnored {
		t.Errorf("unknown sandbox = %s, %v; want ignored", out, err)
	}
	if got, _ := h.store.Get(ctx, rec.SandboxID); got.State != core.StateActive || h.capacity(t).Used != 1 {
		t.Errorf("record %s, used %d; want active, 1", got.State, h.capacity(t).Used)
	}
}

// A killed webhook for a sandbox a peer holds (a release syncing) is left
// to the peer; a paused webhook records a warm sandbox paused.
func TestWebhookDeferredAndPaused(t *testing.T) {
	prov := coretest.NewFakeProvider()
	prov.Pausable = true
	h := newHarnessWith(t, prov, func(s *core.Settings) { s.PauseAfter = core.PauseNever })
	ctx := context.Background()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	held, err := h.store.Claim(ctx, core.Claim{SandboxID: rec.SandboxID, Tenant: "acme", From: []core.State{core.StateActive},
		To: core.StateReleasing, Owner: "peer", Now: h.clock.now(), LeaseUntil: h.clock.now().Add(time.Minute)})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if out, err := h.eng.ApplyProviderEvent(ctx, killedEvent(h, "ev1", rec.SandboxID)); err != nil || out != core.WebhookDeferred {
		t.Errorf("killed under a peer's lease = %s, %v; want deferred", out, err)
	}
	if got, _ := h.store.Get(ctx, rec.SandboxID); got.Fence != held.Fence {
		t.Errorf("a deferred webhook wrote the record")
	}
	other := h.acquire(t, key("t2"), core.SourceCreated)
	if _, err := h.eng.Release(ctx, "acme", other.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := prov.Pause(ctx, other.SandboxID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	ev := core.ProviderEvent{ID: "ev3", Kind: core.ProviderPaused, SandboxID: other.SandboxID, At: h.clock.now()}
	if out, err := h.eng.ApplyProviderEvent(ctx, ev); err != nil || out != core.WebhookApplied {
		t.Fatalf("paused webhook = %s, %v; want applied", out, err)
	}
	if got := h.state(t, other.SandboxID); got.State != core.StatePaused {
		t.Errorf("paused webhook left the record %s, want paused", got.State)
	}
}
