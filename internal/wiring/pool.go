package wiring

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/eventpub"
)

// PoolRefillDetailType is the detail-type of the event a pool claim sends
// the refill function (POOL_REFILL_FUNCTION, the reconcile function): its
// handler refills the pool instead of running a whole pass.
const PoolRefillDetailType = "Pool Refill"

// PoolRefillSource is the event's source (the lifecycle events').
const PoolRefillSource = eventpub.Source

// LambdaAPI lists the Lambda call a pool claim makes (*lambda.Client fits).
type LambdaAPI interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, opts ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

var _ LambdaAPI = (*lambda.Client)(nil)

// PoolRefill returns what a claim calls to start a refill (core.WithPoolRefill):
// an asynchronous invocation (InvocationType Event: Lambda queues it and
// answers 202 at once) of function with a pool-refill event.
func PoolRefill(c LambdaAPI, function string) func(ctx context.Context) error {
	payload, _ := json.Marshal(events.EventBridgeEvent{Version: "0", Source: PoolRefillSource, DetailType: PoolRefillDetailType,
		Detail: json.RawMessage(`{}`)})
	return func(ctx context.Context) error {
		_, err := c.Invoke(ctx, &lambda.InvokeInput{FunctionName: &function, InvocationType: lambdatypes.InvocationTypeEvent, Payload: payload})
		if err != nil {
			return fmt.Errorf("invoke %s: %w", function, err)
		}
		return nil
	}
}

// poolRefiller is what a refill event runs (*core.Engine).
type poolRefiller interface {
	RefillPool(ctx context.Context) (core.PoolStats, error)
}

// refillHandler runs a refill for a pool-refill event; handled is false
// for any other event (or a broker that keeps no pool).
//
// A failed refill is logged here, once, and not returned: every scheduled
// reconcile pass refills the pool, so the schedule backs it up, whereas an
// error would make Lambda retry the asynchronous invocation (more refills
// racing the next pass) and log the failure a second time.
func refillHandler(ctx context.Context, b core.Broker, logger *slog.Logger, ev events.EventBridgeEvent) (core.ReconcileStats, bool) {
	r, ok := b.(poolRefiller)
	if ev.DetailType != PoolRefillDetailType || ev.Source != PoolRefillSource || !ok {
		return core.ReconcileStats{}, false
	}
	st, err := r.RefillPool(ctx)
	if err != nil {
		logger.ErrorContext(ctx, "pool refill invocation failed; the next reconcile pass refills", "created", st.Created,
			"failed", st.Failed, "error", err.Error())
		return core.ReconcileStats{PoolCreated: st.Created, PoolRefillFailures: st.Backoff.Failures}, true
	}
	logger.InfoContext(ctx, "pool refill invocation", "created", st.Created)
	return core.ReconcileStats{PoolCreated: st.Created, PoolRefillFailures: st.Backoff.Failures}, true
}
