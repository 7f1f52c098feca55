package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// TestE2BRoutes: each E2B control-plane call reaches the broker call the
// README's table names, with E2B's statuses and error shape.
func TestE2BRoutes(t *testing.T) {
	active := e2bRecord(core.StateActive, core.ProtocolEnvd, "http://127.0.0.1:4000")
	warm := e2bRecord(core.StateWarm, core.ProtocolEnvd, "http://127.0.0.1:4000")
	oneoff := active
	oneoff.ThreadKey = core.ThreadKey{Tenant: "acme", User: OneOffUser, Thread: OneOffPrefix + "x"}
	capErr := &core.CapacityError{Reason: api.RefusalCapacity, RetryAfter: 3 * time.Second}
	tests := []struct {
		name, method, path, body string
		rec                      core.Record
		acquired                 core.AcquireResult
		err                      error
		wantStatus               int
		wantCalls                []string
	}{
		{"create for a thread", "POST", "/e2b/v2/sandboxes", `{"templateID":"base","metadata":{"user_id":"u","thread_id":"t"},"timeout":300}`, core.Record{}, core.AcquireResult{Record: active}, nil, 201, []string{"Acquire acme/u/t"}},
		{"create v1, no body", "POST", "/e2b/sandboxes", ``, core.Record{}, core.AcquireResult{Record: oneoff}, nil, 201, []string{"*"}},
		{"create, another template", "POST", "/e2b/v2/sandboxes", `{"templateID":"python"}`, core.Record{}, core.AcquireResult{}, nil, 400, nil},
		{"create, envVars", "POST", "/e2b/v2/sandboxes", `{"envVars":{"A":"1"}}`, core.Record{}, core.AcquireResult{}, nil, 400, nil},
		{"create, half a thread", "POST", "/e2b/v2/sandboxes", `{"metadata":{"user_id":"u"}}`, core.Record{}, core.AcquireResult{}, nil, 400, nil},
		{"create, bad thread id", "POST", "/e2b/v2/sandboxes", `{"metadata":{"user_id":"u","thread_id":"a b"}}`, core.Record{}, core.AcquireResult{}, nil, 400, nil},
		{"create, unknown field", "POST", "/e2b/v2/sandboxes", `{"nope":1}`, core.Record{}, core.AcquireResult{}, nil, 400, nil},
		{"create, autoPause", "POST", "/e2b/v2/sandboxes", `{"autoPause":true}`, core.Record{}, core.AcquireResult{}, nil, 400, nil},
		{"create, SDK defaults", "POST", "/e2b/v2/sandboxes", `{"templateID":"base","metadata":{"user_id":"u","thread_id":"t"},"allow_internet_access":true,"autoPause":false}`, core.Record{}, core.AcquireResult{Record: active}, nil, 201, []string{"Acquire acme/u/t"}},
		{"create at capacity", "POST", "/e2b/v2/sandboxes", `{"metadata":{"user_id":"u","thread_id":"t"}}`, core.Record{}, core.AcquireResult{}, capErr, 429, []string{"Acquire acme/u/t"}},
		{"create waiting", "POST", "/e2b/v2/sandboxes", `{"metadata":{"user_id":"u","thread_id":"t"}}`, core.Record{}, core.AcquireResult{Waiting: &core.Waiting{Ticket: "tk", RetryAfter: 2 * time.Second}}, nil, 429, []string{"Acquire acme/u/t"}},
		{"connect a warm sandbox", "POST", "/e2b/v2/sandboxes/sb1/connect", `{}`, warm, core.AcquireResult{Record: active, Source: core.SourceReclaimed}, nil, 201, []string{"Get acme sb1", "Acquire acme/u/t"}},
		{"resume a warm sandbox", "POST", "/e2b/sandboxes/sb1/resume", ``, warm, core.AcquireResult{Record: active}, nil, 201, []string{"Get acme sb1", "Acquire acme/u/t"}},
		{"kill", "DELETE", "/e2b/sandboxes/sb1", ``, active, core.AcquireResult{}, nil, 204, []string{"Get acme sb1", "ReleaseWith acme sb1 destroy=false pause=true"}},
		{"kill a one-off", "DELETE", "/e2b/sandboxes/sb1", ``, oneoff, core.AcquireResult{}, nil, 204, []string{"Get acme sb1", "ReleaseWith acme sb1 destroy=true pause=true"}},
		{"kill again", "DELETE", "/e2b/sandboxes/sb1", ``, warm, core.AcquireResult{}, nil, 404, []string{"Get acme sb1"}},
		{"kill another tenant's", "DELETE", "/e2b/sandboxes/sb1", ``, core.Record{}, core.AcquireResult{}, core.ErrNotFound, 404, []string{"Get acme sb1"}},
		{"pause", "POST", "/e2b/sandboxes/sb1/pause", `{}`, active, core.AcquireResult{}, nil, 204, []string{"Get acme sb1", "ReleaseWith acme sb1 destroy=false pause=true"}},
		{"pause a parked one", "POST", "/e2b/sandboxes/sb1/pause", ``, warm, core.AcquireResult{}, nil, 409, []string{"Get acme sb1"}},
		{"set timeout", "POST", "/e2b/sandboxes/sb1/timeout", `{"timeout":60}`, active, core.AcquireResult{}, nil, 204, []string{"Renew acme sb1 1m0s"}},
		{"set timeout, parked", "POST", "/e2b/sandboxes/sb1/timeout", `{"timeout":60}`, warm, core.AcquireResult{}, nil, 404, []string{"Renew acme sb1 1m0s"}},
		{"set timeout, bad seconds", "POST", "/e2b/sandboxes/sb1/timeout", `{"timeout":-1}`, active, core.AcquireResult{}, nil, 400, nil},
		{"set timeout, bad body", "POST", "/e2b/sandboxes/sb1/timeout", `{"seconds":60}`, active, core.AcquireResult{}, nil, 400, nil},
		{"refresh", "POST", "/e2b/sandboxes/sb1/refreshes", `{"duration":60}`, active, core.AcquireResult{}, nil, 204, []string{"Renew acme sb1 1m0s"}},
		{"info", "GET", "/e2b/sandboxes/sb1", ``, warm, core.AcquireResult{}, nil, 200, []string{"Get acme sb1"}},
		{"info, gone", "GET", "/e2b/sandboxes/sb1", ``, e2bRecord(core.StateGone, core.ProtocolEnvd, "http://x"), core.AcquireResult{}, nil, 404, []string{"Get acme sb1"}},
		{"snapshots", "POST", "/e2b/sandboxes/sb1/snapshots", `{}`, active, core.AcquireResult{}, nil, 501, nil},
		{"volumes", "GET", "/e2b/volumes", ``, active, core.AcquireResult{}, nil, 501, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBroker{record: tt.rec, acquire: tt.acquired, err: tt.err}
			if tt.err != nil && tt.rec.SandboxID != "" {
				b.err = nil
			}
			ev := event(RouteE2BOther, tt.path, tt.body, "acme", map[string]string{"proxy": strings.TrimPrefix(tt.path, "/e2b/")})
			ev.RequestContext.HTTP.Method = tt.method
			resp := serveE2BEvent(t, b, ev, tt.wantStatus, tt.wantCalls)
			if tt.name == "create v1, no body" && (len(b.calls) != 1 || !strings.HasPrefix(b.calls[0], "Acquire acme/"+OneOffUser+"/"+OneOffPrefix)) {
				t.Errorf("create without a thread: calls %q, want an acquire for a one-off thread", b.calls)
			}
			if tt.wantStatus == http.StatusTooManyRequests && resp.Headers["Retry-After"] == "" {
				t.Errorf("429 without Retry-After")
			}
			if tt.wantStatus == http.StatusCreated {
				var got e2bapi.Sandbox
				if err := json.Unmarshal([]byte(resp.Body), &got); err != nil || got.SandboxID == "" || got.EnvdVersion == "" || got.EnvdAccessToken == "" || got.TemplateID == "" {
					t.Errorf("reply %s: want sandboxID, envdVersion, envdAccessToken, templateID", resp.Body)
				}
			}
		})
	}
}

