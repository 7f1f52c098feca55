// Command preflight checks, before a deploy, that the AWS account's Lambda
// concurrency fits the broker's overflow policy and waiter limits, and says
// what quota to request when it does not. It only reads: Service Quotas
// GetServiceQuota (Lambda's concurrent executions) and Lambda
// GetAccountSettings, so read-only credentials are enough and nothing
// changes. `make preflight` runs it; flags default to the SANDBOX_*
// variables and then to the deployed defaults.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/servicequotas"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "preflight: aws config:", err)
		os.Exit(2)
	}
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, servicequotas.NewFromConfig(cfg), lambda.NewFromConfig(cfg)))
}

// run parses args, reads the account and prints the verdict to out. It
// returns the exit code: 0 when the settings fit, 1 when they do not, 2
// on bad flags or when neither read answers.
func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer, sq QuotasAPI, lc LambdaAPI) int {
	plan, err := parsePlan(args, getenv)
	if err != nil {
		fmt.Fprintln(out, "preflight:", err)
		return 2
	}
	acct, err := readAccount(ctx, sq, lc)
	if err != nil {
		fmt.Fprintln(out, "preflight:", err)
		return 2
	}
	v := assess(plan, acct)
	report(out, plan, acct, v)
	if !v.Fits {
		return 1
	}
	return 0
}

// parsePlan reads the flags, each defaulting to its SANDBOX_* variable
// (getenv) and then to the deployed default.
func parsePlan(args []string, getenv func(string) string) (Plan, error) {
	p := DefaultPlan()
	fs := flag.NewFlagSet("preflight", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	policy := fs.String("policy", envOr(getenv, "SANDBOX_OVERFLOW_POLICY", p.Policy), "overflow policy: reject, wait or burst")
	waiters := fs.Int("max-waiters-per-tenant", envInt(getenv, "SANDBOX_MAX_WAITERS_PER_TENANT", p.MaxWaitersPerTenant), "acquires of one tenant that may wait at once (0 = the most, 100)")
	fs.IntVar(&p.WaitingTenants, "waiting-tenants", p.WaitingTenants, "tenants whose acquires may wait at the same time")
	fs.IntVar(&p.Reserved, "reserved", p.Reserved, "sum of the <Function>ReservedConcurrency parameters you will deploy")
	fs.IntVar(&p.Headroom, "headroom", p.Headroom, "concurrent releases, syncs, status reads and reconcile passes to keep room for")
	if err := fs.Parse(args); err != nil {
		return Plan{}, err
	}
	p.Policy, p.MaxWaitersPerTenant = *policy, *waiters
	return p, p.Validate()
}
