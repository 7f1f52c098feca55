package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bwebhook"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// RouteWebhookE2B takes E2B's signed sandbox lifecycle webhooks. It has
// no authorizer: the signature is the caller's authentication.
const RouteWebhookE2B = "POST /webhooks/e2b"

// WebhookApplier applies a provider's verified lifecycle event
// (*core.Engine).
type WebhookApplier interface {
	ApplyProviderEvent(ctx context.Context, ev core.ProviderEvent) (core.WebhookOutcome, error)
}

// WithE2BWebhook serves RouteWebhookE2B: each delivery's signature is
// verified against secret, then a applies it. Without it (or with an
// empty secret) the route answers 404.
func WithE2BWebhook(secret string, a WebhookApplier) Option {
	return func(h *handler) { h.webhookSecret, h.webhooks = secret, a }
}

// WebhookReply is the 200 answer of RouteWebhookE2B.
type WebhookReply struct {
	Outcome string `json:"outcome"`
}

// webhookKinds maps E2B's event types to the kinds the engine acts on.
var webhookKinds = map[string]core.ProviderEventKind{
	e2bwebhook.TypeKilled:  core.ProviderKilled,
	e2bwebhook.TypePaused:  core.ProviderPaused,
	e2bwebhook.TypeResumed: core.ProviderResumed,
	e2bwebhook.TypeUpdated: core.ProviderUpdated,
}

// webhook serves RouteWebhookE2B: 401 for an unsigned or wrongly signed
// delivery and 400 for a malformed one, before anything is read or
// written; 400 (reason timestamp) for a stale one and 409 (reason
// replayed) for a replay, each changing nothing.
func (h *handler) webhook(ctx context.Context, r *request) events.APIGatewayV2HTTPResponse {
	if h.webhookSecret == "" || h.webhooks == nil {
		return r.errorResponse(http.StatusNotFound, apiError{Code: api.CodeRouteNotFound, Message: "no such route"}, 0)
	}
	body, err := bodyOf(r.ev)
	if err != nil {
		return r.bodyError(err, false)
	}
	if !e2bwebhook.Verify(h.webhookSecret, body, header(r.ev, e2bwebhook.HeaderSignature)) {
		return r.errorResponse(http.StatusUnauthorized, apiError{Code: api.CodeUnauthorized,
			Message: "missing or invalid " + strings.ToLower(e2bwebhook.HeaderSignature) + " header", Reason: api.ReasonSignature}, 0)
	}
	p, err := e2bwebhook.Parse(body)
	if err != nil {
		return r.fail(&core.ValidationError{Field: "body", Message: err.Error()})
	}
	kind, ok := webhookKinds[p.Type]
	if !ok {
		kind = core.ProviderEventKind(p.Type)
	}
	out, err := h.webhooks.ApplyProviderEvent(ctx, core.ProviderEvent{ID: p.ID, Kind: kind, SandboxID: p.SandboxID, At: p.Timestamp})
	if errors.Is(err, core.ErrReplayed) {
		return r.errorResponse(http.StatusConflict, apiError{Code: api.CodeConflict, Message: "this webhook event was applied before",
			Reason: api.ReasonReplayed}, 0)
	}
	if err != nil {
		return r.fail(err)
	}
	return r.json(http.StatusOK, WebhookReply{Outcome: string(out)})
}

// header is the request header name, whatever its case (API Gateway
// lowercases header names; a local gateway may not).
func header(ev events.APIGatewayV2HTTPRequest, name string) string {
	if v, ok := ev.Headers[strings.ToLower(name)]; ok {
		return v
	}
	for k, v := range ev.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}
