// Package config reads the broker's Lambda configuration from environment
// variables once, applies the defaults docs/configuration.md documents
// and validates it, so every function fails fast at cold start with a message
// naming the offending variable.
package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Environment variable names read by Load.
const (
	EnvReplicas              = "SANDBOX_REPLICAS"
	EnvOverflowPolicy        = "SANDBOX_OVERFLOW_POLICY"
	EnvAcquireTimeoutSeconds = "SANDBOX_ACQUIRE_TIMEOUT_SECONDS"
	EnvBurstLimit            = "SANDBOX_BURST_LIMIT"
	EnvIdleTimeoutSeconds    = "SANDBOX_IDLE_TIMEOUT_SECONDS"
	EnvActiveTimeoutSeconds  = "SANDBOX_ACTIVE_TIMEOUT_SECONDS"
	EnvMaxLifetimeSeconds    = "SANDBOX_MAX_LIFETIME_SECONDS"
	// EnvExpiringLeadSeconds: how long before an unrenewed lease ends
	// reconcile sends sandbox.expiring (0: never).
	EnvExpiringLeadSeconds = "SANDBOX_EXPIRING_LEAD_SECONDS"
	EnvTemplate            = "SANDBOX_TEMPLATE"
	EnvDeploymentID        = "SANDBOX_DEPLOYMENT_ID"
	EnvMaxPerUser          = "SANDBOX_MAX_PER_USER"
	EnvMaxPerTenant        = "SANDBOX_MAX_PER_TENANT"
	EnvMaxWaitersPerTenant = "SANDBOX_MAX_WAITERS_PER_TENANT"
	// Pause-parking (providers that can pause): idle seconds before a warm
	// sandbox is paused (0: at release, -1: never), the paused slots
	// (default 10 × SANDBOX_REPLICAS) and how long one stays paused.
	EnvPauseAfterSeconds = "SANDBOX_PAUSE_AFTER_SECONDS"
	EnvMaxPaused         = "SANDBOX_MAX_PAUSED"
	EnvPausedTTLSeconds  = "SANDBOX_PAUSED_TTL_SECONDS"
	// EnvTenantUsage is where per-tenant usage goes: "metrics" (default:
	// CloudWatch metrics per tenant, and the lifecycle events) or "events"
	// (the events only; the usage metrics are the deployment's totals).
	EnvTenantUsage = "SANDBOX_TENANT_USAGE"
	// EnvAdminTenants lists the tenants (comma-separated) allowed on the
	// /v1/admin routes (drain, undrain).
	EnvAdminTenants = "BROKER_ADMIN_TENANTS"
	// EnvTenantClaim names the JWT claim that carries the caller's tenant
	// (default DefaultTenantClaim; Cognito user pools issue custom
	// attributes as "custom:<name>").
	EnvTenantClaim   = "BROKER_TENANT_CLAIM"
	EnvE2BAPIURL     = "E2B_API_URL"
	EnvE2BSandboxURL = "E2B_SANDBOX_URL"
	EnvE2BAPIKey     = "E2B_API_KEY"
	// EnvSandboxProvider selects the provider, one of ProviderNames
	// (default "e2b").
	EnvSandboxProvider = "SANDBOX_PROVIDER"
	// EnvProvisionerURL and EnvProvisionerAPIKey configure the Kubernetes
	// sandbox provisioner (SANDBOX_PROVIDER=provisioner: the URL is then
	// required, the key optional; the E2B variables are not read).
	EnvProvisionerURL    = "PROVISIONER_URL"
	EnvProvisionerAPIKey = "PROVISIONER_API_KEY"
	// EnvE2BAPIKeySecretARN names a Secrets Manager secret whose
	// SecretString is the E2B API key (deployed stacks); internal/wiring reads it
	// once at cold start. Set either it or EnvE2BAPIKey.
	EnvE2BAPIKeySecretARN = "E2B_API_KEY_SECRET_ARN"
	EnvTableName          = "TABLE_NAME"
	// EnvWebhookSecret is the secret E2B signs its lifecycle webhooks
	// with (POST /webhooks/e2b; local runs), and EnvWebhookSecretARN a
	// Secrets Manager secret holding it (deployed stacks; internal/wiring
	// reads it at cold start). Neither set: the route answers 404.
	EnvWebhookSecret    = "BROKER_WEBHOOK_SECRET"
	EnvWebhookSecretARN = "BROKER_WEBHOOK_SECRET_ARN"
	// EnvEventBusName names the EventBridge event bus the lifecycle events
	// are published to (a name or an event-bus ARN; default
	// DefaultEventBusName, the account's default bus).
	EnvEventBusName = "EVENT_BUS_NAME"
	EnvOutputBucket = "OUTPUT_BUCKET"
	EnvOutputPrefix = "OUTPUT_PREFIX"
	EnvLogLevel     = "LOG_LEVEL"
	// Output sync caps; unset means the syncer's default
	// (internal/outputsync Default*).
	EnvSyncMaxFiles       = "SYNC_MAX_FILES"
	EnvSyncMaxTotalBytes  = "SYNC_MAX_TOTAL_BYTES"
	EnvSyncMaxFileBytes   = "SYNC_MAX_FILE_BYTES"
	EnvSyncMaxThreadBytes = "SYNC_MAX_THREAD_BYTES"
	EnvSyncMaxTenantBytes = "SYNC_MAX_TENANT_BYTES"
	// Sandbox access tokens are stored sealed (internal/tokenseal): under
	// data keys of the KMS key EnvTokenKMSKeyARN (deployed stacks), or
	// under the local key EnvTokenLocalKey (base64 of 32 bytes; `make
	// run`). Exactly one is required.
	EnvTokenKMSKeyARN      = "TOKEN_KMS_KEY_ARN"
	EnvTokenLocalKey       = "TOKEN_LOCAL_KEY"
	EnvSyncDeadlineSeconds = "SYNC_DEADLINE_SECONDS"
	EnvSyncMirrorDeletes   = "SYNC_MIRROR_DELETES"
	// EnvS3Endpoint and EnvEndpoint are the AWS SDK's own endpoint overrides
	// (honoured by aws-sdk-go-v2/config); Load only reads them to decide
	// whether S3 needs path-style addressing (local S3 stand-ins).
	EnvS3Endpoint = "AWS_ENDPOINT_URL_S3"
	EnvEndpoint   = "AWS_ENDPOINT_URL"
)

