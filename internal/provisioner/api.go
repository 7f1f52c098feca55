package provisioner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
)

// Sentinel errors of the provisioner API client.
var (
	// ErrCannotIsolateUser: an unverified legacy provisioner (mount contract
	// < 2) was asked to create for a user other than DefaultUser. Nothing
	// was sent.
	ErrCannotIsolateUser = errors.New("legacy provisioner cannot isolate users")
	// ErrIdentityMismatch: a create reply's identity (sandbox id, user,
	// thread) differs from the request, or its contract version is not an
	// integer.
	ErrIdentityMismatch = errors.New("mount contract response does not match the request")
)

// MountContractChangedError: the provisioner's mount contract is not the
// one Create relied on (a 409 mount_contract_changed reply, a reply
// advertising another version, or a provisioner below
// Options.RequiredContract). Capability detection restarts; retry later.
type MountContractChangedError struct {
	Expected int // the version the request relied on
	Actual   int // the version the provisioner reported (-1: none)
}

func (e *MountContractChangedError) Error() string {
	return fmt.Sprintf("provisioner mount contract changed: expected %d, got %d", e.Expected, e.Actual)
}

// Mount is an extra host path mounted into a sandbox pod.
type Mount struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	ReadOnly      bool   `json:"read_only"`
}

// Sandbox is one sandbox as the provisioner reports it.
type Sandbox struct {
	ID  string // sandbox_id
	URL string // sandbox_url: the AIO sandbox API base
	// Status is the pod phase ("Running", "Pending", …); "" when not given.
	Status   string
	UserID   string
	ThreadID string
	// Contract is the mount contract version (HasContract false: absent).
	Contract    int
	HasContract bool
	// Metadata and AccessToken are extensions of the local sandbox host's
	// provisioner (absent from other provisioners).
	Metadata         map[string]string
	AccessToken      string
	IncarnationID    string
	BackendNamespace string
}

// Capabilities is what GET /api/capabilities reported.
type Capabilities struct {
	// Known is false while no probe has succeeded (then Contract is 0: an
	// unverified legacy provisioner).
	Known            bool
	Contract         int
	BackendNamespace string
}

// Discovery statuses (reconciliation discovery).
const (
	DiscoveryFound   = "found"
	DiscoveryAbsent  = "absent"
	DiscoveryUnknown = "unknown"
)

// Discovery is the answer of DiscoverForReconciliation. Only Found and
// Absent are authoritative; Unknown never frees a slot or kills anything.
type Discovery struct {
	Status           string
	Info             *Sandbox // set when Status is DiscoveryFound
	BackendNamespace string
	IncarnationID    string
	Err              error // why the status is unknown, if known
}

// ListSandboxes reads GET /api/sandboxes (10 s). Listing is tolerant:
// entries that are not objects or lack sandbox_id or sandbox_url are
// skipped, and a body that is not {"sandboxes": [...]} yields an empty list
// plus a logged warning.
//
// Errors: a transport failure or non-200 status is an ambiguous
// *core.ProviderError, so that an outage can never pass for an empty
// inventory.
func (c *Client) ListSandboxes(ctx context.Context) ([]Sandbox, error) {
	const op = "list sandboxes"
	r, err := c.call(ctx, c.timeouts.List, http.MethodGet, "/api/sandboxes", nil)
	if err != nil {
		return nil, providerhttp.Transport(op, err)
	}
	if r.status != http.StatusOK {
		pe := statusError(op, r)
		pe.Ambiguous = true
		return nil, pe
	}
	var top any
	if err := decodeJSON(r.body, &top); err != nil {
		c.log.WarnContext(ctx, "provisioner list reply is not JSON; treating as empty", "error", err.Error())
		return []Sandbox{}, nil
	}
	obj, ok := top.(map[string]any)
	if !ok {
		c.log.WarnContext(ctx, "provisioner list reply is not an object; treating as empty")
		return []Sandbox{}, nil
	}
	items, ok := obj["sandboxes"].([]any)
	if !ok {
		c.log.WarnContext(ctx, "provisioner list reply has no sandboxes array; treating as empty")
		return []Sandbox{}, nil
	}
	out := make([]Sandbox, 0, len(items))
	for _, it := range items {
		m, ok := it.(map[string]any)
		if !ok {
			continue
		}
		sb, err := parseSandbox(m)
		if err != nil || sb.ID == "" || sb.URL == "" {
			continue
		}
		out = append(out, sb)
	}
	return out, nil
}

