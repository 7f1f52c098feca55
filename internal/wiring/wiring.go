// Package wiring builds a core.Engine from configuration and real clients
// (DynamoDB, S3, E2B) and starts the Lambda runtime, so every function's
// main package is one line. It holds no logic of its own.
package wiring

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/eventpub"
	"github.com/sandbox-broker/sandbox-broker/internal/httpapi"
	"github.com/sandbox-broker/sandbox-broker/internal/outputsync"
	"github.com/sandbox-broker/sandbox-broker/internal/providers"
	"github.com/sandbox-broker/sandbox-broker/internal/tokenseal"
)

// initTimeout bounds building the clients at cold start (reading AWS
// shared config and credentials).
const initTimeout = 10 * time.Second

// MaxHTTPSyncDeadline caps the wall-time budget of a sync pass run by an
// HTTP API function (acquire's restore, release, sync): API Gateway HTTP
// API integrations end at 30 s, and the request also needs time for its
// lease and ledger writes and the manifest store after the pass. A pass cut
// short says what it deferred and the next pass converges.
const MaxHTTPSyncDeadline = 20 * time.Second

// FunctionReconcile is the function name of the scheduled reconcile; every
// other function name is an HTTP API function.
const FunctionReconcile = "reconcile"

// SyncDeadline is the sync pass budget for function: SYNC_DEADLINE_SECONDS
// (default outputsync.DefaultDeadline), capped at MaxHTTPSyncDeadline for
// HTTP API functions; clamped reports that the cap applied. The reconcile
// function (EventBridge, no gateway limit) gets the configured value; in
// every function the syncer also stops before its context's deadline (the
// Lambda timeout).
func SyncDeadline(cfg config.Config, function string) (d time.Duration, clamped bool) {
	d = cfg.Sync.Deadline
	if d == 0 {
		d = outputsync.DefaultDeadline
	}
	if function != FunctionReconcile && d > MaxHTTPSyncDeadline {
		// Clamped silently when SYNC_DEADLINE_SECONDS is unset: the
		// default is meant for reconcile.
		return MaxHTTPSyncDeadline, cfg.Sync.Deadline != 0
	}
	return d, false
}

// TokenSealer is the sealer of sandbox access tokens cfg asks for: KMS
// envelope encryption under cfg.KMSKeyARN (newKMS makes the client), or
// the local key.
func TokenSealer(cfg config.TokenSeal, newKMS func() tokenseal.KMSAPI) (ddbstore.Sealer, error) {
	if cfg.KMSKeyARN != "" {
		return tokenseal.NewKMS(newKMS(), cfg.KMSKeyARN), nil
	}
	s, err := tokenseal.NewLocal(cfg.LocalKey)
	if err != nil {
		return nil, fmt.Errorf("token sealer: %w", err)
	}
	return s, nil
}

// NewBroker builds the engine for an HTTP API function (see NewBrokerFor).
func NewBroker(ctx context.Context, cfg config.Config, logger *slog.Logger) (*core.Engine, error) {
	return NewBrokerFor(ctx, cfg, logger, "http")
}

// keepIdle returns c keeping at least idle idle connections per host, so
// that the store's fan-outs reuse their connections (see
// ddbstore.ConcurrentCalls). The SDK's default client is a BuildableClient
// (any custom CA bundle kept); another client is returned as it is.
func keepIdle(c aws.HTTPClient, idle int) aws.HTTPClient {
	b, ok := c.(*awshttp.BuildableClient)
	if !ok {
		return c
	}
	return b.WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConnsPerHost = max(tr.MaxIdleConnsPerHost, idle)
		if tr.MaxIdleConns != 0 {
			tr.MaxIdleConns = max(tr.MaxIdleConns, tr.MaxIdleConnsPerHost)
		}
	})
}