// DefaultE2BAPIURL is E2B's public control-plane URL (E2B API spec).
const DefaultE2BAPIURL = "https://api.e2b.app"

// DefaultEventBusName is the event bus of EVENT_BUS_NAME unset: the
// account's default bus.
const DefaultEventBusName = "default"

// eventBusPattern and eventBusARNPattern are the shapes EventBridge
// accepts for an event bus name or ARN.
var (
	eventBusPattern    = regexp.MustCompile(`^[A-Za-z0-9/._-]{1,256}$`)
	eventBusARNPattern = regexp.MustCompile(`^arn:aws[a-z-]*:events:[a-z0-9-]+:[0-9]{12}:event-bus/[A-Za-z0-9/._-]{1,256}$`)
)

// DefaultTenantClaim is the JWT claim read when BROKER_TENANT_CLAIM is unset.
const DefaultTenantClaim = "tenant"

// claimPattern is the shape of a JWT claim name BROKER_TENANT_CLAIM accepts.
var claimPattern = regexp.MustCompile(`^[A-Za-z0-9_:.-]{1,128}$`)

// deploymentPattern is the shape core.Settings.Validate requires of Deployment.
var deploymentPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// knownSandboxVars are the SANDBOX_* variables Load understands; any other
// SANDBOX_* variable is reported as a warning (likely a typo).
var knownSandboxVars = map[string]bool{
	EnvReplicas: true, EnvOverflowPolicy: true, EnvAcquireTimeoutSeconds: true,
	EnvBurstLimit: true, EnvIdleTimeoutSeconds: true, EnvActiveTimeoutSeconds: true, EnvMaxLifetimeSeconds: true,
	EnvExpiringLeadSeconds: true,
	EnvTemplate:            true, EnvDeploymentID: true, EnvMaxPerUser: true, EnvMaxPerTenant: true, EnvMaxWaitersPerTenant: true, EnvSandboxProvider: true,
	EnvPoolSize: true, EnvPoolMaxAgeSeconds: true, EnvPoolParked: true,
	EnvPauseAfterSeconds: true, EnvMaxPaused: true, EnvPausedTTLSeconds: true, EnvTenantUsage: true,
}

