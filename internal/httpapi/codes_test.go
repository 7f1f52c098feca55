package httpapi

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bwebhook"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// errorRow is one (status, code, reason, retryable) the adapter answers
// with, and one row of docs/api.md's error table.
type errorRow struct {
	status    int
	code      string
	reason    string
	retryable bool
}

func (r errorRow) String() string {
	return fmt.Sprintf("%d %s reason=%q retryable=%v", r.status, r.code, r.reason, r.retryable)
}

// readmeErrorRows parses docs/api.md's error table (the one headed
// "| status | code | reason | retryable |"); a reason cell lists its
// reasons in backquotes, "–" for none.
func readmeErrorRows(t *testing.T) []errorRow {
	t.Helper()
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []errorRow
	in := false
	tick := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| status | code | reason | retryable |") {
			in = true
			continue
		}
		if !in || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 4 {
			t.Fatalf("docs/api.md error row %q: want at least 4 cells", line)
		}
		status, err := strconv.Atoi(strings.TrimSpace(cells[0]))
		if err != nil {
			t.Fatalf("docs/api.md error row %q: status: %v", line, err)
		}
		code := strings.Trim(strings.TrimSpace(cells[1]), "`")
		retryable := strings.TrimSpace(cells[3]) == "yes"
		reasons := tick.FindAllStringSubmatch(cells[2], -1)
		if len(reasons) == 0 {
			rows = append(rows, errorRow{status, code, "", retryable})
		}
		for _, m := range reasons {
			rows = append(rows, errorRow{status, code, m[1], retryable})
		}
	}
	if len(rows) == 0 {
		t.Fatal("docs/api.md has no error table")
	}
	return rows
}

