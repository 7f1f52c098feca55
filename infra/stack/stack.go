package stack

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2authorizers"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2integrations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/tokenseal"
)

// Props configures the stack at synthesis time. Deploy-time settings are
// CloudFormation parameters (Parameters, JwtIssuer, JwtAudience).
type Props struct {
	awscdk.StackProps
	// AssetDir holds <function>/bootstrap for every function, built for
	// arm64 (default DefaultAssetDir, written by `make synth`; the local
	// builds of `make build` for the host live elsewhere).
	AssetDir string
	// DeletionProtection turns on the table's deletion protection
	// (default true through DefaultProps).
	DeletionProtection bool
	// ExistingSecretARN uses an existing Secrets Manager secret for the
	// E2B API key instead of creating one: its complete ARN, a partial ARN
	// (without the 6-character suffix) or its name.
	ExistingSecretARN string
	// ExistingSecretKMSKeyARN is the customer managed key an existing
	// secret is encrypted with: the functions may kms:Decrypt with it,
	// through Secrets Manager only (empty = the AWS managed key, which
	// needs no grant).
	ExistingSecretKMSKeyARN string
	// AlarmTopicARN, if set, receives every alarm's state changes instead
	// of the topic the stack creates (AlarmTopic, with an optional e-mail
	// subscription: the AlarmEmail parameter).
	AlarmTopicARN string
	// LogRetentionDays of every log group (a value CloudWatch accepts).
	LogRetentionDays int
	// ThrottleRate (requests/s) and ThrottleBurst bound the HTTP API stage.
	ThrottleRate  float64
	ThrottleBurst float64
	// ReconcileAlarmPasses is N: the reconcile alarm fires after N
	// consecutive failed or budget-exhausted passes.
	ReconcileAlarmPasses int
	// TombstoneAlarmSeconds: alarm when a tombstone is older than this.
	TombstoneAlarmSeconds int
	// CapacityAlarmPercent: alarm when used/limit stays at or above it.
	CapacityAlarmPercent int
	// ServerErrorAlarmPercent: alarm when the API's 5xx share exceeds it.
	ServerErrorAlarmPercent int
}

// DefaultAssetDir is where `make synth` writes the arm64 bootstraps the
// stack deploys (the Makefile's DEPLOY_BUILD).
const DefaultAssetDir = ".build/deploy"

// DefaultProps returns the production defaults.
func DefaultProps() Props {
	return Props{
		AssetDir:                DefaultAssetDir,
		DeletionProtection:      true,
		LogRetentionDays:        30,
		ThrottleRate:            50,
		ThrottleBurst:           100,
		ReconcileAlarmPasses:    3,
		TombstoneAlarmSeconds:   1800,
		CapacityAlarmPercent:    90,
		ServerErrorAlarmPercent: 5,
	}
}

// Stack is the synthesized broker stack and its main constructs, for
// tests and for callers that extend it.
type Stack struct {
	awscdk.Stack
	Functions map[string]awslambda.Function // by Function.Name
	Table     awsdynamodb.Table
	Bucket    awss3.Bucket
	Secret    awssecretsmanager.ISecret
	TokenKey  awskms.Key
	API       awsapigatewayv2.HttpApi
	Alarms    map[string]awscloudwatch.Alarm // by short name
	Params    map[string]awscdk.CfnParameter // by parameter name
	// AlarmTopic receives every alarm's state changes.
	AlarmTopic awssns.ITopic
	// policies are the functions' least-privilege policies, by name.
	policies map[string]awsiam.Policy
	// secretRef is what the functions get in E2B_API_KEY_SECRET_ARN (the
	// secret's ARN, or an existing secret's name as given: GetSecretValue
	// takes either); secretResource is what their policies name.
	secretRef, secretResource *string
	// WebhookSecret is the secret provider webhooks are signed with.
	WebhookSecret awssecretsmanager.Secret
}

// DynamoDBActions are the IAM actions a function may get on the table
// (each gets those its code calls, Function.Actions): the calls of
// ddbstore.API (TransactWriteItems is authorized per item as
// PutItem, UpdateItem, DeleteItem and ConditionCheckItem; the store
// queries the table for reconcile's inventory cycle, and scans it for the
// counter repair's exact count and sweep, which read no item GetItem
// could not; every function reads the wait queue's shards in one PartiQL
// SELECT on their partition keys).
var DynamoDBActions = []string{
	"dynamodb:BatchGetItem",
	"dynamodb:ConditionCheckItem",
	"dynamodb:DeleteItem",
	"dynamodb:GetItem",
	"dynamodb:PartiQLSelect",
	"dynamodb:PutItem",
	"dynamodb:Query",
	"dynamodb:Scan",
	"dynamodb:UpdateItem",
}

// DynamoDBIndexActions are granted on the table's indexes: the state
// index (gsi1) and the owner index (gsi2).
var DynamoDBIndexActions = []string{"dynamodb:Query"}