// E2B configures the E2B provider client.
type E2B struct {
	// APIURL is the control-plane base URL (default DefaultE2BAPIURL).
	APIURL string
	// SandboxURL is the envd base URL for every sandbox ("" = the provider's
	// per-sandbox domain).
	SandboxURL string
	// APIKey is sent as X-API-Key. Secret: never log it (String redacts it).
	// Empty when APIKeySecretARN is set: internal/wiring fills it from the secret.
	APIKey string
	// APIKeySecretARN is the Secrets Manager secret holding the API key
	// (E2B_API_KEY_SECRET_ARN), "" when E2B_API_KEY is given directly.
	APIKeySecretARN string
}

// Sync holds the output sync caps. A zero field means "unset":
// the syncer's default applies (internal/outputsync Default*), and for Deadline
// internal/wiring picks the budget per function.
type Sync struct {
	MaxFiles      int   // SYNC_MAX_FILES: uploads per pass
	MaxTotalBytes int64 // SYNC_MAX_TOTAL_BYTES: bytes per pass
	MaxFileBytes  int64 // SYNC_MAX_FILE_BYTES: larger files are skipped unread
	// MaxThreadBytes (SYNC_MAX_THREAD_BYTES): what one thread may store in
	// S3 in all; files past it are excluded (reason thread_quota).
	MaxThreadBytes int64
	// MaxTenantBytes (SYNC_MAX_TENANT_BYTES): what one tenant may store
	// in S3, all its threads together; files past it are excluded (reason
	// tenant_quota).
	MaxTenantBytes int64
	Deadline       time.Duration // SYNC_DEADLINE_SECONDS: wall-time budget of a pass
	// MirrorDeletes (SYNC_MIRROR_DELETES, default false): objects of files
	// deleted in the sandbox are deleted from S3 on a complete pass.
	MirrorDeletes bool
}

// Provider names (SANDBOX_PROVIDER values). Each has an entry in the
// provider registry (internal/providers) and its variables parsed in Load.
const (
	ProviderE2B         = "e2b"
	ProviderProvisioner = "provisioner"
)

// ProviderNames lists every SANDBOX_PROVIDER value, sorted.
var ProviderNames = []string{ProviderE2B, ProviderProvisioner}

// Provisioner configures the Kubernetes sandbox provisioner client.
type Provisioner struct {
	// URL is the provisioner API base URL (PROVISIONER_URL).
	URL string
	// APIKey is sent as X-API-Key when set (PROVISIONER_API_KEY). Secret:
	// never log it (String redacts it).
	APIKey string
}

// TokenSeal is the key sandbox access tokens are sealed under: a KMS key
// (KMSKeyARN) or a local key (LocalKey, 32 bytes; secret: String never
// prints it). Exactly one is set.
type TokenSeal struct {
	KMSKeyARN string
	LocalKey  []byte
}

