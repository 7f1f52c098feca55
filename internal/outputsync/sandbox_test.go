package outputsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// bashSandbox is a test double of Sandbox that is honest about the sandbox
// side: Run executes the script with the real bash (and GNU find) on the
// machine, with only the command's Env and PATH; OpenFile streams the real
// file. Its home is a temporary directory; the syncer under test is given
// that directory as Options.Home, so listing, path checks and reads all
// see real absolute paths.
//
// Fault injection: runErr fails Run; openErr is consulted before each open;
// extra appends bytes to a file's stream (a file that grew while read);
// cut truncates a stream (a file that shrank).
type bashSandbox struct {
	home string

	mu       sync.Mutex
	runs     int
	opens    []string // paths passed to OpenFile, in order
	runErr   error
	openErr  func(n int, path string) error // n: 0-based count of opens so far
	extra    map[string][]byte
	cut      map[string]int64
	readErr  map[string]error // the stream fails with it after the file's bytes
	stdout   []byte           // when non-nil, Run returns it instead of running bash
	exit     int
	writes   []string                       // paths passed to WriteFile, in order
	writeErr func(n int, path string) error // consulted before each write; n: 0-based count
}

var _ Sandbox = (*bashSandbox)(nil)

func (b *bashSandbox) Run(ctx context.Context, _ core.SandboxRef, cmd core.Command) (core.CommandResult, error) {
	b.mu.Lock()
	b.runs++
	runErr, stdout, exit := b.runErr, b.stdout, b.exit
	b.mu.Unlock()
	if runErr != nil {
		return core.CommandResult{}, runErr
	}
	if stdout != nil {
		return core.CommandResult{Stdout: stdout, ExitCode: exit}, nil
	}
	if cmd.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cmd.Timeout)
		defer cancel()
	}
	c := exec.CommandContext(ctx, "bash", "-c", cmd.Script)
	c.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C.UTF-8"}
	for k, v := range cmd.Env {
		c.Env = append(c.Env, k+"="+v)
	}
	c.Dir = b.home
	if cmd.Cwd != "" {
		c.Dir = cmd.Cwd
	}
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return core.CommandResult{ExitCode: ee.ExitCode(), Stdout: out.Bytes(), Stderr: errb.Bytes()}, nil
	case err != nil:
		return core.CommandResult{}, fmt.Errorf("run: %w", err)
	}
	return core.CommandResult{Stdout: out.Bytes(), Stderr: errb.Bytes()}, nil
}

func (b *bashSandbox) OpenFile(_ context.Context, _ core.SandboxRef, path string, maxBytes int64) (io.ReadCloser, error) {
	b.mu.Lock()
	n := len(b.opens)
	b.opens = append(b.opens, path)
	hook, extra, cut, hasCut, readErr := b.openErr, b.extra[path], b.cut[path], false, b.readErr[path]
	if b.cut != nil {
		_, hasCut = b.cut[path]
	}
	b.mu.Unlock()
	if hook != nil {
		if err := hook(n, path); err != nil {
			return nil, err
		}
	}
	if !strings.HasPrefix(path, b.home+"/") {
		return nil, fmt.Errorf("open %q: outside the sandbox home", path)
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, core.ErrFileNotFound
	}
	if err != nil {
		return nil, err
	}
	var r io.Reader = io.MultiReader(f, bytes.NewReader(extra))
	if hasCut {
		r = io.LimitReader(r, cut)
	}
	if readErr != nil {
		r = io.MultiReader(r, errReader{readErr})
	}
	return &capReader{r: r, c: f, left: maxBytes, max: maxBytes, path: path}, nil
}

// WriteFile writes r to path like envd does: in place, parents created; a
// failing r leaves the bytes read so far in the file.
func (b *bashSandbox) WriteFile(_ context.Context, _ core.SandboxRef, path string, r io.Reader) error {
	b.mu.Lock()
	n := len(b.writes)
	b.writes = append(b.writes, path)
	hook := b.writeErr
	b.mu.Unlock()
	if hook != nil {
		if err := hook(n, path); err != nil {
			return err
		}
	}
	if !strings.HasPrefix(path, b.home+"/") {
		return fmt.Errorf("write %q: outside the sandbox home", path)
	}
	if err := os.MkdirAll(path[:strings.LastIndex(path, "/")], 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	return errors.Join(err, f.Close())
}

// writtenPaths returns a copy of the paths written so far.
func (b *bashSandbox) writtenPaths() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.writes...)
}

// openedPaths returns a copy of the paths opened so far.
func (b *bashSandbox) openedPaths() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.opens...)
}

func (b *bashSandbox) resetOpens() {
	b.mu.Lock()
	b.opens = nil
	b.mu.Unlock()
}

// capReader fails with *core.FileTooLargeError once more than max bytes
// were read, as Provider.OpenFile documents (max <= 0: no cap).
type capReader struct {
	r    io.Reader
	c    io.Closer
	left int64
	max  int64
	path string
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.max <= 0 {
		return c.r.Read(p)
	}
	if c.left < 0 {
		return 0, &core.FileTooLargeError{Path: c.path, MaxBytes: c.max}
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n - 1, &core.FileTooLargeError{Path: c.path, MaxBytes: c.max}
	}
	return n, err
}

func (c *capReader) Close() error { return c.c.Close() }

// writeFile creates home/rel with data and mtime (parents included).
func writeFile(t interface{ Fatal(...any) }, home, rel string, data []byte, mtime time.Time) {
	p := home + "/" + rel
	if err := os.MkdirAll(p[:strings.LastIndex(p, "/")], 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if !mtime.IsZero() {
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
