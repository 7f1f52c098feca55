package sandboxhost_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/providertest"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
	"github.com/sandbox-broker/sandbox-broker/internal/provisioner"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
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
			Exec: true, Home: "/home/user", Expiry: true, Pause: true,
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

// TestE2BClientPausesAndResumes drives pause and resume of the local host
// through the E2B client's core.Pauser, as the engine does: the sandbox
// reads as paused and envd refuses it; a background command started
// before the pause is frozen while paused and counts on after the resume;
// files stay; pausing twice is fine; a killed sandbox, paused or not, is
// gone for every call.
func TestE2BClientPausesAndResumes(t *testing.T) {
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: conformanceE2BKey, RootDir: root}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	p := newE2B(t, srv.APIURL, srv.EnvdURL)
	pauser := p.Capabilities().Pause
	if pauser == nil {
		t.Fatal("the E2B client declares no Pause capability")
	}
	const home = "/home/user"
	tag := map[string]string{"case": "pause"}
	ref, err := p.Create(ctx, core.CreateSpec{Timeout: 5 * time.Minute, Metadata: tag})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := p.WriteFile(ctx, ref, home+"/kept.txt", strings.NewReader("kept")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	// The background command: a counter, read from the host's side of
	// the sandbox's home while envd refuses the sandbox.
	counterFile := filepath.Join(root, ref.ID, "home", "counter")
	counter := func() int {
		b, err := os.ReadFile(counterFile)
		if err != nil {
			return 0
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	bgCtx, stopBg := context.WithCancel(ctx)
	bgDone := make(chan error, 1)
	go func() {
		_, err := p.Run(bgCtx, ref, core.Command{Cwd: home, Timeout: 5 * time.Minute,
			Script: "i=0; while :; do i=$((i+1)); echo $i > counter.tmp && mv counter.tmp counter; sleep 0.02; done"})
		bgDone <- err
	}()
	defer func() { stopBg(); <-bgDone }()
	waitUntil(t, "the background counter to count", func() bool { return counter() > 0 })

	if err := pauser.Pause(ctx, ref.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	paused := counter()
	if info, err := p.Info(ctx, ref.ID); err != nil || info.State != core.SandboxPaused {
		t.Errorf("Info of the paused sandbox = %+v, %v; want state paused", info, err)
	}
	listed, err := p.List(ctx, core.ListFilter{Metadata: tag})
	if err != nil || len(listed) != 1 || listed[0].State != core.SandboxPaused {
		t.Errorf("List = %+v, %v; want the one sandbox, paused", listed, err)
	}
	refused := map[string]func() error{
		"Run": func() error { _, err := p.Run(ctx, ref, core.Command{Script: "touch " + home + "/ran"}); return err },
		"OpenFile": func() error {
			rc, err := p.OpenFile(ctx, ref, home+"/kept.txt", 0)
			if rc != nil {
				rc.Close()
			}
			return err
		},
		"SetTimeout": func() error { return p.SetTimeout(ctx, ref.ID, time.Minute) },
	}
	for name, call := range refused {
		if err := call(); err == nil || core.IsAmbiguous(err) || errors.Is(err, core.ErrSandboxGone) || errors.Is(err, core.ErrFileNotFound) {
			t.Errorf("%s of the paused sandbox = %v, want a certain refusal (not gone)", name, err)
		}
	}
	if err := pauser.Pause(ctx, ref.ID); err != nil {
		t.Errorf("second Pause = %v, want nil (already paused)", err)
	}
	// The counter counts every 20 ms: ten times that without a count.
	for range 10 {
		time.Sleep(20 * time.Millisecond)
		if now := counter(); now != paused {
			t.Fatalf("the counter moved from %d to %d while paused", paused, now)
		}
	}

	if err := pauser.Resume(ctx, ref.ID, 2*time.Minute); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	info, err := p.Info(ctx, ref.ID)
	if left := time.Until(info.EndAt); err != nil || info.State != core.SandboxRunning || left <= time.Minute || left > 2*time.Minute {
		t.Errorf("Info after Resume = %+v, %v (ends in %v); want running, ending in the 2 minutes asked", info, err, left)
	}
	waitUntil(t, "the background counter to count again", func() bool { return counter() > paused })
	select {
	case err := <-bgDone:
		t.Fatalf("the background command ended across the pause: %v", err)
	default:
	}
	if got := readAll(t, p, ctx, ref, home+"/kept.txt"); got != "kept" {
		t.Errorf("kept.txt after Resume = %q, want kept", got)
	}
	if rc, err := p.OpenFile(ctx, ref, home+"/ran", 0); !errors.Is(err, core.ErrFileNotFound) {
		if rc != nil {
			rc.Close()
		}
		t.Errorf("the refused command's file: %v, want ErrFileNotFound (it never ran)", err)
	}
	if err := pauser.Resume(ctx, ref.ID, time.Minute); err != nil {
		t.Errorf("Resume of a running sandbox = %v, want nil", err)
	}

	// Kill while paused.
	if err := pauser.Pause(ctx, ref.ID); err != nil {
		t.Fatalf("Pause before the kill: %v", err)
	}
	if err := p.Kill(ctx, ref.ID); err != nil {
		t.Fatalf("Kill of the paused sandbox: %v", err)
	}
	if _, err := p.Info(ctx, ref.ID); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Info after the kill = %v, want ErrSandboxGone", err)
	}
	if err := pauser.Resume(ctx, ref.ID, time.Minute); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Resume of a killed sandbox = %v, want ErrSandboxGone", err)
	}
	if err := pauser.Pause(ctx, ref.ID); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Pause of a killed sandbox = %v, want ErrSandboxGone", err)
	}
	select {
	case <-bgDone:
		bgDone <- nil // for the deferred wait
	case <-time.After(30 * time.Second):
		t.Error("the background command's Run still waits 30 s after the kill")
	}
}

// waitUntil polls cond every 20 ms for up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readAll reads a whole sandbox file.
func readAll(t *testing.T, p core.Provider, ctx context.Context, ref core.SandboxRef, path string) string {
	t.Helper()
	rc, err := p.OpenFile(ctx, ref, path, 0)
	if err != nil {
		t.Fatalf("OpenFile %s: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}
