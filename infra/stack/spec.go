// Package stack defines the sandbox-broker's AWS deployment as a CDK (v2)
// stack: the HTTP API with its authorizer, the five Lambda functions, the
// DynamoDB table, the S3 output bucket, the E2B API key secret, the
// reconcile schedule, alarms and a dashboard. infra/main.go synthesizes it;
// template.yaml describes the same functions, routes, environment and
// schedule for SAM, and the parity test in this package keeps the two (and
// internal/config) in step.
package stack

import (
	"slices"
	"strings"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Route is one HTTP API route: an upper-case method (or ANY) and a path in
// API Gateway's syntax ({id} is a path parameter, {proxy+} the rest of the
// path), and the request header its authorizer reads the caller's token
// from ("" = Authorization).
type Route struct {
	Method      string
	Path        string
	TokenHeader string
}

// APIKeyHeader is where the E2B SDKs send their key: the /e2b routes read
// the tenant's token there.
const APIKeyHeader = "X-API-Key"

// NoAuthorizer is the TokenHeader of a route without an authorizer: it
// authenticates its callers itself (a provider webhook's signature).
const NoAuthorizer = "NONE"

// Public reports whether the route has no authorizer.
func (r Route) Public() bool { return r.TokenHeader == NoAuthorizer }

// Key is the API Gateway route key, "METHOD /path".
func (r Route) Key() string { return r.Method + " " + r.Path }

// Function describes one Lambda function of the broker. Name is also the
// directory of its bootstrap under the asset root (.build/<Name>/) and of
// its source (functions/<Name>).
type Function struct {
	Name        string
	LogicalID   string // the same in template.yaml and the CDK stack
	Description string
	MemoryMB    int
	// TimeoutSeconds: 29 for HTTP API functions (HTTP API integrations end
	// at 30 s), longer for the scheduled reconcile.
	TimeoutSeconds int
	Routes         []Route
	// Schedule is an EventBridge rate expression ("" = not scheduled).
	Schedule string
	// RefillsPool: the function's pool claims start a refill by invoking
	// the scheduled function asynchronously (POOL_REFILL_FUNCTION, and
	// lambda:InvokeFunction on that function alone).
	RefillsPool bool
	// PublishesEvents: the function's routes or schedule publish lifecycle
	// events (the engine's Acquire, Release, Sync and Reconcile do; its
	// Get, Capacity and SetDraining never do). Only these functions get
	// EVENT_BUS_NAME and events:PutEvents on that bus.
	PublishesEvents bool
	// Actions are the IAM actions the function's code calls (its logs
	// aside): the AWS SDK calls reachable from its cold start and from the
	// engine methods its routes or schedule reach, derived and pinned by
	// TestFunctionActions. Its policy grants exactly these.
	Actions []string
}

// ServesWebhooks reports whether f serves a provider webhook route (a
// public one): it gets the webhook secret (BROKER_WEBHOOK_SECRET_ARN, and
// GetSecretValue on that secret alone).
func (f Function) ServesWebhooks() bool { return slices.ContainsFunc(f.Routes, Route.Public) }

// Allows reports whether f's code calls action.
func (f Function) Allows(action string) bool { return slices.Contains(f.Actions, action) }

// Granted returns the actions of all that f calls, in all's order.
func (f Function) Granted(all []string) []string {
	var out []string
	for _, a := range all {
		if f.Allows(a) {
			out = append(out, a)
		}
	}
	return out
}

// Action sets shared by the functions' Actions.
var (
	// tableWrites are what TransactWriteItems is authorized as.
	tableWrites = []string{"dynamodb:ConditionCheckItem", "dynamodb:DeleteItem", "dynamodb:PutItem", "dynamodb:UpdateItem"}
	// outputAccess is the output syncer's (uploads, restores, deletes).
	outputAccess = []string{"s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:ListBucket", "s3:PutObject"}
	readKey      = []string{"secretsmanager:GetSecretValue"}
	openTokens   = []string{"kms:Decrypt"}
	sealTokens   = []string{"kms:Decrypt", "kms:GenerateDataKey"}
	publish      = []string{"events:PutEvents"}
	// readQueue is a read of the wait queue's shards in one PartiQL
	// SELECT on their partition keys (ddbstore's wholeQueue: an
	// eviction's check for waiters, a free's dispatch).
	readQueue = []string{"dynamodb:PartiQLSelect"}
)

// actions joins action sets, sorted.
func actions(sets ...[]string) []string {
	out := slices.Concat(sets...)
	slices.Sort(out)
	return slices.Compact(out)
}

// Gets reports whether f's environment carries p's variable: every
// parameter reaches every function, except the event bus, which only the
// functions that publish lifecycle events get.
func (f Function) Gets(p Parameter) bool {
	return p.Env != config.EnvEventBusName || f.PublishesEvents
}

// Functions are the broker's five functions: four behind the HTTP API,
// one on the reconcile schedule.
var Functions = []Function{
	{
		Name: "acquire", LogicalID: "AcquireFunction", MemoryMB: 256, TimeoutSeconds: 29,
		Description:     "POST /v1/sandboxes/acquire (may wait for a slot; reads are served by StatusFunction)",
		Routes:          []Route{{"POST", "/v1/sandboxes/acquire", ""}},
		RefillsPool:     true,
		PublishesEvents: true,
		Actions: actions(tableWrites, outputAccess, readKey, sealTokens, publish, LambdaInvokeActions, readQueue,
			[]string{"dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:Query"}),
	},
	{
		// Short reads and admin writes, on their own function so that
		// acquires waiting for a slot (holding acquire's instances) never
		// queue them.
		Name: "status", LogicalID: "StatusFunction", MemoryMB: 256, TimeoutSeconds: 29,
		Description:     "GET /v1/capacity, GET /v1/sandboxes/{id}, POST /v1/admin/drain|undrain, GET /v1/openapi.json, /e2b (E2B's control plane)",
		PublishesEvents: true, // the /e2b face acquires and releases
		Routes: []Route{
			{"GET", "/v1/sandboxes/{id}", ""},
			{"GET", "/v1/capacity", ""},
			{"POST", "/v1/admin/drain", ""},
			{"POST", "/v1/admin/undrain", ""},
			{"GET", "/v1/openapi.json", ""},
			{"POST", "/e2b/sandboxes/{id}/connect", APIKeyHeader},
			{"POST", "/e2b/v2/sandboxes/{id}/connect", APIKeyHeader},
			{"ANY", "/e2b/{proxy+}", APIKeyHeader},
		},
		// Reads records and the ledger, writes the drain flag, and, for
		// the /e2b face, acquires (sealing new access tokens), releases
		// (syncing outputs) and lists a tenant's sandboxes (an index
		// query): no scan.
		Actions: actions(tableWrites, outputAccess, readKey, sealTokens, publish, readQueue, []string{"dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:Query"}),
	},
	{
		Name: "release", LogicalID: "ReleaseFunction", MemoryMB: 512, TimeoutSeconds: 29,
		Description:     "POST /v1/sandboxes/{id}/release (syncs outputs to S3, parks warm), /renew, and POST /webhooks/e2b (E2B's signed lifecycle webhooks)",
		Routes:          []Route{{"POST", "/v1/sandboxes/{id}/release", ""}, {"POST", "/v1/sandboxes/{id}/renew", ""}, {"POST", "/webhooks/e2b", NoAuthorizer}},
		PublishesEvents: true,
		Actions:         actions(tableWrites, outputAccess, readKey, openTokens, publish, readQueue, []string{"dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:Query"}),
	},
	{
		Name: "sync", LogicalID: "SyncFunction", MemoryMB: 512, TimeoutSeconds: 29,
		Description:     "POST /v1/sandboxes/{id}/sync (copies outputs to S3)",
		Routes:          []Route{{"POST", "/v1/sandboxes/{id}/sync", ""}},
		PublishesEvents: true, // a sandbox found gone is destroyed
		Actions:         actions(tableWrites, outputAccess, readKey, openTokens, publish, readQueue, []string{"dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:Query"}),
	},
	{
		Name: "reconcile", LogicalID: "ReconcileFunction", MemoryMB: 256, TimeoutSeconds: 120,
		Description:     "Scheduled reconcile pass (idle warm expiry, tombstones, inventory)",
		Schedule:        ReconcileSchedule,
		PublishesEvents: true,
		// The only scan: the counter repair's exact count and sweep.
		Actions: actions(tableWrites, outputAccess, readKey, sealTokens, publish, readQueue,
			[]string{"dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:Query", "dynamodb:Scan"}),
	},
}

// ReservedParam is the CloudFormation parameter (in both templates) that
// sets the function's reserved concurrency, e.g. AcquireReservedConcurrency.
func (f Function) ReservedParam() string { return f.LogicalIDBase() + "ReservedConcurrency" }

// LogicalIDBase is the logical ID without its "Function" suffix ("Acquire").
func (f Function) LogicalIDBase() string { return strings.TrimSuffix(f.LogicalID, "Function") }

// ReservedParamDescription describes f's reserved concurrency parameter.
func ReservedParamDescription(f Function) string {
	return "Concurrent executions reserved for the " + f.Name + " function (0 = none). " +
		"Reservations come out of the account's concurrency quota, which must keep 100 unreserved."
}

// ParamAlarmEmail is the parameter (in both templates) for an e-mail
// subscription to the alarm topic.
const ParamAlarmEmail = "AlarmEmail"

// CDKOnlyParameters are the CDK stack's parameters template.yaml does not
// have, each with the reason (none today: both have the alarm topic's
// AlarmEmail).
var CDKOnlyParameters = map[string]string{}

// NumberParameter is a Number parameter of both templates that feeds no
// environment variable: storage and API settings.
type NumberParameter struct {
	Name        string
	Default     float64
	MinValue    float64
	Description string
}

// Names of the NumberParameters.
const (
	ParamOutputExpirationDays = "OutputExpirationDays"
	ParamAPIThrottleRate      = "ApiThrottleRate"
	ParamAPIThrottleBurst     = "ApiThrottleBurst"
)

// NumberParameters are the storage and API parameters; the CDK stack takes
// the throttling defaults from Props (context throttleRate, throttleBurst).
var NumberParameters = []NumberParameter{
	{Name: ParamOutputExpirationDays, Default: 0, MinValue: 0,
		Description: "Days after its last upload at which an output object expires (its old versions 30 days later); 0 = never. " +
			"A thread idle longer loses the outputs it has not written since."},
	{Name: ParamAPIThrottleRate, Default: 50, MinValue: 1,
		Description: "Requests per second the HTTP API's stage admits, shared by every tenant (capped by the account's API Gateway quota)."},
	{Name: ParamAPIThrottleBurst, Default: 100, MinValue: 0,
		Description: "Burst of requests above the rate the HTTP API's stage admits, shared by every tenant."},
}

// Lifecycle rule IDs of the output bucket.
const (
	RuleAbortUploads        = "abort-incomplete-multipart-uploads"
	RuleExpiredDeleteMarker = "remove-expired-delete-markers"
	RuleExpireOutputs       = "expire-outputs"
)

// ReconcileSchedule is how often the reconcile function runs.
const ReconcileSchedule = "rate(1 minute)"

// Parameter is a CloudFormation parameter that feeds one environment
// variable of every function (the same in template.yaml and the stack).
type Parameter struct {
	Name          string // CloudFormation parameter name
	Env           string // environment variable (a internal/config constant)
	Default       string
	AllowedValues []string
	// AllowedPattern must accept Default.
	AllowedPattern string
	Description    string
}

// Parameters are the deploy-time settings, one per internal/config variable
// that is not a resource reference. An empty default leaves the variable
// blank, which internal/config reads as unset (its documented default
// applies), except SandboxDeploymentId: empty means the stack name.
var Parameters = []Parameter{
	{Name: "SandboxReplicas", Env: config.EnvReplicas, Default: "3", AllowedPattern: `^[1-9][0-9]*$`,
		Description: "Sandboxes the deployment may hold (capacity limit)."},
	{Name: "SandboxOverflowPolicy", Env: config.EnvOverflowPolicy, Default: "wait", AllowedValues: []string{"reject", "wait", "burst"},
		Description: "What an acquire does at the limit."},
	{Name: "SandboxAcquireTimeoutSeconds", Env: config.EnvAcquireTimeoutSeconds, Default: "20", AllowedPattern: `^[1-9][0-9]*$`,
		Description: "Under the wait policy; keep it below the HTTP API's 30 s integration timeout."},
	{Name: "SandboxBurstLimit", Env: config.EnvBurstLimit, Default: "0", AllowedPattern: `^[0-9]+$`,
		Description: "Extra sandboxes under the burst policy."},
	{Name: "SandboxIdleTimeoutSeconds", Env: config.EnvIdleTimeoutSeconds, Default: "1800", AllowedPattern: `^[1-9][0-9]*$`,
		Description: "How long a released sandbox stays warm."},
	{Name: "SandboxActiveTimeoutSeconds", Env: config.EnvActiveTimeoutSeconds, Default: "3600", AllowedPattern: `^[1-9][0-9]*$`,
		Description: "How long a handed-out sandbox is its thread's before a renewal (its provider timer runs 2 minutes longer)."},
	{Name: "SandboxMaxLifetimeSeconds", Env: config.EnvMaxLifetimeSeconds, Default: "86400", AllowedPattern: `^[1-9][0-9]*$`,
		Description: "No renewal goes past this long after a sandbox's creation."},
	{Name: "SandboxExpiringLeadSeconds", Env: config.EnvExpiringLeadSeconds, Default: "60", AllowedPattern: `^[0-9]+$`,
		Description: "How long before an unrenewed lease ends the sandbox.expiring event is sent (0 = never)."},
	{Name: "SandboxTemplate", Env: config.EnvTemplate, Default: "",
		Description: "E2B template ID (empty = the provider's default)."},
	{Name: "SandboxPoolSize", Env: config.EnvPoolSize, Default: "0", AllowedPattern: `^[0-9]+$`,
		Description: "Pre-warmed sandboxes kept for new threads' first acquire (0 = no pool); they hold slots."},
	{Name: "SandboxPoolMaxAgeSeconds", Env: config.EnvPoolMaxAgeSeconds, Default: "3600", AllowedPattern: `^[1-9][0-9]*$`,
		Description: "Age at which a pool member is recycled (so a template change rolls through); at most 86400."},
	{Name: "SandboxPoolParked", Env: config.EnvPoolParked, Default: "", AllowedValues: []string{"", "paused", "running"},
		Description: "How pool members wait: paused (paused slots) or running (running slots); empty = paused when the provider can pause."},
	{Name: "SandboxMaxPerUser", Env: config.EnvMaxPerUser, Default: "", AllowedPattern: `^([0-9]+)?$`,
		Description: "Slots one (tenant, user) may hold; 0 = no cap (empty = the default)."},
	{Name: "SandboxMaxPerTenant", Env: config.EnvMaxPerTenant, Default: "", AllowedPattern: `^([0-9]+)?$`,
		Description: "Slots one tenant may hold across its users; 0 = no cap (empty = the default)."},
	{Name: "SandboxMaxWaitersPerTenant", Env: config.EnvMaxWaitersPerTenant, Default: "", AllowedPattern: `^([0-9]+)?$`,
		Description: "Acquires of one tenant that may wait for a slot at once (wait policy), 0 to 100; 0 = the most, 100 (empty = the default, 10)."},
	{Name: "SandboxPauseAfterSeconds", Env: config.EnvPauseAfterSeconds, Default: "300", AllowedPattern: `^(-1|[0-9]+)$`,
		Description: "Idle seconds before a warm sandbox is paused (providers that can pause); 0 = at release, -1 = never."},
	{Name: "SandboxMaxPaused", Env: config.EnvMaxPaused, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Paused sandboxes the deployment may keep (empty = 10 x SandboxReplicas)."},
	{Name: "SandboxPausedTtlSeconds", Env: config.EnvPausedTTLSeconds, Default: "604800", AllowedPattern: `^[1-9][0-9]*$`,
		Description: "How long a sandbox may stay paused before it is destroyed."},
	{Name: ParamTenantUsage, Env: config.EnvTenantUsage, Default: string(core.TenantUsageMetrics),
		AllowedValues: []string{string(core.TenantUsageMetrics), string(core.TenantUsageEvents)},
		Description: "Where per-tenant usage goes: metrics (CloudWatch metrics per tenant, about $0.60 per active tenant a month, " +
			"and the lifecycle events) or events (the events only; the usage metrics keep the deployment's totals)."},
	{Name: "SandboxProvider", Env: config.EnvSandboxProvider, Default: config.ProviderE2B, AllowedValues: config.ProviderNames,
		Description: "Sandbox provider: E2B, or a Kubernetes sandbox provisioner (PROVISIONER_URL)."},
	{Name: "ProvisionerUrl", Env: config.EnvProvisionerURL, Default: "",
		Description: "Provisioner API base URL (SandboxProvider=provisioner only)."},
	{Name: "BrokerAdminTenants", Env: config.EnvAdminTenants, Default: "", AllowedPattern: `^([A-Za-z0-9_-]{1,64}(,[A-Za-z0-9_-]{1,64})*)?$`,
		Description: "Comma-separated tenants allowed on /v1/admin/drain and /v1/admin/undrain."},
	{Name: "SandboxDeploymentId", Env: config.EnvDeploymentID, Default: "", AllowedPattern: `^([A-Za-z0-9_-]{1,64})?$`,
		Description: "Names this deployment in the table and in provider metadata; reconcile adopts or kills every sandbox tagged with it, " +
			`so it must differ between stacks sharing an E2B team (empty = the stack name; "default" is refused).`},
	{Name: "JwtTenantClaim", Env: config.EnvTenantClaim, Default: config.DefaultTenantClaim, AllowedPattern: `^[A-Za-z0-9_:.-]{1,128}$`,
		Description: "The JWT claim that names the caller's tenant (Cognito user pools issue custom attributes as custom:<name>, e.g. custom:tenant)."},
	{Name: "E2BApiUrl", Env: config.EnvE2BAPIURL, Default: config.DefaultE2BAPIURL,
		Description: "E2B control-plane base URL."},
	{Name: "E2BSandboxUrl", Env: config.EnvE2BSandboxURL, Default: "",
		Description: "envd base URL for every sandbox; empty = E2B's per-sandbox domain."},
	{Name: "OutputPrefix", Env: config.EnvOutputPrefix, Default: "outputs", AllowedPattern: `^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`,
		Description: "Key prefix of synced outputs in the bucket (the functions' S3 access is limited to it)."},
	{Name: "LogLevel", Env: config.EnvLogLevel, Default: "INFO", AllowedValues: []string{"DEBUG", "INFO", "WARN", "ERROR"},
		Description: "Function log level."},
	{Name: ParamEventBusName, Env: config.EnvEventBusName, Default: config.DefaultEventBusName, AllowedPattern: `^[A-Za-z0-9/._-]{1,256}$`,
		Description: "EventBridge event bus the lifecycle events are published to (default = the account's default bus)."},
	{Name: "SyncMaxFiles", Env: config.EnvSyncMaxFiles, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Uploads per sync pass (empty = the syncer's default)."},
	{Name: "SyncMaxTotalBytes", Env: config.EnvSyncMaxTotalBytes, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Bytes per sync pass (empty = the syncer's default)."},
	{Name: "SyncMaxFileBytes", Env: config.EnvSyncMaxFileBytes, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Larger files are skipped (empty = the syncer's default)."},
	{Name: "SyncMaxThreadBytes", Env: config.EnvSyncMaxThreadBytes, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Bytes one thread may store in all (empty = the syncer's default)."},
	{Name: "SyncMaxTenantBytes", Env: config.EnvSyncMaxTenantBytes, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Bytes one tenant may store in all, every thread together (empty = the syncer's default)."},
	{Name: "SyncDeadlineSeconds", Env: config.EnvSyncDeadlineSeconds, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Wall-time budget of a sync pass (empty = the default; capped at 20 s in HTTP API functions)."},
	{Name: "SyncMirrorDeletes", Env: config.EnvSyncMirrorDeletes, Default: "false", AllowedValues: []string{"true", "false"},
		Description: "Delete the S3 objects of files deleted in the sandbox."},
	{Name: "ReconcileMaxPages", Env: config.EnvReconcileMaxPages, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Provider inventory pages per reconcile pass (empty = the default)."},
	{Name: "ReconcileMaxItems", Env: config.EnvReconcileMaxItems, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Inventory items per reconcile pass (empty = the default)."},
	{Name: "ReconcileMaxSeconds", Env: config.EnvReconcileMaxSeconds, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Wall-time budget of a reconcile pass; keep it below the function's 120 s timeout (empty = the default)."},
	{Name: "ReconcileGraceSeconds", Env: config.EnvReconcileGraceSeconds, Default: "", AllowedPattern: `^([0-9]+)?$`,
		Description: "How long reconcile leaves a duplicate or untracked sandbox alone after first seeing it (empty = the default)."},
	{Name: "ReconcileOrphanTtlSeconds", Env: config.EnvReconcileOrphanTTLSeconds, Default: "", AllowedPattern: `^([1-9][0-9]*)?$`,
		Description: "Age past which a sandbox tagged for this deployment without a valid tenant/user/thread is killed (empty = the default)."},
	{Name: "ReconcileKnownTenants", Env: config.EnvReconcileKnownTenants, Default: "", AllowedPattern: `^([A-Za-z0-9_-]{1,64}(,[A-Za-z0-9_-]{1,64})*)?$`,
		Description: "Comma-separated tenants this deployment serves; sandboxes of others are orphans (empty = every tenant)."},
}

// ResourceEnv maps the environment variables whose values are resources
// of the stack to those resources' logical IDs (Ref gives the table name,
// the bucket name and the secret ARN).
var ResourceEnv = map[string]string{
	config.EnvTableName:          LogicalTable,
	config.EnvOutputBucket:       LogicalBucket,
	config.EnvE2BAPIKeySecretARN: LogicalSecret,
	config.EnvTokenKMSKeyARN:     LogicalTokenKey, // its ARN (Fn::GetAtt Arn)
}

// NotDeployed lists the internal/config variables the deployed functions do not
// get, each with the reason.
var NotDeployed = map[string]string{
	config.EnvE2BAPIKey: "the key is read from Secrets Manager (E2B_API_KEY_SECRET_ARN), never an environment variable",
	config.EnvProvisionerAPIKey: "a secret, and the stack has no Secrets Manager path for it yet (like E2B_API_KEY_SECRET_ARN): " +
		"a provisioner deployment needs one before it can use a key",
	config.EnvTokenLocalKey: "local runs only (devstack); deployed stacks seal access tokens with the KMS key (TOKEN_KMS_KEY_ARN)",
	config.EnvS3Endpoint:    "local S3 stand-ins only (devstack)",
	config.EnvWebhookSecret: "the secret is read from Secrets Manager (BROKER_WEBHOOK_SECRET_ARN), never an environment variable",
	config.EnvEndpoint:      "local AWS stand-ins only (devstack)",
}

// ParamTenantUsage is the parameter saying where per-tenant usage goes
// (SANDBOX_TENANT_USAGE).
const ParamTenantUsage = "SandboxTenantUsage"

// ParamEventBusName is the parameter naming the event bus (EVENT_BUS_NAME);
// the functions that publish (PublishesEvents) may publish to that bus
// only.
const ParamEventBusName = "EventBusName"

// Logical IDs shared by template.yaml and the CDK stack.
const (
	LogicalAPI    = "BrokerApi"
	LogicalTable  = "Table"
	LogicalBucket = "OutputBucket"
	LogicalSecret = "E2BApiKeySecret"
	// LogicalWebhookSecret holds the secret provider webhooks are signed
	// with (BROKER_WEBHOOK_SECRET_ARN).
	LogicalWebhookSecret = "WebhookSecret"
	// LogicalTokenKey is the KMS key sandbox access tokens are sealed
	// under (envelope encryption, internal/tokenseal).
	LogicalTokenKey = "TokenKey"
	LogicalRule     = "ReconcileSchedule"
)

// Embedded metrics (CloudWatch embedded metric format) the alarms and the
// dashboard read, in core's namespace with the Deployment dimension set to
// SANDBOX_DEPLOYMENT_ID. Reconcile emits its pass stats (internal/core
// ReconcileStats.EMFAttrs); the others are core's (internal/core/metrics.go),
// written by internal/httpapi and by reconcile. PendingMetrics lists those no
// function emits yet.
const (
	MetricNamespace     = core.MetricsNamespace
	DimensionDeployment = "Deployment"
	// Per reconcile pass (emitted by core): 1 when the pass stopped on its
	// page/item/time budget, else 0; and the errors it met.
	MetricReconcileBudgetExhausted = "BudgetExhausted"
	MetricReconcileErrors          = "Errors"
	MetricReconcileKilled          = "Killed"
	MetricReconcileExpired         = "Expired"
	// Gauges at each capacity read (GET /v1/capacity, a 429 for capacity).
	MetricCapacityUsed  = core.MetricCapacityUsed
	MetricCapacityLimit = core.MetricCapacityLimit
	// Count of acquires refused with 429.
	MetricCapacityRejected = core.MetricCapacityRejected
	// Per reconcile pass: age in seconds of the oldest tombstone (a
	// sandbox whose kill is not confirmed), 0 when there is none.
	MetricTombstoneOldestAge = core.MetricTombstoneOldestAge
	// Per sync pass: files deferred (not uploaded) by caps or errors.
	MetricSyncDeferred = core.MetricSyncDeferred
)

// PendingMetrics are read by alarms or the dashboard but not emitted by
// any function yet (their alarms treat missing data as not breaching).
var PendingMetrics = []string{}
