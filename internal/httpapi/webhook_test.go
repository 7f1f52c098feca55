package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bwebhook"
	"github.com/sandbox-broker/sandbox-broker/internal/memstore"
)

const testWebhookSecret = "whsec-test"

// webhookEvent is a delivery of body to RouteWebhookE2B, signed with sig
// ("" = unsigned), with no authorizer context (the route has none).
func webhookEvent(body, sig string) events.APIGatewayV2HTTPRequest {
	ev := event(RouteWebhookE2B, "/webhooks/e2b", body, "", nil)
	ev.Headers = map[string]string{"content-type": "application/json"}
	if sig != "" {
		ev.Headers["e2b-signature"] = sig
		ev.Headers["e2b-signature-version"] = e2bwebhook.SignatureVersion
	}
	return ev
}

// killedBody is E2B's killed event id about sandbox sb at at.
func killedBody(id, sb string, at time.Time) string {
	return fmt.Sprintf(`{"version":"v2","id":%q,"type":"sandbox.lifecycle.killed","eventData":{"sandbox_metadata":{}},"sandboxId":%q,"sandboxTeamId":"team","timestamp":%q}`,
		id, sb, at.UTC().Format(time.RFC3339))
}

// webhookEngine is an engine over an in-memory store and a fake provider
// holding one thread's active sandbox.
func webhookEngine(t *testing.T) (*core.Engine, *memstore.Store, core.Record) {
	t.Helper()
	s := core.DefaultSettings()
	s.Deployment = "test"
	store := memstore.New()
	eng, err := core.New(s, store, coretest.NewFakeProvider(), nil)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	res, err := eng.Acquire(context.Background(), core.ThreadKey{Tenant: "acme", User: "u", Thread: "t"})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return eng, store, res.Record
}

// TestWebhookRefusalsChangeNothing: an unsigned, forged, malformed, stale
// or replayed delivery is refused with its own answer, and the sandbox
// keeps its slot; a signed one frees it.
func TestWebhookRefusalsChangeNothing(t *testing.T) {
	eng, store, rec := webhookEngine(t)
	now := time.Now()
	good := killedBody("ev1", rec.SandboxID, now)
	signed := func(body string) events.APIGatewayV2HTTPRequest {
		return webhookEvent(body, e2bwebhook.Sign(testWebhookSecret, []byte(body)))
	}
	forged := webhookEvent(good, e2bwebhook.Sign("not-the-secret", []byte(good)))
	tampered := webhookEvent(strings.Replace(good, "killed", "paused", 1), e2bwebhook.Sign(testWebhookSecret, []byte(good)))
	for _, tc := range []struct {
		name   string
		ev     events.APIGatewayV2HTTPRequest
		status int
		reason string
	}{
		{"unsigned", webhookEvent(good, ""), http.StatusUnauthorized, "signature"},
		{"forged", forged, http.StatusUnauthorized, "signature"},
		{"tampered", tampered, http.StatusUnauthorized, "signature"},
		{"malformed", signed(`{"id":"x"}`), http.StatusBadRequest, "body"},
		{"stale", signed(killedBody("ev0", rec.SandboxID, now.Add(-10*time.Minute))), http.StatusBadRequest, "timestamp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body, _ := serve(t, eng, tc.ev, WithE2BWebhook(testWebhookSecret, eng))
			e, _ := body["error"].(map[string]any)
			if resp.StatusCode != tc.status || e["reason"] != tc.reason {
				t.Fatalf("status %d reason %v, want %d %s: %s", resp.StatusCode, e["reason"], tc.status, tc.reason, resp.Body)
			}
			if got, _ := store.Get(context.Background(), rec.SandboxID); got.State != core.StateActive {
				t.Errorf("record %s after a refused webhook, want active", got.State)
			}
		})
	}
	resp, body, _ := serve(t, eng, signed(good), WithE2BWebhook(testWebhookSecret, eng))
	if resp.StatusCode != http.StatusOK || body["outcome"] != "applied" {
		t.Fatalf("signed webhook: status %d body %s, want 200 applied", resp.StatusCode, resp.Body)
	}
	if got, _ := store.Get(context.Background(), rec.SandboxID); got.State != core.StateGone {
		t.Errorf("record %s after the killed webhook, want gone", got.State)
	}
	resp, body, _ = serve(t, eng, signed(good), WithE2BWebhook(testWebhookSecret, eng))
	if e, _ := body["error"].(map[string]any); resp.StatusCode != http.StatusConflict || e["reason"] != "replayed" {
		t.Errorf("replay: status %d body %s, want 409 replayed", resp.StatusCode, resp.Body)
	}
}

// TestWebhookRouteNeedsItsSecret: without a configured secret the route
// does not exist, signed or not.
func TestWebhookRouteNeedsItsSecret(t *testing.T) {
	body := killedBody("ev1", "sb1", time.Now())
	resp, _, _ := serve(t, &fakeBroker{}, webhookEvent(body, e2bwebhook.Sign("", []byte(body))))
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("status %d, want 404 without a webhook secret", resp.StatusCode)
	}
}
