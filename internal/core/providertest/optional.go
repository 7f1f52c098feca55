package providertest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Capabilities enables the optional contract cases of RunWith, for
// providers that really run sandboxes (not the engine's fake).
type Capabilities struct {
	// Exec: commands really run and files really exist. Enables the cases
	// ExecWithEnv, FilesRoundTrip (write, list with a command, stream,
	// byte cap, missing file) and KilledSandboxFilesAreGone.
	Exec bool
	// Home is a writable directory of a sandbox as both the file API and
	// Command.Cwd name it (e.g. /home/user). Required with Exec.
	Home string
	// Expiry: a sandbox really ends at its timeout. Enables SandboxExpires.
	Expiry bool
	// Unreachable, when set, returns a provider and a ref (for the
	// given live sandbox) whose every call fails in transport (e.g. URLs
	// of a closed port). Enables TransportFailureIsNotGone: such failures
	// must be ambiguous, never ErrSandboxGone or ErrFileNotFound.
	Unreachable func(t *testing.T, ref core.SandboxRef) (core.Provider, core.SandboxRef)
	// Pause: the provider declares Capabilities.Pause. Enables
	// PauseAndResume.
	Pause bool
}

// runOptional runs the cases caps enables, on sandboxes of their own.
func runOptional(t *testing.T, p core.Provider, caps Capabilities, tag string) {
	t.Helper()
	if !caps.Exec && !caps.Expiry && caps.Unreachable == nil && !caps.Pause {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	o := optional{ctx: ctx, p: p, tag: tag + "-opt"}
	if caps.Exec {
		if caps.Home == "" {
			t.Fatal("providertest: Capabilities.Exec needs Home")
		}
		ref := o.create(t, 5*time.Minute)
		t.Run("ExecWithEnv", func(t *testing.T) { execWithEnv(ctx, t, p, ref, caps.Home) })
		t.Run("FilesRoundTrip", func(t *testing.T) { filesRoundTrip(ctx, t, p, ref, caps.Home, tag) })
		t.Run("KilledSandboxFilesAreGone", func(t *testing.T) { o.killedSandboxFilesAreGone(t, caps.Home) })
	}
	if caps.Unreachable != nil {
		t.Run("TransportFailureIsNotGone", func(t *testing.T) { o.transportFailureIsNotGone(t, caps.Unreachable) })
	}
	if caps.Pause {
		t.Run("PauseAndResume", o.pauseContract)
	}
	if caps.Expiry {
		t.Run("SandboxExpires", o.sandboxExpires)
	}
}

// optional is a run of the optional cases: their budget, the provider and
// the metadata tag of their sandboxes.
type optional struct {
	ctx context.Context
	p   core.Provider
	tag string
}

// create creates a sandbox with timeout, killed at the end of t.
func (o optional) create(t *testing.T, timeout time.Duration) core.SandboxRef {
	t.Helper()
	ref, err := o.p.Create(o.ctx, core.CreateSpec{Timeout: timeout, Metadata: map[string]string{"contract": o.tag}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = o.p.Kill(context.Background(), ref.ID) })
	return ref
}

// killedSandboxFilesAreGone: a killed sandbox's files answer ErrSandboxGone.
func (o optional) killedSandboxFilesAreGone(t *testing.T, home string) {
	ctx, p := o.ctx, o.p
	victim := o.create(t, 5*time.Minute)
	path := home + "/gone.txt"
	if err := p.WriteFile(ctx, victim, path, strings.NewReader("x")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if err := p.Kill(ctx, victim.ID); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if rc, err := p.OpenFile(ctx, victim, path, 0); !errors.Is(err, core.ErrSandboxGone) {
		if rc != nil {
			rc.Close()
		}
		t.Errorf("OpenFile after kill = %v, want ErrSandboxGone", err)
	}
	if err := p.WriteFile(ctx, victim, path, strings.NewReader("y")); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("WriteFile after kill = %v, want ErrSandboxGone", err)
	}
}

// transportFailureIsNotGone: every call through a broken transport is
// ambiguous, never gone or not-found.
func (o optional) transportFailureIsNotGone(t *testing.T, unreachable func(*testing.T, core.SandboxRef) (core.Provider, core.SandboxRef)) {
	ctx := o.ctx
	live := o.create(t, 5*time.Minute)
	bp, bref := unreachable(t, live)
	checks := []struct {
		name string
		call func() error
	}{
		{"Info", func() error { _, err := bp.Info(ctx, bref.ID); return err }},
		{"SetTimeout", func() error { return bp.SetTimeout(ctx, bref.ID, time.Minute) }},
		{"Kill", func() error { return bp.Kill(ctx, bref.ID) }},
		{"List", func() error { _, err := bp.List(ctx, core.ListFilter{}); return err }},
		{"Run", func() error { _, err := bp.Run(ctx, bref, core.Command{Script: "true"}); return err }},
		{"OpenFile", func() error {
			rc, err := bp.OpenFile(ctx, bref, "/etc/hostname", 0)
			if rc != nil {
				rc.Close()
			}
			return err
		}},
	}
	for _, c := range checks {
		err := c.call()
		if err == nil || errors.Is(err, core.ErrSandboxGone) || errors.Is(err, core.ErrFileNotFound) || !core.IsAmbiguous(err) {
			t.Errorf("%s over a broken transport = %v, want an ambiguous error (not gone, not not-found)", c.name, err)
		}
	}
	if _, err := o.p.Info(ctx, live.ID); err != nil {
		t.Errorf("Info through the working provider = %v, want the sandbox alive", err)
	}
}

// sandboxExpires: a sandbox ends at its timeout.
func (o optional) sandboxExpires(t *testing.T) {
	ref := o.create(t, 2*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := o.p.Info(o.ctx, ref.ID)
		if errors.Is(err, core.ErrSandboxGone) {
			return
		}
		if err != nil {
			t.Fatalf("Info while waiting for expiry: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s with a 2 s timeout still alive after 30 s", ref.ID)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// execWithEnv checks per-call env (no shell interpolation), separate
// stdout/stderr, a non-zero exit code that is not an error, cwd and
// rejected env names.
func execWithEnv(ctx context.Context, t *testing.T, p core.Provider, ref core.SandboxRef, home string) {
	value := `it's "quoted" $HOME ; rm -rf / ` + "`x`\nline2"
	res, err := p.Run(ctx, ref, core.Command{
		Script: `printf '%s' "$CONTRACT_VALUE"; printf 'to-stderr' >&2; exit 7`,
		Env:    map[string]string{"CONTRACT_VALUE": value},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if string(res.Stdout) != value || string(res.Stderr) != "to-stderr" || res.ExitCode != 7 {
		t.Errorf("Run = exit %d stdout %q stderr %q; want exit 7 stdout %q stderr %q",
			res.ExitCode, res.Stdout, res.Stderr, value, "to-stderr")
	}
	res, err = p.Run(ctx, ref, core.Command{Script: `mkdir -p cwd-check && cd cwd-check && pwd -P >/dev/null && echo ok`, Cwd: home})
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Errorf("Run with Cwd %s = %+v, %v; want exit 0 and ok", home, res, err)
	}
	if _, err := p.Run(ctx, ref, core.Command{Script: "true", Env: map[string]string{"BAD NAME": "x"}}); err == nil {
		t.Errorf("Run with env name %q succeeded, want an error", "BAD NAME")
	}
}

// filesRoundTrip writes files (creating parents), lists them with a
// command run in home, streams them back, and checks the byte cap and a
// missing file.
func filesRoundTrip(ctx context.Context, t *testing.T, p core.Provider, ref core.SandboxRef, home, tag string) {
	dir := "ct-" + tag
	bin := []byte{0, 1, 2, 255, '\n', 'z'}
	files := map[string][]byte{
		dir + "/a.txt":          []byte("hello\n"),
		dir + "/sub/deep/b.bin": bin,
	}
	for rel, b := range files {
		if err := p.WriteFile(ctx, ref, home+"/"+rel, bytes.NewReader(b)); err != nil {
			t.Fatalf("WriteFile %s: %v", rel, err)
		}
	}
	res, err := p.Run(ctx, ref, core.Command{Script: `find "$D" -type f -printf '%P %s\n' | LC_ALL=C sort`,
		Env: map[string]string{"D": dir}, Cwd: home})
	want := "a.txt 6\nsub/deep/b.bin 6\n"
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != want {
		t.Errorf("list files = %q (exit %d, stderr %q), %v; want %q", res.Stdout, res.ExitCode, res.Stderr, err, want)
	}
	for rel, b := range files {
		rc, err := p.OpenFile(ctx, ref, home+"/"+rel, 0)
		if err != nil {
			t.Fatalf("OpenFile %s: %v", rel, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("OpenFile %s read %q, %v; want %q", rel, got, err, b)
		}
	}
	rc, err := p.OpenFile(ctx, ref, home+"/"+dir+"/a.txt", 3)
	if err == nil {
		got, rerr := io.ReadAll(rc)
		rc.Close()
		err = rerr
		if len(got) > 3 {
			t.Errorf("capped OpenFile handed out %d bytes, want at most 3", len(got))
		}
	}
	var tl *core.FileTooLargeError
	if !errors.As(err, &tl) {
		t.Errorf("OpenFile with a 3-byte cap on a 6-byte file = %v, want *core.FileTooLargeError", err)
	}
	if rc, err := p.OpenFile(ctx, ref, home+"/"+dir+"/missing", 0); !errors.Is(err, core.ErrFileNotFound) {
		if rc != nil {
			rc.Close()
		}
		t.Errorf("OpenFile(missing) = %v, want ErrFileNotFound", err)
	}
}
