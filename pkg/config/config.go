// Package config reads the broker's Lambda configuration from environment
// variables once, applies the documented defaults (issue 2 item 6, README)
// and validates it, so every function fails fast at cold start with a message
// naming the offending variable.
package config

import (
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

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// Environment variable names read by Load.
const (
	EnvReplicas              = "SANDBOX_REPLICAS"
	EnvOverflowPolicy        = "SANDBOX_OVERFLOW_POLICY"
	EnvAcquireTimeoutSeconds = "SANDBOX_ACQUIRE_TIMEOUT_SECONDS"
	EnvBurstLimit            = "SANDBOX_BURST_LIMIT"
	EnvIdleTimeoutSeconds    = "SANDBOX_IDLE_TIMEOUT_SECONDS"
	EnvActiveTimeoutSeconds  = "SANDBOX_ACTIVE_TIMEOUT_SECONDS"
	EnvTemplate              = "SANDBOX_TEMPLATE"
	EnvDeploymentID          = "SANDBOX_DEPLOYMENT_ID"
	EnvE2BAPIURL             = "E2B_API_URL"
	EnvE2BSandboxURL         = "E2B_SANDBOX_URL"
	EnvE2BAPIKey             = "E2B_API_KEY"
	EnvTableName             = "TABLE_NAME"
	EnvOutputBucket          = "OUTPUT_BUCKET"
	EnvOutputPrefix          = "OUTPUT_PREFIX"
	EnvLogLevel              = "LOG_LEVEL"
	// EnvS3Endpoint and EnvEndpoint are the AWS SDK's own endpoint overrides
	// (honoured by aws-sdk-go-v2/config); Load only reads them to decide
	// whether S3 needs path-style addressing (local S3 stand-ins).
	EnvS3Endpoint = "AWS_ENDPOINT_URL_S3"
	EnvEndpoint   = "AWS_ENDPOINT_URL"
)

// DefaultE2BAPIURL is E2B's public control-plane URL (E2B API spec).
const DefaultE2BAPIURL = "https://api.e2b.app"

// deploymentPattern is the shape core.Settings.Validate requires of Deployment.
var deploymentPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// knownSandboxVars are the SANDBOX_* variables Load understands; any other
// SANDBOX_* variable is reported as a warning (likely a typo).
var knownSandboxVars = map[string]bool{
	EnvReplicas: true, EnvOverflowPolicy: true, EnvAcquireTimeoutSeconds: true,
	EnvBurstLimit: true, EnvIdleTimeoutSeconds: true, EnvActiveTimeoutSeconds: true,
	EnvTemplate: true, EnvDeploymentID: true,
}

// E2B configures the E2B provider client.
type E2B struct {
	// APIURL is the control-plane base URL (default DefaultE2BAPIURL).
	APIURL string
	// SandboxURL is the envd base URL for every sandbox ("" = the provider's
	// per-sandbox domain).
	SandboxURL string
	// APIKey is sent as X-API-Key. Secret: never log it (String redacts it).
	APIKey string
}

// Config is the whole configuration of one broker function.
type Config struct {
	Settings core.Settings
	E2B      E2B
	// TableName is the DynamoDB table holding every record.
	TableName string
	// OutputBucket and OutputPrefix locate synced outputs:
	// s3://OutputBucket/OutputPrefix/<tenant>/<user>/<thread>/...
	OutputBucket string
	OutputPrefix string
	// S3PathStyle is true when an S3 endpoint override is set (local S3
	// stand-ins such as versitygw need path-style addressing).
	S3PathStyle bool
	LogLevel    slog.Level
}

// String renders c for logs with the API key redacted.
func (c Config) String() string {
	key := ""
	if c.E2B.APIKey != "" {
		key = "[redacted]"
	}
	return fmt.Sprintf("deployment=%s replicas=%d policy=%s burst=%d acquire_timeout=%s idle_timeout=%s active_timeout=%s template=%q e2b_api_url=%s e2b_sandbox_url=%s e2b_api_key=%s table=%s bucket=%s prefix=%q log_level=%s",
		c.Settings.Deployment, c.Settings.Replicas, c.Settings.Policy, c.Settings.BurstLimit,
		c.Settings.AcquireTimeout, c.Settings.IdleTimeout, c.Settings.ActiveTimeout, c.Settings.Template,
		c.E2B.APIURL, c.E2B.SandboxURL, key, c.TableName, c.OutputBucket, c.OutputPrefix, c.LogLevel)
}

// LogValue implements slog.LogValuer so logging a Config never prints the key.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Load reads the process environment. See Parse.
func Load() (Config, []string, error) { return Parse(os.Environ()) }

// Parse reads configuration from environ ("KEY=value" entries, as
// os.Environ returns). It returns the config, warnings (unknown SANDBOX_*
// variables, by name) and an error joining every invalid or missing
// variable, each message starting with the variable's name. Required:
// E2B_API_KEY, TABLE_NAME, OUTPUT_BUCKET.
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
	s.Template = p.str(EnvTemplate, s.Template)
	s.Deployment = p.str(EnvDeploymentID, s.Deployment)
	if !deploymentPattern.MatchString(s.Deployment) {
		p.fail(EnvDeploymentID, "must match %s, got %q", deploymentPattern, s.Deployment)
	}

	c := Config{
		Settings: s,
		E2B: E2B{
			APIURL:     p.url(EnvE2BAPIURL, DefaultE2BAPIURL, true),
			SandboxURL: p.url(EnvE2BSandboxURL, "", false),
			APIKey:     p.required(EnvE2BAPIKey),
		},
		TableName:    p.required(EnvTableName),
		OutputBucket: p.required(EnvOutputBucket),
		OutputPrefix: strings.Trim(p.str(EnvOutputPrefix, ""), "/"),
		S3PathStyle:  env[EnvS3Endpoint] != "" || env[EnvEndpoint] != "",
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
