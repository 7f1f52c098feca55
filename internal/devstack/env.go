package devstack

import (
	"os"
	"sort"
	"strings"
)

// functionEnv is the environment of every function: exactly these
// variables (nothing of the caller's environment leaks in but PATH, HOME
// and TMPDIR), then extra.
func (s *Stack) functionEnv(extra []string) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"AWS_REGION=" + s.Info.DynamoDB.Region,
		"AWS_DEFAULT_REGION=" + s.Info.DynamoDB.Region,
		"AWS_ACCESS_KEY_ID=" + s.Info.S3.AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + s.Info.S3.SecretKey,
		"AWS_CONFIG_FILE=" + os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull,
		"AWS_EC2_METADATA_DISABLED=true",
		"AWS_ENDPOINT_URL_DYNAMODB=" + s.Info.DynamoDB.Endpoint,
		"AWS_ENDPOINT_URL_S3=" + s.Info.S3.Endpoint,
		// Lifecycle events go to the stand-in, which records them.
		"AWS_ENDPOINT_URL_EVENTBRIDGE=" + s.Info.Events.Endpoint,
		"E2B_API_URL=" + s.Info.SandboxHost.APIURL,
		"E2B_SANDBOX_URL=" + s.Info.SandboxHost.EnvdURL,
		"E2B_API_KEY=" + s.Info.SandboxHost.APIKey,
		"PROVISIONER_URL=" + s.Info.Provisioner.APIURL,
		"PROVISIONER_API_KEY=" + s.Info.Provisioner.APIKey,
		"TABLE_NAME=" + s.Info.DynamoDB.Table,
		"OUTPUT_BUCKET=" + s.Info.S3.Bucket,
		"OUTPUT_PREFIX=" + s.Info.S3.Prefix,
		"TOKEN_LOCAL_KEY=" + s.tokenKey,
		"BROKER_WEBHOOK_SECRET=" + s.webhook.Secret,
		// A pool claim's refill: an asynchronous invocation of the
		// scheduled function, through the local Invoke API.
		"AWS_ENDPOINT_URL_LAMBDA=" + s.invokeURL(),
		"POOL_REFILL_FUNCTION=" + s.refillFunction(),
	}
	for _, k := range []string{"HOME", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	// SANDBOX_PROVIDER last: Info.Provider already chose between
	// Options.Provider and extra, and stack.json must tell the truth.
	return append(append(env, extra...), "SANDBOX_PROVIDER="+s.Info.Provider)
}

// EnvAdminTenants is the functions' list of admin tenants (internal/config
// EnvAdminTenants).
const EnvAdminTenants = "BROKER_ADMIN_TENANTS"

// PassThroughEnv returns the caller's SANDBOX_*, SYNC_*, RECONCILE_*,
// BROKER_ADMIN_TENANTS and LOG_LEVEL variables, sorted, for
// Options.FunctionEnv. (The E2B, PROVISIONER_*, table, bucket and AWS
// variables are the stack's own.)
func PassThroughEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		for _, p := range []string{"SANDBOX_", "SYNC_", "RECONCILE_", EnvAdminTenants + "=", "LOG_LEVEL="} {
			if strings.HasPrefix(kv, p) {
				out = append(out, kv)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// MakeRunEnv is the FunctionEnv of `make run`: PassThroughEnv(environ),
// plus BROKER_ADMIN_TENANTS=<first tenant of tokens> when environ does not
// set BROKER_ADMIN_TENANTS (set it empty for no admin tenant), so the
// default tenant may drain the local stack.
func MakeRunEnv(environ []string, tokens []TenantToken) []string {
	env := PassThroughEnv(environ)
	for _, kv := range environ {
		if strings.HasPrefix(kv, EnvAdminTenants+"=") {
			return env
		}
	}
	if len(tokens) > 0 {
		env = append(env, EnvAdminTenants+"="+tokens[0].Tenant)
	}
	return env
}

// adminTenants reads the last BROKER_ADMIN_TENANTS of env as a list.
func adminTenants(env []string) []string {
	var v string
	for _, kv := range env {
		if x, ok := strings.CutPrefix(kv, EnvAdminTenants+"="); ok {
			v = x
		}
	}
	out := []string{}
	for _, t := range strings.Split(v, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}
