package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// One-off threads: an E2B create without user_id and thread_id in its
// metadata gets a thread of its own, named OneOffPrefix + a random id
// under the user OneOffUser; kill destroys its sandbox (outputs stored
// first) instead of parking it, since no thread comes back to it.
const (
	OneOffPrefix = "oneoff-"
	OneOffUser   = "e2b"
)

// IsOneOff reports whether k is a one-off thread's.
func IsOneOff(k core.ThreadKey) bool {
	return k.User == OneOffUser && strings.HasPrefix(k.Thread, OneOffPrefix)
}

// e2bCreateFields are the create body's members the SDKs send; those
// after timeout must be absent, null or their default.
var e2bCreateFields = []string{"templateID", "metadata", "envVars", "timeout", "secure", "allow_internet_access", "autoPause",
	"autoPauseMemory", "autoResume", "mcp", "network", "iam", "volumeMounts"}

// e2bCreate is create: acquire for the thread in metadata (a one-off
// thread without one). The lease's length is the deployment's: timeout
// is accepted and read as a wish the broker's renewal will honour.
func (h *handler) e2bCreate(ctx context.Context, r *request, body []byte) events.APIGatewayV2HTTPResponse {
	req, err := h.decodeE2BCreate(body)
	if err != nil {
		return r.e2bInvalid(err)
	}
	key, err := e2bThread(r.tenant, req.Metadata)
	if err != nil {
		return r.e2bInvalid(err)
	}
	res, err := h.broker.AcquireOrWait(ctx, core.AcquireRequest{Key: key})
	if err != nil {
		return r.e2bFail(err, "")
	}
	if w := res.Waiting; w != nil {
		// The wait queue's ticket is dropped: the SDK's own retry of the
		// 429 joins the queue again.
		secs := max(1, int((w.RetryAfter+time.Second-1)/time.Second))
		return r.e2bError(http.StatusTooManyRequests, api.CodeCapacityExceeded,
			"sandbox capacity exceeded: waiting for a slot, retry after "+fmt.Sprint(secs)+"s", secs)
	}
	return h.e2bHandOut(ctx, r, res.Record, http.StatusCreated, true)
}

// decodeE2BCreate reads create's body strictly: known members only, and
// none asking for what the broker cannot honour.
func (h *handler) decodeE2BCreate(body []byte) (e2bapi.NewSandbox, error) {
	var req e2bapi.NewSandbox
	if len(bytes.TrimSpace(body)) == 0 {
		return req, nil
	}
	raw, err := strictObject(body, "must be E2B's NewSandbox JSON object", e2bCreateFields...)
	if err != nil {
		return req, err
	}
	bad := func(field, msg string) error { return &core.ValidationError{Field: field, Message: msg} }
	for _, f := range []struct {
		name string
		dst  any
	}{{"templateID", &req.TemplateID}, {"metadata", &req.Metadata}, {"envVars", &req.EnvVars}, {"timeout", &req.Timeout}} {
		if v, ok := raw[f.name]; ok && json.Unmarshal(v, f.dst) != nil {
			return req, bad(f.name, "has the wrong type")
		}
	}
	if t := req.TemplateID; t != "" && t != "base" && t != h.e2bTemplate {
		return req, bad("templateID", fmt.Sprintf("%q is not this deployment's template: sandbox-broker runs one template (%q); omit templateID or use \"base\"", t, h.e2bTemplate))
	}
	if len(req.EnvVars) > 0 {
		return req, bad("envVars", "sandbox-wide environment variables are not offered: a thread's sandbox is reused, so they cannot be applied at create; pass them per command (commands.run(cmd, {envs}))")
	}
	if req.Timeout != nil && *req.Timeout < 0 {
		return req, bad("timeout", "must be zero or more seconds")
	}
	for name, want := range map[string]string{"secure": "", "allow_internet_access": "true", "autoPause": "false", "autoPauseMemory": "",
		"autoResume": "null", "mcp": "null", "network": "null", "iam": "null", "volumeMounts": "null"} {
		v, ok := raw[name]
		got := string(bytes.TrimSpace(v))
		if ok && want != "" && got != want && got != "null" {
			return req, bad(name, fmt.Sprintf("is not offered by sandbox-broker (got %s): the deployment sets its sandboxes' network, lifecycle and mounts", got))
		}
	}
	return req, nil
}

