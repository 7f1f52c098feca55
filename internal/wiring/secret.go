package wiring

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
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

// secretCache keeps each secret's value for the life of the process (a
// Lambda execution environment), so the key is read once per cold start.
var secretCache = struct {
	sync.Mutex
	values map[string]string
}{values: map[string]string{}}

// ResolveAPIKey returns the SecretString of the Secrets Manager secret arn
// (the E2B API key, as infra/ and template.yaml store it: the bare key,
// surrounding whitespace ignored), reading it once per process and serving
// later calls from memory. Errors wrap the SDK's (e.g. a
// *types.ResourceNotFoundException, AccessDenied) or ErrEmptySecret; they
// never contain the value.
func ResolveAPIKey(ctx context.Context, sm SecretsAPI, arn string) (string, error) {
	secretCache.Lock()
	defer secretCache.Unlock() // cold start only: holding it across the call is fine
	if v, ok := secretCache.values[arn]; ok {
		return v, nil
	}
	ctx, cancel := context.WithTimeout(ctx, SecretTimeout)
	defer cancel()
	out, err := sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &arn})
	if err != nil {
		return "", fmt.Errorf("read secret %s: %w", arn, err)
	}
	if out.SecretString == nil || strings.TrimSpace(*out.SecretString) == "" {
		return "", fmt.Errorf("read secret %s: %w", arn, ErrEmptySecret)
	}
	v := strings.TrimSpace(*out.SecretString)
	secretCache.values[arn] = v
	return v, nil
}
