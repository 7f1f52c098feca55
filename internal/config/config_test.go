package config

import (
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// testLocalKey is a TOKEN_LOCAL_KEY (32 zero bytes, base64).
const testLocalKey = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="

// base is the minimal valid environment: the three required variables.
func base(extra ...string) []string {
	return append([]string{"E2B_API_KEY=e2b_secret", "TABLE_NAME=tbl", "OUTPUT_BUCKET=bkt", "TOKEN_LOCAL_KEY=" + testLocalKey}, extra...)
}

func TestParseDefaults(t *testing.T) {
	c, warnings, err := Parse(base())
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings = %v, want none", warnings)
	}
	want := core.DefaultSettings()
	if !reflect.DeepEqual(c.Settings, want) {
		t.Errorf("Settings = %+v, want defaults %+v", c.Settings, want)
	}
	if c.Settings.Replicas != 3 || c.Settings.Policy != core.PolicyWait || c.Settings.IdleTimeout != 1800*time.Second {
		t.Errorf("documented defaults: replicas=%d policy=%s idle=%s, want 3 wait 30m0s",
			c.Settings.Replicas, c.Settings.Policy, c.Settings.IdleTimeout)
	}
	if c.E2B.APIURL != DefaultE2BAPIURL || c.E2B.SandboxURL != "" || c.E2B.APIKey != "e2b_secret" {
		t.Errorf("E2B = %+v", c.E2B)
	}
	if c.TableName != "tbl" || c.OutputBucket != "bkt" || c.OutputPrefix != "" || c.S3PathStyle {
		t.Errorf("storage = table %q bucket %q prefix %q pathstyle %v", c.TableName, c.OutputBucket, c.OutputPrefix, c.S3PathStyle)
	}
	if c.LogLevel != slog.LevelInfo {
		t.Errorf("LogLevel = %v, want INFO", c.LogLevel)
	}
}

