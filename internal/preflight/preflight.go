// Package preflight checks, before a deploy, that the AWS account's Lambda
// concurrency fits the broker's overflow policy and waiter limits, and
// says what quota to request when it does not. It only reads.
package preflight

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/servicequotas"
)

// Lambda's quota of concurrent executions in a Region, in Service Quotas.
const (
	LambdaServiceCode       = "lambda"
	ConcurrencyQuotaCode    = "L-B99A9384"
	minUnreserved           = 100  // Lambda keeps this many executions unreserved
	standardConcurrency     = 1000 // the quota of an established account
	maxWaiterPlaces         = 100  // SANDBOX_MAX_WAITERS_PER_TENANT=0 means this many
	defaultWaitersPerTenant = 10
)

// QuotasAPI is the Service Quotas call preflight makes.
type QuotasAPI interface {
	GetServiceQuota(ctx context.Context, in *servicequotas.GetServiceQuotaInput, opts ...func(*servicequotas.Options)) (*servicequotas.GetServiceQuotaOutput, error)
}

// LambdaAPI is the Lambda call preflight makes.
type LambdaAPI interface {
	GetAccountSettings(ctx context.Context, in *lambda.GetAccountSettingsInput, opts ...func(*lambda.Options)) (*lambda.GetAccountSettingsOutput, error)
}

// Plan is what the deploy will ask of the account's concurrency.
type Plan struct {
	Policy              string
	MaxWaitersPerTenant int // 0 = maxWaiterPlaces
	WaitingTenants      int
	Reserved            int
	Headroom            int
}

// DefaultPlan is the deployed defaults: wait, 10 waiters per tenant, one
// tenant waiting, no reservation, room for 10 other invocations.
func DefaultPlan() Plan {
	return Plan{Policy: "wait", MaxWaitersPerTenant: defaultWaitersPerTenant, WaitingTenants: 1, Headroom: 10}
}

// Validate refuses a plan no deploy can have.
func (p Plan) Validate() error {
	switch {
	case p.Policy != "reject" && p.Policy != "wait" && p.Policy != "burst":
		return fmt.Errorf("policy must be reject, wait or burst, got %q", p.Policy)
	case p.MaxWaitersPerTenant < 0 || p.MaxWaitersPerTenant > maxWaiterPlaces:
		return fmt.Errorf("max-waiters-per-tenant must be 0 to %d, got %d", maxWaiterPlaces, p.MaxWaitersPerTenant)
	case p.WaitingTenants < 1 || p.Reserved < 0 || p.Headroom < 0:
		return errors.New("waiting-tenants must be at least 1; reserved and headroom at least 0")
	}
	return nil
}

// askShare is the share of an execution one waiting acquire uses: a
// waiter holds no invocation, it asks again once a second, and an ask
// (a read of its ticket and a turn) ends well within a fifth of that.
const askShare = 5

// Waiters is how many acquires may wait for a slot at once.
func (p Plan) Waiters() int {
	if p.Policy != "wait" {
		return 0
	}
	per := p.MaxWaitersPerTenant
	if per == 0 {
		per = maxWaiterPlaces
	}
	return per * p.WaitingTenants
}

// WaitingExecutions is the concurrent executions the waiters' asks use.
func (p Plan) WaitingExecutions() int { return (p.Waiters() + askShare - 1) / askShare }

// Account is what the account allows.
type Account struct {
	Quota      int    // Service Quotas' applied value (0: not read)
	QuotaNote  string // why Quota was not read
	Limit      int    // GetAccountSettings' ConcurrentExecutions (0: not read)
	Unreserved int    // GetAccountSettings' UnreservedConcurrentExecutions
	LimitNote  string
}

// Concurrency is the account's concurrency: the smaller of the values
// read (Service Quotas may show a raise Lambda has not applied yet).
func (a Account) Concurrency() int {
	switch {
	case a.Quota == 0:
		return a.Limit
	case a.Limit == 0:
		return a.Quota
	}
	return min(a.Quota, a.Limit)
}

