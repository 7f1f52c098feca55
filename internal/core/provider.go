package core

import (
	"context"
	"io"
	"time"
)

// Wire protocols a sandbox endpoint speaks (Endpoint.Protocol).
const (
	// ProtocolEnvd is the E2B in-sandbox daemon: Connect process and
	// filesystem services plus the /files routes.
	ProtocolEnvd = "envd"
	// ProtocolAIO is the AIO sandbox HTTP API (/v1/bash/exec, /v1/file/…).
	ProtocolAIO = "aio"
)

// Endpoint is how a sandbox is reached: the provider returns it with the
// sandbox, the store keeps it with the record, and the acquire reply hands
// it to the agent. Core never looks inside the protocol.
type Endpoint struct {
	// Protocol names the wire protocol spoken at URL (ProtocolEnvd,
	// ProtocolAIO).
	Protocol string
	// URL is the protocol's base URL. For envd one URL may serve many
	// sandboxes, routed by the E2b-Sandbox-Id header.
	URL string
	// AccessToken authenticates every call to URL (envd: X-Access-Token;
	// AIO: a bearer token). Secret; may be empty.
	AccessToken string
}

// SandboxRef addresses one sandbox: its id and its endpoint.
type SandboxRef struct {
	ID       string
	Endpoint Endpoint
}

// Capabilities declares what a provider can do beyond the Provider
// methods. The engine asks Provider.Capabilities once, when it is built,
// and consults only this struct: a provider gains an ability by setting a
// field here, never by implementing an interface the engine would have to
// discover. A wrapper around a provider (fault injection, instrumentation)
// that overrides a method a capability names must return a Capabilities
// naming the wrapper, or the engine calls the wrapped provider directly.
type Capabilities struct {
	// Protocol is the wire protocol of the endpoints the provider returns
	// (required). It also describes records stored before endpoints
	// carried their protocol.
	Protocol string
	// Pager lists the inventory one page at a time (E2B pages with a
	// cursor). nil: reconcile lists everything with Provider.List and
	// pages it in memory.
	Pager PagedLister
	// Locate addresses a sandbox's endpoint, its access token included,
	// with a read that neither extends its life nor resumes it (E2B: GET
	// /sandboxes/{id}); ErrSandboxGone when the sandbox is no more.
	// Reconcile gives a sandbox it adopts for its thread this endpoint,
	// so the thread's next acquire can reach it. nil: adopted records
	// carry no endpoint.
	Locate func(ctx context.Context, id string) (Endpoint, error)
	// Pause pauses and resumes sandboxes (memory and files kept). An
	// acquire that finds the thread's sandbox paused resumes it with
	// Pause.Resume; nil: the provider cannot resume, so a sandbox it
	// reports paused is discarded and replaced, never handed out.
	Pause Pauser
	// Discover answers authoritatively whether a sandbox exists (found,
	// absent or unknown), as a plain read may not: a provider's "not
	// found" can come from a redeployed or misrouted backend. The engine
	// frees the slot of a sandbox it no longer sees only on
	// PresenceAbsent. nil: Provider.Info's ErrSandboxGone is the answer.
	//
	// A provider whose inventory carries no metadata (no reservation
	// token or creation time) needs no declaration: its List reports the
	// keys it can derive (thread, user, tenant, and the deployment from a
	// tag in the sandbox id) and reconcile judges sandboxes by those.
	Discover func(ctx context.Context, id string) (Presence, error)
	// Metrics reads a sandbox's resource use between start and end (zero:
	// the provider's default interval), for the sandbox's own tenant.
	// nil: the provider reports no figures (ErrNotOffered).
	Metrics func(ctx context.Context, id string, start, end time.Time) ([]SandboxMetric, error)
}

// SandboxMetric is one sample of a sandbox's resource use, as its
// provider reports it.
type SandboxMetric struct {
	Timestamp  time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    int64 // bytes
	MemTotal   int64
	MemCache   int64
	DiskUsed   int64
	DiskTotal  int64
}