// S3ObjectActions are granted on objects under the output prefix: the
// calls of outputsync.S3API (multipart uploads are authorized as
// s3:PutObject, HeadObject as s3:GetObject).
var S3ObjectActions = []string{
	"s3:AbortMultipartUpload",
	"s3:DeleteObject",
	"s3:GetObject",
	"s3:PutObject",
}

// S3BucketActions are granted on the bucket (ListObjectsV2), without an
// s3:prefix condition: S3 answers a GetObject of a missing key with 404
// only to a caller allowed s3:ListBucket on the bucket, else 403, and that
// condition key is absent from a GetObject request, so a prefix-limited
// grant would turn every "no manifest yet" into an access error.
var S3BucketActions = []string{"s3:ListBucket"}

// SecretActions are granted on the E2B API key secret.
var SecretActions = []string{"secretsmanager:GetSecretValue"}

// KMSActions are granted on the token key, only with the encryption
// context internal/tokenseal uses: the calls of tokenseal.KMSAPI.
var KMSActions = []string{"kms:Decrypt", "kms:GenerateDataKey"}

// EventActions are granted on the event bus the lifecycle events go to
// (EVENT_BUS_NAME): the call of eventpub.API.
var EventActions = []string{"events:PutEvents"}

// LogActions are granted on the function's own log group.
var LogActions = []string{"logs:CreateLogStream", "logs:PutLogEvents"}

// LambdaInvokeActions is what a function that refills the pool may do to
// the scheduled function (internal/wiring.LambdaAPI).
var LambdaInvokeActions = []string{"lambda:InvokeFunction"}

// New defines the broker stack in scope. It panics (as CDK constructs do)
// on invalid props.
func New(scope constructs.Construct, id string, props Props) *Stack {
	if props.AssetDir == "" {
		props.AssetDir = DefaultAssetDir
	}
	sp := props.StackProps
	if sp.Description == nil {
		sp.Description = jsii.String("sandbox-broker: isolated E2B sandboxes for AI-agent threads (HTTP API, Lambda, DynamoDB, S3)")
	}
	st := awscdk.NewStack(scope, jsii.String(id), &sp)
	// Feature flags this stack relies on (set before any child exists):
	// server access logs are delivered under a bucket policy, not the
	// legacy LogDeliveryWrite ACL (which BucketOwnerEnforced forbids).
	st.Node().SetContext(jsii.String("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy"), true)
	s := &Stack{
		Stack:     st,
		Functions: map[string]awslambda.Function{},
		policies:  map[string]awsiam.Policy{},
		Alarms:    map[string]awscloudwatch.Alarm{},
		Params:    map[string]awscdk.CfnParameter{},
	}
	retention := retentionDays(props.LogRetentionDays)

	s.parameters(props)
	prefix := s.Params["OutputPrefix"].ValueAsString()
	deployment := s.deploymentID()
	s.table(props)
	s.buckets()
	s.secret(props)
	s.webhookSecret()
	s.tokenKey()
	for _, f := range Functions {
		s.Functions[f.Name] = s.function(f, props, s.environment(f, deployment), prefix, retention)
	}
	s.poolRefill()
	s.api(props, retention)
	s.schedule()
	s.observability(props, deployment)
	s.outputs()
	s.suppressions()
	return s
}

// parameters defines the CloudFormation parameters of Parameters and
// NumberParameters.
func (s *Stack) parameters(props Props) {
	for _, p := range Parameters {
		cp := &awscdk.CfnParameterProps{
			Type:        jsii.String("String"),
			Default:     jsii.String(p.Default),
			Description: jsii.String(p.Description),
		}
		if p.AllowedPattern != "" {
			cp.AllowedPattern = jsii.String(p.AllowedPattern)
		}
		if len(p.AllowedValues) > 0 {
			cp.AllowedValues = jsii.Strings(p.AllowedValues...)
		}
		s.Params[p.Name] = awscdk.NewCfnParameter(s.Stack, jsii.String(p.Name), cp)
	}
	for _, p := range NumberParameters {
		def := p.Default
		switch p.Name {
		case ParamAPIThrottleRate:
			def = props.ThrottleRate
		case ParamAPIThrottleBurst:
			def = props.ThrottleBurst
		}
		s.Params[p.Name] = awscdk.NewCfnParameter(s.Stack, jsii.String(p.Name), &awscdk.CfnParameterProps{
			Type:        jsii.String("Number"),
			Default:     jsii.Number(def),
			MinValue:    jsii.Number(p.MinValue),
			Description: jsii.String(p.Description),
		})
	}
}

