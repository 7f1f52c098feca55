package provisioner_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/provisioner"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
)

const hostKey = "host-provisioner-key"

// startHost runs the local sandbox host with its provisioner face.
func startHost(t *testing.T, opts sandboxhost.ProvisionerOptions) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: "unused-e2b-key", RootDir: t.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	t.Cleanup(func() { cancel(); _ = srv.Close() })
	opts.APIKey = hostKey
	u, err := srv.StartProvisioner("127.0.0.1:0", opts)
	if err != nil {
		t.Fatalf("StartProvisioner: %v", err)
	}
	return u
}

func hostClient(t *testing.T, base string, mod func(*provisioner.Options)) *provisioner.Client {
	t.Helper()
	o := provisioner.Options{BaseURL: base, APIKey: hostKey, Home: "/home/user"}
	if mod != nil {
		mod(&o)
	}
	c, err := provisioner.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestHostLifecycle(t *testing.T) {
	base := startHost(t, sandboxhost.ProvisionerOptions{BackendNamespace: "ns-1"})
	c := hostClient(t, base, nil)
	ctx := context.Background()

	ref, err := c.Create(ctx, core.CreateSpec{Metadata: map[string]string{
		core.MetaTenant: "t1", core.MetaUser: "alice", core.MetaThread: "thread-1", core.MetaDeployment: "dev"},
		EnvVars: map[string]string{"FROM_CREATE": "yes"}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if !strings.HasPrefix(ref.Endpoint.URL, base+"/aio/") || ref.Endpoint.AccessToken == "" {
		t.Errorf("ref = %+v, want the AIO URL under %s and a token", ref, base)
	}

	// The engine's bootstrap shape: env in, marker out.
	res, err := c.Run(ctx, ref, core.Command{Script: `mkdir -p "$SBX_HOME/outputs" && echo "$FROM_CREATE" && echo BOOTSTRAP_OK`,
		Env: map[string]string{"SBX_HOME": "/home/user"}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "yes\nBOOTSTRAP_OK\n" {
		t.Errorf("bootstrap-like run = %+v (stderr %q), %v", res, res.Stderr, err)
	}

	// A command past its timeout is killed.
	start := time.Now()
	_, err = c.Run(ctx, ref, core.Command{Script: "sleep 30", Timeout: time.Second})
	if !errors.Is(err, provisioner.ErrCommandTimeout) || time.Since(start) > 10*time.Second {
		t.Errorf("Run(sleep 30, 1 s) = %v after %s, want ErrCommandTimeout within seconds", err, time.Since(start))
	}

	if p, err := c.Capabilities().Discover(ctx, ref.ID); p != core.PresenceFound {
		t.Errorf("declared discovery = %s (%v), want found", p, err)
	}
	d := c.DiscoverForReconciliation(ctx, ref.ID, "")
	if d.Status != provisioner.DiscoveryFound || d.BackendNamespace != "ns-1" || d.Info.UserID != "t1.alice" || d.Info.ThreadID != "thread-1" {
		t.Errorf("discovery = %+v info %+v", d, d.Info)
	}
	if d2 := c.DiscoverForReconciliation(ctx, ref.ID, "another-incarnation"); d2.Status != provisioner.DiscoveryAbsent {
		t.Errorf("discovery of another incarnation = %s, want absent", d2.Status)
	}
	list, err := c.List(ctx, core.ListFilter{Metadata: map[string]string{core.MetaDeployment: "dev", core.MetaUser: "alice"}})
	if err != nil || len(list) != 1 || list[0].ID != ref.ID || list[0].State != "running" {
		t.Errorf("List = %+v, %v", list, err)
	}
	if err := c.Kill(ctx, ref.ID); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if d := c.DiscoverForReconciliation(ctx, ref.ID, ""); d.Status != provisioner.DiscoveryAbsent {
		t.Errorf("discovery after kill = %+v, want absent", d)
	}
	if p, err := c.Capabilities().Discover(ctx, ref.ID); p != core.PresenceAbsent {
		t.Errorf("declared discovery after kill = %s (%v), want absent", p, err)
	}
	if _, err := c.Run(ctx, ref, core.Command{Script: "true"}); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Run after kill = %v, want ErrSandboxGone", err)
	}
}

func TestHostRejectsBadCredentials(t *testing.T) {
	base := startHost(t, sandboxhost.ProvisionerOptions{})
	bad := hostClient(t, base, func(o *provisioner.Options) { o.APIKey = "wrong" })
	if _, err := bad.List(context.Background(), core.ListFilter{}); err == nil {
		t.Error("List with a wrong API key succeeded")
	}
	c := hostClient(t, base, nil)
	ref, err := c.Create(context.Background(), core.CreateSpec{})
	if err != nil {
		t.Fatal(err)
	}
	ref.Endpoint.AccessToken = "stolen"
	if _, err := c.Run(context.Background(), ref, core.Command{Script: "true"}); err == nil || errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Run with a wrong bearer token = %v, want a refusal", err)
	}
}

func TestHostLegacyMode(t *testing.T) {
	base := startHost(t, sandboxhost.ProvisionerOptions{Legacy: true})
	c := hostClient(t, base, nil)
	ctx := context.Background()
	if _, err := c.Create(ctx, core.CreateSpec{Metadata: map[string]string{core.MetaUser: "alice"}}); !errors.Is(err, provisioner.ErrCannotIsolateUser) {
		t.Errorf("legacy create for alice = %v, want ErrCannotIsolateUser", err)
	}
	ref, err := c.Create(ctx, core.CreateSpec{})
	if err != nil {
		t.Fatalf("legacy create for the default user: %v", err)
	}
	if d := c.DiscoverForReconciliation(ctx, ref.ID, ""); d.Status != provisioner.DiscoveryUnknown {
		t.Errorf("legacy discovery = %s, want unknown", d.Status)
	}
	if p, err := c.Capabilities().Discover(ctx, ref.ID); p != core.PresenceUnknown || err == nil {
		t.Errorf("declared legacy discovery = %s (%v), want unknown with its cause", p, err)
	}
}

func TestHostContractMismatch(t *testing.T) {
	base := startHost(t, sandboxhost.ProvisionerOptions{ContractVersion: 3})
	c := hostClient(t, base, func(o *provisioner.Options) { o.RequiredContract = 4 })
	var mc *provisioner.MountContractChangedError
	if _, err := c.Create(context.Background(), core.CreateSpec{}); !errors.As(err, &mc) || mc.Expected != 4 || mc.Actual != 3 {
		t.Errorf("Create requiring 4 from a v3 host = %v, want MountContractChangedError{4, 3}", err)
	}
}