// Config is the whole configuration of one broker function.
type Config struct {
	Settings core.Settings
	// Provider is one of ProviderNames (default ProviderE2B).
	Provider    string
	E2B         E2B
	Provisioner Provisioner
	// TableName is the DynamoDB table holding every record.
	TableName string
	// EventBusName is the EventBridge bus of the lifecycle events
	// (EVENT_BUS_NAME, default DefaultEventBusName).
	EventBusName string
	// OutputBucket and OutputPrefix locate synced outputs:
	// s3://OutputBucket/OutputPrefix/<tenant>/<user>/<thread>/...
	OutputBucket string
	OutputPrefix string
	// S3PathStyle is true when an S3 endpoint override is set (local S3
	// stand-ins such as versitygw need path-style addressing).
	S3PathStyle bool
	// Sync caps the output sync passes.
	Sync Sync
	// Reconcile bounds the reconcile passes (RECONCILE_*).
	Reconcile core.ReconcileSettings
	// Pool is the pre-warmed pool (SANDBOX_POOL_*).
	Pool Pool
	// TokenSeal says how sandbox access tokens are sealed at rest.
	TokenSeal TokenSeal
	// Webhook is the provider webhooks' signing secret.
	Webhook Webhook
	// AdminTenants may call the /v1/admin routes (BROKER_ADMIN_TENANTS).
	AdminTenants []string
	// TenantClaim is the JWT claim naming the caller's tenant
	// (BROKER_TENANT_CLAIM, default DefaultTenantClaim).
	TenantClaim string
	LogLevel    slog.Level
}

// Webhook is the secret provider webhooks are signed with: Secret itself
// (BROKER_WEBHOOK_SECRET; never logged), or the Secrets Manager secret
// SecretARN holding it (BROKER_WEBHOOK_SECRET_ARN).
type Webhook struct {
	Secret    string
	SecretARN string
}

// String renders c for logs with the API key redacted.
func (c Config) String() string {
	key := ""
	if c.E2B.APIKey != "" {
		key = "[redacted]"
	}
	return fmt.Sprintf("deployment=%s replicas=%d policy=%s burst=%d acquire_timeout=%s idle_timeout=%s active_timeout=%s template=%q e2b_api_url=%s e2b_sandbox_url=%s e2b_api_key=%s table=%s bucket=%s prefix=%q sync_max_files=%d sync_max_total_bytes=%d sync_max_file_bytes=%d sync_max_thread_bytes=%d sync_max_tenant_bytes=%d sync_deadline=%s sync_mirror_deletes=%t log_level=%s",
		c.Settings.Deployment, c.Settings.Replicas, c.Settings.Policy, c.Settings.BurstLimit,
		c.Settings.AcquireTimeout, c.Settings.IdleTimeout, c.Settings.ActiveTimeout, c.Settings.Template,
		c.E2B.APIURL, c.E2B.SandboxURL, key, c.TableName, c.OutputBucket, c.OutputPrefix,
		c.Sync.MaxFiles, c.Sync.MaxTotalBytes, c.Sync.MaxFileBytes, c.Sync.MaxThreadBytes, c.Sync.MaxTenantBytes, c.Sync.Deadline, c.Sync.MirrorDeletes, c.LogLevel) +
		c.providerString()
}

// providerString renders the provider selection with its key redacted.
func (c Config) providerString() string {
	key := ""
	if c.Provisioner.APIKey != "" {
		key = "[redacted]"
	}
	seal := "kms:" + c.TokenSeal.KMSKeyARN
	if len(c.TokenSeal.LocalKey) > 0 {
		seal = "local:[redacted]"
	}
	return fmt.Sprintf(" provider=%s provisioner_url=%s provisioner_api_key=%s token_seal=%s event_bus=%s", c.Provider, c.Provisioner.URL, key, seal, c.EventBusName)
}

// LogValue implements slog.LogValuer so logging a Config never prints the key.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Load reads the process environment. See Parse.
func Load() (Config, []string, error) { return Parse(os.Environ()) }

