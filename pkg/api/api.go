// Package api holds the contract of the broker's HTTP API (v1, JSON): its
// OpenAPI 3.1 document (openapi.yaml), served by the API at
// GET /v1/openapi.json, and the request and reply bodies as Go types: the
// server (internal/httpapi) encodes them and the Go client (pkg/client)
// decodes them, so the two cannot drift. It knows no provider and no
// engine: a sandbox's connection is keyed by its protocol.
package api

import (
	"encoding/json"
	"fmt"
	"time"
)

// Protocols of a Connection (the endpoint protocols of internal/core).
const (
	ProtocolEnvd = "envd" // E2B's in-sandbox daemon (pkg/envd)
	ProtocolAIO  = "aio"  // the AIO sandbox API (pkg/aio)
)

// AcquireRequest is the body of POST /v1/sandboxes/acquire. The server
// reads it strictly: these names, each at most once, user_id and
// thread_id required.
type AcquireRequest struct {
	UserID   string `json:"user_id"`
	ThreadID string `json:"thread_id"`
	// Ticket is the ticket of an earlier AcquireWaiting answer for the
	// same thread: the acquire keeps its place in the wait queue instead
	// of joining at the back. Empty on a first acquire.
	Ticket string `json:"ticket,omitempty"`
}

// AcquireWaiting is the 202 answer of an acquire that waits for a slot
// under the overflow policy wait. The caller repeats the acquire with
// Ticket after RetryAfterSeconds, until it gets the sandbox (200) or a
// refusal; a waiter that stops asking loses its place by itself. Waiting
// holds a place in the queue, never a function invocation.
type AcquireWaiting struct {
	// Ticket is the waiter's place in the queue: opaque, valid for the
	// thread that got it until WaitUntil.
	Ticket            string `json:"ticket"`
	RetryAfterSeconds int    `json:"retry_after_seconds"`
	// WaitUntil is when the wait ends (the deployment's acquire timeout
	// after the first acquire): an acquire still waiting then is refused.
	WaitUntil time.Time `json:"wait_until"`
}

// Connection is how to reach a sandbox, as the acquire reply carries it.
// Its keys depend on the protocol the sandbox speaks (Protocol), never on
// the backend:
//
//   - envd: every sandbox is routed on EnvdURL by its id (E2b-Sandbox-Id
//     header), and EnvdAccessToken is sent as X-Access-Token;
//   - aio (and any other protocol): SandboxURL is the sandbox's API base,
//     and AccessToken, when set, is sent as "Authorization: Bearer".
//
// The tokens are secrets.
type Connection struct {
	// Protocol is ProtocolEnvd or ProtocolAIO ("" from a broker that
	// predates the key: Kind then infers it from the URL present).
	Protocol        string `json:"protocol,omitempty"`
	EnvdURL         string `json:"envd_url,omitempty"`
	EnvdAccessToken string `json:"envd_access_token,omitempty"`
	SandboxURL      string `json:"sandbox_url,omitempty"`
	AccessToken     string `json:"access_token,omitempty"`
}

// EndpointConnection is the connection of an endpoint speaking protocol
// at url with token.
func EndpointConnection(protocol, url, token string) Connection {
	if protocol == ProtocolEnvd {
		return Connection{Protocol: protocol, EnvdURL: url, EnvdAccessToken: token}
	}
	return Connection{Protocol: protocol, SandboxURL: url, AccessToken: token}
}

// MarshalJSON writes an envd connection with both of its keys (an
// unknown token is ""), any other protocol's with sandbox_url and, when
// set, access_token; a connection without a protocol writes the fields
// that are set.
func (c Connection) MarshalJSON() ([]byte, error) {
	type plain Connection
	switch c.Protocol {
	case "":
		return json.Marshal(plain(c))
	case ProtocolEnvd:
		return json.Marshal(struct {
			Protocol        string `json:"protocol"`
			EnvdURL         string `json:"envd_url"`
			EnvdAccessToken string `json:"envd_access_token"`
		}{c.Protocol, c.EnvdURL, c.EnvdAccessToken})
	default:
		return json.Marshal(struct {
			Protocol    string `json:"protocol"`
			SandboxURL  string `json:"sandbox_url"`
			AccessToken string `json:"access_token,omitempty"`
		}{c.Protocol, c.SandboxURL, c.AccessToken})
	}
}

// Kind is the connection's protocol: Protocol when set; else ProtocolAIO
// when SandboxURL is set, ProtocolEnvd when EnvdURL is set, "" when
// neither is.
func (c Connection) Kind() string {
	switch {
	case c.Protocol != "":
		return c.Protocol
	case c.SandboxURL != "":
		return ProtocolAIO
	case c.EnvdURL != "":
		return ProtocolEnvd
	}
	return ""
}

