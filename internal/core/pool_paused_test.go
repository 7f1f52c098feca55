package core_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// newPausedPoolHarness is newPoolHarness over a fake provider that can
// pause (members parked as parked says).
func newPausedPoolHarness(t *testing.T, size int, parked core.PoolParking, mutate func(*core.Settings), opts ...core.Option) *harness {
	t.Helper()
	return newPauseHarness(t, mutate, append([]core.Option{core.WithPool(core.PoolSettings{Size: size, MaxAge: 10 * time.Minute, Parked: parked})}, opts...)...)
}

// slotsAre checks the running slots used, the paused slots used and the
// pool's places.
func (h *harness) slotsAre(t *testing.T, used, paused, places int) {
	t.Helper()
	if got := h.capacity(t).Used; got != used {
		t.Errorf("running slots used = %d, want %d", got, used)
	}
	if got := h.pausedSlots(t); got != paused {
		t.Errorf("paused slots used = %d, want %d", got, paused)
	}
	if got := h.poolCount(t); got != places {
		t.Errorf("pool places = %d, want %d", got, places)
	}
}

func TestPoolParking(t *testing.T) {
	tests := []struct {
		name       string
		pausable   bool
		parked     core.PoolParking
		wantPaused bool
	}{
		{"default with a provider that pauses: paused", true, core.PoolParkedDefault, true},
		{"default with one that cannot: running", false, core.PoolParkedDefault, false},
		{"running asked: running", true, core.PoolParkedRunning, false},
		{"paused asked: paused", true, core.PoolParkedPaused, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prov := coretest.NewFakeProvider()
			prov.Pausable = tc.pausable
			h := newHarnessWith(t, prov, nil, core.WithPool(core.PoolSettings{Size: 2, MaxAge: 10 * time.Minute, Parked: tc.parked}))
			h.refill(t, 2)
			for _, m := range h.members(t) {
				if got := prov.Paused(m.SandboxID); got != tc.wantPaused {
					t.Errorf("member %s paused at the provider = %v, want %v", m.SandboxID, got, tc.wantPaused)
				}
				if m.Slots.Paused != tc.wantPaused || m.Slots.Running() == tc.wantPaused {
					t.Errorf("member %s slots = %+v, want paused %v", m.SandboxID, m.Slots, tc.wantPaused)
				}
			}
			if tc.wantPaused {
				h.slotsAre(t, 0, 2, 2)
			} else {
				h.slotsAre(t, 2, 0, 2)
			}
			rec := h.acquire(t, key("t1"), core.SourcePool)
			if prov.Paused(rec.SandboxID) || rec.State != core.StateActive || rec.Slots != (core.Slots{}) {
				t.Errorf("claimed %s: provider paused %v, record %s %+v; want running, active, a running slot",
					rec.SandboxID, prov.Paused(rec.SandboxID), rec.State, rec.Slots)
			}
			if got := prov.Timeout(rec.SandboxID); got != core.DefaultSettings().ActiveTimeout+core.TimerMargin {
				t.Errorf("claimed member's timeout = %s, want the active timeout plus the timer margin", got)
			}
			if tc.wantPaused {
				h.slotsAre(t, 1, 1, 1)
			} else {
				h.slotsAre(t, 2, 0, 1)
			}
			if again := h.acquire(t, key("t1"), core.SourceReused); again.SandboxID != rec.SandboxID {
				t.Errorf("second acquire = %s, want the claimed %s", again.SandboxID, rec.SandboxID)
			}
		})
	}
}

func TestPoolParkedPausedNeedsAProviderThatPauses(t *testing.T) {
	h := newHarness(t, nil)
	s := core.DefaultSettings()
	s.Deployment = "test"
	_, err := core.New(s, h.store, h.prov, nil, core.WithPool(core.PoolSettings{Size: 1, MaxAge: time.Hour, Parked: core.PoolParkedPaused}))
	if err == nil || !strings.Contains(err.Error(), "Parked") {
		t.Fatalf("core.New = %v, want an error naming Parked", err)
	}
	_, err = core.New(s, h.store, h.prov, nil, core.WithPool(core.PoolSettings{Size: 1, MaxAge: time.Hour, Parked: "frozen"}))
	if err == nil || !strings.Contains(err.Error(), "Parked") {
		t.Fatalf("core.New(frozen) = %v, want an error naming Parked", err)
	}
}