// Parse reads configuration from environ ("KEY=value" entries, as
// os.Environ returns). It returns the config, warnings (unknown SANDBOX_*
// variables, by name) and an error joining every invalid or missing
// variable, each message starting with the variable's name. Required:
// TABLE_NAME, OUTPUT_BUCKET, and the backend's own: E2B_API_KEY or
// E2B_API_KEY_SECRET_ARN for SANDBOX_PROVIDER=e2b (the default),
// PROVISIONER_URL for SANDBOX_PROVIDER=provisioner.
func Parse(environ []string) (Config, []string, error) {
	env := make(map[string]string, len(environ))
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			env[k] = v
		}
	}
	var warnings []string
	for k := range env {
		if strings.HasPrefix(k, "SANDBOX_") && !knownSandboxVars[k] {
			warnings = append(warnings, fmt.Sprintf("%s: unknown SANDBOX_* variable, ignored", k))
		}
	}
	sort.Strings(warnings)

	p := parser{env: env}
	s := p.settings()

	c := Config{
		Settings:     s,
		Provider:     p.str(EnvSandboxProvider, ProviderE2B),
		TableName:    p.required(EnvTableName),
		EventBusName: p.eventBus(),
		OutputBucket: p.required(EnvOutputBucket),
		OutputPrefix: strings.Trim(p.str(EnvOutputPrefix, ""), "/"),
		S3PathStyle:  env[EnvS3Endpoint] != "" || env[EnvEndpoint] != "",
		TokenSeal:    p.tokenSeal(),
		Webhook:      Webhook{Secret: p.str(EnvWebhookSecret, ""), SecretARN: p.str(EnvWebhookSecretARN, "")},
		Sync: Sync{
			MaxFiles:       p.intVar(EnvSyncMaxFiles, 0, 1),
			MaxTotalBytes:  p.byteCount(EnvSyncMaxTotalBytes),
			MaxFileBytes:   p.byteCount(EnvSyncMaxFileBytes),
			MaxThreadBytes: p.byteCount(EnvSyncMaxThreadBytes),
			MaxTenantBytes: p.byteCount(EnvSyncMaxTenantBytes),
			Deadline:       p.seconds(EnvSyncDeadlineSeconds, 0),
			MirrorDeletes:  p.boolVar(EnvSyncMirrorDeletes, false),
		},
	}
	p.provider(&c)
	c.Reconcile = p.reconcile()
	c.Pool = p.pool()
	c.AdminTenants = p.tenantList(EnvAdminTenants)
	c.TenantClaim = p.str(EnvTenantClaim, DefaultTenantClaim)
	if !claimPattern.MatchString(c.TenantClaim) {
		p.fail(EnvTenantClaim, "must match %s, got %q", claimPattern, c.TenantClaim)
	}
	if err := c.LogLevel.UnmarshalText([]byte(p.str(EnvLogLevel, "INFO"))); err != nil {
		p.fail(EnvLogLevel, "must be DEBUG, INFO, WARN or ERROR, got %q", env[EnvLogLevel])
	}
	if p.errs == nil {
		// Every field was checked above under its variable's name; this is
		// a safety net should core add rules.
		if err := s.Validate(); err != nil {
			p.errs = append(p.errs, fmt.Errorf("SANDBOX_* settings: %w", err))
		}
	}
	if err := errors.Join(p.errs...); err != nil {
		return Config{}, warnings, err
	}
	return c, warnings, nil
}

