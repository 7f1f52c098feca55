package core_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// declaredProvider is the fake with other declared capabilities, and
// endpoints that carry no protocol (as records stored before endpoints
// had one do).
type declaredProvider struct {
	*coretest.FakeProvider
	caps core.Capabilities
}

func (p declaredProvider) Capabilities() core.Capabilities { return p.caps }

func TestNewRequiresADeclaredProtocol(t *testing.T) {
	p := declaredProvider{FakeProvider: coretest.NewFakeProvider()}
	if _, err := core.New(core.DefaultSettings(), ddbstore.New(nil, "t", "d"), p, nil); err == nil {
		t.Fatal("core.New with a provider declaring no protocol succeeded, want an error")
	}
}

// capsProvider is a provider declaring caps instead of its own capabilities.
type capsProvider struct {
	core.Provider
	caps core.Capabilities
}

func (p capsProvider) Capabilities() core.Capabilities { return p.caps }

// capsEngine builds an engine over a fresh table and prov, whose declared
// capabilities declare changes.
func capsEngine(t *testing.T, prov core.Provider, declare func(*core.Capabilities), clock *recClock) (*core.Engine, *ddbstore.Store) {
	t.Helper()
	db := testenv.DynamoClient(t)
	table := freshTable(t, db, "caps")
	s := core.DefaultSettings()
	s.Deployment = "test"
	s.AcquireTimeout = 5 * time.Second
	caps := prov.Capabilities()
	declare(&caps)
	store := ddbstore.New(db, table, s.Deployment)
	eng, err := core.New(s, store, capsProvider{Provider: prov, caps: caps}, &fakeSyncer{},
		core.WithClock(clock.now), core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	return eng, store
}

// TestReconcileFreesAVanishedSandboxOnlyOnDeclaredAbsence: a record whose
// sandbox is in no listing is freed when the provider confirms it gone:
// through Capabilities.Discover when declared (only "absent" counts),
// else through Info's ErrSandboxGone.
func TestReconcileFreesAVanishedSandboxOnlyOnDeclaredAbsence(t *testing.T) {
	t.Parallel()
	answer := func(p core.Presence) func(context.Context, string) (core.Presence, error) {
		return func(context.Context, string) (core.Presence, error) { return p, nil }
	}
	tests := []struct {
		name     string
		discover func(context.Context, string) (core.Presence, error)
		wantDead int
	}{
		{"no discovery: Info says gone", nil, 1},
		{"discovery absent", answer(core.PresenceAbsent), 1},
		{"discovery unknown", answer(core.PresenceUnknown), 0},
		{"discovery found", answer(core.PresenceFound), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake := coretest.NewFakeProvider()
			clock := &recClock{}
			eng, store := capsEngine(t, fake, func(c *core.Capabilities) { c.Discover = tc.discover }, clock)
			ctx := context.Background()
			res, err := eng.Acquire(ctx, key("t1"))
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			fake.Drop(res.Record.SandboxID) // gone from every listing and from Info
			clock.advance(time.Second)
			st, err := eng.Reconcile(ctx)
			if err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			capa, err := store.Capacity(ctx)
			if err != nil {
				t.Fatalf("Capacity: %v", err)
			}
			if st.Dead != tc.wantDead || capa.Used != 1-tc.wantDead {
				t.Errorf("dead = %d, used = %d; want %d, %d", st.Dead, capa.Used, tc.wantDead, 1-tc.wantDead)
			}
		})
	}
}

// pausedProvider is the fake reporting its sandboxes paused until
// resumed, and declaring no pause of its own.
type pausedProvider struct {
	*coretest.FakeProvider
	mu      sync.Mutex
	paused  map[string]bool
	resumed []string
}

func (p *pausedProvider) Info(ctx context.Context, id string) (core.SandboxInfo, error) {
	info, err := p.FakeProvider.Info(ctx, id)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil && p.paused[id] {
		info.State = core.SandboxPaused
	}
	return info, err
}

func (p *pausedProvider) Pause(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused[id] = true
	return nil
}

func (p *pausedProvider) Resume(_ context.Context, id string, _ time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.paused, id)
	p.resumed = append(p.resumed, id)
	return nil
}

// TestAcquireResumesAPausedSandboxOnlyWhenTheProviderCanPause: an active
// sandbox the provider reports paused is resumed and handed out again
// when the provider declares Capabilities.Pause; otherwise it is never
// handed out: it is discarded and the thread gets a fresh one.
func TestAcquireResumesAPausedSandboxOnlyWhenTheProviderCanPause(t *testing.T) {
	for _, canPause := range []bool{true, false} {
		t.Run(fmt.Sprintf("pause declared %v", canPause), func(t *testing.T) {
			prov := &pausedProvider{FakeProvider: coretest.NewFakeProvider(), paused: map[string]bool{}}
			eng, _ := capsEngine(t, prov, func(c *core.Capabilities) {
				if canPause {
					c.Pause = prov
				}
			}, &recClock{})
			ctx := context.Background()
			first, err := eng.Acquire(ctx, key("t1"))
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			id := first.Record.SandboxID
			if err := prov.Pause(ctx, id); err != nil {
				t.Fatal(err)
			}
			again, err := eng.Acquire(ctx, key("t1"))
			if err != nil {
				t.Fatalf("second Acquire: %v", err)
			}
			wantSource, wantResumed := core.SourceCreated, 0
			if canPause {
				wantSource, wantResumed = core.SourceReused, 1
			}
			if again.Source != wantSource || len(prov.resumed) != wantResumed || (again.Record.SandboxID == id) != canPause {
				t.Errorf("second acquire = %s of %s (first %s), resumed %v; want %s, %d resumed",
					again.Source, again.Record.SandboxID, id, prov.resumed, wantSource, wantResumed)
			}
			if alive := prov.Alive(id); alive != canPause {
				t.Errorf("paused sandbox alive = %v, want %v", alive, canPause)
			}
		})
	}
}
