package stack

import (
	"time"

	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/httpapi"
	"github.com/sandbox-broker/sandbox-broker/internal/wiring"
)

// publishingMethods are the engine's calls that publish lifecycle events
// (they create, hand over, park or destroy sandboxes); Get, Capacity and
// SetDraining change no sandbox and publish none.
var publishingMethods = map[string]bool{"Acquire": true, "Release": true, "Sync": true, "Reconcile": true, "RefillPool": true}

// callRecorder is a core.Broker (and pool refiller) that notes which of its
// methods a handler calls and answers each with core.ErrNotFound.
type callRecorder struct{ called map[string]bool }

var _ core.Broker = (*callRecorder)(nil)

func (c *callRecorder) note(m string) error { c.called[m] = true; return core.ErrNotFound }
func (c *callRecorder) AcquireOrWait(context.Context, core.AcquireRequest) (core.AcquireResult, error) {
	return core.AcquireResult{}, c.note("Acquire")
}
func (c *callRecorder) Release(context.Context, string, string) (core.ReleaseResult, error) {
	return core.ReleaseResult{}, c.note("Release")
}
func (c *callRecorder) ReleaseWith(context.Context, string, string, core.ReleaseOptions) (core.ReleaseResult, error) {
	return core.ReleaseResult{}, c.note("ReleaseWith")
}
func (c *callRecorder) Sandboxes(context.Context, string, string, int) ([]core.Record, string, error) {
	return nil, "", c.note("Sandboxes")
}
func (c *callRecorder) Sync(context.Context, string, string) (core.SyncResult, error) {
	return core.SyncResult{}, c.note("Sync")
}
func (c *callRecorder) Renew(context.Context, string, string, time.Duration) (core.RenewResult, error) {
	return core.RenewResult{}, c.note("Renew")
}
func (c *callRecorder) Get(context.Context, string, string) (core.Record, error) {
	return core.Record{}, c.note("Get")
}
func (c *callRecorder) Metrics(context.Context, string, string, time.Time, time.Time) ([]core.SandboxMetric, error) {
	return nil, c.note("Metrics")
}
func (c *callRecorder) Capacity(context.Context) (core.CapacityStatus, error) {
	return core.CapacityStatus{}, c.note("Capacity")
}
func (c *callRecorder) Reconcile(context.Context) (core.ReconcileStats, error) {
	return core.ReconcileStats{}, c.note("Reconcile")
}
func (c *callRecorder) SetDraining(context.Context, bool) error { return c.note("SetDraining") }
func (c *callRecorder) RefillPool(context.Context) (core.PoolStats, error) {
	return core.PoolStats{}, c.note("RefillPool")
}

// brokerCalls serves one request of every route of f (and, for a scheduled
// function, a scheduled pass and a pool-refill event) through the
// functions' real handlers and returns the engine methods they called.
func brokerCalls(t *testing.T, f Function) []string {
	t.Helper()
	rec := &callRecorder{called: map[string]bool{}}
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	const tenant = "acme"
	h := httpapi.NewHandler(rec, logger, httpapi.WithAdminTenants(tenant))
	for _, r := range f.Routes {
		path := strings.NewReplacer("{id}", "sbx-1", "{proxy+}", "sandboxes").Replace(r.Path)
		method := r.Method
		if method == "ANY" {
			method = "POST"
		}
		ev := events.APIGatewayV2HTTPRequest{
			Version: "2.0", RouteKey: r.Key(), RawPath: path, PathParameters: map[string]string{"id": "sbx-1"},
			RequestContext: events.APIGatewayV2HTTPRequestContext{
				HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: method, Path: path},
				Authorizer: &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
					JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"tenant": tenant}},
				},
			},
		}
		if r.Path == "/v1/sandboxes/acquire" {
			ev.Body = `{"user_id":"u1","thread_id":"t-1"}`
		}
		if _, err := h(context.Background(), ev); err != nil {
			t.Fatalf("%s %s: %v", f.Name, r.Key(), err)
		}
	}
	if f.Schedule != "" {
		handle := wiring.ReconcileHandler(rec, logger)
		_, _ = handle(context.Background(), events.EventBridgeEvent{DetailType: "Scheduled Event", Source: "aws.events"})
		_, _ = handle(context.Background(), events.EventBridgeEvent{DetailType: wiring.PoolRefillDetailType, Source: wiring.PoolRefillSource})
	}
	return slices.Sorted(maps.Keys(rec.called))
}

// TestPublishesEventsFlag pins Function.PublishesEvents (which decides
// EVENT_BUS_NAME and events:PutEvents in both templates) to what each
// function's routes and schedule call: a function is flagged exactly when
// it reaches an engine method that publishes lifecycle events.
func TestPublishesEventsFlag(t *testing.T) {
	for _, f := range Functions {
		calls := brokerCalls(t, f)
		if len(calls) == 0 {
			t.Errorf("%s: its routes reached no engine method (a route not served?)", f.Name)
		}
		publishes := slices.ContainsFunc(calls, func(m string) bool { return publishingMethods[m] })
		if publishes != f.PublishesEvents {
			t.Errorf("%s: calls %v, which publish events: %v; PublishesEvents = %v", f.Name, calls, publishes, f.PublishesEvents)
		}
	}
}
