package preflight

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/servicequotas"
)

// fakeAWS answers the two reads preflight makes, as Service Quotas (JSON
// 1.1, X-Amz-Target) and Lambda (REST) do, and records every request.
type fakeAWS struct {
	quota      string // GetServiceQuota's Quota.Value ("" = AccessDeniedException)
	limit      int
	unreserved int

	mu    sync.Mutex
	calls []string
}

func (f *fakeAWS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path+" "+r.Header.Get("X-Amz-Target"))
	f.mu.Unlock()
	switch {
	case r.Header.Get("X-Amz-Target") == "ServiceQuotasV20190624.GetServiceQuota":
		var in struct{ ServiceCode, QuotaCode string }
		_ = json.Unmarshal(body, &in)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		if f.quota == "" || in.ServiceCode != LambdaServiceCode || in.QuotaCode != ConcurrencyQuotaCode {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"__type":"AccessDeniedException","message":"not allowed"}`)
			return
		}
		io.WriteString(w, `{"Quota":{"ServiceCode":"lambda","QuotaCode":"L-B99A9384","Value":`+f.quota+`,"Adjustable":true}}`)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/2016-08-19/account-settings"):
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"AccountLimit": map[string]any{
			"ConcurrentExecutions": f.limit, "UnreservedConcurrentExecutions": f.unreserved}})
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// preflight runs the command against a fake account and returns its exit
// code, its output and the requests it made.
func preflight(t *testing.T, f *fakeAWS, env map[string]string, args ...string) (int, string, []string) {
	t.Helper()
	srv := httptest.NewServer(f)
	defer srv.Close()
	cfg := aws.Config{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		BaseEndpoint: aws.String(srv.URL), RetryMaxAttempts: 1}
	var out bytes.Buffer
	code := Run(context.Background(), args, func(k string) string { return env[k] }, &out,
		servicequotas.NewFromConfig(cfg), lambda.NewFromConfig(cfg))
	return code, out.String(), f.calls
}

func TestNewAccountDoesNotFitTheDefaults(t *testing.T) {
	code, out, calls := preflight(t, &fakeAWS{quota: "10.0", limit: 10, unreserved: 10}, nil)
	if code != 1 || !strings.Contains(out, "does not fit: the plan may run 12 executions at once; the account has 10 unreserved") ||
		!strings.Contains(out, "--quota-code L-B99A9384 --desired-value 1000") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
	// Read-only: exactly the two reads, nothing else.
	want := []string{"GET /2016-08-19/account-settings ", "POST / ServiceQuotasV20190624.GetServiceQuota"}
	slices.Sort(calls)
	if !slices.Equal(calls, want) {
		t.Errorf("requests %q, want only %q", calls, want)
	}
}

func TestEstablishedAccountFits(t *testing.T) {
	code, out, _ := preflight(t, &fakeAWS{quota: "1000.0", limit: 1000, unreserved: 1000}, nil)
	if code != 0 || !strings.Contains(out, "fits: the plan needs 12 concurrent executions, the account has 1000") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
}

// TestQuotaUnreadableFallsBack: without servicequotas:GetServiceQuota (or
// with a quota code Lambda no longer uses) the account settings decide.
func TestQuotaUnreadableFallsBack(t *testing.T) {
	code, out, _ := preflight(t, &fakeAWS{limit: 50, unreserved: 50}, nil)
	if code != 0 || !strings.Contains(out, "not read (service-quotas GetServiceQuota") || !strings.Contains(out, "the account has 50") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
}

// TestPlanFromEnvironmentAndFlags: the SANDBOX_* variables set the plan,
// flags override them; waiters use a fifth of an execution each (they
// ask once a second); reject needs no waiters; a reservation must leave
// 100 unreserved.
func TestPlanFromEnvironmentAndFlags(t *testing.T) {
	f := func() *fakeAWS { return &fakeAWS{quota: "150.0", limit: 150, unreserved: 100} }
	if code, out, _ := preflight(t, f(), map[string]string{"SANDBOX_MAX_WAITERS_PER_TENANT": "0"}); code != 0 || !strings.Contains(out, "(20 executions)") {
		t.Errorf("100 waiters: exit %d\n%s", code, out)
	}
	if code, out, _ := preflight(t, f(), map[string]string{"SANDBOX_MAX_WAITERS_PER_TENANT": "0"}, "-waiting-tenants", "5"); code != 1 || !strings.Contains(out, "110 executions") {
		t.Errorf("500 waiters: exit %d\n%s", code, out)
	}
	if code, out, _ := preflight(t, f(), map[string]string{"SANDBOX_MAX_WAITERS_PER_TENANT": "0"}, "-policy", "reject"); code != 0 {
		t.Errorf("reject: exit %d\n%s", code, out)
	}
	if code, out, _ := preflight(t, f(), nil, "-reserved", "20"); code != 1 || !strings.Contains(out, "would leave 80 unreserved") {
		t.Errorf("reserved 150: exit %d\n%s", code, out)
	}
	if code, out, _ := preflight(t, f(), nil, "-policy", "queue"); code != 2 || !strings.Contains(out, "policy must be") {
		t.Errorf("bad policy: exit %d\n%s", code, out)
	}
}

func TestNothingReadable(t *testing.T) {
	code, out, _ := preflight(t, &fakeAWS{}, nil)
	if code != 2 || !strings.Contains(out, "could not read") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
}
