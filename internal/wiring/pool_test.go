package wiring

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// refillBroker counts refills and passes.
type refillBroker struct {
	reconcileBroker
	refills int
	err     error
}

func (b *refillBroker) RefillPool(context.Context) (core.PoolStats, error) {
	b.refills++
	return core.PoolStats{Created: 2}, b.err
}

// recordingLambda records the invocations a refill kick makes.
type recordingLambda struct{ in []*lambda.InvokeInput }

func (r *recordingLambda) Invoke(_ context.Context, in *lambda.InvokeInput, _ ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	r.in = append(r.in, in)
	return &lambda.InvokeOutput{StatusCode: 202}, nil
}

// TestPoolRefillEventRunsARefill: the kick a claim makes is an Event
// invocation of the refill function whose payload the reconcile handler
// recognises, and runs a refill instead of a pass; a scheduled event
// still runs a pass.
func TestPoolRefillEventRunsARefill(t *testing.T) {
	rl := &recordingLambda{}
	if err := PoolRefill(rl, "broker-reconcile")(context.Background()); err != nil {
		t.Fatalf("kick: %v", err)
	}
	if len(rl.in) != 1 || *rl.in[0].FunctionName != "broker-reconcile" || rl.in[0].InvocationType != lambdatypes.InvocationTypeEvent {
		t.Fatalf("invocations = %+v, want one Event invocation of broker-reconcile", rl.in)
	}
	var ev events.EventBridgeEvent
	if err := json.Unmarshal(rl.in[0].Payload, &ev); err != nil {
		t.Fatalf("payload: %v", err)
	}
	tests := []struct {
		name                string
		ev                  events.EventBridgeEvent
		wantRefills, wantRC int
	}{
		{"refill event", ev, 1, 0},
		{"scheduled event", events.EventBridgeEvent{ID: "ev-2", DetailType: "Scheduled Event", Source: "aws.events"}, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			b := &refillBroker{}
			stats, err := ReconcileHandler(b, slog.New(slog.NewJSONHandler(&logs, nil)))(context.Background(), tc.ev)
			if err != nil {
				t.Fatalf("handler: %v", err)
			}
			if b.refills != tc.wantRefills || b.calls != tc.wantRC {
				t.Errorf("refills %d passes %d, want %d and %d", b.refills, b.calls, tc.wantRefills, tc.wantRC)
			}
			if tc.wantRefills == 1 && (stats.PoolCreated != 2 || !strings.Contains(logs.String(), `"msg":"pool refill invocation"`)) {
				t.Errorf("stats = %+v, log %q; want the refill's", stats, logs.String())
			}
		})
	}
}

// TestPoolRefillFailureIsLoggedOnceAndNotRetried: a failed refill is one
// error line and a nil Lambda error (an error would have Lambda retry the
// asynchronous invocation; the reconcile schedule refills instead).
func TestPoolRefillFailureIsLoggedOnceAndNotRetried(t *testing.T) {
	var logs bytes.Buffer
	b := &refillBroker{err: errors.New("store unavailable")}
	ev := events.EventBridgeEvent{Source: PoolRefillSource, DetailType: PoolRefillDetailType}
	stats, err := ReconcileHandler(b, slog.New(slog.NewJSONHandler(&logs, nil)))(context.Background(), ev)
	if err != nil {
		t.Errorf("handler error = %v, want nil (no retry of the invocation)", err)
	}
	if b.refills != 1 || b.calls != 0 || stats.PoolCreated != 2 {
		t.Errorf("refills %d passes %d stats %+v, want one refill, no pass, its stats", b.refills, b.calls, stats)
	}
	if got := strings.Count(logs.String(), "store unavailable"); got != 1 {
		t.Errorf("log lines naming the failure = %d, want 1; log:\n%s", got, logs.String())
	}
}