// table defines the table: one table, on-demand, PITR, KMS (AWS managed
// key), TTL for garbage only (gone records), the state index ddbstore
// queries.
func (s *Stack) table(props Props) {
	s.Table = awsdynamodb.NewTable(s.Stack, jsii.String(LogicalTable), &awsdynamodb.TableProps{
		PartitionKey: &awsdynamodb.Attribute{Name: jsii.String(ddbstore.AttrPK), Type: awsdynamodb.AttributeType_STRING},
		SortKey:      &awsdynamodb.Attribute{Name: jsii.String(ddbstore.AttrSK), Type: awsdynamodb.AttributeType_STRING},
		BillingMode:  awsdynamodb.BillingMode_PAY_PER_REQUEST,
		PointInTimeRecoverySpecification: &awsdynamodb.PointInTimeRecoverySpecification{
			PointInTimeRecoveryEnabled: jsii.Bool(true),
		},
		Encryption:          awsdynamodb.TableEncryption_AWS_MANAGED,
		TimeToLiveAttribute: jsii.String(ddbstore.AttrTTL),
		DeletionProtection:  jsii.Bool(props.DeletionProtection),
		RemovalPolicy:       awscdk.RemovalPolicy_RETAIN,
	})
	s.Table.AddGlobalSecondaryIndex(&awsdynamodb.GlobalSecondaryIndexProps{
		IndexName:      jsii.String(ddbstore.IndexGSI1),
		PartitionKey:   &awsdynamodb.Attribute{Name: jsii.String(ddbstore.AttrGSI1PK), Type: awsdynamodb.AttributeType_STRING},
		SortKey:        &awsdynamodb.Attribute{Name: jsii.String(ddbstore.AttrGSI1SK), Type: awsdynamodb.AttributeType_STRING},
		ProjectionType: awsdynamodb.ProjectionType_ALL,
	})
	s.Table.AddGlobalSecondaryIndex(&awsdynamodb.GlobalSecondaryIndexProps{
		IndexName:      jsii.String(ddbstore.IndexGSI2),
		PartitionKey:   &awsdynamodb.Attribute{Name: jsii.String(ddbstore.AttrGSI2PK), Type: awsdynamodb.AttributeType_STRING},
		SortKey:        &awsdynamodb.Attribute{Name: jsii.String(ddbstore.AttrGSI2SK), Type: awsdynamodb.AttributeType_STRING},
		ProjectionType: awsdynamodb.ProjectionType_KEYS_ONLY,
	})
	overrideID(s.Table, LogicalTable)
}

