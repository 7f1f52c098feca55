package core_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// fakeProvider is an in-memory core.Provider for fault injection: each
// error knob makes the matching call fail. Real-provider behaviour is
// covered by pkg/e2b's tests against the local sandbox host.
type fakeProvider struct {
	mu        sync.Mutex
	next      int
	sandboxes map[string]*fakeSandbox
	calls     []string

	createErr     error
	createdButErr error // create succeeds at the provider, but the caller sees this error
	infoErr       error
	killErr       error
	setTimeoutErr error
	runErr        error
	runExit       int
	killed        []string
}

type fakeSandbox struct {
	meta    map[string]string
	timeout time.Duration
}

var _ core.Provider = (*fakeProvider)(nil)

func newFakeProvider() *fakeProvider { return &fakeProvider{sandboxes: map[string]*fakeSandbox{}} }

func (f *fakeProvider) record(call string) { f.calls = append(f.calls, call) }

func (f *fakeProvider) Name() string { return "fake" }

func (f *fakeProvider) Create(_ context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("create")
	if f.createErr != nil {
		return core.SandboxRef{}, f.createErr
	}
	f.next++
	id := fmt.Sprintf("sb%04d", f.next)
	f.sandboxes[id] = &fakeSandbox{meta: spec.Metadata, timeout: spec.Timeout}
	if f.createdButErr != nil {
		return core.SandboxRef{}, f.createdButErr
	}
	return core.SandboxRef{ID: id, EnvdURL: "http://envd.invalid", AccessToken: "tok-" + id}, nil
}

func (f *fakeProvider) Info(_ context.Context, id string) (core.SandboxInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("info " + id)
	if f.infoErr != nil {
		return core.SandboxInfo{}, f.infoErr
	}
	sb, ok := f.sandboxes[id]
	if !ok {
		return core.SandboxInfo{}, core.ErrSandboxGone
	}
	return core.SandboxInfo{ID: id, Metadata: sb.meta, State: "running"}, nil
}

func (f *fakeProvider) List(context.Context, core.ListFilter) ([]core.SandboxInfo, error) {
	return nil, nil
}

func (f *fakeProvider) Kill(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("kill " + id)
	if f.killErr != nil {
		return f.killErr
	}
	delete(f.sandboxes, id)
	f.killed = append(f.killed, id)
	return nil
}

func (f *fakeProvider) SetTimeout(_ context.Context, id string, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(fmt.Sprintf("timeout %s %s", id, d))
	if f.setTimeoutErr != nil {
		return f.setTimeoutErr
	}
	sb, ok := f.sandboxes[id]
	if !ok {
		return core.ErrSandboxGone
	}
	sb.timeout = d
	return nil
}

func (f *fakeProvider) Run(_ context.Context, ref core.SandboxRef, cmd core.Command) (core.CommandResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("run " + ref.ID)
	if f.runErr != nil {
		return core.CommandResult{}, f.runErr
	}
	if _, ok := f.sandboxes[ref.ID]; !ok {
		return core.CommandResult{}, core.ErrSandboxGone
	}
	if f.runExit != 0 {
		return core.CommandResult{ExitCode: f.runExit, Stderr: []byte("boom")}, nil
	}
	if !strings.Contains(cmd.Script, "BOOTSTRAP_OK") || cmd.Env["SBX_HOME"] == "" {
		return core.CommandResult{ExitCode: 2}, nil
	}
	return core.CommandResult{Stdout: []byte("BOOTSTRAP_OK\n")}, nil
}

func (f *fakeProvider) OpenFile(context.Context, core.SandboxRef, string, int64) (io.ReadCloser, error) {
	return nil, core.ErrFileNotFound
}

func (f *fakeProvider) WriteFile(context.Context, core.SandboxRef, string, io.Reader) error {
	return nil
}

// alive reports whether the provider still runs id.
func (f *fakeProvider) alive(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.sandboxes[id]
	return ok
}

func (f *fakeProvider) count(prefix string) int {
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

func (f *fakeProvider) set(fn func(f *fakeProvider)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// fakeSyncer records sync passes; hook, when set, runs inside each pass.
type fakeSyncer struct {
	mu     sync.Mutex
	passes []string
	err    error
	hook   func()
}

func (s *fakeSyncer) Sync(_ context.Context, t core.SyncTarget) (core.SyncResult, error) {
	s.mu.Lock()
	s.passes = append(s.passes, t.Ref.ID)
	hook, err := s.hook, s.err
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err != nil {
		return core.SyncResult{}, err
	}
	return core.SyncResult{Uploaded: 1, Complete: true}, nil
}
