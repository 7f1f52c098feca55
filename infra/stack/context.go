package stack

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// Context keys read by PropsFromContext (`cdk deploy -c key=value`, or
// CDK_CONTEXT_JSON for `go run ./infra`).
const (
	CtxAssetDir             = "assetDir"
	CtxDeletionProtection   = "deletionProtection"
	CtxE2BSecretARN         = "e2bApiKeySecretArn" // an ARN or a name
	CtxE2BSecretKMSKeyARN   = "e2bApiKeySecretKmsKeyArn"
	CtxAlarmTopicARN        = "alarmTopicArn"
	CtxLogRetentionDays     = "logRetentionDays"
	CtxThrottleRate         = "throttleRate"
	CtxThrottleBurst        = "throttleBurst"
	CtxReconcileAlarmPasses = "reconcileAlarmPasses"
	CtxTombstoneAlarmSecs   = "tombstoneAlarmSeconds"
)

// removedContext are context keys earlier versions read, with what replaced
// them: PropsFromContext refuses them rather than silently ignoring them.
var removedContext = map[string]string{
	"auth": "the API always uses the JWT authorizer (an IAM authorizer made every caller one tenant); " +
		"set the JwtTenantClaim parameter for the claim that names the tenant",
	"reservedConcurrency": "reserved concurrency is a deploy-time parameter per function (<Function>ReservedConcurrency, default 0 = none)",
}

// PropsFromContext starts from DefaultProps and applies the context values
// set on node.
func PropsFromContext(node constructs.Node) (Props, error) {
	p := DefaultProps()
	get := func(key string) (string, bool) {
		v := node.TryGetContext(jsii.String(key))
		if v == nil {
			return "", false
		}
		return strings.TrimSpace(fmt.Sprint(v)), true
	}
	var errs []string
	num := func(key string, dst *float64) {
		if v, ok := get(key); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				errs = append(errs, fmt.Sprintf("%s: want a positive number, got %q", key, v))
				return
			}
			*dst = f
		}
	}
	integer := func(key string, dst *int) {
		var f float64
		num(key, &f)
		if f > 0 {
			*dst = int(f)
		}
	}
	if v, ok := get(CtxAssetDir); ok {
		p.AssetDir = v
	}
	for _, k := range slices.Sorted(maps.Keys(removedContext)) {
		if v, ok := get(k); ok {
			errs = append(errs, fmt.Sprintf("%s=%s: no longer read: %s", k, v, removedContext[k]))
		}
	}
	if v, ok := get(CtxDeletionProtection); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: want true or false, got %q", CtxDeletionProtection, v))
		}
		p.DeletionProtection = b
	}
	if v, ok := get(CtxE2BSecretARN); ok {
		p.ExistingSecretARN = v
	}
	if v, ok := get(CtxE2BSecretKMSKeyARN); ok {
		p.ExistingSecretKMSKeyARN = v
	}
	if v, ok := get(CtxAlarmTopicARN); ok {
		p.AlarmTopicARN = v
	}
	integer(CtxLogRetentionDays, &p.LogRetentionDays)
	num(CtxThrottleRate, &p.ThrottleRate)
	num(CtxThrottleBurst, &p.ThrottleBurst)
	integer(CtxReconcileAlarmPasses, &p.ReconcileAlarmPasses)
	integer(CtxTombstoneAlarmSecs, &p.TombstoneAlarmSeconds)
	if len(errs) > 0 {
		return Props{}, fmt.Errorf("cdk context: %s", strings.Join(errs, "; "))
	}
	return p, nil
}