// Pauser pauses and resumes sandboxes (Capabilities.Pause).
type Pauser interface {
	// Pause freezes a running sandbox; it stops counting as running.
	Pause(ctx context.Context, id string) error
	// Resume starts a paused sandbox again, ending it timeout from now.
	Resume(ctx context.Context, id string, timeout time.Duration) error
}

// Presence is Capabilities.Discover's answer.
type Presence int

// Presence values. Only PresenceFound and PresenceAbsent are
// authoritative; PresenceUnknown never frees a slot.
const (
	PresenceUnknown Presence = iota
	PresenceFound
	PresenceAbsent
)

// String names the presence as providers report it.
func (p Presence) String() string {
	switch p {
	case PresenceFound:
		return "found"
	case PresenceAbsent:
		return "absent"
	default:
		return "unknown"
	}
}

// CreateSpec is what Provider.Create needs.
type CreateSpec struct {
	Template string            // provider template id; "" means the provider default
	Timeout  time.Duration     // life before the provider ends it; rounded up to seconds
	Metadata map[string]string // searchable with ListFilter.Metadata
	EnvVars  map[string]string // environment of every process in the sandbox
}

// SandboxInfo is one sandbox as the provider reports it.
type SandboxInfo struct {
	ID         string
	TemplateID string
	Metadata   map[string]string
	State      string // SandboxRunning or SandboxPaused
	StartedAt  time.Time
	EndAt      time.Time // when the provider will end it
}

// SandboxInfo.State values core relies on (a provider may report others,
// e.g. "pending").
const (
	SandboxRunning = "running"
	SandboxPaused  = "paused"
)

// ListFilter selects sandboxes in Provider.List. Every Metadata pair must match.
type ListFilter struct {
	Metadata map[string]string
	States   []string // empty = running and paused
}

// Command is one process to run in a sandbox.
type Command struct {
	// Script is run by bash -c. Never interpolate untrusted values into it:
	// pass them in Env.
	Script string
	// Env is per-call environment; keys must match ^[A-Za-z_][A-Za-z0-9_]*$.
	Env     map[string]string
	Cwd     string
	Timeout time.Duration // 0 = provider default
}

// CommandResult is a finished process. A non-zero ExitCode is not an error.
type CommandResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// Provider is a sandbox provider (E2B, the local host, a provisioner).
//
// Errors: ErrSandboxGone when the provider says the sandbox does not exist
// (or no longer exists); *ProviderError for answers that certainly did not
// apply (4xx); anything else (timeouts, 5xx, transport) is ambiguous: the
// call may or may not have taken effect.
type Provider interface {
	// Name is the backend name reported to clients, e.g. "e2b".
	Name() string
	// Capabilities declares the provider's optional abilities and its
	// endpoints' protocol; it must not change over the provider's life.
	Capabilities() Capabilities
	// Create starts a sandbox. The returned ref carries its endpoint.
	Create(ctx context.Context, spec CreateSpec) (SandboxRef, error)
	// Info reads a sandbox's state without extending its life.
	Info(ctx context.Context, id string) (SandboxInfo, error)
	// List returns every sandbox matching f, following all pages.
	List(ctx context.Context, f ListFilter) ([]SandboxInfo, error)
	// Kill ends a sandbox. nil means confirmed gone (killed now or already
	// absent); any error means the kill is uncertain.
	Kill(ctx context.Context, id string) error
	// SetTimeout makes the sandbox end d from now (rounded up to seconds).
	SetTimeout(ctx context.Context, id string, d time.Duration) error
	// Run runs a command to completion and returns its output.
	Run(ctx context.Context, ref SandboxRef, cmd Command) (CommandResult, error)
	// OpenFile streams a file's bytes. It fails with a *FileTooLargeError
	// once more than maxBytes have been read (maxBytes <= 0: no cap) and
	// with ErrFileNotFound when the path does not exist.
	OpenFile(ctx context.Context, ref SandboxRef, path string, maxBytes int64) (io.ReadCloser, error)
	// WriteFile writes r to path, creating parent directories.
	WriteFile(ctx context.Context, ref SandboxRef, path string, r io.Reader) error
}
