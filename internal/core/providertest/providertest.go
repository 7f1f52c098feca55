// Package providertest is the contract every core.Provider must meet, run
// against the real ones (internal/e2b over the local sandbox host) and against
// the fault-injecting fake the engine tests use, so the fake cannot drift
// from what real providers do.
package providertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Run checks p against the provider contract. Each call gets a 60 s budget.
// It is RunWith with no optional capabilities.
func Run(t *testing.T, p core.Provider) {
	t.Helper()
	RunWith(t, p, Capabilities{})
}

// RunWith checks p against the provider contract (every check of Run) and
// then the optional cases caps enables. Each call gets a 60 s budget (plus
// the expiry wait).
func RunWith(t *testing.T, p core.Provider, caps Capabilities) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := &contract{ctx: ctx, p: p, tag: fmt.Sprintf("contract-%d", time.Now().UnixNano())}
	t.Run("UnknownSandboxIsGone", c.unknownSandboxIsGone)
	c.createSandboxes(t)
	t.Run("InfoReportsMetadata", c.infoReportsMetadata)
	t.Run("ListFiltersByMetadata", c.listFiltersByMetadata)
	t.Run("SetTimeoutOnLiveSandbox", c.setTimeoutOnLiveSandbox)
	if p.Capabilities().Locate != nil {
		t.Run("LocateGivesTheEndpoint", c.locateGivesTheEndpoint)
	}
	t.Run("KilledSandboxIsGoneEverywhere", c.killedSandboxIsGoneEverywhere)
	runOptional(t, p, caps, c.tag)
}

// contract is one run of the contract: its budget, the provider, the
// metadata tag of its sandboxes and the three sandboxes it created.
type contract struct {
	ctx  context.Context
	p    core.Provider
	tag  string
	refs []core.SandboxRef
}

func (c *contract) unknownSandboxIsGone(t *testing.T) {
	ctx, p := c.ctx, c.p
	if _, err := p.Info(ctx, "doesnotexist0000"); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Info(unknown) = %v, want ErrSandboxGone", err)
	}
	if err := p.Kill(ctx, "doesnotexist0000"); err != nil {
		t.Errorf("Kill(unknown) = %v, want nil (already gone counts as confirmed)", err)
	}
}

// createSandboxes creates the three sandboxes the cases share (killed at
// the end of t).
func (c *contract) createSandboxes(t *testing.T) {
	t.Helper()
	ctx, p, tag := c.ctx, c.p, c.tag
	var refs []core.SandboxRef
	for i := range 3 {
		ref, err := p.Create(ctx, core.CreateSpec{Timeout: 5 * time.Minute,
			Metadata: map[string]string{"contract": tag, "n": fmt.Sprint(i)}})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		if ref.ID == "" || ref.Endpoint.AccessToken == "" || ref.Endpoint.URL == "" {
			t.Fatalf("Create returned %+v, want id, endpoint URL and access token", ref)
		}
		if got, want := ref.Endpoint.Protocol, p.Capabilities().Protocol; got != want {
			t.Errorf("Create endpoint protocol = %q, want the declared %q", got, want)
		}
		refs = append(refs, ref)
	}
	t.Cleanup(func() {
		for _, r := range refs {
			_ = p.Kill(context.Background(), r.ID)
		}
	})
	c.refs = refs
}

func (c *contract) infoReportsMetadata(t *testing.T) {
	ctx, p, tag, refs := c.ctx, c.p, c.tag, c.refs
	info, err := p.Info(ctx, refs[0].ID)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if info.ID != refs[0].ID || info.Metadata["contract"] != tag || info.Metadata["n"] != "0" {
		t.Errorf("Info = %+v, want id %s with metadata contract=%s n=0", info, refs[0].ID, tag)
	}
}

func (c *contract) listFiltersByMetadata(t *testing.T) {
	ctx, p, tag, refs := c.ctx, c.p, c.tag, c.refs
	all, err := p.List(ctx, core.ListFilter{Metadata: map[string]string{"contract": tag}})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var got []string
	for _, s := range all {
		got = append(got, s.ID)
	}
	for _, r := range refs {
		if !slices.Contains(got, r.ID) {
			t.Errorf("List(contract=%s) = %v, missing %s", tag, got, r.ID)
		}
	}
	if len(got) != len(refs) {
		t.Errorf("List(contract=%s) returned %d sandboxes, want %d", tag, len(got), len(refs))
	}
	one, err := p.List(ctx, core.ListFilter{Metadata: map[string]string{"contract": tag, "n": "1"}})
	if err != nil || len(one) != 1 || one[0].ID != refs[1].ID {
		t.Errorf("List(contract, n=1) = %v, %v; want only %s", one, err, refs[1].ID)
	}
	none, err := p.List(ctx, core.ListFilter{Metadata: map[string]string{"contract": tag + "-other"}})
	if err != nil || len(none) != 0 {
		t.Errorf("List(other tag) = %v, %v; want none", none, err)
	}
}

func (c *contract) setTimeoutOnLiveSandbox(t *testing.T) {
	ctx, p, refs := c.ctx, c.p, c.refs
	if err := p.SetTimeout(ctx, refs[0].ID, 2*time.Minute); err != nil {
		t.Errorf("SetTimeout: %v", err)
	}
	if _, err := p.Info(ctx, refs[0].ID); err != nil {
		t.Errorf("Info after SetTimeout: %v", err)
	}
}

// locateGivesTheEndpoint: a provider that declares Capabilities.Locate
// addresses a live sandbox as its create did, access token included, and
// answers ErrSandboxGone for an unknown one.
func (c *contract) locateGivesTheEndpoint(t *testing.T) {
	locate := c.p.Capabilities().Locate
	if ep, err := locate(c.ctx, c.refs[1].ID); err != nil || ep != c.refs[1].Endpoint {
		t.Errorf("Locate = %+v, %v; want the create's endpoint %+v", ep, err, c.refs[1].Endpoint)
	}
	if _, err := locate(c.ctx, "doesnotexist0000"); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Locate(unknown) = %v, want ErrSandboxGone", err)
	}
}

func (c *contract) killedSandboxIsGoneEverywhere(t *testing.T) {
	ctx, p, tag, refs := c.ctx, c.p, c.tag, c.refs
	victim := refs[2]
	if err := p.Kill(ctx, victim.ID); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := p.Info(ctx, victim.ID); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Info after kill = %v, want ErrSandboxGone", err)
	}
	if err := p.Kill(ctx, victim.ID); err != nil {
		t.Errorf("second Kill = %v, want nil", err)
	}
	if err := p.SetTimeout(ctx, victim.ID, time.Minute); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("SetTimeout after kill = %v, want ErrSandboxGone", err)
	}
	if _, err := p.Run(ctx, victim, core.Command{Script: "true"}); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Run after kill = %v, want ErrSandboxGone", err)
	}
	left, err := p.List(ctx, core.ListFilter{Metadata: map[string]string{"contract": tag}})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, s := range left {
		if s.ID == victim.ID {
			t.Errorf("List still shows killed sandbox %s", victim.ID)
		}
	}
}
