package wiring

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/outputsync"
)

type reconcileBroker struct {
	core.Broker // only Reconcile is called
	stats       core.ReconcileStats
	err         error
	calls       int
}

func (b *reconcileBroker) Reconcile(context.Context) (core.ReconcileStats, error) {
	b.calls++
	return b.stats, b.err
}

func TestReconcileHandler(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		wantErr bool
		wantLog string
	}{
		{"ok", nil, false, `"msg":"reconcile"`},
		{"failed", errors.New("store down"), true, `"error":"store down"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			b := &reconcileBroker{stats: core.ReconcileStats{Expired: 2, Killed: 1, Duration: time.Second}, err: tt.err}
			h := ReconcileHandler(b, slog.New(slog.NewJSONHandler(&logs, nil)))
			stats, err := h(context.Background(), events.EventBridgeEvent{ID: "ev-1", DetailType: "Scheduled Event"})
			if (err != nil) != tt.wantErr || b.calls != 1 {
				t.Fatalf("err = %v, calls = %d; want error %v, 1 call", err, b.calls, tt.wantErr)
			}
			if stats.Expired != 2 || stats.Killed != 1 {
				t.Errorf("stats = %+v", stats)
			}
			if !strings.Contains(logs.String(), tt.wantLog) || !strings.Contains(logs.String(), `"event_id":"ev-1"`) {
				t.Errorf("log %q lacks %s or the event id", logs.String(), tt.wantLog)
			}
		})
	}
}

func TestNewBrokerBuildsFromConfig(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "x")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "y")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	cfg, _, err := config.Parse([]string{"E2B_API_KEY=k", "TABLE_NAME=t", "OUTPUT_BUCKET=b", "TOKEN_LOCAL_KEY=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "E2B_API_URL=http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := NewBroker(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil || eng == nil {
		t.Fatalf("NewBroker: %v", err)
	}
	cfg.Settings.Replicas = 0
	if _, err := NewBroker(context.Background(), cfg, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("NewBroker with invalid settings: want an error")
	}
}

func TestSyncDeadline(t *testing.T) {
	tests := []struct {
		name        string
		configured  time.Duration
		function    string
		want        time.Duration
		wantClamped bool
	}{
		{"http default", 0, "release", MaxHTTPSyncDeadline, false},
		{"http below cap", 10 * time.Second, "sync", 10 * time.Second, false},
		{"http above cap", 120 * time.Second, "acquire", MaxHTTPSyncDeadline, true},
		{"reconcile default", 0, FunctionReconcile, outputsync.DefaultDeadline, false},
		{"reconcile configured", 300 * time.Second, FunctionReconcile, 300 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Config{Sync: config.Sync{Deadline: tt.configured}}
			got, clamped := SyncDeadline(cfg, tt.function)
			if got != tt.want || clamped != tt.wantClamped {
				t.Errorf("SyncDeadline(%s, %q) = %s, %v; want %s, %v", tt.configured, tt.function, got, clamped, tt.want, tt.wantClamped)
			}
		})
	}
}