// readAccount reads both values; either may fail (a policy without
// servicequotas:GetServiceQuota, a quota code Lambda renamed), not both.
func readAccount(ctx context.Context, sq QuotasAPI, lc LambdaAPI) (Account, error) {
	var a Account
	q, err := sq.GetServiceQuota(ctx, &servicequotas.GetServiceQuotaInput{
		ServiceCode: aws.String(LambdaServiceCode), QuotaCode: aws.String(ConcurrencyQuotaCode)})
	switch {
	case err != nil:
		a.QuotaNote = "service-quotas GetServiceQuota: " + err.Error()
	case q.Quota == nil || q.Quota.Value == nil:
		a.QuotaNote = "service-quotas GetServiceQuota: no value for " + ConcurrencyQuotaCode
	default:
		a.Quota = int(*q.Quota.Value)
	}
	s, err := lc.GetAccountSettings(ctx, &lambda.GetAccountSettingsInput{})
	switch {
	case err != nil:
		a.LimitNote = "lambda GetAccountSettings: " + err.Error()
	case s.AccountLimit == nil:
		a.LimitNote = "lambda GetAccountSettings: no account limit"
	default:
		a.Limit = int(s.AccountLimit.ConcurrentExecutions)
		a.Unreserved = int(aws.ToInt32(s.AccountLimit.UnreservedConcurrentExecutions))
	}
	if a.Concurrency() == 0 {
		return a, fmt.Errorf("could not read the account's concurrency: %s; %s", a.QuotaNote, a.LimitNote)
	}
	return a, nil
}

// Verdict is preflight's answer.
type Verdict struct {
	Need      int // concurrent executions the plan may use at once
	Available int // executions the functions may draw on
	Fits      bool
	Request   int      // the quota to request when it does not fit
	Problems  []string // why it does not fit
}

// assess compares the plan with the account. The functions draw on the
// unreserved executions (less the reservations the plan adds), and Lambda
// refuses a reservation that would leave fewer than 100 unreserved.
func assess(p Plan, a Account) Verdict {
	v := Verdict{Need: p.WaitingExecutions() + p.Headroom}
	unreserved := a.Unreserved
	if unreserved == 0 || unreserved > a.Concurrency() {
		unreserved = a.Concurrency()
	}
	v.Available = unreserved
	if v.Need > v.Available {
		v.Problems = append(v.Problems, fmt.Sprintf("the plan may run %d executions at once; the account has %d unreserved", v.Need, v.Available))
	}
	if p.Reserved > 0 && unreserved-p.Reserved < minUnreserved {
		v.Problems = append(v.Problems, fmt.Sprintf("reserving %d would leave %d unreserved; Lambda keeps at least %d", p.Reserved, unreserved-p.Reserved, minUnreserved))
	}
	v.Fits = len(v.Problems) == 0
	if !v.Fits {
		used := a.Concurrency() - unreserved // reservations the account already holds
		v.Request = max(standardConcurrency, used+p.Reserved+max(v.Need, minUnreserved))
	}
	return v
}

// report prints the account, the plan and the verdict.
func report(out io.Writer, p Plan, a Account, v Verdict) {
	quota := "not read (" + a.QuotaNote + ")"
	if a.Quota > 0 {
		quota = strconv.Itoa(a.Quota)
	}
	limit := "not read (" + a.LimitNote + ")"
	if a.Limit > 0 {
		limit = fmt.Sprintf("%d, %d unreserved", a.Limit, a.Unreserved)
	}
	fmt.Fprintf(out, "account: Lambda concurrent executions %s (Service Quotas %s); GetAccountSettings %s\n", quota, ConcurrencyQuotaCode, limit)
	fmt.Fprintf(out, "plan: policy %s, %d waiting acquires (%d tenants x %d) asking once a second (%d executions), %d more for releases, syncs, reads and reconcile, %d reserved\n",
		p.Policy, p.Waiters(), p.WaitingTenants, p.Waiters()/p.WaitingTenants, p.WaitingExecutions(), p.Headroom, p.Reserved)
	if v.Fits {
		fmt.Fprintf(out, "fits: the plan needs %d concurrent executions, the account has %d\n", v.Need, v.Available)
		return
	}
	for _, pr := range v.Problems {
		fmt.Fprintln(out, "does not fit:", pr)
	}
	fmt.Fprintf(out, "request a quota of %d (run it yourself; preflight changes nothing):\n", v.Request)
	fmt.Fprintf(out, "  aws service-quotas request-service-quota-increase --service-code %s --quota-code %s --desired-value %d\n",
		LambdaServiceCode, ConcurrencyQuotaCode, v.Request)
	fmt.Fprintln(out, "or lower SandboxMaxWaitersPerTenant, or use SandboxOverflowPolicy=reject (429 at once, no waiting)")
}

// envOr is getenv(key), or def when it is empty.
func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}

// envInt is getenv(key) as an int, or def when it is empty or not a number
// (Validate then judges the value).
func envInt(getenv func(string) string, key string, def int) int {
	if n, err := strconv.Atoi(getenv(key)); err == nil {
		return n
	}
	return def
}

// Run parses args, reads the account and prints the verdict to out. It
// returns the exit code: 0 when the settings fit, 1 when they do not, 2
// on bad flags or when neither read answers.
func Run(ctx context.Context, args []string, getenv func(string) string, out io.Writer, sq QuotasAPI, lc LambdaAPI) int {
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