func TestParseOverrides(t *testing.T) {
	c, _, err := Parse(base(
		"SANDBOX_REPLICAS=1", "SANDBOX_OVERFLOW_POLICY=reject", "SANDBOX_ACQUIRE_TIMEOUT_SECONDS=5",
		"SANDBOX_BURST_LIMIT=2", "SANDBOX_IDLE_TIMEOUT_SECONDS=60", "SANDBOX_ACTIVE_TIMEOUT_SECONDS=120",
		"SANDBOX_TEMPLATE=python", "SANDBOX_DEPLOYMENT_ID=dev-1", "SANDBOX_MAX_PER_TENANT=7", "SANDBOX_MAX_WAITERS_PER_TENANT=4",
		"E2B_API_URL=http://127.0.0.1:3000/", "E2B_SANDBOX_URL=http://127.0.0.1:3001",
		"OUTPUT_PREFIX=/outputs/", "LOG_LEVEL=debug", "AWS_ENDPOINT_URL_S3=http://127.0.0.1:9000",
		"SANDBOX_TENANT_USAGE=events",
	))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	s := c.Settings
	got := []any{s.Replicas, s.Policy, s.AcquireTimeout, s.BurstLimit, s.IdleTimeout, s.ActiveTimeout, s.Template, s.Deployment,
		s.MaxPerTenant, s.MaxWaitersPerTenant, c.E2B.APIURL, c.E2B.SandboxURL, c.OutputPrefix, c.LogLevel, c.S3PathStyle, s.TenantUsage}
	want := []any{1, core.PolicyReject, 5 * time.Second, 2, 60 * time.Second, 120 * time.Second, "python", "dev-1",
		7, 4, "http://127.0.0.1:3000", "http://127.0.0.1:3001", "outputs", slog.LevelDebug, true, core.TenantUsageEvents}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestParseInvalidNamesVariable(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string // variable the error must name
	}{
		{"replicas zero", base("SANDBOX_REPLICAS=0"), "SANDBOX_REPLICAS"},
		{"replicas not int", base("SANDBOX_REPLICAS=three"), "SANDBOX_REPLICAS"},
		{"policy unknown", base("SANDBOX_OVERFLOW_POLICY=queue"), "SANDBOX_OVERFLOW_POLICY"},
		{"acquire timeout negative", base("SANDBOX_ACQUIRE_TIMEOUT_SECONDS=-1"), "SANDBOX_ACQUIRE_TIMEOUT_SECONDS"},
		{"acquire timeout fraction", base("SANDBOX_ACQUIRE_TIMEOUT_SECONDS=1.5"), "SANDBOX_ACQUIRE_TIMEOUT_SECONDS"},
		{"burst negative", base("SANDBOX_BURST_LIMIT=-2"), "SANDBOX_BURST_LIMIT"},
		{"tenant quota negative", base("SANDBOX_MAX_PER_TENANT=-1"), "SANDBOX_MAX_PER_TENANT"},
		{"waiters not int", base("SANDBOX_MAX_WAITERS_PER_TENANT=ten"), "SANDBOX_MAX_WAITERS_PER_TENANT"},
		{"idle zero", base("SANDBOX_IDLE_TIMEOUT_SECONDS=0"), "SANDBOX_IDLE_TIMEOUT_SECONDS"},
		{"active huge", base("SANDBOX_ACTIVE_TIMEOUT_SECONDS=999999999"), "SANDBOX_ACTIVE_TIMEOUT_SECONDS"},
		{"deployment bad", base("SANDBOX_DEPLOYMENT_ID=a/b"), "SANDBOX_DEPLOYMENT_ID"},
		// Deployed (the templates set the secret ARN): "default" is refused,
		// explicitly or by omission.
		{"deployed as default", []string{"TABLE_NAME=t", "OUTPUT_BUCKET=b", "E2B_API_KEY_SECRET_ARN=arn:aws:secretsmanager:eu-west-1:123456789012:secret:k", "SANDBOX_DEPLOYMENT_ID=default"}, "SANDBOX_DEPLOYMENT_ID"},
		{"deployed without id", []string{"TABLE_NAME=t", "OUTPUT_BUCKET=b", "E2B_API_KEY_SECRET_ARN=arn:aws:secretsmanager:eu-west-1:123456789012:secret:k"}, "SANDBOX_DEPLOYMENT_ID"},
		{"tenant claim with space", base("BROKER_TENANT_CLAIM=custom tenant"), "BROKER_TENANT_CLAIM"},
		{"api url relative", base("E2B_API_URL=api.e2b.app"), "E2B_API_URL"},
		{"sandbox url scheme", base("E2B_SANDBOX_URL=ftp://x"), "E2B_SANDBOX_URL"},
		{"log level", base("LOG_LEVEL=loud"), "LOG_LEVEL"},
		{"missing key", []string{"TABLE_NAME=t", "OUTPUT_BUCKET=b"}, "E2B_API_KEY"},
		{"missing table", []string{"E2B_API_KEY=k", "OUTPUT_BUCKET=b"}, "TABLE_NAME"},
		{"missing bucket", []string{"E2B_API_KEY=k", "TABLE_NAME=t"}, "OUTPUT_BUCKET"},
		{"blank table", []string{"E2B_API_KEY=k", "TABLE_NAME=  ", "OUTPUT_BUCKET=b"}, "TABLE_NAME"},
		{"sync max files zero", base("SYNC_MAX_FILES=0"), "SYNC_MAX_FILES"},
		{"sync total bytes unit", base("SYNC_MAX_TOTAL_BYTES=1GiB"), "SYNC_MAX_TOTAL_BYTES"},
		{"sync file bytes negative", base("SYNC_MAX_FILE_BYTES=-1"), "SYNC_MAX_FILE_BYTES"},
		{"sync tenant bytes unit", base("SYNC_MAX_TENANT_BYTES=100GiB"), "SYNC_MAX_TENANT_BYTES"},
		{"sync deadline zero", base("SYNC_DEADLINE_SECONDS=0"), "SYNC_DEADLINE_SECONDS"},
		{"sync mirror deletes", base("SYNC_MIRROR_DELETES=maybe"), "SYNC_MIRROR_DELETES"},
		{"pause after -2", base("SANDBOX_PAUSE_AFTER_SECONDS=-2"), "SANDBOX_PAUSE_AFTER_SECONDS"},
		{"pause after word", base("SANDBOX_PAUSE_AFTER_SECONDS=never"), "SANDBOX_PAUSE_AFTER_SECONDS"},
		{"max paused zero", base("SANDBOX_MAX_PAUSED=0"), "SANDBOX_MAX_PAUSED"},
		{"paused ttl zero", base("SANDBOX_PAUSED_TTL_SECONDS=0"), "SANDBOX_PAUSED_TTL_SECONDS"},
		{"tenant usage unknown", base("SANDBOX_TENANT_USAGE=logs"), "SANDBOX_TENANT_USAGE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Parse(tt.env)
			if err == nil {
				t.Fatalf("Parse(%v) = nil error, want one naming %s", tt.env, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want+":") {
				t.Errorf("error %q does not name %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "e2b_secret") {
				t.Errorf("error %q leaks the API key", err)
			}
		})
	}
}

func TestParsePauseParking(t *testing.T) {
	tests := []struct {
		name       string
		env        []string
		pauseAfter time.Duration
		maxPaused  int
		ttl        time.Duration
	}{
		{"defaults", base(), 300 * time.Second, 30, 7 * 24 * time.Hour},
		{"max paused follows replicas", base("SANDBOX_REPLICAS=5"), 300 * time.Second, 50, 7 * 24 * time.Hour},
		{"at release", base("SANDBOX_PAUSE_AFTER_SECONDS=0"), 0, 30, 7 * 24 * time.Hour},
		{"never", base("SANDBOX_PAUSE_AFTER_SECONDS=-1"), core.PauseNever, 30, 7 * 24 * time.Hour},
		{"set", base("SANDBOX_PAUSE_AFTER_SECONDS=60", "SANDBOX_MAX_PAUSED=4", "SANDBOX_PAUSED_TTL_SECONDS=3600"), time.Minute, 4, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, warnings, err := Parse(tt.env)
			if err != nil || len(warnings) > 0 {
				t.Fatalf("Parse = %v (warnings %v)", err, warnings)
			}
			s := c.Settings
			if s.PauseAfter != tt.pauseAfter || s.PausedLimit() != tt.maxPaused || s.PausedTTL != tt.ttl {
				t.Errorf("pause after %s, paused limit %d, ttl %s; want %s, %d, %s", s.PauseAfter, s.PausedLimit(), s.PausedTTL,
					tt.pauseAfter, tt.maxPaused, tt.ttl)
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	_, _, err := Parse([]string{"SANDBOX_REPLICAS=x", "SANDBOX_OVERFLOW_POLICY=y"})
	if err == nil {
		t.Fatal("want error")
	}
	for _, v := range []string{"SANDBOX_REPLICAS", "SANDBOX_OVERFLOW_POLICY", "E2B_API_KEY", "TABLE_NAME", "OUTPUT_BUCKET"} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("error %q does not mention %s", err, v)
		}
	}
}

func TestParseWarnsUnknownSandboxVars(t *testing.T) {
	_, warnings, err := Parse(base("SANDBOX_REPLICA=2", "SANDBOX_IDLE_TIMEOUT=60", "OTHER_THING=1"))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(warnings) != 2 || !strings.HasPrefix(warnings[0], "SANDBOX_IDLE_TIMEOUT:") || !strings.HasPrefix(warnings[1], "SANDBOX_REPLICA:") {
		t.Errorf("warnings = %q, want SANDBOX_IDLE_TIMEOUT and SANDBOX_REPLICA", warnings)
	}
}

func TestConfigNeverPrintsAPIKey(t *testing.T) {
	c, _, err := Parse(base())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	slog.New(slog.NewJSONHandler(&b, nil)).Info("config", "config", c)
	for _, s := range []string{c.String(), b.String()} {
		if strings.Contains(s, "e2b_secret") {
			t.Errorf("%q contains the API key", s)
		}
		if !strings.Contains(s, "[redacted]") {
			t.Errorf("%q does not show the key as redacted", s)
		}
	}
}

func TestParseSyncCaps(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want Sync
	}{
		{"unset means syncer defaults", base(), Sync{}},
		{"all set", base("SYNC_MAX_FILES=50", "SYNC_MAX_TOTAL_BYTES=1073741824", "SYNC_MAX_FILE_BYTES=1048576",
			"SYNC_MAX_THREAD_BYTES=2048", "SYNC_MAX_TENANT_BYTES=4096", "SYNC_DEADLINE_SECONDS=15", "SYNC_MIRROR_DELETES=true"),
			Sync{MaxFiles: 50, MaxTotalBytes: 1 << 30, MaxFileBytes: 1 << 20, MaxThreadBytes: 2048, MaxTenantBytes: 4096,
				Deadline: 15 * time.Second, MirrorDeletes: true}},
		{"mirror deletes off", base("SYNC_MIRROR_DELETES=false"), Sync{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := Parse(tt.env)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if c.Sync != tt.want {
				t.Errorf("Sync = %+v, want %+v", c.Sync, tt.want)
			}
		})
	}
}

// TestParseTokenSeal: sandbox access tokens are sealed under a KMS key or
// a local key; exactly one is required, so none are stored in plaintext.
func TestParseTokenSeal(t *testing.T) {
	common := []string{"E2B_API_KEY=k", "TABLE_NAME=t", "OUTPUT_BUCKET=b"}
	const arn = "arn:aws:kms:eu-west-1:123456789012:key/0a1b2c3d-0000-4000-8000-000000000000"
	tests := []struct {
		name    string
		env     []string
		want    TokenSeal
		wantErr string
	}{
		{"local key", []string{"TOKEN_LOCAL_KEY=" + testLocalKey}, TokenSeal{LocalKey: make([]byte, 32)}, ""},
		{"kms key", []string{"TOKEN_KMS_KEY_ARN=" + arn}, TokenSeal{KMSKeyARN: arn}, ""},
		{"neither", nil, TokenSeal{}, "TOKEN_KMS_KEY_ARN: required"},
		{"both", []string{"TOKEN_KMS_KEY_ARN=" + arn, "TOKEN_LOCAL_KEY=" + testLocalKey}, TokenSeal{}, "TOKEN_LOCAL_KEY: must be empty"},
		{"short local key", []string{"TOKEN_LOCAL_KEY=AAAA"}, TokenSeal{}, "TOKEN_LOCAL_KEY: must be the base64 encoding of 32 bytes"},
		{"not a kms arn", []string{"TOKEN_KMS_KEY_ARN=alias/x"}, TokenSeal{}, "TOKEN_KMS_KEY_ARN: must be a KMS key ARN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := Parse(append(append([]string{}, common...), tt.env...))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(c.TokenSeal, tt.want) {
				t.Fatalf("TokenSeal = %+v, %v; want %+v", c.TokenSeal, err, tt.want)
			}
			if strings.Contains(c.String(), testLocalKey) {
				t.Errorf("String() prints the local key: %s", c.String())
			}
		})
	}
}

