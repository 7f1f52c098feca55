package stack

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// Context keys read by PropsFromContext (`cdk deploy -c key=value`, or
// CDK_CONTEXT_JSON for `go run ./infra`).
const (
	CtxAssetDir             = "assetDir"
	CtxAuth                 = "auth"
	CtxDeletionProtection   = "deletionProtection"
	CtxE2BSecretARN         = "e2bApiKeySecretArn"
	CtxAlarmTopicARN        = "alarmTopicArn"
	CtxLogRetentionDays     = "logRetentionDays"
	CtxReservedConcurrency  = "reservedConcurrency"
	CtxThrottleRate         = "throttleRate"
	CtxThrottleBurst        = "throttleBurst"
	CtxReconcileAlarmPasses = "reconcileAlarmPasses"
	CtxTombstoneAlarmSecs   = "tombstoneAlarmSeconds"
)

// PropsFromContext starts from DefaultProps and applies the context values
// set on node. reservedConcurrency=false drops every reservation (accounts
// with the default concurrency quota of 10 cannot reserve any).
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
	if v, ok := get(CtxAuth); ok {
		p.Auth = Auth(v)
		if p.Auth != AuthJWT && p.Auth != AuthIAM {
			errs = append(errs, fmt.Sprintf("%s: want jwt or iam, got %q", CtxAuth, v))
		}
	}
	if v, ok := get(CtxDeletionProtection); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: want true or false, got %q", CtxDeletionProtection, v))
		}
		p.DeletionProtection = b
	}
	if v, ok := get(CtxReservedConcurrency); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: want true or false, got %q", CtxReservedConcurrency, v))
		}
		if !b {
			p.ReservedConcurrency = nil
		}
	}
	if v, ok := get(CtxE2BSecretARN); ok {
		p.ExistingSecretARN = v
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