func TestPoolPausedMemberThatFailsIsDiscardedAndNextTried(t *testing.T) {
	tests := []struct {
		name  string
		fault func(h *harness, members []core.Record)
		want  []core.Source // of two first acquires
	}{
		{"one gone: the other, then a create", func(h *harness, m []core.Record) { h.prov.Drop(m[0].SandboxID) },
			[]core.Source{core.SourcePool, core.SourceCreated}},
		{"resume refused: creates", func(h *harness, _ []core.Record) {
			h.prov.Set(func(f *coretest.FakeProvider) {
				f.ResumeErr = &core.ProviderError{Op: "resume", StatusCode: 500, Message: "boom"}
			})
		}, []core.Source{core.SourceCreated, core.SourceCreated}},
		{"resume applied, its reply lost: creates", func(h *harness, _ []core.Record) {
			h.prov.Set(func(f *coretest.FakeProvider) {
				f.ResumeErr = &core.ProviderError{Op: "resume", Ambiguous: true, Message: "reply lost"}
				f.ResumeApplies = true
			})
		}, []core.Source{core.SourceCreated, core.SourceCreated}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newPausedPoolHarness(t, 2, core.PoolParkedDefault, nil)
			h.refill(t, 2)
			members := h.members(t)
			tc.fault(h, members)
			var got []core.Source
			for _, th := range []string{"t1", "t2"} {
				res, err := h.eng.Acquire(context.Background(), key(th))
				if err != nil {
					t.Fatalf("Acquire(%s): %v", th, err)
				}
				got = append(got, res.Source)
				if out := h.prov.Paused(res.Record.SandboxID); out || !h.prov.Alive(res.Record.SandboxID) {
					t.Errorf("%s handed out %s, paused %v alive %v", th, res.Record.SandboxID, out, h.prov.Alive(res.Record.SandboxID))
				}
			}
			if got[0] != tc.want[0] || got[1] != tc.want[1] {
				t.Errorf("sources = %v, want %v", got, tc.want)
			}
			// Every discarded member is gone with its slots.
			h.slotsAre(t, 2, 0, 0)
			if live := h.prov.Live(); live != 2 {
				t.Errorf("live sandboxes = %d, want the threads' 2", live)
			}
		})
	}
}

func TestPoolPausedMemberIsGivenUpBeforeAThreadsPausedSandbox(t *testing.T) {
	h := newPausedPoolHarness(t, 1, core.PoolParkedDefault, func(s *core.Settings) { s.MaxPaused = 2 })
	ctx := context.Background()
	b := h.acquire(t, key("b"), core.SourceCreated) // active: not paused by the first pass
	a := h.park(t, "a")
	h.clock.advance(301 * time.Second)
	if st := h.reconcile(t); st.Paused != 1 || st.PoolCreated != 1 {
		t.Fatalf("first pass paused %d and created %d members, want 1 and 1", st.Paused, st.PoolCreated)
	}
	member := h.members(t)[0]
	if !member.Slots.Paused {
		t.Fatalf("member %+v not parked paused", member.Slots)
	}
	h.slotsAre(t, 1, 2, 1)
	if _, err := h.eng.Release(ctx, "acme", b.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.clock.advance(301 * time.Second)
	h.reconcile(t) // pauses b: the paused slots are full, the member goes first
	if h.prov.Alive(member.SandboxID) {
		t.Errorf("paused member %s still exists; it must be given up first", member.SandboxID)
	}
	for _, rec := range []core.Record{a, b} {
		if !h.prov.Paused(rec.SandboxID) {
			t.Errorf("thread sandbox %s not paused", rec.SandboxID)
		}
	}
	// The refill of the same pass found no paused slot: its member runs.
	m := h.members(t)
	if len(m) != 1 || m[0].Slots.Paused || h.prov.Paused(m[0].SandboxID) {
		t.Fatalf("members = %+v, want one running member", m)
	}
	h.slotsAre(t, 1, 2, 1)
}

func TestPoolPausedMembersAreRecycledAndDrained(t *testing.T) {
	h := newPausedPoolHarness(t, 2, core.PoolParkedDefault, nil)
	h.refill(t, 2)
	old := h.members(t)
	h.clock.advance(9 * time.Minute) // past MaxAge less the lead
	if st := h.reconcile(t); st.PoolRecycled != 2 || st.PoolCreated != 2 {
		t.Fatalf("recycling pass recycled %d created %d, want 2 and 2", st.PoolRecycled, st.PoolCreated)
	}
	for _, m := range old {
		if h.prov.Alive(m.SandboxID) {
			t.Errorf("old member %s still exists", m.SandboxID)
		}
	}
	h.slotsAre(t, 0, 2, 2)
	if err := h.eng.SetDraining(context.Background(), true); err != nil {
		t.Fatalf("SetDraining: %v", err)
	}
	if st := h.reconcile(t); st.PoolRecycled != 2 || st.PoolCreated != 0 {
		t.Errorf("draining pass recycled %d created %d, want 2 and 0", st.PoolRecycled, st.PoolCreated)
	}
	h.slotsAre(t, 0, 0, 0)
	if live := h.prov.Live(); live != 0 {
		t.Errorf("live sandboxes = %d, want 0", live)
	}
}

func TestPoolMemberPauseFaults(t *testing.T) {
	tests := []struct {
		name string
		set  func(f *coretest.FakeProvider)
		// after the refill: the member's state and slots, before reconcile
		state       core.State
		used, pause int
	}{
		{"refused: kept running", func(f *coretest.FakeProvider) {
			f.PauseErr = &core.ProviderError{Op: "pause", StatusCode: 500, Message: "no"}
		}, core.StatePooled, 1, 0},
		{"applied, reply lost: left pausing for reconcile", func(f *coretest.FakeProvider) {
			f.PauseErr = &core.ProviderError{Op: "pause", Ambiguous: true, Message: "reply lost"}
			f.PauseApplies = true
		}, core.StatePausing, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newPausedPoolHarness(t, 1, core.PoolParkedDefault, nil)
			h.prov.Set(tc.set)
			h.refill(t, 1)
			infos, err := h.prov.List(context.Background(), core.ListFilter{})
			if err != nil || len(infos) != 1 {
				t.Fatalf("sandboxes = %v, %v; want the member", infos, err)
			}
			ids := []string{infos[0].ID}
			if rec := h.state(t, ids[0]); rec.State != tc.state {
				t.Errorf("member state = %s, want %s", rec.State, tc.state)
			}
			h.slotsAre(t, tc.used, tc.pause, 1)
			h.prov.Set(func(f *coretest.FakeProvider) { f.PauseErr, f.PauseApplies = nil, false })
			h.clock.advance(3 * time.Minute) // the refill's lease lapses
			h.reconcile(t)
			rec := h.state(t, ids[0])
			if rec.State != core.StatePooled || (tc.state == core.StatePausing) != rec.Slots.Paused {
				t.Errorf("after reconcile: %s %+v, want pooled (paused when the pause had applied)", rec.State, rec.Slots)
			}
			h.acquire(t, key("t1"), core.SourcePool)
			h.slotsAre(t, 1, 0, 0)
		})
	}
}

