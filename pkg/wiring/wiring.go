// Package wiring builds a core.Engine from configuration and real clients
// (DynamoDB, S3, E2B) and starts the Lambda runtime, so every function's
// main package is one line. It holds no logic of its own.
package wiring

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sandbox-broker/sandbox-broker/pkg/config"
	"github.com/sandbox-broker/sandbox-broker/pkg/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/e2b"
	"github.com/sandbox-broker/sandbox-broker/pkg/httpapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/outputsync"
)

// initTimeout bounds building the clients at cold start (reading AWS
// shared config and credentials).
const initTimeout = 10 * time.Second

// SyncDeadline is the wall-time budget of one output sync pass.
const SyncDeadline = 20 * time.Second

// NewLogger returns the JSON logger every function uses, on stdout.
func NewLogger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: level}))
}

// NewBroker builds the engine: DynamoDB store, E2B provider and S3 output
// syncer, with AWS configuration from the SDK's default chain (which
// honours AWS_ENDPOINT_URL_DYNAMODB and AWS_ENDPOINT_URL_S3 for local runs).
func NewBroker(ctx context.Context, cfg config.Config, logger *slog.Logger) (*core.Engine, error) {
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("aws config: %w", err)
	}
	ddb := dynamodb.NewFromConfig(awsCfg)
	s3c := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		o.UsePathStyle = cfg.S3PathStyle
	})
	prov, err := e2b.New(e2b.Options{
		APIURL:     cfg.E2B.APIURL,
		SandboxURL: cfg.E2B.SandboxURL,
		APIKey:     cfg.E2B.APIKey,
		Logger:     logger,
	})
	if err != nil {
		return nil, fmt.Errorf("e2b client: %w", err)
	}
	syncer, err := outputsync.New(prov, s3c, outputsync.Options{
		Bucket: cfg.OutputBucket,
		Prefix: cfg.OutputPrefix,
		Home:   cfg.Settings.Home,
		// A release must finish within the function's 29 s timeout (API
		// Gateway HTTP API integrations end at 30 s); a pass cut short by
		// its deadline says what it deferred and the next pass converges.
		Deadline: SyncDeadline,
		Logger:   logger,
	})
	if err != nil {
		return nil, fmt.Errorf("output syncer: %w", err)
	}
	store := ddbstore.New(ddb, cfg.TableName, cfg.Settings.Deployment)
	eng, err := core.New(cfg.Settings, store, prov, syncer, core.WithLogger(logger))
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	return eng, nil
}

// setup loads the configuration and builds the engine, exiting the process
// (a Lambda init error) when either fails.
func setup(function string) (*core.Engine, *slog.Logger) {
	cfg, warnings, err := config.Load()
	if err != nil {
		NewLogger(slog.LevelInfo).Error("invalid configuration", "function", function, "error", err.Error())
		os.Exit(1)
	}
	logger := NewLogger(cfg.LogLevel).With("function", function)
	for _, w := range warnings {
		logger.Warn("configuration", "warning", w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), initTimeout)
	defer cancel()
	eng, err := NewBroker(ctx, cfg, logger)
	if err != nil {
		logger.Error("init failed", "error", err.Error())
		os.Exit(1)
	}
	logger.Debug("configured", "config", cfg)
	return eng, logger
}

// StartHTTP runs an HTTP API function (acquire, release, sync): the same
// handler serves every route; template.yaml decides which routes reach it.
func StartHTTP(function string) {
	eng, logger := setup(function)
	lambda.Start(httpapi.NewHandler(eng, logger))
}

// StartReconcile runs the reconcile function on EventBridge schedule events.
func StartReconcile() {
	eng, logger := setup("reconcile")
	lambda.Start(ReconcileHandler(eng, logger))
}

// ReconcileHandler runs one reconcile pass per event and logs its stats.
// A failed pass is returned as the Lambda error (EventBridge retries it).
func ReconcileHandler(b core.Broker, logger *slog.Logger) func(ctx context.Context, ev events.EventBridgeEvent) (core.ReconcileStats, error) {
	return func(ctx context.Context, ev events.EventBridgeEvent) (core.ReconcileStats, error) {
		stats, err := b.Reconcile(ctx)
		attrs := []any{"event_id", ev.ID, "expired", stats.Expired, "killed", stats.Killed, "dead", stats.Dead,
			"errors", stats.Errors, "duration_ms", stats.Duration.Milliseconds()}
		if err != nil {
			logger.Error("reconcile failed", append(attrs, "error", err.Error())...)
			return stats, fmt.Errorf("reconcile: %w", err)
		}
		logger.Info("reconcile", attrs...)
		return stats, nil
	}
}
