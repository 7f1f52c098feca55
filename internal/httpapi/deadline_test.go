package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/memstore"
)

// deadlineBroker records the deadline of the ctx each acquire gets.
type deadlineBroker struct {
	fakeBroker
	mu   sync.Mutex
	seen []time.Time
}

func (b *deadlineBroker) AcquireOrWait(ctx context.Context, req core.AcquireRequest) (core.AcquireResult, error) {
	dl, _ := ctx.Deadline()
	b.mu.Lock()
	b.seen = append(b.seen, dl)
	b.mu.Unlock()
	return b.fakeBroker.AcquireOrWait(ctx, req)
}

// arrivedAt is an acquire event that reached API Gateway at arrival
// (requestContext.timeEpoch; the zero time leaves it out).
func arrivedAt(arrival time.Time) events.APIGatewayV2HTTPRequest {
	ev := event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil)
	if !arrival.IsZero() {
		ev.RequestContext.TimeEpoch = arrival.UnixMilli()
	}
	return ev
}

// TestAnswerDeadlineCountsTheColdStart: the broker's ctx ends at the
// earlier of the function's deadline and the request's arrival at API
// Gateway plus 29 s. A request that arrived 8 s before its invocation
// started (a cold start's init) gets a deadline before arrival + 30 s,
// although the function's own 29 s run to arrival + 37 s. Without an
// arrival time, or with one the gateway gave up on long ago (a canned
// test event), the function's deadline stands.
func TestAnswerDeadlineCountsTheColdStart(t *testing.T) {
	arrival := when
	for _, tt := range []struct {
		name    string
		arrival time.Time
		start   time.Duration // the invocation's start, after arrival
		timeout time.Duration // the function's
		want    time.Time
	}{
		{"cold start", arrival, 8 * time.Second, 29 * time.Second, arrival.Add(29 * time.Second)},
		{"warm", arrival, 50 * time.Millisecond, 29 * time.Second, arrival.Add(29 * time.Second)},
		{"function ends first", arrival, 8 * time.Second, 10 * time.Second, arrival.Add(18 * time.Second)},
		{"no arrival time", time.Time{}, 8 * time.Second, 29 * time.Second, arrival.Add(37 * time.Second)},
		{"canned event", arrival.Add(-10 * time.Minute), 8 * time.Second, 29 * time.Second, arrival.Add(37 * time.Second)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := arrival.Add(tt.start)
			b := &deadlineBroker{}
			h := NewHandler(b, slog.New(slog.NewJSONHandler(io.Discard, nil)), WithClock(func() time.Time { return start }))
			ctx, cancel := context.WithDeadline(context.Background(), start.Add(tt.timeout))
			defer cancel()
			if _, err := h(ctx, arrivedAt(tt.arrival)); err != nil {
				t.Fatalf("handler: %v", err)
			}
			if len(b.seen) != 1 || !b.seen[0].Equal(tt.want) {
				t.Fatalf("broker's deadlines %v, want [%s]", b.seen, tt.want)
			}
			if tt.name == "cold start" && !b.seen[0].Before(arrival.Add(GatewayTimeout)) {
				t.Errorf("deadline %s is not before the gateway's %s", b.seen[0], arrival.Add(GatewayTimeout))
			}
		})
	}
}

// stalledCreates is a provider whose creates never answer: an acquire
// that creates spends its whole budget.
type stalledCreates struct{ *coretest.FakeProvider }

func (stalledCreates) Create(ctx context.Context, _ core.CreateSpec) (core.SandboxRef, error) {
	<-ctx.Done()
	return core.SandboxRef{}, ctx.Err()
}

// TestColdStartAnswersBeforeGatewayTimeout: the engine's whole budget
// (work, settle reserve, response margin) fits before API Gateway's 30 s
// even when a cold start took 8 s of them: an acquire whose create
// stalls answers 503 before arrival + 30 s, on the bubble's fake clock.
// Without the arrival time the same acquire runs on the function's 29 s
// and answers no sooner than the gateway gives up.
func TestColdStartAnswersBeforeGatewayTimeout(t *testing.T) {
	for _, withArrival := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			s := core.DefaultSettings()
			s.Deployment, s.Policy = "test", core.PolicyReject
			eng, err := core.New(s, memstore.New(), stalledCreates{coretest.NewFakeProvider()}, nil,
				core.WithLogger(slog.New(slog.NewJSONHandler(io.Discard, nil))))
			if err != nil {
				t.Fatal(err)
			}
			arrival := time.Now()
			time.Sleep(8 * time.Second) // the cold start's init
			ctx, cancel := context.WithTimeout(context.Background(), 29*time.Second)
			defer cancel()
			ev := arrivedAt(arrival)
			if !withArrival {
				ev = arrivedAt(time.Time{})
			}
			resp, err := NewHandler(eng, slog.New(slog.NewJSONHandler(io.Discard, nil)))(ctx, ev)
			answered := time.Since(arrival)
			if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("answer %d %s, %v; want 503 (the create stalled)", resp.StatusCode, resp.Body, err)
			}
			if withArrival && answered >= GatewayTimeout {
				t.Errorf("answered %s after the request's arrival, want before the gateway's %s", answered, GatewayTimeout)
			}
			if !withArrival && answered < GatewayTimeout {
				t.Errorf("without an arrival time answered %s after it, want the function's deadline (not before %s)", answered, GatewayTimeout)
			}
			t.Logf("arrival time %t: answered %s after arrival", withArrival, answered)
		})
	}
}
