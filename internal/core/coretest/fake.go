// Package coretest holds test doubles for core's interfaces. FakeProvider
// exists for fault injection; providertest.Run keeps it honest against the
// same contract the real providers pass.
package coretest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// FakeProvider is an in-memory core.Provider. Each *Err field, when set,
// makes the matching call fail with it. Commands are not executed: Run
// answers the engine's bootstrap script with its success marker (or
// RunExit when set), "cat -- <path>" with the file written at path (exit
// code 1 when there is none), and exit code 0 for anything else. Files
// written are kept per sandbox (by path as given) and read back by
// OpenFile and cat. A wedged sandbox (Wedge) times out every command.
type FakeProvider struct {
	mu        sync.Mutex
	next      int
	sandboxes map[string]*fakeSandbox
	calls     []string
	killed    []string

	CreateErr     error
	InfoErr       error
	KillErr       error
	SetTimeoutErr error
	RunErr        error
	RunExit       int

	// Pausable declares Capabilities.Pause (the fake's Pause and Resume);
	// set it before the engine is built. PauseErr and ResumeErr make those
	// calls fail; with PauseApplies (ResumeApplies) the call takes effect
	// first, its answer lost (an applied-then-lost reply).
	Pausable      bool
	PauseErr      error
	PauseApplies  bool
	ResumeErr     error
	ResumeApplies bool
	// misuse lists the calls made on a paused sandbox that would use or
	// extend it (SetTimeout, Run, file access): none may happen.
	misuse []string
	// OpenFileErr, when set, fails OpenFile of a live sandbox.
	OpenFileErr error
	// Locating declares Capabilities.Locate (the fake's Locate): the
	// endpoint and access token a create returned, read by id; set it
	// before the engine is built. LocateErr makes Locate fail.
	// CheckTokens makes Run refuse (401) a call whose access token is not
	// the sandbox's.
	Locating    bool
	LocateErr   error
	CheckTokens bool
	// Clock, when set (before the sandboxes are created), dates each
	// timeout set: Info and List then report when the sandbox ends
	// (SandboxInfo.EndAt). The fake never ends a sandbox on its own.
	Clock func() time.Time
}

type fakeSandbox struct {
	meta    map[string]string
	timeout time.Duration
	endAt   time.Time // when timeout was set, plus timeout (zero without Clock)
	paused  bool
	wedged  bool              // its processes are stopped: commands time out
	files   map[string][]byte // by path, as written
}

var _ core.Pauser = (*FakeProvider)(nil)

var _ core.Provider = (*FakeProvider)(nil)

// NewFakeProvider returns an empty fake.
func NewFakeProvider() *FakeProvider { return &FakeProvider{sandboxes: map[string]*fakeSandbox{}} }

// Set changes knobs under the fake's lock (for use while calls are in flight).
func (f *FakeProvider) Set(fn func(f *FakeProvider)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// Name implements core.Provider.
func (f *FakeProvider) Name() string { return "fake" }

// Capabilities implements core.Provider: envd endpoints, paged listing
// (ListPage), no locator, and pause and resume when Pausable.
func (f *FakeProvider) Capabilities() core.Capabilities {
	c := core.Capabilities{Protocol: core.ProtocolEnvd, Pager: f}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Pausable {
		c.Pause = f
	}
	if f.Locating {
		c.Locate = f.Locate
	}
	return c
}

// endpoint is the endpoint a create of id returns.
func endpoint(id string) core.Endpoint {
	return core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: "tok-" + id}
}

// Locate is Capabilities.Locate when Locating: id's endpoint, token
// included, as its create returned it.
func (f *FakeProvider) Locate(_ context.Context, id string) (core.Endpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "locate "+id)
	if f.LocateErr != nil {
		return core.Endpoint{}, f.LocateErr
	}
	if _, ok := f.sandboxes[id]; !ok {
		return core.Endpoint{}, core.ErrSandboxGone
	}
	return endpoint(id), nil
}

// state is the SandboxInfo.State of sb.
func (sb *fakeSandbox) state() string {
	if sb.paused {
		return core.SandboxPaused
	}
	return core.SandboxRunning
}

// usePaused records a call that uses or extends id while it is paused
// (caller holds f.mu) and reports whether id is paused.
func (f *FakeProvider) usePaused(call, id string) bool {
	if sb, ok := f.sandboxes[id]; ok && sb.paused {
		f.misuse = append(f.misuse, call+" "+id)
		return true
	}
	return false
}

