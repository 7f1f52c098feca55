package sandboxhost_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
	"github.com/sandbox-broker/sandbox-broker/internal/provisioner"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/pkg/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/core/providertest"
)

const (
	conformanceE2BKey  = "conformance-e2b-key"
	conformanceProvKey = "conformance-provisioner-key"
)

// startBothFaces runs one host serving the E2B face and the provisioner face.
func startBothFaces(t *testing.T) (*sandboxhost.Server, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: conformanceE2BKey, RootDir: t.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	provURL, err := srv.StartProvisioner("127.0.0.1:0", sandboxhost.ProvisionerOptions{APIKey: conformanceProvKey})
	if err != nil {
		cancel()
		_ = srv.Close()
		t.Fatalf("StartProvisioner: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := srv.Close(); err != nil {
			t.Logf("close: %v", err)
		}
	})
	return srv, provURL
}

// closedURL is the URL of a loopback port nobody listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

func newE2B(t *testing.T, apiURL, envdURL string) *e2b.Client {
	t.Helper()
	c, err := e2b.New(e2b.Options{APIURL: apiURL, SandboxURL: envdURL, APIKey: conformanceE2BKey,
		Timeouts: e2b.Timeouts{ControlPlane: 5 * time.Second, FileHeader: 5 * time.Second}})
	if err != nil {
		t.Fatalf("e2b.New: %v", err)
	}
	return c
}

func newProvisioner(t *testing.T, baseURL string) *provisioner.Client {
	t.Helper()
	c, err := provisioner.New(provisioner.Options{BaseURL: baseURL, APIKey: conformanceProvKey, Home: "/home/user",
		Timeouts: provisioner.Timeouts{Get: 5 * time.Second, Delete: 5 * time.Second, List: 5 * time.Second, Probe: 2 * time.Second}})
	if err != nil {
		t.Fatalf("provisioner.New: %v", err)
	}
	return c
}

// TestProviderConformance runs the provider contract, with every optional
// case that applies, against both provider clients over the local host.
func TestProviderConformance(t *testing.T) {
	srv, provURL := startBothFaces(t)

	t.Run("e2b", func(t *testing.T) {
		providertest.RunWith(t, newE2B(t, srv.APIURL, srv.EnvdURL), providertest.Capabilities{
			Exec: true, Home: "/home/user", Expiry: true,
			Unreachable: func(t *testing.T, ref core.SandboxRef) (core.Provider, core.SandboxRef) {
				u := closedURL(t)
				ref.Endpoint.URL = u
				return newE2B(t, u, u), ref
			},
		})
	})

	t.Run("provisioner", func(t *testing.T) {
		providertest.RunWith(t, newProvisioner(t, provURL), providertest.Capabilities{
			Exec: true, Home: "/home/user",
			Unreachable: func(t *testing.T, ref core.SandboxRef) (core.Provider, core.SandboxRef) {
				u := closedURL(t)
				ref.Endpoint.URL = u + "/aio/" + ref.ID
				return newProvisioner(t, u), ref
			},
		})
	})
}
