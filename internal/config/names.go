package config

import "sort"

// VariableNames returns the name of every environment variable this
// package reads (its Env* constants), sorted. The deployment templates
// (template.yaml, the CDK stack in infra/) are checked against it by the
// parity test in infra/stack; names_test.go checks that it lists every
// Env* constant of this package, so a variable added to Parse without
// being listed here fails `go test ./internal/config`.
func VariableNames() []string {
	names := []string{
		EnvReplicas,
		EnvOverflowPolicy,
		EnvAcquireTimeoutSeconds,
		EnvBurstLimit,
		EnvIdleTimeoutSeconds,
		EnvActiveTimeoutSeconds,
		EnvMaxLifetimeSeconds,
		EnvExpiringLeadSeconds,
		EnvTemplate,
		EnvPoolSize,
		EnvPoolMaxAgeSeconds,
		EnvPoolRefillFunction,
		EnvPoolParked,
		EnvDeploymentID, EnvMaxPerUser, EnvMaxPerTenant, EnvMaxWaitersPerTenant, EnvAdminTenants, EnvTenantClaim,
		EnvPauseAfterSeconds, EnvMaxPaused, EnvPausedTTLSeconds, EnvTenantUsage,
		EnvE2BAPIURL,
		EnvE2BSandboxURL,
		EnvE2BAPIKey,
		EnvE2BAPIKeySecretARN,
		EnvSandboxProvider,
		EnvProvisionerURL,
		EnvProvisionerAPIKey,
		EnvTableName,
		EnvWebhookSecret,
		EnvWebhookSecretARN,
		EnvEventBusName,
		EnvOutputBucket,
		EnvOutputPrefix,
		EnvLogLevel,
		EnvSyncMaxFiles,
		EnvSyncMaxTotalBytes,
		EnvSyncMaxFileBytes,
		EnvSyncMaxThreadBytes,
		EnvSyncMaxTenantBytes,
		EnvTokenKMSKeyARN,
		EnvTokenLocalKey,
		EnvSyncDeadlineSeconds,
		EnvSyncMirrorDeletes,
		EnvReconcileMaxPages,
		EnvReconcileMaxItems,
		EnvReconcileMaxSeconds,
		EnvReconcileGraceSeconds,
		EnvReconcileOrphanTTLSeconds,
		EnvReconcileKnownTenants,
		EnvS3Endpoint,
		EnvEndpoint,
	}
	sort.Strings(names)
	return names
}
