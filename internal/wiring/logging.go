package wiring

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambdacontext"
)

// RequestIDKey is the log attribute that carries the Lambda request id,
// named as aws-lambda-go's lambdacontext log handler and Lambda's own
// JSON log lines name it.
const RequestIDKey = "requestId"

// NewLogger returns the JSON logger every function uses, on stdout (see
// newLogger).
func NewLogger(level slog.Level) *slog.Logger {
	return newLogger(os.Stdout, level)
}

// newLogger returns a JSON logger on w at level whose every line logged
// with an invocation's context (the engine's, the syncer's, the provider
// clients', the HTTP adapter's) carries the Lambda request id, taken from
// the context by lambdacontext.FromContext.
//
// lambdacontext.NewLogHandler adds the same attribute, but it chooses its
// own output (stdout), format (text unless AWS_LAMBDA_LOG_FORMAT=JSON) and
// level (AWS_LAMBDA_LOG_LEVEL); the broker's lines must be JSON (the EMF
// records) at LOG_LEVEL, so the attribute is added here around slog's
// JSON handler.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(requestIDHandler{slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})})
}

// requestIDHandler adds RequestIDKey to every record handled with a
// Lambda invocation's context.
type requestIDHandler struct{ slog.Handler }

func (h requestIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if lc, ok := lambdacontext.FromContext(ctx); ok && lc.AwsRequestID != "" {
		r.AddAttrs(slog.String(RequestIDKey, lc.AwsRequestID))
	}
	return h.Handler.Handle(ctx, r)
}

func (h requestIDHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return requestIDHandler{h.Handler.WithAttrs(attrs)}
}

func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{h.Handler.WithGroup(name)}
}
