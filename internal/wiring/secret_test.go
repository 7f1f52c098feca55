package wiring

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
)

// fakeSecrets serves Secrets Manager's GetSecretValue (JSON 1.1 protocol,
// X-Amz-Target secretsmanager.GetSecretValue) from values, counting calls.
// Hold valuesMu to change values while it runs.
func fakeSecrets(t *testing.T, values map[string]*string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		valuesMu.Lock()
		defer valuesMu.Unlock()
		calls.Add(1)
		if got := r.Header.Get("X-Amz-Target"); got != "secretsmanager.GetSecretValue" {
			http.Error(w, "unexpected target "+got, http.StatusBadRequest)
			return
		}
		if !strings.Contains(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256") {
			http.Error(w, "unsigned", http.StatusForbidden)
			return
		}
		var in struct{ SecretId string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		v, ok := values[in.SecretId]
		if !ok {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"__type": "ResourceNotFoundException", "message": "Secrets Manager can't find the specified secret."})
			return
		}
		out := map[string]any{"ARN": in.SecretId, "Name": "e2b", "VersionId": "v1"}
		if v != nil {
			out["SecretString"] = *v
		} else {
			out["SecretBinary"] = "AAEC"
		}
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

var valuesMu sync.Mutex

func secretsClient(url string) *secretsmanager.Client {
	return secretsmanager.New(secretsmanager.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(url),
		Credentials:      credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		RetryMaxAttempts: 1,
	})
}

func TestSecretKey(t *testing.T) {
	const (
		arnKey   = "arn:aws:secretsmanager:us-east-1:123456789012:secret:resolve-key-AAAAAA"
		arnBlank = "arn:aws:secretsmanager:us-east-1:123456789012:secret:resolve-blank-AAAAAA"
		arnBin   = "arn:aws:secretsmanager:us-east-1:123456789012:secret:resolve-binary-AAAAAA"
		arnNone  = "arn:aws:secretsmanager:us-east-1:123456789012:secret:resolve-missing-AAAAAA"
	)
	values := map[string]*string{arnKey: aws.String(" e2b_live_key\n"), arnBlank: aws.String("  "), arnBin: nil}
	srv, calls := fakeSecrets(t, values)
	sm := secretsClient(srv.URL)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)
	newKey := func(arn string) *SecretKey {
		k := NewSecretKey(sm, arn, nil)
		k.now = func() time.Time { return now }
		return k
	}
	key := func(k *SecretKey, refresh bool, want string) {
		t.Helper()
		if got, err := k.Key(ctx, refresh); err != nil || got != want {
			t.Fatalf("Key(refresh=%t) = %q, %v; want %q", refresh, got, err, want)
		}
	}
	rotate := func(v string) {
		valuesMu.Lock()
		values[arnKey] = aws.String(v)
		valuesMu.Unlock()
	}

	k := newKey(arnKey)
	for range 3 {
		key(k, false, "e2b_live_key")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("GetSecretValue called %d times for 3 reads within the TTL, want 1 (cached)", n)
	}
	// put-secret-value: a refused key is re-read at once.
	rotate("e2b_rotated")
	key(k, false, "e2b_live_key") // still cached
	key(k, true, "e2b_rotated")
	// Refreshes are bounded: another refusal within KeyMinRefresh does not
	// read the secret again.
	before := calls.Load()
	key(k, true, "e2b_rotated")
	if calls.Load() != before {
		t.Error("a second refresh within KeyMinRefresh read the secret")
	}
	// The TTL: a key put without any refusal is picked up after KeyTTL.
	rotate("e2b_third")
	now = now.Add(KeyTTL - time.Second)
	key(k, false, "e2b_rotated")
	now = now.Add(2 * time.Second)
	key(k, false, "e2b_third")
	// Secrets Manager failing after the TTL keeps the cached key.
	valuesMu.Lock()
	delete(values, arnKey)
	valuesMu.Unlock()
	now = now.Add(KeyTTL)
	key(k, false, "e2b_third")

	tests := []struct {
		arn   string
		check func(error) bool
		want  string
	}{
		{arnBlank, func(err error) bool { return errors.Is(err, ErrEmptySecret) }, "ErrEmptySecret"},
		{arnBin, func(err error) bool { return errors.Is(err, ErrEmptySecret) }, "ErrEmptySecret"},
		{arnNone, func(err error) bool {
			var nf *types.ResourceNotFoundException
			return errors.As(err, &nf)
		}, "*types.ResourceNotFoundException"},
	}
	for _, tt := range tests {
		_, err := newKey(tt.arn).Key(ctx, false)
		if !tt.check(err) || !strings.Contains(err.Error(), tt.arn) {
			t.Errorf("Key(%s) error = %v, want %s naming the ARN", tt.arn, err, tt.want)
		}
	}
	// A failure is not cached: the next call retries.
	none := newKey(arnNone)
	none.Key(ctx, false)
	before = calls.Load()
	none.Key(ctx, false)
	if calls.Load() != before+1 {
		t.Error("a failed read was cached")
	}
}

// TestNewBrokerReadsKeyFromSecret builds the engine from a configuration
// that names the secret, with the SDK's endpoint override pointing at the
// fake: the key is read once, through the default AWS config chain.
func TestNewBrokerReadsKeyFromSecret(t *testing.T) {
	const arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:newbroker-AAAAAA"
	srv, calls := fakeSecrets(t, map[string]*string{arn: aws.String("e2b_from_secret")})
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "x")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "y")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", srv.URL)
	cfg, _, err := config.Parse([]string{"E2B_API_KEY_SECRET_ARN=" + arn, "SANDBOX_DEPLOYMENT_ID=staging", "TABLE_NAME=t", "OUTPUT_BUCKET=b", "TOKEN_LOCAL_KEY=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "E2B_API_URL=http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewBroker(context.Background(), cfg, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("NewBroker: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("GetSecretValue calls = %d, want 1", n)
	}

	missing := cfg
	missing.E2B.APIKeySecretARN = arn + "-gone"
	if _, err := NewBroker(context.Background(), missing, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("NewBroker with a missing secret: want an error")
	}
}

// TestWebhookSecret: the secret itself wins; else the ARN's secret is read
// once; neither set means no webhook route, and a missing secret fails
// the cold start.
func TestWebhookSecret(t *testing.T) {
	arn := "arn:aws:secretsmanager:us-east-1:123456789012:secret:webhook"
	v := "  whsec-1 \n"
	srv, calls := fakeSecrets(t, map[string]*string{arn: &v})
	sm := func() SecretsAPI { return secretsClient(srv.URL) }
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		w    config.Webhook
		want string
	}{
		{"none", config.Webhook{}, ""},
		{"local", config.Webhook{Secret: "local", SecretARN: arn}, "local"},
		{"from the ARN", config.Webhook{SecretARN: arn}, "whsec-1"},
	} {
		got, err := WebhookSecret(ctx, config.Config{Webhook: tc.w}, sm)
		if err != nil || got != tc.want {
			t.Errorf("%s: WebhookSecret = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("GetSecretValue calls = %d, want 1", n)
	}
	if _, err := WebhookSecret(ctx, config.Config{Webhook: config.Webhook{SecretARN: arn + "-gone"}}, sm); err == nil {
		t.Error("a missing secret was not an error")
	}
}