// Sandbox is the reply of POST /v1/sandboxes/acquire: a sandbox handed to
// a thread.
type Sandbox struct {
	SandboxID string `json:"sandbox_id"`
	// State is "active" for a handed-out sandbox.
	State string `json:"state"`
	// Source is how the broker obtained it: reused, reclaimed, resumed or created.
	Source     string     `json:"source"`
	Backend    string     `json:"backend"`
	Connection Connection `json:"connection"`
	// ExpiresAt is when the sandbox stops being the thread's unless it is
	// renewed (POST /v1/sandboxes/{id}/renew); the provider's timer runs a
	// little longer. UTC, whole seconds on the wire; zero when unknown
	// (written as "").
	ExpiresAt time.Time `json:"expires_at"`
	// Restore reports the thread's earlier outputs brought back into the
	// sandbox by this acquire; nil (absent) when none ran.
	Restore *RestoreResult `json:"restore,omitempty"`
	// Previous names the thread's earlier sandbox and why it ended, when
	// this acquire replaced one that ended without the thread asking; nil
	// (absent) otherwise. Only one acquire answers it.
	Previous *Previous `json:"previous,omitempty"`
}

// Previous is a thread's earlier sandbox, as the acquire that replaced it
// names it.
type Previous struct {
	SandboxID string `json:"sandbox_id"`
	// Reason is why it ended: provider_timeout, provider_killed,
	// unresponsive, max_lifetime, or another reason of a sandbox.destroyed
	// event (idle_expired, capacity, ...).
	Reason string `json:"reason"`
}

// RestoreResult reports a restore of a thread's outputs into its sandbox.
// While Complete is false, Remaining files were left by a cap (files,
// bytes, time) and the thread's next acquire or sync continues them,
// never overwriting a file changed in the sandbox since.
type RestoreResult struct {
	Complete  bool           `json:"complete"`
	Restored  int            `json:"restored"`
	Skipped   int            `json:"skipped"`
	Remaining int            `json:"remaining"`
	Bytes     int64          `json:"bytes"`
	Deferred  []DeferredFile `json:"deferred"`
	Excluded  []DeferredFile `json:"excluded"`
}

// MarshalJSON writes expires_at as RFC 3339 in UTC, "" when zero.
func (s Sandbox) MarshalJSON() ([]byte, error) {
	type plain Sandbox
	return json.Marshal(struct {
		plain
		ExpiresAt string `json:"expires_at"`
	}{plain(s), Time(s.ExpiresAt)})
}