// buckets defines the output bucket and the bucket of its server access
// logs.
func (s *Stack) buckets() {
	accessLogs := awss3.NewBucket(s.Stack, jsii.String("AccessLogBucket"), &awss3.BucketProps{
		BlockPublicAccess: awss3.BlockPublicAccess_BLOCK_ALL(),
		Encryption:        awss3.BucketEncryption_S3_MANAGED,
		EnforceSSL:        jsii.Bool(true),
		ObjectOwnership:   awss3.ObjectOwnership_BUCKET_OWNER_ENFORCED,
		LifecycleRules: &[]*awss3.LifecycleRule{{
			Id:                                  jsii.String("expire-access-logs"),
			Expiration:                          awscdk.Duration_Days(jsii.Number(365)),
			AbortIncompleteMultipartUploadAfter: awscdk.Duration_Days(jsii.Number(1)),
		}},
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	s.Bucket = awss3.NewBucket(s.Stack, jsii.String(LogicalBucket), &awss3.BucketProps{
		BlockPublicAccess:      awss3.BlockPublicAccess_BLOCK_ALL(),
		Encryption:             awss3.BucketEncryption_S3_MANAGED,
		EnforceSSL:             jsii.Bool(true),
		Versioned:              jsii.Bool(true),
		ObjectOwnership:        awss3.ObjectOwnership_BUCKET_OWNER_ENFORCED,
		ServerAccessLogsBucket: accessLogs,
		ServerAccessLogsPrefix: jsii.String("output-bucket/"),
		RemovalPolicy:          awscdk.RemovalPolicy_RETAIN,
	})
	overrideID(s.Bucket, LogicalBucket)
	s.Bucket.Node().DefaultChild().(awss3.CfnBucket).AddPropertyOverride(jsii.String("LifecycleConfiguration.Rules"), s.outputLifecycle())
}

// outputLifecycle is the output bucket's lifecycle: incomplete uploads
// aborted after a day and old versions expired after 30; delete markers
// left without versions removed (a rule of their own: S3 refuses
// ExpiredObjectDeleteMarker beside an expiration in days); and, when
// OutputExpirationDays is above 0, outputs expired that many days after
// their last upload.
func (s *Stack) outputLifecycle() []any {
	days := s.Params[ParamOutputExpirationDays]
	has := awscdk.NewCfnCondition(s.Stack, jsii.String("HasOutputExpiration"), &awscdk.CfnConditionProps{
		Expression: awscdk.Fn_ConditionNot(awscdk.Fn_ConditionEquals(days.ValueAsString(), jsii.String("0"))),
	})
	expire := map[string]any{
		"Id": RuleExpireOutputs, "Status": "Enabled", "ExpirationInDays": days.ValueAsNumber(),
		"Prefix": awscdk.Fn_Sub(jsii.String("${OutputPrefix}/"), nil),
	}
	return []any{
		map[string]any{"Id": RuleAbortUploads, "Status": "Enabled",
			"AbortIncompleteMultipartUpload": map[string]any{"DaysAfterInitiation": 1},
			"NoncurrentVersionExpiration":    map[string]any{"NoncurrentDays": 30}},
		map[string]any{"Id": RuleExpiredDeleteMarker, "Status": "Enabled", "ExpiredObjectDeleteMarker": true},
		awscdk.Fn_ConditionIf(has.LogicalId(), expire, awscdk.Aws_NO_VALUE()),
	}
}

// secret defines (or imports, props.ExistingSecretARN) the E2B API key:
// in Secrets Manager, read by the functions at cold start and again after
// a TTL or a refusal (internal/wiring.SecretKey). A new secret starts
// with a random placeholder: put the real key with
// `aws secretsmanager put-secret-value --secret-id <E2BApiKeySecretArn> --secret-string <key>`.
func (s *Stack) secret(props Props) {
	if ref := props.ExistingSecretARN; ref != "" {
		switch {
		case completeSecretARN.MatchString(ref):
			s.Secret = awssecretsmanager.Secret_FromSecretCompleteArn(s.Stack, jsii.String(LogicalSecret), jsii.String(ref))
		case strings.HasPrefix(ref, "arn:"):
			s.Secret = awssecretsmanager.Secret_FromSecretPartialArn(s.Stack, jsii.String(LogicalSecret), jsii.String(ref))
		default:
			s.Secret = awssecretsmanager.Secret_FromSecretNameV2(s.Stack, jsii.String(LogicalSecret), jsii.String(ref))
		}
		s.secretRef, s.secretResource = jsii.String(ref), secretGrantARN(ref)
		return
	}
	sec := awssecretsmanager.NewSecret(s.Stack, jsii.String(LogicalSecret), &awssecretsmanager.SecretProps{
		Description: jsii.String("sandbox-broker: E2B API key (SecretString = the bare key)"),
		GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
			ExcludePunctuation: jsii.Bool(true),
			PasswordLength:     jsii.Number(40),
		},
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	overrideID(sec, LogicalSecret)
	s.Secret = sec
	s.secretRef, s.secretResource = sec.SecretArn(), sec.SecretArn()
}

// completeSecretARN matches a secret's complete ARN: Secrets Manager ends
// every secret's ARN with a hyphen and 6 random characters.
var completeSecretARN = regexp.MustCompile(`^arn:[^:]+:secretsmanager:[^:]*:[^:]*:secret:.+-[A-Za-z0-9]{6}$`)

// secretGrantARN is what a policy names for the existing secret ref: its
// complete ARN, or, for a partial ARN or a name, the ARN with "-??????"
// for the suffix Secrets Manager added (IAM matches a policy against the
// complete ARN, so a bare name or partial ARN would match nothing).
func secretGrantARN(ref string) *string {
	switch {
	case completeSecretARN.MatchString(ref):
		return jsii.String(ref)
	case strings.HasPrefix(ref, "arn:"):
		return jsii.String(ref + "-??????")
	}
	return awscdk.Fn_Sub(jsii.String("arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:"+ref+"-??????"), nil)
}

// tokenKey defines the KMS key sandbox access tokens are sealed under
// (data keys of it, internal/tokenseal); only the functions may use it,
// and only with the token encryption context.
func (s *Stack) tokenKey() {
	s.TokenKey = awskms.NewKey(s.Stack, jsii.String(LogicalTokenKey), &awskms.KeyProps{
		Description:       jsii.String("sandbox-broker: seals sandbox access tokens stored in the table"),
		EnableKeyRotation: jsii.Bool(true),
		RemovalPolicy:     awscdk.RemovalPolicy_RETAIN,
	})
	overrideID(s.TokenKey, LogicalTokenKey)
}

// environment is f's environment: the parameters it gets (Function.Gets)
// and the names of the stack's resources.
func (s *Stack) environment(f Function, deployment *string) map[string]*string {
	env := map[string]*string{}
	for _, p := range Parameters {
		if f.Gets(p) {
			env[p.Env] = s.Params[p.Name].ValueAsString()
		}
	}
	env[config.EnvDeploymentID] = deployment
	env["TABLE_NAME"] = s.Table.TableName()
	env["OUTPUT_BUCKET"] = s.Bucket.BucketName()
	env["E2B_API_KEY_SECRET_ARN"] = s.secretRef
	env[config.EnvTokenKMSKeyARN] = s.TokenKey.KeyArn()
	if f.ServesWebhooks() {
		env[config.EnvWebhookSecretARN] = s.WebhookSecret.SecretArn()
	}
	return env
}

// poolRefill lets the functions that refill the pool (RefillsPool) invoke
// the scheduled function: its name in POOL_REFILL_FUNCTION, and
// lambda:InvokeFunction on it alone.
func (s *Stack) poolRefill() {
	var target awslambda.Function
	for _, f := range Functions {
		if f.Schedule != "" {
			target = s.Functions[f.Name]
		}
	}
	for _, f := range Functions {
		if !f.RefillsPool {
			continue
		}
		s.Functions[f.Name].AddEnvironment(jsii.String(config.EnvPoolRefillFunction), target.FunctionName(), nil)
		s.policies[f.Name].AddStatements(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String("InvokePoolRefill"),
			Actions:   jsii.Strings(LambdaInvokeActions...),
			Resources: jsii.Strings(*target.FunctionArn()),
		}))
	}
}

// schedule defines the EventBridge rule of every scheduled function (the
// reconcile pass).
func (s *Stack) schedule() {
	for _, f := range Functions {
		if f.Schedule == "" {
			continue
		}
		// Asynchronous invocations (the schedule's) are not retried by
		// Lambda either, and one older than a schedule period is dropped
		// (the next pass is already due).
		s.Functions[f.Name].ConfigureAsyncInvoke(&awslambda.EventInvokeConfigOptions{
			RetryAttempts: jsii.Number(0),
			MaxEventAge:   awscdk.Duration_Minutes(jsii.Number(1)),
		})
		rule := awsevents.NewRule(s.Stack, jsii.String(LogicalRule), &awsevents.RuleProps{
			Description: jsii.String("sandbox-broker reconcile pass"),
			Schedule:    awsevents.Schedule_Expression(jsii.String(f.Schedule)),
			Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(s.Functions[f.Name], &awseventstargets.LambdaFunctionProps{
				// A failed pass is not retried: the next scheduled pass
				// starts over (and the alarm counts failed passes).
				RetryAttempts: jsii.Number(0),
				MaxEventAge:   awscdk.Duration_Minutes(jsii.Number(5)),
			})},
		})
		overrideID(rule, LogicalRule)
	}
}

