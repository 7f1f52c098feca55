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

// TestE2BList: list pages the tenant's own sandboxes, filters them by
// the double-encoded metadata and by state, and hands on the next page's
// token in X-Next-Token.
func TestE2BList(t *testing.T) {
	a := e2bRecord(core.StateActive, core.ProtocolEnvd, "http://x")
	w := e2bRecord(core.StateWarm, core.ProtocolEnvd, "http://x")
	w.SandboxID, w.Thread = "sb2", "t2"
	tests := []struct {
		name, query string
		wantIDs     string
		wantCall    string
		wantStatus  int
	}{
		{"all", "", "sb1,sb2", `Sandboxes acme "" 100`, 200},
		{"metadata (double-encoded)", "metadata=" + "thread_id%3Dt2%26user_id%3Du", "sb2", `Sandboxes acme "" 100`, 200},
		{"running only", "state=running&limit=5&nextToken=c1", "sb1", `Sandboxes acme "c1" 5`, 200},
		{"paused only (repeated)", "state=paused&state=paused", "sb2", `Sandboxes acme "" 100`, 200},
		{"bad state", "state=killed", "", "", 400},
		{"bad limit", "limit=1000", "", "", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBroker{list: []core.Record{a, w}, next: "page2"}
			ev := event(RouteE2BOther, "/e2b/v2/sandboxes", "", "acme", map[string]string{"proxy": "v2/sandboxes"})
			ev.RequestContext.HTTP.Method = "GET"
			ev.RawQueryString = tt.query
			var calls []string
			if tt.wantCall != "" {
				calls = []string{tt.wantCall}
			}
			resp := serveE2BEvent(t, b, ev, tt.wantStatus, calls)
			if tt.wantStatus != 200 {
				return
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
			if strings.Join(ids, ",") != tt.wantIDs || resp.Headers["X-Next-Token"] != "page2" {
				t.Errorf("listed %v, next %q; want %s, page2", ids, resp.Headers["X-Next-Token"], tt.wantIDs)
			}
		})
	}
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
