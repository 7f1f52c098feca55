package wiring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
)

// SecretsAPI lists the Secrets Manager call wiring makes, with the
// signature of aws-sdk-go-v2's *secretsmanager.Client.
type SecretsAPI interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

var _ SecretsAPI = (*secretsmanager.Client)(nil)

// ErrEmptySecret means the secret exists but holds no usable string (a
// binary secret, or only whitespace).
var ErrEmptySecret = errors.New("secret has no string value")

// SecretTimeout bounds one GetSecretValue call (SDK retries included).
const SecretTimeout = 5 * time.Second

// Key freshness: a cached key is read again after KeyTTL (so a key put
// with put-secret-value reaches warm environments within minutes even
// before E2B refuses the old one), and at once when the provider refuses
// it, but at most once per KeyMinRefresh (a key that is really wrong must
// not turn every request into a Secrets Manager call).
const (
	KeyTTL        = 5 * time.Minute
	KeyMinRefresh = 10 * time.Second
)

// SecretKey is the E2B API key held in a Secrets Manager secret (its
// SecretString, surrounding whitespace ignored), as infra/ and
// template.yaml store it. It is an e2b.KeySource: Key serves the cached
// value for KeyTTL, and reads the secret again when asked to refresh.
// Errors wrap the SDK's (e.g. a *types.ResourceNotFoundException,
// AccessDenied) or ErrEmptySecret; they never contain the value. Safe for
// concurrent use.
type SecretKey struct {
	sm  SecretsAPI
	arn string
	now func() time.Time
	log *slog.Logger

	mu       sync.Mutex
	value    string
	readAt   time.Time
	forcedAt time.Time
}

var _ e2b.KeySource = (*SecretKey)(nil)

// NewSecretKey returns the key source of secret arn; nothing is read
// until Key is called.
func NewSecretKey(sm SecretsAPI, arn string, logger *slog.Logger) *SecretKey {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &SecretKey{sm: sm, arn: arn, now: time.Now, log: logger}
}

// Key returns the key: the cached one while it is younger than KeyTTL and
// refresh is false, else the secret's current value. A failed read after
// KeyTTL keeps serving the cached key (Secrets Manager being down must not
// stop requests that E2B still accepts); a failed first read or refresh is
// an error.
func (k *SecretKey) Key(ctx context.Context, refresh bool) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock() // one read at a time: concurrent refreshes share it
	now := k.now()
	if k.value != "" {
		if !refresh && now.Sub(k.readAt) < KeyTTL {
			return k.value, nil
		}
		if refresh && now.Sub(k.forcedAt) < KeyMinRefresh {
			return k.value, nil
		}
	}
	if refresh {
		k.forcedAt = now
	}
	v, err := k.read(ctx)
	if err != nil {
		if k.value != "" && !refresh {
			k.log.WarnContext(ctx, "e2b api key: re-read failed; keeping the cached key", "err", err.Error())
			k.readAt = now
			return k.value, nil
		}
		return "", err
	}
	if k.value != "" && v != k.value {
		k.log.InfoContext(ctx, "e2b api key: the secret holds a new key")
	}
	k.value, k.readAt = v, now
	return v, nil
}

func (k *SecretKey) read(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, SecretTimeout)
	defer cancel()
	out, err := k.sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &k.arn})
	if err != nil {
		return "", fmt.Errorf("read secret %s: %w", k.arn, err)
	}
	if out.SecretString == nil || strings.TrimSpace(*out.SecretString) == "" {
		return "", fmt.Errorf("read secret %s: %w", k.arn, ErrEmptySecret)
	}
	return strings.TrimSpace(*out.SecretString), nil
}

// WebhookSecret is the secret provider webhooks are signed with:
// cfg.Webhook.Secret, else the SecretString of cfg.Webhook.SecretARN read
// once (newSM makes the client: it is called only then), else "" (the
// webhook route is not served). A rotated secret reaches an environment
// at its next cold start.
func WebhookSecret(ctx context.Context, cfg config.Config, newSM func() SecretsAPI) (string, error) {
	if cfg.Webhook.Secret != "" || cfg.Webhook.SecretARN == "" {
		return cfg.Webhook.Secret, nil
	}
	v, err := NewSecretKey(newSM(), cfg.Webhook.SecretARN, nil).read(ctx)
	if err != nil {
		return "", fmt.Errorf("webhook secret: %w", err)
	}
	return v, nil
}