// errPaused is what the fake's envd answers for a paused sandbox.
var errPaused = &core.ProviderError{Op: "envd", StatusCode: 502, Ambiguous: true, Message: "sandbox is paused"}

// Pause implements core.Pauser: idempotent; a paused sandbox keeps its
// files and stops counting as running.
func (f *FakeProvider) Pause(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "pause "+id)
	sb, ok := f.sandboxes[id]
	if f.PauseErr != nil {
		if ok && f.PauseApplies {
			sb.paused = true
		}
		return f.PauseErr
	}
	if !ok {
		return core.ErrSandboxGone
	}
	sb.paused = true
	return nil
}

// Resume implements core.Pauser: idempotent (a running sandbox only gets
// its timeout).
func (f *FakeProvider) Resume(_ context.Context, id string, timeout time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("resume %s %s", id, timeout))
	sb, ok := f.sandboxes[id]
	if f.ResumeErr != nil {
		if ok && f.ResumeApplies {
			sb.paused = false
			f.setTimer(sb, timeout)
		}
		return f.ResumeErr
	}
	if !ok {
		return core.ErrSandboxGone
	}
	sb.paused = false
	f.setTimer(sb, timeout)
	return nil
}

// Paused reports whether the fake holds id paused.
func (f *FakeProvider) Paused(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[id]
	return ok && sb.paused
}

// Running is the number of sandboxes the fake runs (not paused).
func (f *FakeProvider) Running() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, sb := range f.sandboxes {
		if !sb.paused {
			n++
		}
	}
	return n
}

// Misuse lists the calls made on paused sandboxes that would use or extend
// them (SetTimeout, Run, OpenFile, WriteFile), "<call> <id>", in order.
func (f *FakeProvider) Misuse() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.misuse...)
}

// Create implements core.Provider.
func (f *FakeProvider) Create(_ context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "create")
	if f.CreateErr != nil {
		return core.SandboxRef{}, f.CreateErr
	}
	f.next++
	id := fmt.Sprintf("sb%04d", f.next)
	sb := &fakeSandbox{meta: maps.Clone(spec.Metadata)}
	f.setTimer(sb, spec.Timeout)
	f.sandboxes[id] = sb
	return core.SandboxRef{ID: id, Endpoint: endpoint(id)}, nil
}

// Info implements core.Provider.
func (f *FakeProvider) Info(_ context.Context, id string) (core.SandboxInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "info "+id)
	if f.InfoErr != nil {
		return core.SandboxInfo{}, f.InfoErr
	}
	sb, ok := f.sandboxes[id]
	if !ok {
		return core.SandboxInfo{}, core.ErrSandboxGone
	}
	return core.SandboxInfo{ID: id, Metadata: maps.Clone(sb.meta), State: sb.state(), EndAt: sb.endAt}, nil
}

// List implements core.Provider.
func (f *FakeProvider) List(_ context.Context, filter core.ListFilter) ([]core.SandboxInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []core.SandboxInfo
	for id, sb := range f.sandboxes {
		match := true
		for k, v := range filter.Metadata {
			match = match && sb.meta[k] == v
		}
		if match && (len(filter.States) == 0 || slices.Contains(filter.States, sb.state())) {
			out = append(out, core.SandboxInfo{ID: id, Metadata: maps.Clone(sb.meta), State: sb.state(), EndAt: sb.endAt})
		}
	}
	return out, nil
}

// Kill implements core.Provider.
func (f *FakeProvider) Kill(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "kill "+id)
	if f.KillErr != nil {
		return f.KillErr
	}
	if _, ok := f.sandboxes[id]; ok {
		delete(f.sandboxes, id)
		f.killed = append(f.killed, id)
	}
	return nil
}

// SetTimeout implements core.Provider.
func (f *FakeProvider) SetTimeout(_ context.Context, id string, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("timeout %s %s", id, d))
	if f.SetTimeoutErr != nil {
		return f.SetTimeoutErr
	}
	sb, ok := f.sandboxes[id]
	if !ok {
		return core.ErrSandboxGone
	}
	if f.usePaused("timeout", id) {
		return errPaused
	}
	f.setTimer(sb, d)
	return nil
}

// setTimer sets sb's timeout to d from now (caller holds f.mu).
func (f *FakeProvider) setTimer(sb *fakeSandbox, d time.Duration) {
	sb.timeout = d
	if f.Clock != nil {
		sb.endAt = f.Clock().Add(d)
	}
}

