package stack

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2authorizers"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigatewayv2integrations"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/interfaces/interfacesawscloudwatch"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/sandbox-broker/sandbox-broker/pkg/ddbstore"
)

// Auth selects how the HTTP API authenticates callers.
type Auth string

const (
	// AuthJWT: a JWT authorizer (issuer and audience are the JwtIssuer and
	// JwtAudience parameters); the token's "tenant" claim is the tenant.
	AuthJWT Auth = "jwt"
	// AuthIAM: SigV4-signed requests (AWS_IAM); the caller's IAM identity
	// is the principal.
	AuthIAM Auth = "iam"
)

// Props configures the stack at synthesis time. Deploy-time settings are
// CloudFormation parameters (Parameters, JwtIssuer, JwtAudience).
type Props struct {
	awscdk.StackProps
	// AssetDir holds <function>/bootstrap for every function (default
	// ".build", written by `make build LAMBDA_ARCH=arm64`).
	AssetDir string
	// Auth is AuthJWT (default) or AuthIAM.
	Auth Auth
	// DeletionProtection turns on the table's deletion protection
	// (default true through DefaultProps).
	DeletionProtection bool
	// ExistingSecretARN uses an existing Secrets Manager secret for the
	// E2B API key instead of creating one.
	ExistingSecretARN string
	// AlarmTopicARN, if set, receives every alarm's state changes.
	AlarmTopicARN string
	// LogRetentionDays of every log group (a value CloudWatch accepts).
	LogRetentionDays int
	// ReservedConcurrency caps concurrent executions per function name (a
	// missing or zero entry leaves the function unreserved); it bounds the
	// load the functions put on the table.
	ReservedConcurrency map[string]int
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

// DefaultProps returns the production defaults.
func DefaultProps() Props {
	return Props{
		AssetDir:           ".build",
		Auth:               AuthJWT,
		DeletionProtection: true,
		LogRetentionDays:   30,
		// Reconcile must never overlap itself; the others bound the
		// concurrent DynamoDB writers (one request is a handful of calls).
		ReservedConcurrency:     map[string]int{"acquire": 50, "release": 20, "sync": 20, "reconcile": 1},
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
	API       awsapigatewayv2.HttpApi
	Alarms    map[string]awscloudwatch.Alarm // by short name
	Params    map[string]awscdk.CfnParameter // by parameter name
}

// DynamoDBActions are the IAM actions every function gets on the table:
// the calls of ddbstore.API (TransactWriteItems is authorized per item as
// PutItem, UpdateItem, DeleteItem and ConditionCheckItem; the store
// queries the table for reconcile's inventory cycle).
var DynamoDBActions = []string{
	"dynamodb:BatchGetItem",
	"dynamodb:ConditionCheckItem",
	"dynamodb:DeleteItem",
	"dynamodb:GetItem",
	"dynamodb:PutItem",
	"dynamodb:Query",
	"dynamodb:UpdateItem",
}

// DynamoDBIndexActions are granted on the state index (gsi1), the only
// index.
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

// S3BucketActions are granted on the bucket, limited to the output prefix
// by an s3:prefix condition (ListObjectsV2).
var S3BucketActions = []string{"s3:ListBucket"}

// SecretActions are granted on the E2B API key secret.
var SecretActions = []string{"secretsmanager:GetSecretValue"}

// LogActions are granted on the function's own log group.
var LogActions = []string{"logs:CreateLogStream", "logs:PutLogEvents"}

// New defines the broker stack in scope. It panics (as CDK constructs do)
// on invalid props.
func New(scope constructs.Construct, id string, props Props) *Stack {
	if props.Auth == "" {
		props.Auth = AuthJWT
	}
	if props.Auth != AuthJWT && props.Auth != AuthIAM {
		panic(fmt.Sprintf("stack: auth must be %q or %q, got %q", AuthJWT, AuthIAM, props.Auth))
	}
	if props.AssetDir == "" {
		props.AssetDir = ".build"
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
		Alarms:    map[string]awscloudwatch.Alarm{},
		Params:    map[string]awscdk.CfnParameter{},
	}
	retention := retentionDays(props.LogRetentionDays)

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
		s.Params[p.Name] = awscdk.NewCfnParameter(st, jsii.String(p.Name), cp)
	}
	prefix := s.Params["OutputPrefix"].ValueAsString()
	deployment := s.Params["SandboxDeploymentId"].ValueAsString()

	// Table: one table, on-demand, PITR, KMS (AWS managed key), TTL for
	// garbage only (gone records), the state index ddbstore queries.
	s.Table = awsdynamodb.NewTable(st, jsii.String(LogicalTable), &awsdynamodb.TableProps{
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
	overrideID(s.Table, LogicalTable)

	// Buckets: outputs, and its server access logs.
	accessLogs := awss3.NewBucket(st, jsii.String("AccessLogBucket"), &awss3.BucketProps{
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
	s.Bucket = awss3.NewBucket(st, jsii.String(LogicalBucket), &awss3.BucketProps{
		BlockPublicAccess:      awss3.BlockPublicAccess_BLOCK_ALL(),
		Encryption:             awss3.BucketEncryption_S3_MANAGED,
		EnforceSSL:             jsii.Bool(true),
		Versioned:              jsii.Bool(true),
		ObjectOwnership:        awss3.ObjectOwnership_BUCKET_OWNER_ENFORCED,
		ServerAccessLogsBucket: accessLogs,
		ServerAccessLogsPrefix: jsii.String("output-bucket/"),
		LifecycleRules: &[]*awss3.LifecycleRule{{
			Id:                                  jsii.String("abort-incomplete-multipart-uploads"),
			AbortIncompleteMultipartUploadAfter: awscdk.Duration_Days(jsii.Number(1)),
			NoncurrentVersionExpiration:         awscdk.Duration_Days(jsii.Number(30)),
		}},
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	overrideID(s.Bucket, LogicalBucket)

	// The E2B API key: in Secrets Manager, read by the functions at cold
	// start (internal/wiring.ResolveAPIKey). A new secret starts with a random
	// placeholder: put the real key with
	// `aws secretsmanager put-secret-value --secret-id <E2BApiKeySecretArn> --secret-string <key>`.
	if props.ExistingSecretARN != "" {
		s.Secret = awssecretsmanager.Secret_FromSecretCompleteArn(st, jsii.String(LogicalSecret), jsii.String(props.ExistingSecretARN))
	} else {
		sec := awssecretsmanager.NewSecret(st, jsii.String(LogicalSecret), &awssecretsmanager.SecretProps{
			Description: jsii.String("sandbox-broker: E2B API key (SecretString = the bare key)"),
			GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
				ExcludePunctuation: jsii.Bool(true),
				PasswordLength:     jsii.Number(40),
			},
			RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
		})
		overrideID(sec, LogicalSecret)
		s.Secret = sec
	}

	env := map[string]*string{}
	for _, p := range Parameters {
		env[p.Env] = s.Params[p.Name].ValueAsString()
	}
	env["TABLE_NAME"] = s.Table.TableName()
	env["OUTPUT_BUCKET"] = s.Bucket.BucketName()
	env["E2B_API_KEY_SECRET_ARN"] = s.Secret.SecretArn()

	for _, f := range Functions {
		s.Functions[f.Name] = s.function(f, props, env, prefix, retention)
	}

	s.api(props, retention)

	// Reconcile schedule.
	for _, f := range Functions {
		if f.Schedule == "" {
			continue
		}
		rule := awsevents.NewRule(st, jsii.String(LogicalRule), &awsevents.RuleProps{
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

	s.observability(props, deployment)

	out := func(id string, v *string, desc string) {
		awscdk.NewCfnOutput(st, jsii.String(id), &awscdk.CfnOutputProps{Value: v, Description: jsii.String(desc)})
	}
	out("ApiUrl", s.API.ApiEndpoint(), "Base URL of the broker's HTTP API")
	out("TableName", s.Table.TableName(), "DynamoDB table")
	out("OutputBucketName", s.Bucket.BucketName(), "S3 bucket for thread outputs")
	out("E2BApiKeySecretArn", s.Secret.SecretArn(), "Put the E2B API key here (SecretString)")

	s.suppressions()
	return s
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
	stmt := func(sid string, actions []string, resources ...*string) awsiam.PolicyStatement {
		return awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String(sid),
			Actions:   jsii.Strings(actions...),
			Resources: &resources,
		})
	}
	tableArn := s.Table.TableArn()
	indexArn := awscdk.Fn_Join(jsii.String(""), &[]*string{tableArn, jsii.String("/index/" + ddbstore.IndexGSI1)})
	// Object keys are <prefix>/<tenant>/<user>/<thread>/...: created at run
	// time, so the narrowest static scope is the prefix with a trailing
	// wildcard (IAM has no other way to name "objects under a prefix").
	objects := awscdk.Fn_Join(jsii.String(""), &[]*string{s.Bucket.BucketArn(), jsii.String("/"), prefix, jsii.String("/*")})
	list := stmt("ListOutputPrefix", S3BucketActions, s.Bucket.BucketArn())
	list.AddCondition(jsii.String("StringLike"), map[string]any{
		"s3:prefix": []any{awscdk.Fn_Join(jsii.String(""), &[]*string{prefix, jsii.String("/*")})},
	})
	doc := awsiam.NewPolicyDocument(&awsiam.PolicyDocumentProps{Statements: &[]awsiam.PolicyStatement{
		stmt("WriteOwnLogs", LogActions, logs.LogGroupArn()),
		stmt("TableItems", DynamoDBActions, tableArn),
		stmt("StateIndex", DynamoDBIndexActions, indexArn),
		stmt("OutputObjects", S3ObjectActions, objects),
		list,
		stmt("ReadE2BApiKey", SecretActions, s.Secret.SecretArn()),
	}})
	policy := awsiam.NewPolicy(st, jsii.String(f.LogicalID+"Policy"), &awsiam.PolicyProps{Document: doc})
	policy.AttachToRole(role)

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
	if n := props.ReservedConcurrency[f.Name]; n > 0 {
		fp.ReservedConcurrentExecutions = jsii.Number(float64(n))
	}
	fn := awslambda.NewFunction(st, jsii.String(f.LogicalID), fp)
	// The role's policy must exist before the function is created (it
	// reads the secret at cold start).
	fn.Node().AddDependency(policy)
	overrideID(fn, f.LogicalID)
	return fn
}

// api defines the HTTP API: routes to the functions behind the authorizer,
// an access-logged, throttled $default stage.
func (s *Stack) api(props Props, retention awslogs.RetentionDays) {
	st := s.Stack
	// authz reads the token from Authorization; apiKeyAuthz, the same JWTs
	// from X-API-Key (the /e2b routes, for the E2B SDKs). Under IAM
	// authorization both are the IAM authorizer: the E2B SDKs cannot sign
	// requests, so the /e2b routes then serve SigV4 callers only.
	var authz, apiKeyAuthz awsapigatewayv2.IHttpRouteAuthorizer
	if props.Auth == AuthJWT {
		issuer := awscdk.NewCfnParameter(st, jsii.String("JwtIssuer"), &awscdk.CfnParameterProps{
			Type:           jsii.String("String"),
			AllowedPattern: jsii.String(`^https://\S+$`),
			Description:    jsii.String(`Issuer URL of the JWTs callers present; the "tenant" claim names the tenant.`),
		})
		audience := awscdk.NewCfnParameter(st, jsii.String("JwtAudience"), &awscdk.CfnParameterProps{
			Type:           jsii.String("String"),
			AllowedPattern: jsii.String(`^\S+$`),
			Description:    jsii.String("Audience the JWTs must carry."),
		})
		s.Params["JwtIssuer"], s.Params["JwtAudience"] = issuer, audience
		authz = awsapigatewayv2authorizers.NewHttpJwtAuthorizer(jsii.String("TenantJwt"), issuer.ValueAsString(),
			&awsapigatewayv2authorizers.HttpJwtAuthorizerProps{
				AuthorizerName: jsii.String("TenantJwt"),
				JwtAudience:    jsii.Strings(*audience.ValueAsString()),
				IdentitySource: jsii.Strings("$request.header.Authorization"),
			})
		apiKeyAuthz = awsapigatewayv2authorizers.NewHttpJwtAuthorizer(jsii.String("TenantApiKey"), issuer.ValueAsString(),
			&awsapigatewayv2authorizers.HttpJwtAuthorizerProps{
				AuthorizerName: jsii.String("TenantApiKey"),
				JwtAudience:    jsii.Strings(*audience.ValueAsString()),
				IdentitySource: jsii.Strings("$request.header." + APIKeyHeader),
			})
	} else {
		authz = awsapigatewayv2authorizers.NewHttpIamAuthorizer()
		apiKeyAuthz = authz
	}
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
			routeAuthz := authz
			if r.TokenHeader == APIKeyHeader {
				routeAuthz = apiKeyAuthz
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
		ThrottlingRateLimit:  jsii.Number(props.ThrottleRate),
		ThrottlingBurstLimit: jsii.Number(props.ThrottleBurst),
	})
}

// accessLogFormat is one JSON line per request; the principal fields name
// the caller (JWT subject and tenant claim, or the IAM identity).
const accessLogFormat = `{"requestId":"$context.requestId","ip":"$context.identity.sourceIp",` +
	`"requestTime":"$context.requestTime","routeKey":"$context.routeKey","status":"$context.status",` +
	`"responseLength":"$context.responseLength","latencyMs":"$context.responseLatency",` +
	`"integrationError":"$context.integrationErrorMessage","authorizerError":"$context.authorizer.error",` +
	`"jwtSub":"$context.authorizer.claims.sub","tenant":"$context.authorizer.claims.tenant",` +
	`"iamUserArn":"$context.identity.userArn"}`

// observability defines the alarms and the dashboard.
func (s *Stack) observability(props Props, deployment *string) {
	st := s.Stack
	five := awscdk.Duration_Minutes(jsii.Number(5))
	emf := func(name, stat string) awscloudwatch.Metric {
		return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace:     jsii.String(MetricNamespace),
			MetricName:    jsii.String(name),
			DimensionsMap: &map[string]*string{DimensionDeployment: deployment},
			Statistic:     jsii.String(stat),
			Period:        five,
		})
	}
	var topic awssns.ITopic
	if props.AlarmTopicARN != "" {
		topic = awssns.Topic_FromTopicArn(st, jsii.String("AlarmTopic"), jsii.String(props.AlarmTopicARN))
	}
	alarm := func(key, id string, p *awscloudwatch.AlarmProps) {
		a := awscloudwatch.NewAlarm(st, jsii.String(id), p)
		if topic != nil {
			a.AddAlarmAction(awscloudwatchactions.NewSnsAction(topic))
			a.AddOkAction(awscloudwatchactions.NewSnsAction(topic))
		}
		s.Alarms[key] = a
	}

	capacity := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("100 * used / limit"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"used":  emf(MetricCapacityUsed, "Maximum"),
			"limit": emf(MetricCapacityLimit, "Maximum"),
		},
		Label:  jsii.String("capacity used (%)"),
		Period: five,
	})
	alarm("capacity", "CapacitySaturationAlarm", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String(fmt.Sprintf("Capacity slots in use at or above %d%% of the limit for 15 minutes: acquires wait or get 429.", props.CapacityAlarmPercent)),
		Metric:             capacity,
		Threshold:          jsii.Number(float64(props.CapacityAlarmPercent)),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})

	// One period per scheduled pass (ReconcileSchedule).
	reconcile := s.Functions["reconcile"]
	n := float64(props.ReconcileAlarmPasses)
	one := awscdk.Duration_Minutes(jsii.Number(1))
	failed := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("errors + exhausted"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"errors":    reconcile.MetricErrors(&awscloudwatch.MetricOptions{Period: one, Statistic: jsii.String("Sum")}),
			"exhausted": emf(MetricReconcileBudgetExhausted, "Sum"),
		},
		Label:  jsii.String("failed or budget-exhausted reconcile passes"),
		Period: one,
	})
	alarm("reconcile", "ReconcileFailingAlarm", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String(fmt.Sprintf("%d consecutive reconcile passes (1 minute apart) failed or ran out of budget.", props.ReconcileAlarmPasses)),
		Metric:             failed,
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(n),
		DatapointsToAlarm:  jsii.Number(n),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})

	alarm("tombstones", "TombstoneAgeAlarm", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String(fmt.Sprintf("A sandbox kill has been unconfirmed for more than %d seconds (a tombstone holds a slot).", props.TombstoneAlarmSeconds)),
		Metric:             emf(MetricTombstoneOldestAge, "Maximum"),
		Threshold:          jsii.Number(float64(props.TombstoneAlarmSeconds)),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(2),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})

	rate := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("IF(requests > 0, 100 * errors / requests, 0)"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"errors":   s.API.MetricServerError(&awscloudwatch.MetricOptions{Period: five, Statistic: jsii.String("Sum")}),
			"requests": s.API.MetricCount(&awscloudwatch.MetricOptions{Period: five, Statistic: jsii.String("Sum")}),
		},
		Label:  jsii.String("5xx (%)"),
		Period: five,
	})
	alarm("5xx", "ServerErrorRateAlarm", &awscloudwatch.AlarmProps{
		AlarmDescription:   jsii.String(fmt.Sprintf("More than %d%% of API requests answered 5xx for 15 minutes.", props.ServerErrorAlarmPercent)),
		Metric:             rate,
		Threshold:          jsii.Number(float64(props.ServerErrorAlarmPercent)),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(3),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})

	graph := func(title string, metrics ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{
			Title: jsii.String(title), Left: &metrics, Width: jsii.Number(12), Height: jsii.Number(6),
		})
	}
	var invocations, errs, throttles []awscloudwatch.IMetric
	for _, f := range Functions {
		fn := s.Functions[f.Name]
		lbl := &awscloudwatch.MetricOptions{Label: jsii.String(f.Name), Period: five}
		invocations = append(invocations, fn.MetricInvocations(lbl))
		errs = append(errs, fn.MetricErrors(lbl))
		throttles = append(throttles, fn.MetricThrottles(lbl))
	}
	alarmNames := make([]string, 0, len(s.Alarms))
	for k := range s.Alarms {
		alarmNames = append(alarmNames, k)
	}
	sort.Strings(alarmNames)
	var alarms []interfacesawscloudwatch.IAlarmRef
	for _, k := range alarmNames {
		alarms = append(alarms, s.Alarms[k])
	}
	awscloudwatch.NewDashboard(st, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		Widgets: &[]*[]awscloudwatch.IWidget{
			{awscloudwatch.NewAlarmStatusWidget(&awscloudwatch.AlarmStatusWidgetProps{
				Title: jsii.String("Alarms"), Alarms: &alarms, Width: jsii.Number(24),
			})},
			{
				graph("Capacity (slots)", emf(MetricCapacityUsed, "Maximum"), emf(MetricCapacityLimit, "Maximum")),
				graph("Capacity refusals (429)", emf(MetricCapacityRejected, "Sum")),
			},
			{
				graph("Reconcile passes", emf(MetricReconcileBudgetExhausted, "Sum"), emf(MetricReconcileErrors, "Sum"),
					emf(MetricReconcileKilled, "Sum"), emf(MetricReconcileExpired, "Sum")),
				graph("Oldest tombstone (s)", emf(MetricTombstoneOldestAge, "Maximum")),
			},
			{
				graph("Output sync: deferred files", emf(MetricSyncDeferred, "Sum")),
			},
			{
				graph("API requests and 5xx", s.API.MetricCount(&awscloudwatch.MetricOptions{Period: five}), s.API.MetricServerError(&awscloudwatch.MetricOptions{Period: five})),
				graph("Function invocations", invocations...),
			},
			{
				graph("Function errors", errs...),
				graph("Function throttles", throttles...),
			},
		},
	})
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
