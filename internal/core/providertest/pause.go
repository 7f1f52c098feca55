package providertest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// pauseContract: what the engine relies on of Capabilities.Pause. A
// paused sandbox reads and lists as paused (and only under the paused
// state filter); pause and resume are idempotent (a peer finishing an
// interrupted one calls them again); resume sets the timeout given; an
// unknown sandbox is gone to both.
func (o optional) pauseContract(t *testing.T) {
	ctx := o.ctx
	pauser := o.p.Capabilities().Pause
	if pauser == nil {
		t.Fatal("providertest: Capabilities.Pause case, but the provider declares no Pause")
	}
	ref, err := o.p.Create(ctx, core.CreateSpec{Timeout: 5 * time.Minute, Metadata: map[string]string{"contract": o.tag + "-pause"}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = o.p.Kill(context.Background(), ref.ID) })
	listed := func(state string) bool {
		infos, err := o.p.List(ctx, core.ListFilter{Metadata: map[string]string{"contract": o.tag + "-pause"}, States: []string{state}})
		if err != nil {
			t.Fatalf("List(state %s): %v", state, err)
		}
		return slices.ContainsFunc(infos, func(in core.SandboxInfo) bool { return in.ID == ref.ID && in.State == state })
	}
	for i := range 2 { // the second pause finds it paused
		if err := pauser.Pause(ctx, ref.ID); err != nil {
			t.Fatalf("Pause #%d: %v", i+1, err)
		}
	}
	if info, err := o.p.Info(ctx, ref.ID); err != nil || info.State != core.SandboxPaused {
		t.Errorf("Info after Pause = %+v, %v; want state paused", info, err)
	}
	if !listed(core.SandboxPaused) || listed(core.SandboxRunning) {
		t.Errorf("a paused sandbox lists under paused %v, under running %v; want paused only", listed(core.SandboxPaused), listed(core.SandboxRunning))
	}
	for i := range 2 { // the second resume finds it running
		if err := pauser.Resume(ctx, ref.ID, 4*time.Minute); err != nil {
			t.Fatalf("Resume #%d: %v", i+1, err)
		}
	}
	if info, err := o.p.Info(ctx, ref.ID); err != nil || info.State != core.SandboxRunning {
		t.Errorf("Info after Resume = %+v, %v; want state running", info, err)
	}
	if !listed(core.SandboxRunning) || listed(core.SandboxPaused) {
		t.Errorf("a resumed sandbox lists under running %v, under paused %v; want running only", listed(core.SandboxRunning), listed(core.SandboxPaused))
	}
	if err := pauser.Pause(ctx, "doesnotexist0000"); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Pause(unknown) = %v, want ErrSandboxGone", err)
	}
	if err := pauser.Resume(ctx, "doesnotexist0000", time.Minute); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Resume(unknown) = %v, want ErrSandboxGone", err)
	}
}