// e2bThread is the thread a create names in metadata (user_id and
// thread_id), or a new one-off thread when it names none.
func e2bThread(tenant string, md map[string]string) (core.ThreadKey, error) {
	user, hasUser := md["user_id"]
	thread, hasThread := md["thread_id"]
	if !hasUser && !hasThread {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		return core.ThreadKey{Tenant: tenant, User: OneOffUser, Thread: OneOffPrefix + hex.EncodeToString(b)}, nil
	}
	if !hasUser || !hasThread {
		return core.ThreadKey{}, &core.ValidationError{Field: "metadata", Message: "must carry both user_id and thread_id (or neither, for a one-off sandbox)"}
	}
	key := core.ThreadKey{Tenant: tenant, User: user, Thread: thread}
	if err := key.Validate(); err != nil {
		return core.ThreadKey{}, err
	}
	return key, nil
}

// e2bHandOut answers create or connect with rec, a sandbox handed out.
// A sandbox the SDK cannot drive (not envd) is refused, and handed back
// when this call acquired it.
func (h *handler) e2bHandOut(ctx context.Context, r *request, rec core.Record, status int, acquired bool) events.APIGatewayV2HTTPResponse {
	if rec.Endpoint.Protocol != core.ProtocolEnvd && acquired {
		if _, err := h.broker.ReleaseWith(ctx, r.tenant, rec.SandboxID, core.ReleaseOptions{Destroy: IsOneOff(rec.ThreadKey)}); err != nil {
			r.detail = "hand back a non-envd sandbox: " + err.Error()
		}
	}
	if rec.Endpoint.Protocol != core.ProtocolEnvd {
		return r.e2bError(http.StatusBadRequest, api.CodeValidation, fmt.Sprintf(
			"sandbox %q runs on backend %q, reached by the %s protocol, not E2B's envd: the E2B SDK cannot work in it; "+
				"use the connection of POST /v1/sandboxes/acquire", rec.SandboxID, rec.Backend, rec.Endpoint.Protocol), 0)
	}
	return r.json(status, e2bapi.Sandbox{
		SandboxID:       rec.SandboxID,
		TemplateID:      h.templateID(),
		ClientID:        e2bClientID,
		EnvdVersion:     E2BEnvdVersion,
		EnvdAccessToken: rec.Endpoint.AccessToken,
		Domain:          e2bapi.DomainOf(rec.SandboxID, rec.Endpoint.URL),
	})
}

// templateID is the template the E2B replies name.
func (h *handler) templateID() string {
	if h.e2bTemplate == "" {
		return "base"
	}
	return h.e2bTemplate
}

// e2bConnect is connect (and the older resume): the tenant's active
// sandbox as it is; a parked one (warm or paused) is taken back for its
// thread through acquire (source reclaimed or resumed).
func (h *handler) e2bConnect(ctx context.Context, r *request, id string, body []byte) events.APIGatewayV2HTTPResponse {
	if _, err := strictObject(orEmpty(body), "must be {} or {\"timeout\"}", "timeout", "autoPause"); err != nil {
		return r.e2bInvalid(err)
	}
	rec, err := h.broker.Get(ctx, r.tenant, id)
	if err != nil {
		return r.e2bFail(err, id)
	}
	switch rec.State {
	case core.StateActive:
		return h.e2bHandOut(ctx, r, rec, http.StatusOK, false)
	case core.StateWarm, core.StatePaused:
	case core.StateDestroying, core.StateGone:
		return r.e2bNotFound(id)
	default: // moving between states: the SDK retries a 429
		return r.e2bError(http.StatusTooManyRequests, api.CodeConflict, fmt.Sprintf("sandbox %q is %s, retry in a moment", id, rec.State), 1)
	}
	res, err := h.broker.AcquireOrWait(ctx, core.AcquireRequest{Key: rec.ThreadKey})
	if err != nil {
		return r.e2bFail(err, id)
	}
	if res.Waiting != nil {
		secs := max(1, int((res.Waiting.RetryAfter+time.Second-1)/time.Second))
		return r.e2bError(http.StatusTooManyRequests, api.CodeCapacityExceeded, "sandbox capacity exceeded: waiting for a slot to resume it", secs)
	}
	if res.Record.SandboxID != id {
		// The parked sandbox was gone: its thread got another one, which
		// this call did not ask for.
		_, _ = h.broker.ReleaseWith(ctx, r.tenant, res.Record.SandboxID, core.ReleaseOptions{Destroy: IsOneOff(rec.ThreadKey)})
		return r.e2bNotFound(id)
	}
	return h.e2bHandOut(ctx, r, res.Record, http.StatusCreated, true)
}