// TestE2BList: list reads the tenant's own sandboxes (every store page),
// filters them by the double-encoded metadata and by state, orders them
// by start time (newest first unless order=asc) and pages the result
// with X-Next-Token.
func TestE2BList(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	rec := func(id, thread string, st core.State, created time.Duration) core.Record {
		r := e2bRecord(st, core.ProtocolEnvd, "http://x")
		r.SandboxID, r.Thread, r.CreatedAt = id, thread, t0.Add(created)
		return r
	}
	// sb2 comes twice, as a record moving state between store pages may.
	pages := [][]core.Record{{rec("sb1", "t", core.StateActive, time.Minute), rec("sb2", "t2", core.StateWarm, 3*time.Minute)},
		{rec("sb3", "t3", core.StateActive, 2*time.Minute), rec("sb2", "t2", core.StateWarm, 3*time.Minute)}}
	both := []string{`Sandboxes acme "" 100`, `Sandboxes acme "p1" 100`}
	tests := []struct {
		name, query string
		wantIDs     string
		wantCalls   []string
		wantStatus  int
	}{
		{"all, newest first", "", "sb2,sb3,sb1", both, 200},
		{"oldest first", "order=asc", "sb1,sb3,sb2", both, 200},
		{"newest first, asked", "order=desc", "sb2,sb3,sb1", both, 200},
		{"metadata (double-encoded)", "metadata=" + "thread_id%3Dt2%26user_id%3Du", "sb2", both, 200},
		{"running only", "state=running", "sb3,sb1", both, 200},
		{"paused only (repeated)", "state=paused&state=paused", "sb2", both, 200},
		{"bad state", "state=killed", "", nil, 400},
		{"bad limit", "limit=1000", "", nil, 400},
		{"bad order", "order=newest", "", nil, 400},
		{"bad token", "nextToken=c1", "", nil, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids, next := listE2B(t, &fakeBroker{pages: pages}, tt.query, tt.wantStatus, tt.wantCalls)
			if tt.wantStatus == 200 && (strings.Join(ids, ",") != tt.wantIDs || next != "") {
				t.Errorf("listed %v, next %q; want %s and no next page", ids, next, tt.wantIDs)
			}
		})
	}
	for order, want := range map[string]string{"asc": "sb1,sb3,sb2", "desc": "sb2,sb3,sb1"} {
		var got []string
		tok := ""
		for range 4 {
			q := "limit=1&order=" + order
			if tok != "" {
				q += "&nextToken=" + tok
			}
			ids, next := listE2B(t, &fakeBroker{pages: pages}, q, 200, both)
			got = append(got, ids...)
			if tok = next; tok == "" {
				break
			}
		}
		if strings.Join(got, ",") != want || tok != "" {
			t.Errorf("order=%s, one a page: %v (last token %q), want %s", order, got, tok, want)
		}
	}
}

