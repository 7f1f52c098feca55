package httpapi

import (
	"context"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

// GatewayTimeout is API Gateway HTTP API's integration timeout (fixed, not
// adjustable). It runs from the request's arrival at the gateway, so it
// counts a cold start's init, which the function's own deadline (its
// timeout, from the invocation's start) does not.
const GatewayTimeout = 30 * time.Second

// gatewayMargin is kept between the answer deadline and GatewayTimeout:
// the answer's way back through the gateway, and the skew between the
// gateway's clock (requestContext.timeEpoch) and the function's.
const gatewayMargin = time.Second

// answerDeadline is when the answer to ev must leave so that API Gateway
// still waits for it: the request's arrival at the gateway
// (requestContext.timeEpoch, payload format 2.0) plus GatewayTimeout less
// gatewayMargin. ok is false without an arrival time, and when that
// deadline has passed at now: the gateway has answered already (or the
// event is a canned one, from a console test or `sam local invoke`), so
// the function's deadline alone bounds the work.
func answerDeadline(ev events.APIGatewayV2HTTPRequest, now time.Time) (time.Time, bool) {
	if ev.RequestContext.TimeEpoch <= 0 {
		return time.Time{}, false
	}
	by := time.UnixMilli(ev.RequestContext.TimeEpoch).Add(GatewayTimeout - gatewayMargin)
	if !by.After(now) {
		return time.Time{}, false
	}
	return by, true
}

// withAnswerDeadline bounds ctx (the invocation's, ending at the function's
// deadline) by ev's answer deadline when that comes first, as on a cold
// start. The engine derives every budget from ctx's deadline (its work
// end, settle reserve and response margin), so the answer leaves before
// the gateway gives up. Call cancel when the request is answered.
func (h *handler) withAnswerDeadline(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (context.Context, context.CancelFunc) {
	by, ok := answerDeadline(ev, h.now())
	if dl, has := ctx.Deadline(); !ok || has && !by.Before(dl) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, by)
}

// WithClock sets the clock the answer deadline is checked against
// (default time.Now): tests start an invocation at a time of their own.
func WithClock(now func() time.Time) Option { return func(h *handler) { h.now = now } }