// Run implements core.Provider (see the type comment).
func (f *FakeProvider) Run(_ context.Context, ref core.SandboxRef, cmd core.Command) (core.CommandResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "run "+ref.ID)
	if f.RunErr != nil {
		return core.CommandResult{}, f.RunErr
	}
	if _, ok := f.sandboxes[ref.ID]; !ok {
		return core.CommandResult{}, core.ErrSandboxGone
	}
	if f.usePaused("run", ref.ID) {
		return core.CommandResult{}, errPaused
	}
	sb := f.sandboxes[ref.ID]
	if f.CheckTokens && ref.Endpoint.AccessToken != endpoint(ref.ID).AccessToken {
		return core.CommandResult{}, &core.ProviderError{Op: "envd", StatusCode: 401, Message: "wrong access token"}
	}
	if sb.wedged {
		return core.CommandResult{}, errWedged
	}
	if f.RunExit != 0 {
		return core.CommandResult{ExitCode: f.RunExit, Stderr: []byte("injected failure")}, nil
	}
	if strings.Contains(cmd.Script, "BOOTSTRAP_OK") {
		return core.CommandResult{Stdout: []byte("BOOTSTRAP_OK\n")}, nil
	}
	if path, ok := strings.CutPrefix(cmd.Script, "cat -- "); ok {
		b, ok := sb.files[path]
		if !ok {
			return core.CommandResult{ExitCode: 1, Stderr: []byte("cat: " + path + ": No such file or directory")}, nil
		}
		return core.CommandResult{Stdout: bytes.Clone(b)}, nil
	}
	return core.CommandResult{}, nil
}

// errWedged is what a command in a wedged sandbox ends with: the envd
// client's deadline, an ambiguous failure.
var errWedged = &core.ProviderError{Op: "envd", Ambiguous: true, Message: "process did not start before the deadline"}

// Wedge stops id's processes: its commands time out, while its files are
// still served and the provider still lists it running.
func (f *FakeProvider) Wedge(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.sandboxes[id]; ok {
		sb.wedged = true
	}
}

// OpenFile implements core.Provider: the bytes WriteFile stored at path.
func (f *FakeProvider) OpenFile(_ context.Context, ref core.SandboxRef, path string, maxBytes int64) (io.ReadCloser, error) {
	if err := f.fileAccess("open", ref.ID); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.OpenFileErr != nil {
		return nil, f.OpenFileErr
	}
	sb, ok := f.sandboxes[ref.ID]
	if !ok {
		return nil, core.ErrSandboxGone // killed meanwhile
	}
	b, ok := sb.files[path]
	if !ok {
		return nil, core.ErrFileNotFound
	}
	if maxBytes > 0 && int64(len(b)) > maxBytes {
		return nil, &core.FileTooLargeError{Path: path, MaxBytes: maxBytes}
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// fileAccess checks a file call on id: gone, or paused (misuse).
func (f *FakeProvider) fileAccess(call, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sandboxes[id]; !ok {
		return core.ErrSandboxGone
	}
	if f.usePaused(call, id) {
		return errPaused
	}
	return nil
}

// WriteFile implements core.Provider: the bytes are kept for OpenFile.
func (f *FakeProvider) WriteFile(_ context.Context, ref core.SandboxRef, path string, r io.Reader) error {
	if err := f.fileAccess("write", ref.ID); err != nil {
		return err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[ref.ID]
	if !ok {
		return core.ErrSandboxGone
	}
	if sb.files == nil {
		sb.files = map[string][]byte{}
	}
	sb.files[path] = b
	return nil
}

// Alive reports whether the fake still runs id.
func (f *FakeProvider) Alive(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.sandboxes[id]
	return ok
}

// Live is the number of sandboxes the fake runs.
func (f *FakeProvider) Live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sandboxes)
}

// Drop makes a sandbox vanish without a Kill call (killed behind the broker's back).
func (f *FakeProvider) Drop(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, id)
}

// Metadata returns the metadata id was created with (nil if gone).
func (f *FakeProvider) Metadata(id string) map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.sandboxes[id]; ok {
		return maps.Clone(sb.meta)
	}
	return nil
}

// Timeout returns the timeout last set on id.
func (f *FakeProvider) Timeout(id string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.sandboxes[id]; ok {
		return sb.timeout
	}
	return 0
}

// Killed lists the sandboxes killed through Kill, in order.
func (f *FakeProvider) Killed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.killed...)
}

// Count returns how many recorded calls start with prefix ("" = all).
func (f *FakeProvider) Count(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}
