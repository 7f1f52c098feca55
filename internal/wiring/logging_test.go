package wiring

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/lambdacontext"
)

func TestLoggerCarriesLambdaRequestID(t *testing.T) {
	invocation := lambdacontext.NewContext(context.Background(), &lambdacontext.LambdaContext{AwsRequestID: "req-42"})
	tests := []struct {
		name string
		ctx  context.Context
		log  func(l *slog.Logger, ctx context.Context)
		want string // requestId, "" for none
	}{
		{"in an invocation", invocation, func(l *slog.Logger, ctx context.Context) { l.InfoContext(ctx, "m") }, "req-42"},
		{"through With", invocation, func(l *slog.Logger, ctx context.Context) { l.With("function", "acquire").WarnContext(ctx, "m") }, "req-42"},
		{"through LogAttrs", invocation, func(l *slog.Logger, ctx context.Context) { l.LogAttrs(ctx, slog.LevelError, "m") }, "req-42"},
		{"at cold start", context.Background(), func(l *slog.Logger, ctx context.Context) { l.InfoContext(ctx, "m") }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tt.log(newLogger(&buf, slog.LevelInfo), tt.ctx)
			var line map[string]any
			if err := json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &line); err != nil {
				t.Fatalf("line %q is not JSON: %v", buf.String(), err)
			}
			got, _ := line[RequestIDKey].(string)
			if got != tt.want {
				t.Errorf("%s = %q, want %q (line %s)", RequestIDKey, got, tt.want, strings.TrimSpace(buf.String()))
			}
		})
	}
}
