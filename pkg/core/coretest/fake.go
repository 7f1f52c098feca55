// Package coretest holds test doubles for core's interfaces. FakeProvider
// exists for fault injection; providertest.Run keeps it honest against the
// same contract the real providers pass.
package coretest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// FakeProvider is an in-memory core.Provider. Each *Err field, when set,
// makes the matching call fail with it. Commands are not executed: Run
// answers the engine's bootstrap script with its success marker (or
// RunExit when set) and exit code 0 for anything else.
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
}

type fakeSandbox struct {
	meta    map[string]string
	timeout time.Duration
}

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
// (ListPage) and no locator.
func (f *FakeProvider) Capabilities() core.Capabilities {
	return core.Capabilities{Protocol: core.ProtocolEnvd, Pager: f}
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
	f.sandboxes[id] = &fakeSandbox{meta: maps.Clone(spec.Metadata), timeout: spec.Timeout}
	return core.SandboxRef{ID: id, Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: "tok-" + id}}, nil
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
	return core.SandboxInfo{ID: id, Metadata: maps.Clone(sb.meta), State: "running"}, nil
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
		if match {
			out = append(out, core.SandboxInfo{ID: id, Metadata: maps.Clone(sb.meta), State: "running"})
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
	sb.timeout = d
	return nil
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
	if f.RunExit != 0 {
		return core.CommandResult{ExitCode: f.RunExit, Stderr: []byte("injected failure")}, nil
	}
	if strings.Contains(cmd.Script, "BOOTSTRAP_OK") {
		return core.CommandResult{Stdout: []byte("BOOTSTRAP_OK\n")}, nil
	}
	return core.CommandResult{}, nil
}

// OpenFile implements core.Provider; the fake holds no files.
func (f *FakeProvider) OpenFile(_ context.Context, ref core.SandboxRef, _ string, _ int64) (io.ReadCloser, error) {
	if !f.Alive(ref.ID) {
		return nil, core.ErrSandboxGone
	}
	return nil, core.ErrFileNotFound
}

// WriteFile implements core.Provider; the bytes are discarded.
func (f *FakeProvider) WriteFile(_ context.Context, ref core.SandboxRef, _ string, r io.Reader) error {
	if !f.Alive(ref.ID) {
		return core.ErrSandboxGone
	}
	_, err := io.Copy(io.Discard, r)
	return err
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