// listE2B serves GET /e2b/v2/sandboxes?query with b and returns the
// listed ids and X-Next-Token.
func listE2B(t *testing.T, b *fakeBroker, query string, wantStatus int, wantCalls []string) ([]string, string) {
	t.Helper()
	ev := event(RouteE2BOther, "/e2b/v2/sandboxes", "", "acme", map[string]string{"proxy": "v2/sandboxes"})
	ev.RequestContext.HTTP.Method = "GET"
	ev.RawQueryString = query
	resp := serveE2BEvent(t, b, ev, wantStatus, wantCalls)
	if wantStatus != 200 {
		return nil, ""
	}
	var got []e2bapi.ListedSandbox
	if err := json.Unmarshal([]byte(resp.Body), &got); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range got {
		ids = append(ids, s.SandboxID)
		if s.Metadata["user_id"] != "u" || s.Metadata["thread_id"] == "" || s.EnvdVersion == "" {
			t.Errorf("listed %+v: want its thread in metadata", s)
		}
	}
	return ids, resp.Headers["X-Next-Token"]
}

// TestE2BMetrics: get metrics passes the provider's figures for the
// tenant's own sandbox through in E2B's shape; another tenant's sandbox
// is E2B's not-found, a provider without figures E2B's 501.
func TestE2BMetrics(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	figures := []core.SandboxMetric{{Timestamp: at, CPUCount: 2, CPUUsedPct: 12.5, MemUsed: 1 << 20, MemTotal: 1 << 30, DiskUsed: 4096, DiskTotal: 1 << 31}}
	tests := []struct {
		name, query string
		err         error
		wantStatus  int
		wantCalls   []string
	}{
		{"own sandbox", "", nil, 200, []string{"Metrics acme sb1 0 0"}},
		{"an interval", "start=1700000000&end=1700000060", nil, 200, []string{"Metrics acme sb1 1700000000 1700000060"}},
		{"another tenant's", "", core.ErrNotFound, 404, []string{"Metrics acme sb1 0 0"}},
		{"gone at the provider", "", fmt.Errorf("read: %w", core.ErrSandboxGone), 404, []string{"Metrics acme sb1 0 0"}},
		{"provider without figures", "", core.ErrNotOffered, 501, []string{"Metrics acme sb1 0 0"}},
		{"provider down", "", fmt.Errorf("x: %w", core.ErrProviderUnavailable), 503, []string{"Metrics acme sb1 0 0"}},
		{"bad start", "start=yesterday", nil, 400, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBroker{metrics: figures, err: tt.err}
			ev := event(RouteE2BOther, "/e2b/sandboxes/sb1/metrics", "", "acme", map[string]string{"proxy": "sandboxes/sb1/metrics"})
			ev.RequestContext.HTTP.Method = "GET"
			ev.RawQueryString = tt.query
			resp := serveE2BEvent(t, b, ev, tt.wantStatus, tt.wantCalls)
			if tt.wantStatus != http.StatusOK {
				return
			}
			var got []e2bapi.SandboxMetric
			if err := json.Unmarshal([]byte(resp.Body), &got); err != nil {
				t.Fatal(err)
			}
			want := []e2bapi.SandboxMetric{{Timestamp: at, TimestampUnix: at.Unix(), CPUCount: 2, CPUUsedPct: 12.5, MemUsed: 1 << 20,
				MemTotal: 1 << 30, DiskUsed: 4096, DiskTotal: 1 << 31}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("metrics %+v, want %+v", got, want)
			}
		})
	}
}