// GetSandbox reads GET /api/sandboxes/{id} (10 s).
//
// Errors: core.ErrSandboxGone on 404; an ambiguous *core.ProviderError on
// 5xx, a transport failure or a malformed 200 reply (never "absent").
func (c *Client) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	const op = "get sandbox"
	r, err := c.call(ctx, c.timeouts.Get, http.MethodGet, "/api/sandboxes/"+url.PathEscape(id), nil)
	if err != nil {
		return Sandbox{}, providerhttp.Transport(op, fmt.Errorf("provisioner health check failed for %s: %w", id, err))
	}
	switch {
	case r.status == http.StatusNotFound:
		return Sandbox{}, fmt.Errorf("provisioner sandbox %s: %w", id, core.ErrSandboxGone)
	case r.status != http.StatusOK:
		pe := statusError(op, r)
		pe.Message = fmt.Sprintf("provisioner health check failed for %s: HTTP %d %s", id, r.status, pe.Message)
		return Sandbox{}, pe
	}
	var m map[string]any
	if err := decodeJSON(r.body, &m); err != nil || m == nil {
		return Sandbox{}, &core.ProviderError{Op: op, StatusCode: r.status, Message: "malformed reply", Ambiguous: true}
	}
	sb, err := parseSandbox(m)
	if err != nil {
		return Sandbox{}, &core.ProviderError{Op: op, StatusCode: r.status, Message: err.Error(), Ambiguous: true}
	}
	if sb.ID == "" {
		sb.ID = id
	}
	return sb, nil
}

// Alive reports whether the sandbox's status is "Running": 404 means not
// alive; 5xx or a transport
// error is an error, never "absent".
func (c *Client) Alive(ctx context.Context, id string) (bool, error) {
	sb, err := c.GetSandbox(ctx, id)
	if errors.Is(err, core.ErrSandboxGone) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return sb.Status == "Running", nil
}

// DeleteSandbox sends DELETE /api/sandboxes/{id} (15 s). A 404 counts as
// already gone (nil).
//
// Errors: a *core.ProviderError (ambiguous for 5xx and transport failures).
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	const op = "delete sandbox"
	r, err := c.call(ctx, c.timeouts.Delete, http.MethodDelete, "/api/sandboxes/"+url.PathEscape(id), nil)
	if err != nil {
		return providerhttp.Transport(op, err)
	}
	if r.status == http.StatusNotFound || (r.status >= 200 && r.status <= 299) {
		return nil
	}
	return statusError(op, r)
}

// DiscoverForReconciliation asks GET /api/reconciliation/sandboxes/{id}
// whether the sandbox exists. Found and absent come only from that route's
// explicit answer carrying a backend namespace that matches the expected
// one (Options.BackendNamespace, else the probed one, else any); a 404
// from an older provisioner, another status, a malformed body or a
// transport error is unknown. With incarnation set, a found sandbox of
// another incarnation (a new pod under the same id) is absent.
func (c *Client) DiscoverForReconciliation(ctx context.Context, id, incarnation string) Discovery {
	r, err := c.call(ctx, c.timeouts.Get, http.MethodGet, "/api/reconciliation/sandboxes/"+url.PathEscape(id), nil)
	if err != nil {
		return Discovery{Status: DiscoveryUnknown, Err: providerhttp.Transport("discover sandbox", err)}
	}
	if r.status != http.StatusOK {
		return Discovery{Status: DiscoveryUnknown, Err: statusError("discover sandbox", r)}
	}
	unknown := func(why string) Discovery {
		return Discovery{Status: DiscoveryUnknown, Err: certain("discover sandbox", why)}
	}
	var m map[string]any
	if err := decodeJSON(r.body, &m); err != nil || m == nil {
		return unknown("malformed reply")
	}
	status, _ := m["status"].(string)
	ns, _ := m["backend_namespace"].(string)
	gotID, _ := m["sandbox_id"].(string)
	inc, _ := m["incarnation_id"].(string)
	if gotID != id {
		return unknown(fmt.Sprintf("reply is about sandbox %q", gotID))
	}
	if ns == "" {
		return unknown("reply carries no backend namespace")
	}
	if want := c.expectedNamespace(); want != "" && ns != want {
		return unknown(fmt.Sprintf("backend namespace %q, want %q", ns, want))
	}
	switch status {
	case DiscoveryAbsent:
		return Discovery{Status: DiscoveryAbsent, BackendNamespace: ns}
	case DiscoveryFound:
		sb, err := parseSandbox(m)
		if err != nil || sb.URL == "" {
			return unknown("malformed found reply")
		}
		if incarnation != "" && inc != incarnation {
			return Discovery{Status: DiscoveryAbsent, BackendNamespace: ns, IncarnationID: inc}
		}
		return Discovery{Status: DiscoveryFound, Info: &sb, BackendNamespace: ns, IncarnationID: inc}
	default:
		return unknown(fmt.Sprintf("status %q", status))
	}
}

