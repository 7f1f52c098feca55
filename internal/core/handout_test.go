package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// TestRecordHandOut: the stored record of an active sandbox tells the
// source of the acquire that last handed it out (GET /v1/sandboxes/{id}
// shows it), on both stores: created, reused, reclaimed from warm,
// resumed from paused, taken from the pool; a parked record tells nothing.
func TestRecordHandOut(t *testing.T) {
	for _, store := range []string{"memstore", "ddbstore"} {
		t.Run(store, func(t *testing.T) {
			prov := coretest.NewFakeProvider()
			prov.Pausable = true
			newH := func(mutate func(*core.Settings), opts ...core.Option) *harness {
				if store == "ddbstore" {
					return newDDBHarnessWith(t, prov, mutate, opts...)
				}
				return newHarnessWith(t, prov, mutate, opts...)
			}
			ctx := context.Background()
			stored := func(h *harness, id string, want core.Source) {
				t.Helper()
				rec, err := h.eng.Get(ctx, "acme", id)
				if err != nil {
					t.Fatal(err)
				}
				if got := rec.HandOut(); got != want {
					t.Errorf("%s record (prev %s): hand-out %q, want %q", rec.State, rec.PrevState, got, want)
				}
			}
			h := newH(nil)
			id := h.acquire(t, key("h1"), core.SourceCreated).SandboxID
			stored(h, id, core.SourceCreated)
			h.acquire(t, key("h1"), core.SourceReused)
			stored(h, id, core.SourceReused)
			if _, err := h.eng.Release(ctx, "acme", id); err != nil {
				t.Fatal(err)
			}
			stored(h, id, "")
			h.acquire(t, key("h1"), core.SourceReclaimed)
			stored(h, id, core.SourceReclaimed)

			p := newH(func(s *core.Settings) { s.PauseAfter = 0 })
			id = p.acquire(t, key("h2"), core.SourceCreated).SandboxID
			if _, err := p.eng.Release(ctx, "acme", id); err != nil {
				t.Fatal(err)
			}
			p.acquire(t, key("h2"), core.SourceResumed)
			stored(p, id, core.SourceResumed)

			pool := newH(nil, core.WithPool(core.PoolSettings{Size: 1, MaxAge: time.Hour}))
			if _, err := pool.eng.RefillPool(ctx); err != nil {
				t.Fatal(err)
			}
			id = pool.acquire(t, key("h3"), core.SourcePool).SandboxID
			stored(pool, id, core.SourcePool)
		})
	}
}