// settings parses the engine's SANDBOX_* settings.
func (p *parser) settings() core.Settings {
	s := core.DefaultSettings()
	s.Replicas = p.intVar(EnvReplicas, s.Replicas, 1)
	s.Policy = core.OverflowPolicy(p.str(EnvOverflowPolicy, string(s.Policy)))
	switch s.Policy {
	case core.PolicyReject, core.PolicyWait, core.PolicyBurst:
	default:
		p.fail(EnvOverflowPolicy, "must be reject, wait or burst, got %q", s.Policy)
	}
	s.BurstLimit = p.intVar(EnvBurstLimit, s.BurstLimit, 0)
	s.AcquireTimeout = p.seconds(EnvAcquireTimeoutSeconds, s.AcquireTimeout)
	s.IdleTimeout = p.seconds(EnvIdleTimeoutSeconds, s.IdleTimeout)
	s.ActiveTimeout = p.seconds(EnvActiveTimeoutSeconds, s.ActiveTimeout)
	s.MaxLifetime = p.seconds(EnvMaxLifetimeSeconds, s.MaxLifetime)
	s.ExpiringLead = time.Duration(p.intVar(EnvExpiringLeadSeconds, int(s.ExpiringLead/time.Second), 0)) * time.Second
	s.Template = p.str(EnvTemplate, s.Template)
	s.Deployment = p.str(EnvDeploymentID, s.Deployment)
	s.MaxPerUser = p.intVar(EnvMaxPerUser, s.MaxPerUser, 0)
	s.MaxPerTenant = p.intVar(EnvMaxPerTenant, s.MaxPerTenant, 0)
	s.MaxWaitersPerTenant = p.intVar(EnvMaxWaitersPerTenant, s.MaxWaitersPerTenant, 0)
	s.PauseAfter = p.pauseAfter(s.PauseAfter)
	s.MaxPaused = p.intVar(EnvMaxPaused, 0, 1) // unset: 10 × replicas (core.Settings.PausedLimit)
	s.PausedTTL = p.seconds(EnvPausedTTLSeconds, s.PausedTTL)
	s.TenantUsage = core.TenantUsage(p.str(EnvTenantUsage, string(s.TenantUsage)))
	switch s.TenantUsage {
	case core.TenantUsageMetrics, core.TenantUsageEvents:
	default:
		p.fail(EnvTenantUsage, "must be %s or %s, got %q", core.TenantUsageMetrics, core.TenantUsageEvents, s.TenantUsage)
	}
	if !deploymentPattern.MatchString(s.Deployment) {
		p.fail(EnvDeploymentID, "must match %s, got %q", deploymentPattern, s.Deployment)
	}
	// The templates always set E2B_API_KEY_SECRET_ARN, and only they do: a
	// deployed stack must name itself (they default the id to the stack
	// name), because reconcile adopts or kills every sandbox tagged with the
	// id, and "default" is what every unconfigured run shares.
	if s.Deployment == core.DefaultSettings().Deployment && p.str(EnvE2BAPIKeySecretARN, "") != "" {
		p.fail(EnvDeploymentID, "must name this deployment when it is deployed (%s is set), not %q: stacks sharing a provider account would reconcile each other's sandboxes",
			EnvE2BAPIKeySecretARN, s.Deployment)
	}
	return s
}

// provider parses the settings of the provider c.Provider names.
func (p *parser) provider(c *Config) {
	switch c.Provider {
	case ProviderE2B:
		c.E2B = E2B{
			APIURL:     p.url(EnvE2BAPIURL, DefaultE2BAPIURL, true),
			SandboxURL: p.url(EnvE2BSandboxURL, "", false),
			APIKey:     p.apiKey(),
			// Validated by p.apiKey.
			APIKeySecretARN: p.str(EnvE2BAPIKeySecretARN, ""),
		}
	case ProviderProvisioner:
		c.Provisioner = Provisioner{URL: p.url(EnvProvisionerURL, "", true), APIKey: p.str(EnvProvisionerAPIKey, "")}
	default:
		p.fail(EnvSandboxProvider, "must be one of %s, got %q", strings.Join(ProviderNames, ", "), c.Provider)
	}
}

type parser struct {
	env  map[string]string
	errs []error
}

func (p *parser) fail(name, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: "+format, append([]any{name}, args...)...))
}

func (p *parser) str(name, def string) string {
	if v, ok := p.env[name]; ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v)
	}
	return def
}

// tokenSeal reads TOKEN_KMS_KEY_ARN or TOKEN_LOCAL_KEY: exactly one.
func (p *parser) tokenSeal() TokenSeal {
	arn, local := p.str(EnvTokenKMSKeyARN, ""), p.str(EnvTokenLocalKey, "")
	switch {
	case arn != "" && local != "":
		p.fail(EnvTokenLocalKey, "must be empty when %s is set", EnvTokenKMSKeyARN)
	case arn != "":
		if !strings.HasPrefix(arn, "arn:") || !strings.Contains(arn, ":kms:") {
			p.fail(EnvTokenKMSKeyARN, "must be a KMS key ARN, got %q", arn)
		}
		return TokenSeal{KMSKeyARN: arn}
	case local != "":
		key, err := base64.StdEncoding.DecodeString(local)
		if err != nil || len(key) != 32 {
			p.fail(EnvTokenLocalKey, "must be the base64 encoding of 32 bytes")
			return TokenSeal{}
		}
		return TokenSeal{LocalKey: key}
	default:
		p.fail(EnvTokenKMSKeyARN, "required (or %s): sandbox access tokens are never stored in plaintext", EnvTokenLocalKey)
	}
	return TokenSeal{}
}