// NewBrokerFor builds the engine of function: DynamoDB store, the provider
// SANDBOX_PROVIDER selects (internal/providers: E2B or the provisioner) and S3
// output syncer (caps from cfg.Sync, deadline from SyncDeadline) and the
// EventBridge publisher of lifecycle events (EVENT_BUS_NAME), with AWS
// configuration from the SDK's default chain (which honours
// AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL_S3 and
// AWS_ENDPOINT_URL_EVENTBRIDGE for local runs).
func NewBrokerFor(ctx context.Context, cfg config.Config, logger *slog.Logger, function string) (*core.Engine, error) {
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("aws config: %w", err)
	}
	registry := providers.Builtin()
	if cfg.E2B.APIKeySecretARN != "" {
		// Deployed stacks keep the key in Secrets Manager: read at cold
		// start (a missing or empty secret fails the init), then again
		// after KeyTTL or when E2B refuses it.
		keys := NewSecretKey(secretsmanager.NewFromConfig(awsCfg), cfg.E2B.APIKeySecretARN, logger)
		if _, err := keys.Key(ctx, false); err != nil {
			return nil, fmt.Errorf("e2b api key: %w", err)
		}
		registry[config.ProviderE2B] = providers.E2BWithKeys(keys)
	}
	ddb := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		o.HTTPClient = keepIdle(o.HTTPClient, ddbstore.ConcurrentCalls)
	})
	s3c := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		o.UsePathStyle = cfg.S3PathStyle
	})
	prov, err := registry.New(cfg, logger)
	if err != nil {
		return nil, err
	}
	deadline, clamped := SyncDeadline(cfg, function)
	if clamped {
		logger.Warn("configuration", "warning", fmt.Sprintf("%s=%s capped at %s for HTTP API functions",
			config.EnvSyncDeadlineSeconds, cfg.Sync.Deadline, MaxHTTPSyncDeadline))
	}
	sealer, err := TokenSealer(cfg.TokenSeal, func() tokenseal.KMSAPI { return kms.NewFromConfig(awsCfg) })
	if err != nil {
		return nil, err
	}
	store := ddbstore.New(ddb, cfg.TableName, cfg.Settings.Deployment, ddbstore.WithSealer(sealer),
		ddbstore.WithLimit(cfg.Settings.Limit()), ddbstore.WithLogger(logger))
	syncer, err := outputsync.New(prov, s3c, outputsync.Options{
		Bucket:         cfg.OutputBucket,
		Prefix:         cfg.OutputPrefix,
		Home:           cfg.Settings.Home,
		MaxFiles:       cfg.Sync.MaxFiles,
		MaxTotalBytes:  cfg.Sync.MaxTotalBytes,
		MaxFileBytes:   cfg.Sync.MaxFileBytes,
		MaxThreadBytes: cfg.Sync.MaxThreadBytes,
		MaxTenantBytes: cfg.Sync.MaxTenantBytes,
		Ledger:         store,
		Deadline:       deadline,
		MirrorDeletes:  cfg.Sync.MirrorDeletes,
		Logger:         logger,
	})
	if err != nil {
		return nil, fmt.Errorf("output syncer: %w", err)
	}
	opts := []core.Option{core.WithLogger(logger), core.WithReconcileSettings(cfg.Reconcile), core.WithPool(cfg.Pool.PoolSettings),
		core.WithEventSink(eventpub.New(eventbridge.NewFromConfig(awsCfg), cfg.EventBusName))}
	if cfg.Pool.Size > 0 && cfg.Pool.RefillFunction != "" {
		opts = append(opts, core.WithPoolRefill(PoolRefill(awslambda.NewFromConfig(awsCfg), cfg.Pool.RefillFunction)))
	}
	eng, err := core.New(cfg.Settings, store, prov, syncer, opts...)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	return eng, nil
}

// setup loads the configuration and builds the engine, exiting the process
// (a Lambda init error) when either fails.
func setup(function string) (*core.Engine, config.Config, *slog.Logger) {
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
	eng, err := NewBrokerFor(ctx, cfg, logger, function)
	if err != nil {
		logger.Error("init failed", "error", err.Error())
		os.Exit(1)
	}
	logger.Debug("configured", "config", cfg)
	return eng, cfg, logger
}

// StartHTTP runs an HTTP API function (acquire, release, sync): the same
// handler serves every route; template.yaml decides which routes reach it.
func StartHTTP(function string) {
	eng, cfg, logger := setup(function)
	ctx, cancel := context.WithTimeout(context.Background(), initTimeout)
	secret, err := WebhookSecret(ctx, cfg, func() SecretsAPI {
		awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			logger.Error("init failed", "error", fmt.Sprintf("aws config: %v", err))
			os.Exit(1)
		}
		return secretsmanager.NewFromConfig(awsCfg)
	})
	cancel()
	if err != nil {
		logger.Error("init failed", "error", err.Error())
		os.Exit(1)
	}
	opts := HTTPOptions(cfg)
	if secret != "" {
		opts = append(opts, httpapi.WithE2BWebhook(secret, eng))
	}
	lambda.Start(httpapi.NewHandler(eng, logger, opts...))
}

// HTTPOptions are the httpapi options of the HTTP API functions: the admin
// tenants (BROKER_ADMIN_TENANTS), the JWT claim naming the tenant
// (BROKER_TENANT_CLAIM) and EMF metrics under the deployment id
// (SANDBOX_DEPLOYMENT_ID) as the Deployment dimension.
func HTTPOptions(cfg config.Config) []httpapi.Option {
	return []httpapi.Option{httpapi.WithAdminTenants(cfg.AdminTenants...), httpapi.WithTenantClaim(cfg.TenantClaim),
		httpapi.WithMetrics(cfg.Settings.Deployment), httpapi.WithE2BTemplate(cfg.Settings.Template)}
}

// StartReconcile runs the reconcile function on EventBridge schedule events.
func StartReconcile() {
	eng, _, logger := setup(FunctionReconcile)
	lambda.Start(ReconcileHandler(eng, logger))
}

// ReconcileHandler runs one reconcile pass per event and logs its stats;
// a pool-refill event (PoolRefillDetailType, sent by a pool claim) runs a
// refill only, and never fails (see refillHandler).
// A failed pass is returned as the Lambda error; neither EventBridge nor
// Lambda retries it (the templates set no retries): the next scheduled
// pass starts over.
func ReconcileHandler(b core.Broker, logger *slog.Logger) func(ctx context.Context, ev events.EventBridgeEvent) (core.ReconcileStats, error) {
	return func(ctx context.Context, ev events.EventBridgeEvent) (core.ReconcileStats, error) {
		if stats, handled := refillHandler(ctx, b, logger, ev); handled {
			return stats, nil
		}
		stats, err := b.Reconcile(ctx)
		attrs := []any{"event_id", ev.ID, "expired", stats.Expired, "killed", stats.Killed, "dead", stats.Dead,
			"errors", stats.Errors, "duration_ms", stats.Duration.Milliseconds()}
		if err != nil {
			logger.ErrorContext(ctx, "reconcile failed", append(attrs, "error", err.Error())...)
			return stats, fmt.Errorf("reconcile: %w", err)
		}
		logger.InfoContext(ctx, "reconcile", attrs...)
		return stats, nil
	}
}