// TestErrorTableIsWhatTheAdapterAnswers drives the handler into every
// error answer it has and compares what it answered with docs/api.md's
// table, row for row, and the table's codes and reasons with the
// constants of internal/core: a code or reason added, removed or documented
// without being produced fails here.
func TestErrorTableIsWhatTheAdapterAnswers(t *testing.T) {
	acquire := func(err error) (core.Broker, events.APIGatewayV2HTTPRequest) {
		return &fakeBroker{err: err}, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil)
	}
	capErr := func(r api.RefusalReason) error {
		return &core.CapacityError{Reason: r, Status: core.CapacityStatus{Limit: 1}}
	}
	cases := []struct {
		name string
		in   func() (core.Broker, events.APIGatewayV2HTTPRequest)
	}{
		{"bad body", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return &fakeBroker{}, event(RouteAcquire, "/v1/sandboxes/acquire", `[1]`, "acme", nil)
		}},
		{"bad user", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return &fakeBroker{}, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"a b","thread_id":"t"}`, "acme", nil)
		}},
		{"bad thread", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return &fakeBroker{}, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"a b"}`, "acme", nil)
		}},
		{"bad ticket", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return acquire(&core.ValidationError{Field: "ticket", Message: "must be the ticket of an earlier waiting answer for this thread"})
		}},
		{"bad renewal seconds", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return &fakeBroker{}, event(RouteRenew, "/v1/sandboxes/sb1/renew", `{"seconds":0}`, "acme", map[string]string{"id": "sb1"})
		}},
		{"bad sandbox id", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return &fakeBroker{}, event(RouteGet, "/v1/sandboxes/a.b", "", "acme", map[string]string{"id": "a.b"})
		}},
		{"no tenant", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return &fakeBroker{}, event(RouteCapacity, "/v1/capacity", "", "", nil)
		}},
		{"not admin", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			ev := event(RouteDrain, "/v1/admin/drain", "", "acme", nil)
			ev.RequestContext.HTTP.Method = "POST"
			return &fakeBroker{}, ev
		}},
		{"no sandbox", func() (core.Broker, events.APIGatewayV2HTTPRequest) { return acquire(core.ErrNotFound) }},
		{"no route", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return &fakeBroker{}, event("$default", "/v2/x", "", "acme", nil)
		}},
		{"bad method", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			ev := event("$default", "/v1/capacity", "", "acme", nil)
			ev.RequestContext.HTTP.Method = "DELETE"
			return &fakeBroker{}, ev
		}},
		{"lease held", func() (core.Broker, events.APIGatewayV2HTTPRequest) { return acquire(core.ErrLeaseHeld) }},
		{"conflict", func() (core.Broker, events.APIGatewayV2HTTPRequest) { return acquire(core.ErrConflict) }},
		{"too large", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return &fakeBroker{}, event(RouteAcquire, "/v1/sandboxes/acquire", strings.Repeat(" ", MaxBodyBytes+1), "acme", nil)
		}},
		{"capacity", func() (core.Broker, events.APIGatewayV2HTTPRequest) { return acquire(capErr(api.RefusalCapacity)) }},
		{"user quota", func() (core.Broker, events.APIGatewayV2HTTPRequest) { return acquire(capErr(api.RefusalUserQuota)) }},
		{"tenant quota", func() (core.Broker, events.APIGatewayV2HTTPRequest) { return acquire(capErr(api.RefusalTenantQuota)) }},
		{"too many waiters", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return acquire(capErr(api.RefusalTooManyWaiters))
		}},
		{"ledger failed", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return acquire(capErr(api.RefusalCapacityBackend))
		}},
		{"draining", func() (core.Broker, events.APIGatewayV2HTTPRequest) { return acquire(capErr(api.RefusalDraining)) }},
		{"bug", func() (core.Broker, events.APIGatewayV2HTTPRequest) { return acquire(fmt.Errorf("boom")) }},
		{"store", func() (core.Broker, events.APIGatewayV2HTTPRequest) { return acquire(core.ErrStoreUnavailable) }},
		{"provider", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return acquire(&core.ProviderError{Op: "create", StatusCode: 502, Ambiguous: true})
		}},
		{"provider refuses the key", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return acquire(&core.ProviderError{Op: "create", StatusCode: 401, Message: "unauthorized"})
		}},
		{"unsigned webhook", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			return &fakeBroker{}, webhookEvent(killedBody("ev", "sb1", time.Now()), "")
		}},
		{"stale webhook", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			body := killedBody("ev", "sb1", time.Now())
			return &fakeBroker{err: &core.ValidationError{Field: "timestamp", Message: "stale"}}, webhookEvent(body, e2bwebhook.Sign(testWebhookSecret, []byte(body)))
		}},
		{"replayed webhook", func() (core.Broker, events.APIGatewayV2HTTPRequest) {
			body := killedBody("ev", "sb1", time.Now())
			return &fakeBroker{err: core.ErrReplayed}, webhookEvent(body, e2bwebhook.Sign(testWebhookSecret, []byte(body)))
		}},
	}
	var got []errorRow
	for _, c := range cases {
		b, ev := c.in()
		opts := []Option{WithAdminTenants("ops")}
		if fb, ok := b.(*fakeBroker); ok {
			opts = append(opts, WithE2BWebhook(testWebhookSecret, fb))
		}
		h := NewHandler(b, nil, opts...)
		resp, err := h(context.Background(), ev)
		if err != nil {
			t.Fatalf("%s: handler: %v", c.name, err)
		}
		body := mustJSON(t, resp.Body)
		e, ok := body["error"].(map[string]any)
		if !ok {
			t.Fatalf("%s: status %d body %s: no error object", c.name, resp.StatusCode, resp.Body)
		}
		row := errorRow{status: resp.StatusCode}
		row.code, _ = e["code"].(string)
		row.reason, _ = e["reason"].(string)
		row.retryable, _ = e["retryable"].(bool)
		got = append(got, row)
	}
	want := readmeErrorRows(t)
	for _, r := range got {
		if !slices.Contains(want, r) {
			t.Errorf("the adapter answers %v; docs/api.md's error table lacks it", r)
		}
	}
	for _, r := range want {
		if !slices.Contains(got, r) {
			t.Errorf("docs/api.md lists %v; no case produced it (documented but never answered?)", r)
		}
	}

	var codes []string
	refusals, reasons := map[string]bool{}, map[string]bool{}
	for _, r := range want {
		if !slices.Contains(codes, r.code) {
			codes = append(codes, r.code)
		}
		switch {
		case r.code == string(api.CodeCapacityExceeded):
			refusals[r.reason] = true
		case r.code != string(api.CodeValidation) && r.reason != "":
			reasons[r.reason] = true
		}
	}
	var consts []string
	for _, c := range api.ErrorCodes() {
		consts = append(consts, string(c))
	}
	slices.Sort(codes)
	slices.Sort(consts)
	if !slices.Equal(codes, consts) {
		t.Errorf("docs/api.md codes %v, api.ErrorCodes %v", codes, consts)
	}
	for _, r := range api.RefusalReasons() {
		if !refusals[string(r)] {
			t.Errorf("api.RefusalReasons has %q; docs/api.md does not list it", r)
		}
		delete(refusals, string(r))
	}
	for r := range refusals {
		t.Errorf("docs/api.md lists refusal reason %q; api.RefusalReasons lacks it", r)
	}
	for _, r := range api.ErrorReasons() {
		if r != api.ReasonBody && !reasons[r] {
			t.Errorf("api.ErrorReasons has %q; docs/api.md does not list it", r)
		}
		delete(reasons, r)
	}
	for r := range reasons {
		t.Errorf("docs/api.md lists reason %q; api.ErrorReasons lacks it", r)
	}
}