func TestParseEventBusName(t *testing.T) {
	const arn = "arn:aws:events:eu-west-1:123456789012:event-bus/broker-events"
	tests := []struct {
		name    string
		env     []string
		want    string
		wantErr string
	}{
		{"unset: the default bus", nil, DefaultEventBusName, ""},
		{"name", []string{"EVENT_BUS_NAME=broker-events"}, "broker-events", ""},
		{"partner bus name", []string{"EVENT_BUS_NAME=aws.partner/example.com/123/stream"}, "aws.partner/example.com/123/stream", ""},
		{"arn", []string{"EVENT_BUS_NAME=" + arn}, arn, ""},
		{"spaces", []string{"EVENT_BUS_NAME=my bus"}, "", "EVENT_BUS_NAME: must be an event bus name"},
		{"another service's arn", []string{"EVENT_BUS_NAME=arn:aws:sqs:eu-west-1:123456789012:q"}, "", "EVENT_BUS_NAME: must be an event bus name"},
		{"too long", []string{"EVENT_BUS_NAME=" + strings.Repeat("b", 257)}, "", "EVENT_BUS_NAME: must be an event bus name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := Parse(base(tt.env...))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || c.EventBusName != tt.want {
				t.Fatalf("EventBusName = %q, %v; want %q", c.EventBusName, err, tt.want)
			}
		})
	}
}
