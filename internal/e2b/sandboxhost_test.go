package e2b

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/providertest"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
)

// startHost runs the repository's local E2B-compatible sandbox host on
// loopback and returns a Client for it.
func startHost(t *testing.T, mod func(*Options)) (*Client, *sandboxhost.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: testKey, RootDir: t.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := srv.Close(); err != nil {
			t.Logf("sandbox host close: %v", err)
		}
	})
	return newTestClient(t, srv.APIURL, srv.EnvdURL, mod), srv
}

func TestSandboxHostLifecycle(t *testing.T) {
	c, srv := startHost(t, func(o *Options) { o.ListPageSize = 2 })
	ctx := context.Background()

	// Create with metadata: three for thread T, one for another thread.
	var refs []core.SandboxRef
	for _, thread := range []string{"T", "T", "other", "T"} {
		ref, err := c.Create(ctx, core.CreateSpec{
			Timeout:  5 * time.Minute,
			Metadata: map[string]string{"thread": thread, "deployment": "a&b=c d"},
			EnvVars:  map[string]string{"SANDBOX_LEVEL": "from-create"},
		})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		if ref.ID == "" || ref.Endpoint.AccessToken == "" || ref.Endpoint.URL != srv.EnvdURL {
			t.Fatalf("ref = %+v, want id, token and EnvdURL %s", ref, srv.EnvdURL)
		}
		refs = append(refs, ref)
	}
	ref := refs[0]

	t.Run("list by metadata across pages", func(t *testing.T) {
		got, err := c.List(ctx, core.ListFilter{Metadata: map[string]string{"thread": "T", "deployment": "a&b=c d"}})
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		var ids []string
		for _, s := range got {
			ids = append(ids, s.ID)
			if s.Metadata["thread"] != "T" || s.State != "running" {
				t.Errorf("listed %+v, want thread T running", s)
			}
		}
		want := []string{refs[0].ID, refs[1].ID, refs[3].ID}
		sort.Strings(ids)
		sort.Strings(want)
		if strings.Join(ids, ",") != strings.Join(want, ",") {
			t.Errorf("listed ids = %v, want %v", ids, want)
		}
	})

	t.Run("info", func(t *testing.T) {
		info, err := c.Info(ctx, ref.ID)
		if err != nil {
			t.Fatalf("Info: %v", err)
		}
		if info.ID != ref.ID || info.State != "running" || info.Metadata["thread"] != "T" || info.TemplateID != DefaultTemplate {
			t.Errorf("info = %+v, want running base sandbox with thread T", info)
		}
		if left := time.Until(info.EndAt); left < 4*time.Minute || left > 5*time.Minute+time.Second {
			t.Errorf("EndAt in %s, want about 5m", left)
		}
		// Reading does not extend the sandbox's life.
		if again, err := c.Info(ctx, ref.ID); err != nil || !again.EndAt.Equal(info.EndAt) {
			t.Errorf("second Info EndAt = %v (%v), want unchanged %v", again.EndAt, err, info.EndAt)
		}
	})

	t.Run("set timeout", func(t *testing.T) {
		if err := c.SetTimeout(ctx, ref.ID, 90*time.Second); err != nil {
			t.Fatalf("SetTimeout: %v", err)
		}
		info, err := c.Info(ctx, ref.ID)
		if left := time.Until(info.EndAt); err != nil || left < 80*time.Second || left > 91*time.Second {
			t.Errorf("after SetTimeout(90s) EndAt in %s (%v), want about 90s", left, err)
		}
	})

	t.Run("run with env arrives literally", func(t *testing.T) {
		value := `a'b"c $(touch /tmp/pwned) ; & | * \n ` + "`id`"
		res, err := c.Run(ctx, ref, core.Command{
			Script:  `printf '%s|%s' "$TOK" "$SANDBOX_LEVEL"; test ! -e /tmp/pwned`,
			Env:     map[string]string{"TOK": value},
			Timeout: 30 * time.Second,
		})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if want := value + "|from-create"; string(res.Stdout) != want || res.ExitCode != 0 {
			t.Errorf("stdout = %q exit %d (stderr %q), want %q exit 0", res.Stdout, res.ExitCode, res.Stderr, want)
		}
	})

	t.Run("non-zero exit code is a result", func(t *testing.T) {
		res, err := c.Run(ctx, ref, core.Command{Script: "echo out; echo oops >&2; exit 7", Timeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if res.ExitCode != 7 || string(res.Stdout) != "out\n" || string(res.Stderr) != "oops\n" {
			t.Errorf("result = exit %d stdout %q stderr %q, want 7, out, oops", res.ExitCode, res.Stdout, res.Stderr)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		_, err := c.Run(ctx, ref, core.Command{Script: "echo started; sleep 60", Timeout: time.Second})
		if elapsed := time.Since(start); elapsed > 15*time.Second {
			t.Errorf("Run took %s, want about 1s", elapsed)
		}
		if !errors.Is(err, ErrCommandTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Run past its timeout = %v, want ErrCommandTimeout", err)

		}
		// The sleep is gone: nothing else runs in the sandbox.
		res, err := c.Run(ctx, ref, core.Command{Script: "pgrep -x sleep || true", Timeout: 10 * time.Second})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != "" {
			t.Errorf("sleep still running after timeout: %q, %v", res.Stdout, err)
		}
	})

	t.Run("write and read file", func(t *testing.T) {
		data := append([]byte("binary\x00data\n"), bytes.Repeat([]byte{0xff, 0x01}, 5000)...)
		path := "/home/user/outputs/deep/dir/f.bin"
		if err := c.WriteFile(ctx, ref, path, io.MultiReader(bytes.NewReader(data[:7]), bytes.NewReader(data[7:]))); err != nil {
			t.Fatalf("WriteFile: %v", err)
		}
		rc, err := c.OpenFile(ctx, ref, path, int64(len(data)))
		if err != nil {
			t.Fatalf("OpenFile: %v", err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("read back %d bytes, %v; want the %d written", len(got), err, len(data))
		}
		res, err := c.Run(ctx, ref, core.Command{Script: "wc -c < " + path, Timeout: 10 * time.Second})
		if want := strconv.Itoa(len(data)); err != nil || strings.TrimSpace(string(res.Stdout)) != want {
			t.Errorf("file size seen by a process = %q, %v; want %s", res.Stdout, err, want)
		}

		// Over the cap: FileTooLargeError, never more than the cap handed out.
		n, err := readCapped(c, ctx, ref, path, 1000)
		var tl *core.FileTooLargeError
		if !errors.As(err, &tl) || n > 1000 {
			t.Errorf("capped read = %d bytes, %v; want at most 1000 then FileTooLargeError", n, err)
		}
		if _, err := c.OpenFile(ctx, ref, "/home/user/nope.txt", 0); !errors.Is(err, core.ErrFileNotFound) {
			t.Errorf("OpenFile of a missing file = %v, want ErrFileNotFound", err)
		}
	})

	t.Run("wrong access token is refused for certain", func(t *testing.T) {
		bad := ref
		bad.Endpoint.AccessToken = "wrong"
		_, err := c.Run(ctx, bad, core.Command{Script: "true"})
		var pe *core.ProviderError
		if !errors.As(err, &pe) || pe.Ambiguous || errors.Is(err, core.ErrSandboxGone) {
			t.Errorf("Run with a wrong token = %v, want a certain ProviderError", err)
		}
	})

	t.Run("kill then gone", func(t *testing.T) {
		if err := c.Kill(ctx, ref.ID); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		if _, err := c.Info(ctx, ref.ID); !errors.Is(err, core.ErrSandboxGone) {
			t.Errorf("Info after kill = %v, want ErrSandboxGone", err)
		}
		if _, err := c.Run(ctx, ref, core.Command{Script: "true"}); !errors.Is(err, core.ErrSandboxGone) {
			t.Errorf("Run after kill = %v, want ErrSandboxGone", err)
		}
		if _, err := c.OpenFile(ctx, ref, "/home/user/outputs/deep/dir/f.bin", 0); !errors.Is(err, core.ErrSandboxGone) {
			t.Errorf("OpenFile after kill = %v, want ErrSandboxGone", err)
		}
		if err := c.WriteFile(ctx, ref, "/home/user/x", strings.NewReader("x")); !errors.Is(err, core.ErrSandboxGone) {
			t.Errorf("WriteFile after kill = %v, want ErrSandboxGone", err)
		}
		if err := c.SetTimeout(ctx, ref.ID, time.Minute); !errors.Is(err, core.ErrSandboxGone) {
			t.Errorf("SetTimeout after kill = %v, want ErrSandboxGone", err)
		}
		if err := c.Kill(ctx, ref.ID); err != nil {
			t.Errorf("second Kill = %v, want nil (already gone)", err)
		}
		if err := c.Kill(ctx, "unknownsandbox123"); err != nil {
			t.Errorf("Kill of an unknown id = %v, want nil", err)
		}
		got, err := c.List(ctx, core.ListFilter{Metadata: map[string]string{"thread": "T"}})
		if err != nil || len(got) != 2 {
			t.Errorf("List after kill = %d sandboxes, %v; want 2", len(got), err)
		}
	})
}

// readCapped reads path with cap max and returns how many bytes it got.
func readCapped(c *Client, ctx context.Context, ref core.SandboxRef, path string, max int64) (int, error) {
	rc, err := c.OpenFile(ctx, ref, path, max)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	return len(got), err
}

func TestSandboxHostTimeoutEndsSandbox(t *testing.T) {
	c, _ := startHost(t, nil)
	ctx := context.Background()
	ref, err := c.Create(ctx, core.CreateSpec{Timeout: time.Second})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := c.Info(ctx, ref.ID)
		if errors.Is(err, core.ErrSandboxGone) {
			break
		}
		if err != nil {
			t.Fatalf("Info: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("sandbox with a 1s timeout still alive after 15s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.Run(ctx, ref, core.Command{Script: "true"}); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("Run in an expired sandbox = %v, want ErrSandboxGone", err)
	}
}

func TestSandboxHostRejectsWrongAPIKey(t *testing.T) {
	_, srv := startHost(t, nil)
	c, err := New(Options{APIURL: srv.APIURL, SandboxURL: srv.EnvdURL, APIKey: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Create(context.Background(), core.CreateSpec{})
	var pe *core.ProviderError
	if !errors.As(err, &pe) || pe.StatusCode != 401 || pe.Ambiguous || !strings.Contains(err.Error(), "API key") {
		t.Errorf("Create with a wrong key = %v, want a certain 401 naming the API key", err)
	}
}

// TestSandboxHostMeetsProviderContract runs the provider contract shared
// with the engine's fault-injection fake against this client and the real
// local sandbox host.
func TestSandboxHostMeetsProviderContract(t *testing.T) {
	c, _ := startHost(t, func(o *Options) { o.ListPageSize = 2 })
	providertest.Run(t, c)
}