// expectedNamespace is the backend namespace discovery answers must carry.
func (c *Client) expectedNamespace() string {
	if c.opts.BackendNamespace != "" {
		return c.opts.BackendNamespace
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.capNamespace
}

// CreateRequest is one sandbox to create.
type CreateRequest struct {
	SandboxID string
	ThreadID  string // "" is sent as null (an anonymous thread)
	UserID    string // "" means DefaultUser
	// ExtraMounts are forwarded as extra_mounts.
	ExtraMounts []Mount
	// RequiredContract, when > 0, overrides Options.RequiredContract.
	RequiredContract int
	// Metadata and Env are extensions understood by the local sandbox
	// host's provisioner (other provisioners ignore unknown fields).
	Metadata map[string]string
	Env      map[string]string
}

// createBody is POST /api/sandboxes's request (metadata and env are this
// broker's extensions; a provisioner that ignores them still creates).
type createBody struct {
	SandboxID        string            `json:"sandbox_id"`
	ThreadID         *string           `json:"thread_id"`
	UserID           string            `json:"user_id"`
	RequiredContract int               `json:"required_mount_contract_version"`
	ExtraMounts      []Mount           `json:"extra_mounts,omitempty"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	Env              map[string]string `json:"env,omitempty"`
}

// CreateSandbox creates a sandbox with POST /api/sandboxes (30 s) under the
// mount contract version known when the call starts (frozen: a capability
// change during the call does not relax the reply's validation).
//
// Errors (none of them ambiguous unless marked):
//   - *MountContractChangedError when the known version is below the
//     required one (nothing sent), on a 409 mount_contract_changed reply, or
//     when a reply advertises another version (a verified one must echo
//     it); capability detection restarts;
//   - ErrCannotIsolateUser for a non-default user on an unverified legacy
//     provisioner (nothing sent);
//   - ErrIdentityMismatch when the reply's identity differs or its version
//     is not an integer;
//   - a *core.ProviderError for other refusals, ambiguous on 5xx/transport.
//
// A refused 200 reply is followed by a delete of the requested id; if that
// delete fails the error is ambiguous (a sandbox may exist).
func (c *Client) CreateSandbox(ctx context.Context, req CreateRequest) (Sandbox, error) {
	const op = "create sandbox"
	if err := core.ValidateSandboxID(req.SandboxID); err != nil {
		return Sandbox{}, err
	}
	user := req.UserID
	if user == "" {
		user = DefaultUser
	}
	caps := c.ensureCapabilities(ctx)
	frozen := caps.Contract
	required := req.RequiredContract
	if required <= 0 {
		required = c.opts.RequiredContract
	}
	if required > 0 && frozen < required {
		c.invalidateCapabilities()
		return Sandbox{}, &MountContractChangedError{Expected: required, Actual: frozen}
	}
	if frozen < MinIsolatingContract && user != DefaultUser {
		return Sandbox{}, providerhttp.WithCause(certain(op, fmt.Sprintf("cannot isolate user '%s' on an unverified legacy provisioner (mount contract %d)", user, frozen)), ErrCannotIsolateUser)
	}
	body := createBody{SandboxID: req.SandboxID, UserID: user, RequiredContract: frozen,
		ExtraMounts: req.ExtraMounts, Metadata: req.Metadata, Env: req.Env}
	if req.ThreadID != "" {
		t := req.ThreadID
		body.ThreadID = &t
	}
	r, err := c.call(ctx, c.timeouts.Create, http.MethodPost, "/api/sandboxes", body)
	if err != nil {
		return Sandbox{}, providerhttp.Transport(op, fmt.Errorf("provisioner create failed: %w", err))
	}
	if r.status == http.StatusConflict {
		if mc, ok := contractConflict(r.body); ok {
			c.invalidateCapabilities()
			if mc.Expected == 0 {
				mc.Expected = frozen
			}
			return Sandbox{}, mc
		}
	}
	if r.status < 200 || r.status > 299 {
		pe := statusError(op, r)
		pe.Message = "provisioner create failed: " + pe.Message
		return Sandbox{}, pe
	}
	var m map[string]any
	if err := decodeJSON(r.body, &m); err != nil || m == nil {
		return Sandbox{}, c.refuseCreated(ctx, req.SandboxID, &core.ProviderError{Op: op, StatusCode: r.status, Message: "malformed create reply"})
	}
	sb, perr := parseSandbox(m)
	if perr != nil {
		return Sandbox{}, c.refuseCreated(ctx, req.SandboxID, providerhttp.WithCause(certain(op, perr.Error()), ErrIdentityMismatch))
	}
	verified := frozen >= MinIsolatingContract
	switch {
	case verified && (!sb.HasContract || sb.Contract != frozen):
		c.invalidateCapabilities()
		actual := -1
		if sb.HasContract {
			actual = sb.Contract
		}
		return Sandbox{}, c.refuseCreated(ctx, req.SandboxID, &MountContractChangedError{Expected: frozen, Actual: actual})
	case !verified && sb.HasContract && sb.Contract != frozen:
		c.invalidateCapabilities()
		return Sandbox{}, c.refuseCreated(ctx, req.SandboxID, &MountContractChangedError{Expected: frozen, Actual: sb.Contract})
	}
	if sb.ID != req.SandboxID || sb.URL == "" {
		return Sandbox{}, c.refuseCreated(ctx, req.SandboxID, providerhttp.WithCause(certain(op,
			fmt.Sprintf("mount contract response: sandbox %q (url %q), want %q", sb.ID, sb.URL, req.SandboxID)), ErrIdentityMismatch))
	}
	if verified && (sb.UserID != user || sb.ThreadID != req.ThreadID) {
		return Sandbox{}, c.refuseCreated(ctx, req.SandboxID, providerhttp.WithCause(certain(op,
			fmt.Sprintf("mount contract response identity user=%q thread=%q, want user=%q thread=%q", sb.UserID, sb.ThreadID, user, req.ThreadID)), ErrIdentityMismatch))
	}
	return sb, nil
}

// refuseCreated kills (deletes and confirms gone) a sandbox whose create
// was refused after the provisioner accepted it; if that fails, the
// refusal becomes ambiguous (the sandbox may exist).
func (c *Client) refuseCreated(ctx context.Context, id string, refusal error) error {
	dctx, cancel := core.CleanupContext(ctx, c.timeouts.Delete+c.timeouts.KillConfirm)
	defer cancel()
	if err := c.Kill(dctx, id); err != nil {
		return errors.Join(refusal, &core.ProviderError{Op: "create sandbox", Ambiguous: true,
			Message: fmt.Sprintf("cleanup delete of refused sandbox %s failed: %v", id, err)})
	}
	return refusal
}

// contractConflict parses a 409 {"detail": {"code": "mount_contract_changed",
// "expected": N, "actual": M}} reply.
func contractConflict(body []byte) (*MountContractChangedError, bool) {
	var v struct {
		Detail struct {
			Code     string `json:"code"`
			Expected int    `json:"expected"`
			Actual   int    `json:"actual"`
		} `json:"detail"`
	}
	if json.Unmarshal(body, &v) != nil || v.Detail.Code != "mount_contract_changed" {
		return nil, false
	}
	return &MountContractChangedError{Expected: v.Detail.Expected, Actual: v.Detail.Actual}, true
}

// ServiceCapabilities returns the provisioner service's capabilities
// (GET /api/capabilities), probing first when the cached answer is stale
// (see ensureCapabilities).
func (c *Client) ServiceCapabilities(ctx context.Context) Capabilities {
	return c.ensureCapabilities(ctx)
}

// ensureCapabilities probes GET /api/capabilities (5 s) when the cached
// answer is stale, and returns the current state. A 404 means a legacy
// provisioner (contract 0, known). A failure keeps the previous state and
// backs off 1, 2, 4 … s, capped at 30 s (without overflow after any number
// of failures); a fresh answer is trusted for Options.CapabilityTTL.
// Concurrent callers wait for the one probe in flight.
func (c *Client) ensureCapabilities(ctx context.Context) Capabilities {
	if caps, fresh := c.cachedCapabilities(); fresh {
		return caps
	}
	c.probeMu.Lock()
	defer c.probeMu.Unlock()
	if caps, fresh := c.cachedCapabilities(); fresh {
		return caps
	}
	caps, err := c.probe(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if err != nil {
		c.failures++
		c.nextProbe = now.Add(probeBackoff(c.failures))
		c.log.WarnContext(ctx, "provisioner capability probe failed", "failures", c.failures, "error", err.Error())
	} else {
		c.failures = 0
		c.capKnown, c.capVersion, c.capNamespace = true, caps.Contract, caps.BackendNamespace
		c.nextProbe = now.Add(c.opts.CapabilityTTL)
	}
	return Capabilities{Known: c.capKnown, Contract: c.capVersion, BackendNamespace: c.capNamespace}
}

// cachedCapabilities returns the state and whether it needs no probe.
func (c *Client) cachedCapabilities() (Capabilities, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	caps := Capabilities{Known: c.capKnown, Contract: c.capVersion, BackendNamespace: c.capNamespace}
	return caps, !c.nextProbe.IsZero() && c.now().Before(c.nextProbe)
}

// invalidateCapabilities restarts capability detection: the next caller probes.
func (c *Client) invalidateCapabilities() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capKnown = false
	c.nextProbe = time.Time{}
}

// probeBackoff is the wait after n consecutive probe failures: 2^(n-1) s,
// capped at 30 s; computed without shifting by large n.
func probeBackoff(n int) time.Duration {
	const ceiling = 30 * time.Second
	if n <= 0 {
		return 0
	}
	if n > 5 {
		return ceiling
	}
	return min(time.Duration(1<<(n-1))*time.Second, ceiling)
}

// probe performs one GET /api/capabilities.
func (c *Client) probe(ctx context.Context) (Capabilities, error) {
	r, err := c.call(ctx, c.timeouts.Probe, http.MethodGet, "/api/capabilities", nil)
	if err != nil {
		return Capabilities{}, err
	}
	if r.status == http.StatusNotFound {
		return Capabilities{Known: true}, nil // legacy provisioner
	}
	if r.status != http.StatusOK {
		return Capabilities{}, fmt.Errorf("capabilities: HTTP %d %s", r.status, replyMessage(r.body))
	}
	var m map[string]any
	if err := decodeJSON(r.body, &m); err != nil || m == nil {
		return Capabilities{}, errors.New("capabilities: malformed reply")
	}
	v, ok, err := intField(m, "mount_contract_version")
	if err != nil {
		return Capabilities{}, fmt.Errorf("capabilities: %w", err)
	}
	if !ok {
		v = 0
	}
	ns, _ := m["backend_namespace"].(string)
	return Capabilities{Known: true, Contract: v, BackendNamespace: ns}, nil
}

// decodeJSON decodes b keeping numbers exact (json.Number).
func decodeJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}

// intField reads an integer field: absent or null is (0, false, nil); a
// string, bool or fraction is an error (a contract version must be an
// integer to be trusted).
func intField(m map[string]any, key string) (int, bool, error) {
	raw, ok := m[key]
	if !ok || raw == nil {
		return 0, false, nil
	}
	n, ok := raw.(json.Number)
	if !ok {
		return 0, false, fmt.Errorf("%s is %T, want an integer", key, raw)
	}
	i, err := n.Int64()
	if err != nil || i < 0 || i > 1<<31 {
		return 0, false, fmt.Errorf("%s %q is not a non-negative integer", key, n.String())
	}
	return int(i), true, nil
}

// parseSandbox reads a sandbox object. Only a malformed contract version is
// an error; string fields of other types read as empty.
func parseSandbox(m map[string]any) (Sandbox, error) {
	str := func(k string) string { s, _ := m[k].(string); return s }
	sb := Sandbox{ID: str("sandbox_id"), URL: str("sandbox_url"), Status: str("status"), UserID: str("user_id"),
		ThreadID: str("thread_id"), AccessToken: str("access_token"), IncarnationID: str("incarnation_id"),
		BackendNamespace: str("backend_namespace")}
	v, ok, err := intField(m, "mount_contract_version")
	if err != nil {
		return sb, fmt.Errorf("mount contract response: %w", err)
	}
	sb.Contract, sb.HasContract = v, ok
	if md, ok := m["metadata"].(map[string]any); ok {
		sb.Metadata = make(map[string]string, len(md))
		for k, v := range md {
			if s, ok := v.(string); ok {
				sb.Metadata[k] = s
			}
		}
	}
	sb.URL = strings.TrimRight(sb.URL, "/")
	return sb, nil
}