func orEmpty(body []byte) []byte {
	if len(bytes.TrimSpace(body)) == 0 {
		return []byte("{}")
	}
	return body
}

// e2bRelease is kill and pause: a release, parked paused at once where
// the deployment pauses (as SANDBOX_PAUSE_AFTER_SECONDS=0 does), else
// warm. Kill parks paused too: on E2B a killed sandbox stops running, and
// the SDK's isRunning() asks envd, which answers "not running" for a
// paused sandbox; its thread's next create resumes it. A one-off's
// sandbox is destroyed at kill. Only an active sandbox is released: kill
// of a parked one is E2B's "not running" (404), pause of one E2B's
// "already paused" (409).
func (h *handler) e2bRelease(ctx context.Context, r *request, route, id string, body []byte) events.APIGatewayV2HTTPResponse {
	fields := []string{}
	if route == e2bRoutePause {
		fields = []string{"memory"}
	}
	if _, err := strictObject(orEmpty(body), "must be empty or {}", fields...); err != nil {
		return r.e2bInvalid(err)
	}
	rec, err := h.broker.Get(ctx, r.tenant, id)
	if err != nil {
		return r.e2bFail(err, id)
	}
	if rec.State != core.StateActive {
		if route == e2bRoutePause && rec.State != core.StateDestroying && rec.State != core.StateGone {
			return r.e2bError(http.StatusConflict, api.CodeConflict, fmt.Sprintf("sandbox %q is already %s", id, rec.State), 0)
		}
		return r.e2bNotFound(id)
	}
	opts := core.ReleaseOptions{Pause: true, Destroy: route == e2bRouteKill && IsOneOff(rec.ThreadKey)}
	res, err := h.broker.ReleaseWith(ctx, r.tenant, id, opts)
	if err != nil {
		return r.e2bFail(err, id)
	}
	if res.Sync != nil {
		r.metrics = append(r.metrics, core.SyncMetrics(*res.Sync)...)
	}
	return events.APIGatewayV2HTTPResponse{StatusCode: http.StatusNoContent, Headers: map[string]string{"Cache-Control": "no-store"}}
}

// e2bKeepAlive is set timeout and refresh: a renewal of the tenant's
// active sandbox (204); 404 when it is not running.
func (h *handler) e2bKeepAlive(ctx context.Context, r *request, route, id string, body []byte) events.APIGatewayV2HTTPResponse {
	field := "timeout"
	if route == e2bRouteRefresh {
		field = "duration"
	}
	raw, err := strictObject(orEmpty(body), "must be {\""+field+"\": seconds}", field)
	if err != nil {
		return r.e2bInvalid(err)
	}
	var secs int
	if v, ok := raw[field]; ok {
		if err := json.Unmarshal(v, &secs); err != nil || secs <= 0 {
			return r.e2bInvalid(&core.ValidationError{Field: field, Message: "must be a positive whole number of seconds"})
		}
	}
	// Renewal: the lease and the provider's timer move together (0: the
	// deployment's active timeout).
	if _, err := h.broker.Renew(ctx, r.tenant, id, time.Duration(secs)*time.Second); err != nil {
		if errors.Is(err, core.ErrConflict) {
			return r.e2bNotFound(id) // not running: E2B's answer for a sandbox it does not run
		}
		return r.e2bFail(err, id)
	}
	return events.APIGatewayV2HTTPResponse{StatusCode: http.StatusNoContent, Headers: map[string]string{"Cache-Control": "no-store"}}
}