// webhookSecret defines the secret E2B signs its lifecycle webhooks with
// (POST /webhooks/e2b): generated here, given to E2B when the webhook is
// registered (docs/operations.md), read by the functions serving the
// route at cold start.
func (s *Stack) webhookSecret() {
	sec := awssecretsmanager.NewSecret(s.Stack, jsii.String(LogicalWebhookSecret), &awssecretsmanager.SecretProps{
		Description: jsii.String("sandbox-broker: the secret E2B signs its lifecycle webhooks with (SecretString)"),
		GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
			ExcludePunctuation: jsii.Bool(true),
			PasswordLength:     jsii.Number(48),
		},
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	overrideID(sec, LogicalWebhookSecret)
	s.WebhookSecret = sec
}

// outputs defines the stack's outputs.
func (s *Stack) outputs() {
	out := func(id string, v *string, desc string) {
		awscdk.NewCfnOutput(s.Stack, jsii.String(id), &awscdk.CfnOutputProps{Value: v, Description: jsii.String(desc)})
	}
	out("ApiUrl", s.API.ApiEndpoint(), "Base URL of the broker's HTTP API")
	out("TableName", s.Table.TableName(), "DynamoDB table")
	out("OutputBucketName", s.Bucket.BucketName(), "S3 bucket for thread outputs")
	out("E2BApiKeySecretArn", s.secretRef, "Put the E2B API key here (SecretString)")
	out("WebhookSecretArn", s.WebhookSecret.SecretArn(), "Give this secret to E2B when registering the webhook (docs/operations.md)")
}

// function defines one Lambda function with its own role, log group and
// least-privilege policy.
func (s *Stack) function(f Function, props Props, env map[string]*string, prefix *string, retention awslogs.RetentionDays) awslambda.Function {
	st := s.Stack
	logs := awslogs.NewLogGroup(st, jsii.String(f.LogicalID+"Logs"), &awslogs.LogGroupProps{
		Retention:     retention,
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	role := awsiam.NewRole(st, jsii.String(f.LogicalID+"Role"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		Description: jsii.String("sandbox-broker " + f.Name + " function"),
	})
	policy := s.functionPolicy(f, props, prefix, logs, role)

	fp := &awslambda.FunctionProps{
		Description:  jsii.String(f.Description),
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture: awslambda.Architecture_ARM_64(),
		Handler:      jsii.String("bootstrap"),
		Code:         awslambda.Code_FromAsset(jsii.String(filepath.Join(props.AssetDir, f.Name)), nil),
		MemorySize:   jsii.Number(float64(f.MemoryMB)),
		Timeout:      awscdk.Duration_Seconds(jsii.Number(float64(f.TimeoutSeconds))),
		Environment:  &env,
		Role:         role,
		LogGroup:     logs,
	}
	fn := awslambda.NewFunction(st, jsii.String(f.LogicalID), fp)
	s.reserve(fn, f)
	// The role's policy must exist before the function is created (it
	// reads the secret at cold start).
	fn.Node().AddDependency(policy)
	overrideID(fn, f.LogicalID)
	dependOnPolicyOnly(fn, policy)
	return fn
}

// functionPolicy is f's role policy: its own log group, and of each
// resource only the actions f calls (no statement when none).
func (s *Stack) functionPolicy(f Function, props Props, prefix *string, logs awslogs.LogGroup, role awsiam.Role) awsiam.Policy {
	st := s.Stack
	stmt := func(sid string, actions []string, resources ...*string) awsiam.PolicyStatement {
		return awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String(sid),
			Actions:   jsii.Strings(actions...),
			Resources: &resources,
		})
	}
	tableArn := s.Table.TableArn()
	indexArn := func(index string) *string {
		return awscdk.Fn_Join(jsii.String(""), &[]*string{tableArn, jsii.String("/index/" + index)})
	}
	// Object keys are <prefix>/<tenant>/<user>/<thread>/...: created at run
	// time, so the narrowest static scope is the prefix with a trailing
	// wildcard (IAM has no other way to name "objects under a prefix").
	objects := awscdk.Fn_Join(jsii.String(""), &[]*string{s.Bucket.BucketArn(), jsii.String("/"), prefix, jsii.String("/*")})
	bus := awscdk.Fn_Join(jsii.String(""), &[]*string{jsii.String("arn:"), awscdk.Aws_PARTITION(), jsii.String(":events:"),
		awscdk.Aws_REGION(), jsii.String(":"), awscdk.Aws_ACCOUNT_ID(), jsii.String(":event-bus/"), s.Params[ParamEventBusName].ValueAsString()})
	statements := []awsiam.PolicyStatement{stmt("WriteOwnLogs", LogActions, logs.LogGroupArn())}
	// Each statement holds the actions of its resource that f calls, and
	// is left out when f calls none.
	grant := func(sid string, all []string, resources ...*string) awsiam.PolicyStatement {
		if acts := f.Granted(all); len(acts) > 0 {
			st := stmt(sid, acts, resources...)
			statements = append(statements, st)
			return st
		}
		return nil
	}
	grant("TableItems", DynamoDBActions, tableArn)
	grant("TableIndexes", DynamoDBIndexActions, indexArn(ddbstore.IndexGSI1), indexArn(ddbstore.IndexGSI2))
	grant("OutputObjects", S3ObjectActions, objects)
	grant("ListOutputBucket", S3BucketActions, s.Bucket.BucketArn())
	grant("ReadE2BApiKey", SecretActions, s.secretResource)
	if f.ServesWebhooks() {
		grant("ReadWebhookSecret", SecretActions, s.WebhookSecret.SecretArn())
	}
	if key := props.ExistingSecretKMSKeyARN; key != "" && props.ExistingSecretARN != "" && len(f.Granted(SecretActions)) > 0 {
		// Secrets Manager decrypts an existing secret under its customer
		// managed key as the caller: GetSecretValue needs kms:Decrypt on it.
		dec := stmt("DecryptE2BApiKey", []string{"kms:Decrypt"}, jsii.String(key))
		dec.AddCondition(jsii.String("StringEquals"), map[string]any{
			"kms:ViaService": awscdk.Fn_Sub(jsii.String("secretsmanager.${AWS::Region}.amazonaws.com"), nil),
		})
		statements = append(statements, dec)
	}
	if seal := grant("SealAccessTokens", KMSActions, s.TokenKey.KeyArn()); seal != nil {
		seal.AddCondition(jsii.String("StringEquals"), map[string]any{
			"kms:EncryptionContext:purpose": tokenseal.EncryptionContext["purpose"],
		})
	}
	grant("PublishEvents", EventActions, bus)
	doc := awsiam.NewPolicyDocument(&awsiam.PolicyDocumentProps{Statements: &statements})
	policy := awsiam.NewPolicy(st, jsii.String(f.LogicalID+"Policy"), &awsiam.PolicyProps{Document: doc})
	policy.AttachToRole(role)
	s.policies[f.Name] = policy
	return policy
}

// dependOnPolicyOnly leaves the policy as fn's only explicit dependency:
// the Function construct also makes it depend on its role, which the
// function's Role (a GetAtt of the role) already implies (cfn-lint W3005).
func dependOnPolicyOnly(fn awslambda.Function, policy awsiam.Policy) {
	cfn := fn.Node().DefaultChild().(awslambda.CfnFunction)
	id := awscdk.Stack_Of(fn).GetLogicalId(policy.Node().DefaultChild().(awscdk.CfnElement))
	cfn.AddOverride(jsii.String("DependsOn"), []*string{id})
}

// api defines the HTTP API: routes to the functions behind the authorizer,
// an access-logged, throttled $default stage.
func (s *Stack) api(props Props, retention awslogs.RetentionDays) {
	st := s.Stack
	// JWT only: an IAM authorizer would name callers by AWS identity, and
	// an HTTP API takes callers of other accounts only through a role in
	// its own account, so every caller would be one tenant. The tenant is
	// the claim JwtTenantClaim names (BROKER_TENANT_CLAIM). authz reads the
	// token from Authorization; apiKeyAuthz, the same JWTs from X-API-Key
	// (the /e2b routes, for the E2B SDKs).
	issuer := awscdk.NewCfnParameter(st, jsii.String("JwtIssuer"), &awscdk.CfnParameterProps{
		Type:           jsii.String("String"),
		AllowedPattern: jsii.String(`^https://\S+$`),
		Description:    jsii.String("Issuer URL of the JWTs callers present (JwtTenantClaim names the tenant)."),
	})
	audience := awscdk.NewCfnParameter(st, jsii.String("JwtAudience"), &awscdk.CfnParameterProps{
		Type:           jsii.String("String"),
		AllowedPattern: jsii.String(`^\S+$`),
		Description:    jsii.String("Audience the JWTs must carry."),
	})
	s.Params["JwtIssuer"], s.Params["JwtAudience"] = issuer, audience
	authz := awsapigatewayv2authorizers.NewHttpJwtAuthorizer(jsii.String("TenantJwt"), issuer.ValueAsString(),
		&awsapigatewayv2authorizers.HttpJwtAuthorizerProps{
			AuthorizerName: jsii.String("TenantJwt"),
			JwtAudience:    jsii.Strings(*audience.ValueAsString()),
			IdentitySource: jsii.Strings("$request.header.Authorization"),
		})
	apiKeyAuthz := awsapigatewayv2authorizers.NewHttpJwtAuthorizer(jsii.String("TenantApiKey"), issuer.ValueAsString(),
		&awsapigatewayv2authorizers.HttpJwtAuthorizerProps{
			AuthorizerName: jsii.String("TenantApiKey"),
			JwtAudience:    jsii.Strings(*audience.ValueAsString()),
			IdentitySource: jsii.Strings("$request.header." + APIKeyHeader),
		})
	s.API = awsapigatewayv2.NewHttpApi(st, jsii.String(LogicalAPI), &awsapigatewayv2.HttpApiProps{
		Description:       jsii.String("sandbox-broker API"),
		DefaultAuthorizer: authz,
	})
	overrideID(s.API, LogicalAPI)
	for _, f := range Functions {
		if len(f.Routes) == 0 {
			continue
		}
		integ := awsapigatewayv2integrations.NewHttpLambdaIntegration(jsii.String(f.LogicalID+"Integration"), s.Functions[f.Name],
			&awsapigatewayv2integrations.HttpLambdaIntegrationProps{
				PayloadFormatVersion: awsapigatewayv2.PayloadFormatVersion_VERSION_2_0(),
			})
		for _, r := range f.Routes {
			var routeAuthz awsapigatewayv2.IHttpRouteAuthorizer = authz
			switch {
			case r.TokenHeader == APIKeyHeader:
				routeAuthz = apiKeyAuthz
			case r.Public():
				routeAuthz = awsapigatewayv2.NewHttpNoneAuthorizer() // the webhook's signature authenticates it
			}
			s.API.AddRoutes(&awsapigatewayv2.AddRoutesOptions{
				Path:        jsii.String(r.Path),
				Methods:     &[]awsapigatewayv2.HttpMethod{awsapigatewayv2.HttpMethod(r.Method)},
				Integration: integ,
				Authorizer:  routeAuthz,
			})
		}
	}
	accessLogs := awslogs.NewLogGroup(st, jsii.String("ApiAccessLogs"), &awslogs.LogGroupProps{
		Retention:     retention,
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	stage := s.API.DefaultStage().Node().DefaultChild().(awsapigatewayv2.CfnStage)
	stage.SetAccessLogSettings(&awsapigatewayv2.CfnStage_AccessLogSettingsProperty{
		DestinationArn: accessLogs.LogGroupArn(),
		Format:         jsii.String(accessLogFormat),
	})
	stage.SetDefaultRouteSettings(&awsapigatewayv2.CfnStage_RouteSettingsProperty{
		ThrottlingRateLimit:  s.Params[ParamAPIThrottleRate].ValueAsNumber(),
		ThrottlingBurstLimit: s.Params[ParamAPIThrottleBurst].ValueAsNumber(),
	})
}

// accessLogFormat is one JSON line per request; jwtSub names the caller
// (the function's own request log names the tenant, whichever claim
// carries it).
const accessLogFormat = `{"requestId":"$context.requestId","ip":"$context.identity.sourceIp",` +
	`"requestTime":"$context.requestTime","routeKey":"$context.routeKey","status":"$context.status",` +
	`"responseLength":"$context.responseLength","latencyMs":"$context.responseLatency",` +
	`"integrationError":"$context.integrationErrorMessage","authorizerError":"$context.authorizer.error",` +
	`"jwtSub":"$context.authorizer.claims.sub"}`

// deploymentID is SandboxDeploymentId, or the stack name when it is empty;
// a rule refuses "default" (see the SAM template's Rules).
func (s *Stack) deploymentID() *string {
	st := s.Stack
	param := s.Params["SandboxDeploymentId"]
	has := awscdk.NewCfnCondition(st, jsii.String("HasDeploymentId"), &awscdk.CfnConditionProps{
		Expression: awscdk.Fn_ConditionNot(awscdk.Fn_ConditionEquals(param.ValueAsString(), jsii.String(""))),
	})
	awscdk.NewCfnRule(st, jsii.String("DeploymentIdIsNotDefault"), &awscdk.CfnRuleProps{
		Assertions: &[]*awscdk.CfnRuleAssertion{{
			Assert:            awscdk.Fn_ConditionNot(awscdk.Fn_ConditionEquals(param.ValueAsString(), jsii.String(core.DefaultSettings().Deployment))),
			AssertDescription: jsii.String(`SandboxDeploymentId must not be "default"; leave it empty to use the stack name.`),
		}},
	})
	// CloudFormation's validation sees the parameter's empty default in the
	// alarms' Deployment dimension; the Fn::If never passes it there.
	awscdk.Validations_Of(st).Acknowledge(&awscdk.Acknowledgment{
		Id:     jsii.String("CloudFormation-Validate::W1030"),
		Reason: jsii.String("SANDBOX_DEPLOYMENT_ID and the alarms' Deployment dimension are Fn::If(HasDeploymentId, SandboxDeploymentId, AWS::StackName): an empty SandboxDeploymentId is replaced by the stack name."),
	})
	return awscdk.Token_AsString(awscdk.Fn_ConditionIf(has.LogicalId(), param.ValueAsString(), awscdk.Aws_STACK_NAME()), nil)
}

// reserve gives fn the reserved concurrency its parameter names, or none
// when the parameter is 0 (the default: reservations come out of the
// account's quota, which must keep 100 unreserved, and new accounts have
// far less than the sum).
func (s *Stack) reserve(fn awslambda.Function, f Function) {
	st := s.Stack
	param := awscdk.NewCfnParameter(st, jsii.String(f.ReservedParam()), &awscdk.CfnParameterProps{
		Type:        jsii.String("Number"),
		Default:     jsii.Number(0),
		MinValue:    jsii.Number(0),
		Description: jsii.String(ReservedParamDescription(f)),
	})
	s.Params[f.ReservedParam()] = param
	cond := awscdk.NewCfnCondition(st, jsii.String("Reserve"+f.LogicalIDBase()), &awscdk.CfnConditionProps{
		Expression: awscdk.Fn_ConditionNot(awscdk.Fn_ConditionEquals(param.ValueAsString(), jsii.String("0"))),
	})
	cfn := fn.Node().DefaultChild().(awslambda.CfnFunction)
	cfn.AddPropertyOverride(jsii.String("ReservedConcurrentExecutions"),
		awscdk.Fn_ConditionIf(cond.LogicalId(), param.ValueAsString(), awscdk.Aws_NO_VALUE()))
}

// overrideID gives c's CloudFormation resource the logical ID id (the one
// template.yaml uses).
func overrideID(c constructs.IConstruct, id string) {
	c.Node().DefaultChild().(awscdk.CfnResource).OverrideLogicalId(jsii.String(id))
}

// retentionDays converts days to a CloudWatch retention (panics on a value
// CloudWatch does not accept).
func retentionDays(days int) awslogs.RetentionDays {
	valid := map[int]awslogs.RetentionDays{
		1: awslogs.RetentionDays_ONE_DAY, 3: awslogs.RetentionDays_THREE_DAYS, 5: awslogs.RetentionDays_FIVE_DAYS,
		7: awslogs.RetentionDays_ONE_WEEK, 14: awslogs.RetentionDays_TWO_WEEKS, 30: awslogs.RetentionDays_ONE_MONTH,
		60: awslogs.RetentionDays_TWO_MONTHS, 90: awslogs.RetentionDays_THREE_MONTHS, 180: awslogs.RetentionDays_SIX_MONTHS,
		365: awslogs.RetentionDays_ONE_YEAR, 731: awslogs.RetentionDays_TWO_YEARS, 1827: awslogs.RetentionDays_FIVE_YEARS,
		3653: awslogs.RetentionDays_TEN_YEARS,
	}
	if days == 0 {
		days = 30
	}
	r, ok := valid[days]
	if !ok {
		panic("stack: log retention of " + strconv.Itoa(days) + " days is not one CloudWatch accepts")
	}
	return r
}