// eventBus reads EVENT_BUS_NAME: an event bus name or ARN.
func (p *parser) eventBus() string {
	v := p.str(EnvEventBusName, DefaultEventBusName)
	if !eventBusPattern.MatchString(v) && !eventBusARNPattern.MatchString(v) {
		p.fail(EnvEventBusName, "must be an event bus name (%s) or an event bus ARN, got %q", eventBusPattern, v)
	}
	return v
}

// apiKey reads E2B_API_KEY, required unless E2B_API_KEY_SECRET_ARN names
// the secret holding it (a Secrets Manager ARN); setting both is an error.
func (p *parser) apiKey() string {
	arn := p.str(EnvE2BAPIKeySecretARN, "")
	if arn == "" {
		return p.required(EnvE2BAPIKey)
	}
	if !strings.HasPrefix(arn, "arn:") || !strings.Contains(arn, ":secretsmanager:") {
		p.fail(EnvE2BAPIKeySecretARN, "must be a Secrets Manager secret ARN, got %q", arn)
	}
	if p.str(EnvE2BAPIKey, "") != "" {
		p.fail(EnvE2BAPIKey, "must be empty when %s is set", EnvE2BAPIKeySecretARN)
	}
	return ""
}

// tenantList parses a comma-separated list of tenant ids.
func (p *parser) tenantList(name string) []string {
	var out []string
	for _, t := range strings.Split(p.str(name, ""), ",") {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		if !deploymentPattern.MatchString(t) {
			p.fail(name, "tenant %q must match %s", t, deploymentPattern)
			continue
		}
		out = append(out, t)
	}
	return out
}

func (p *parser) required(name string) string {
	v := p.str(name, "")
	if v == "" {
		p.fail(name, "is required")
	}
	return v
}

func (p *parser) intVar(name string, def, minimum int) int {
	v := p.str(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		p.fail(name, "must be an integer, got %q", v)
		return def
	}
	if n < minimum {
		p.fail(name, "must be >= %d, got %d", minimum, n)
		return def
	}
	return n
}

// byteCount parses a positive whole number of bytes; unset is 0.
func (p *parser) byteCount(name string) int64 {
	v := p.str(name, "")
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		p.fail(name, "must be a positive whole number of bytes, got %q", v)
		return 0
	}
	return n
}

// boolVar parses true/false (strconv.ParseBool forms).
func (p *parser) boolVar(name string, def bool) bool {
	v := p.str(name, "")
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.fail(name, "must be true or false, got %q", v)
		return def
	}
	return b
}

// pauseAfter parses SANDBOX_PAUSE_AFTER_SECONDS: -1 (never pauses), 0
// (pauses at release) or a positive whole number of seconds.
func (p *parser) pauseAfter(def time.Duration) time.Duration {
	switch p.str(EnvPauseAfterSeconds, "") {
	case "-1":
		return core.PauseNever
	case "0":
		return 0
	}
	return p.seconds(EnvPauseAfterSeconds, def)
}

// seconds parses a positive whole number of seconds.
func (p *parser) seconds(name string, def time.Duration) time.Duration {
	v := p.str(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		p.fail(name, "must be a whole number of seconds, got %q", v)
		return def
	}
	const maxSeconds = 365 * 24 * 3600
	if n <= 0 || n > maxSeconds {
		p.fail(name, "must be between 1 and %d seconds, got %d", maxSeconds, n)
		return def
	}
	return time.Duration(n) * time.Second
}

func (p *parser) url(name, def string, required bool) string {
	v := p.str(name, def)
	if v == "" {
		if required {
			p.fail(name, "is required")
		}
		return ""
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.fail(name, "must be an absolute http(s) URL, got %q", v)
		return v
	}
	return strings.TrimRight(v, "/")
}