// claimAndDie claims the only member for thread as an acquire that died
// right after its claim write would (lease owner "dead").
func (h *harness) claimAndDie(t *testing.T, thread string) core.Record {
	t.Helper()
	m := h.members(t)
	if len(m) != 1 {
		t.Fatalf("members = %d, want 1", len(m))
	}
	now := h.clock.now()
	rec, err := h.store.ClaimPoolMember(context.Background(), core.PoolClaim{Member: m[0], ThreadKey: key(thread), Owner: "dead",
		Now: now, LeaseUntil: now.Add(time.Minute), Limit: core.DefaultSettings().Limit()})
	if err != nil {
		t.Fatalf("ClaimPoolMember: %v", err)
	}
	return rec
}

func TestPoolInterruptedHandOut(t *testing.T) {
	for _, parked := range []core.PoolParking{core.PoolParkedRunning, core.PoolParkedPaused} {
		t.Run("taken over by the thread/"+string(parked), func(t *testing.T) {
			h := newPausedPoolHarness(t, 1, parked, nil)
			h.refill(t, 1)
			claimed := h.claimAndDie(t, "t1")
			h.clock.advance(2 * time.Minute)
			rec := h.acquire(t, key("t1"), core.SourcePool)
			if rec.SandboxID != claimed.SandboxID || h.prov.Paused(rec.SandboxID) {
				t.Errorf("acquire = %s (paused %v), want the claimed member %s, running", rec.SandboxID, h.prov.Paused(rec.SandboxID), claimed.SandboxID)
			}
			h.slotsAre(t, 1, 0, 0)
		})
		t.Run("destroyed by reconcile/"+string(parked), func(t *testing.T) {
			h := newPausedPoolHarness(t, 1, parked, nil)
			h.refill(t, 1)
			claimed := h.claimAndDie(t, "t1")
			h.clock.advance(2 * time.Minute)
			st := h.reconcile(t)
			if st.PoolRecycled != 1 || st.PoolCreated != 1 {
				t.Errorf("reconcile recycled %d created %d members, want 1 and 1", st.PoolRecycled, st.PoolCreated)
			}
			if rec := h.state(t, claimed.SandboxID); rec.State != core.StateGone || h.prov.Alive(claimed.SandboxID) {
				t.Errorf("interrupted member %s: record %s, alive %v; want gone", claimed.SandboxID, rec.State, h.prov.Alive(claimed.SandboxID))
			}
			if parked == core.PoolParkedPaused {
				h.slotsAre(t, 0, 1, 1) // the new member's
			} else {
				h.slotsAre(t, 1, 0, 1)
			}
			if rec := h.acquire(t, key("t1"), core.SourcePool); rec.SandboxID == claimed.SandboxID {
				t.Errorf("thread got the destroyed member back")
			}
		})
	}
}