// UnmarshalJSON accepts an empty or absent expires_at (zero time).
func (s *Sandbox) UnmarshalJSON(b []byte) error {
	type plain Sandbox
	var w struct {
		plain
		ExpiresAt string `json:"expires_at"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*s = Sandbox(w.plain)
	s.ExpiresAt = time.Time{}
	if w.ExpiresAt != "" {
		t, err := time.Parse(time.RFC3339Nano, w.ExpiresAt)
		if err != nil {
			return fmt.Errorf("expires_at: %w", err)
		}
		s.ExpiresAt = t.UTC()
	}
	return nil
}

// Time is how the API writes a time: RFC 3339 in UTC, "" for the zero time.
func Time(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// Record is the reply of GET /v1/sandboxes/{id}: the broker's record of a
// sandbox, without secrets or lease internals. Times are Time strings.
type Record struct {
	SandboxID string `json:"sandbox_id"`
	State     string `json:"state"`
	UserID    string `json:"user_id"`
	ThreadID  string `json:"thread_id"`
	Backend   string `json:"backend"`
	CreatedAt string `json:"created_at,omitempty"`
	UpdatedAt string `json:"updated_at,omitempty"`
	ParkedAt  string `json:"parked_at,omitempty"`
	ExpiresAt string `json:"expires_at,omitempty"`
	// Source, for an active sandbox, is the source of the acquire that
	// last handed it out (as the acquire reply's); absent otherwise.
	Source string `json:"source,omitempty"`
	// EndReason is why the sandbox ended (a destroying or gone record),
	// as its sandbox.destroyed event names it.
	EndReason string `json:"end_reason,omitempty"`
}

// DeferredFile is an output file a sync pass did not copy, and why.
type DeferredFile struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// SyncResult is the reply of POST /v1/sandboxes/{id}/sync: one pass
// copying outputs/ and workspace/ to S3.
type SyncResult struct {
	Uploaded int `json:"uploaded"`
	Skipped  int `json:"skipped"`
	// Deferred lists files a later pass may still copy, with the reason.
	Deferred []DeferredFile `json:"deferred"`
	// Excluded lists files no pass copies as they are (over the per-file
	// cap, unsafe or too long a name); they do not make a pass incomplete.
	Excluded []DeferredFile `json:"excluded"`
	Bytes    int64          `json:"bytes"`
	// Complete is true when a later pass would copy nothing more.
	Complete bool `json:"complete"`
	// Remaining is how many files of a restore a cap left for a later
	// pass (absent when none).
	Remaining int `json:"remaining,omitempty"`
}

// RenewRequest is the optional body of POST /v1/sandboxes/{id}/renew.
type RenewRequest struct {
	// Seconds is how long from now the sandbox stays the thread's (absent
	// or 0: the deployment's SANDBOX_ACTIVE_TIMEOUT_SECONDS).
	Seconds int `json:"seconds,omitempty"`
}

// RenewResult is the reply of POST /v1/sandboxes/{id}/renew.
type RenewResult struct {
	SandboxID string `json:"sandbox_id"`
	// ExpiresAt is the sandbox's end after the renewal (RFC 3339, UTC):
	// the one asked for, or earlier at the deployment's maximum lifetime,
	// or later when the sandbox already ended later (a renewal never
	// moves an end earlier).
	ExpiresAt string `json:"expires_at"`
}

// ReleaseResult is the reply of POST /v1/sandboxes/{id}/release.
type ReleaseResult struct {
	SandboxID string `json:"sandbox_id"`
	// State is "warm" (parked for the thread), "paused" (parked paused, with
	// SANDBOX_PAUSE_AFTER_SECONDS=0) or "destroyed".
	State string `json:"state"`
	// Sync is the output sync that ran before parking (null if none ran).
	Sync *SyncResult `json:"sync"`
	// SyncError says why the sync failed, when it did.
	SyncError string `json:"sync_error,omitempty"`
}

// Capacity is the reply of GET /v1/capacity: deployment-wide slot usage.
type Capacity struct {
	Limit         int `json:"limit"`
	Used          int `json:"used"`
	Active        int `json:"active"`
	Warm          int `json:"warm"`
	Reserved      int `json:"reserved"`
	Transitioning int `json:"transitioning"`
	Tombstones    int `json:"tombstones"` // destroying: kill not yet confirmed
	// Pool is the pre-warmed pool's members waiting to be claimed (their
	// slots are in Used).
	Pool int `json:"pool"`
	// Granted is the running slots held in trust for waiting acquires,
	// each until its waiter takes it or a dispatch passes on or frees a
	// lapsed grant (they are in Used).
	Granted int `json:"granted"`
	// Paused is the paused slots held (paused sandboxes hold no running
	// slot); PausedLimit bounds them.
	Paused      int    `json:"paused"`
	PausedLimit int    `json:"paused_limit"`
	Policy      string `json:"policy"`
	// Draining is true while the deployment drains.
	Draining bool `json:"draining"`
	// PoolRefill, present while the pre-warmed pool's refill backs off
	// after failed creates, says how many failed and until when it waits.
	PoolRefill *PoolRefill `json:"pool_refill,omitempty"`
	// CountedAt is when reconcile last counted the running slots by state
	// (Active, Warm, Reserved, Transitioning, Tombstones, Pool); zero
	// before its first count. The other fields are read at once.
	CountedAt time.Time `json:"counted_at,omitzero"`
}

// PoolRefill is the pool refill's back-off (Capacity.PoolRefill).
type PoolRefill struct {
	// Failures counts the refill's failed creates since one succeeded.
	Failures int `json:"failures"`
	// BackingOffUntil is when a refill may create again.
	BackingOffUntil time.Time `json:"backing_off_until"`
}

// DrainStatus is the reply of POST /v1/admin/drain and /v1/admin/undrain.
type DrainStatus struct {
	// Draining is true while the deployment is draining: acquires answer
	// 503 with reason "draining" and releases destroy instead of parking.
	Draining bool `json:"draining"`
}

// ErrorReply is the body of every non-2xx reply of the broker.
type ErrorReply struct {
	Error Error `json:"error"`
}

// Error says what failed: a machine-readable Code and Reason, whether a
// retry may succeed and after how long, and Details (e.g. the capacity
// counters of a refusal).
type Error struct {
	Code              string         `json:"code"`
	Message           string         `json:"message"`
	Reason            string         `json:"reason"`
	Retryable         bool           `json:"retryable"`
	RetryAfterSeconds float64        `json:"retry_after_seconds"`
	Details           map[string]any `json:"details,omitempty"`
}
