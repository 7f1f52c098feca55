package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// emfLines parses every JSON log line that is an embedded-metric-format
// record (has an "_aws" member) and checks its envelope: namespace
// core.MetricsNamespace, dimension set [Deployment], every declared
// metric present as a top-level number. It returns the metric values of
// all records (name -> values in order) and their units.
func emfLines(t *testing.T, logs, deployment string) (map[string][]float64, map[string]string) {
	t.Helper()
	vals, units := map[string][]float64{}, map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		if l == "" {
			continue
		}
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, l)
		}
		aws, ok := line["_aws"].(map[string]any)
		if !ok {
			continue
		}
		if _, ok := aws["Timestamp"].(float64); !ok {
			t.Errorf("EMF line without a numeric Timestamp: %s", l)
		}
		dirs, _ := aws["CloudWatchMetrics"].([]any)
		if len(dirs) != 1 {
			t.Fatalf("EMF line has %d directives, want 1: %s", len(dirs), l)
		}
		dir := dirs[0].(map[string]any)
		if dir["Namespace"] != core.MetricsNamespace {
			t.Errorf("namespace %v, want %s", dir["Namespace"], core.MetricsNamespace)
		}
		if got, _ := json.Marshal(dir["Dimensions"]); string(got) != `[["Deployment"]]` {
			t.Errorf("dimensions %s, want [[\"Deployment\"]]", got)
		}
		if line["Deployment"] != deployment {
			t.Errorf("Deployment = %v, want %s", line["Deployment"], deployment)
		}
		for _, m := range dir["Metrics"].([]any) {
			def := m.(map[string]any)
			name, _ := def["Name"].(string)
			v, ok := line[name].(float64)
			if !ok {
				t.Errorf("metric %s has no numeric top-level value: %s", name, l)
			}
			vals[name] = append(vals[name], v)
			units[name], _ = def["Unit"].(string)
		}
	}
	return vals, units
}

func serveWithMetrics(t *testing.T, b core.Broker, ev events.APIGatewayV2HTTPRequest, level slog.Level) (events.APIGatewayV2HTTPResponse, string) {
	t.Helper()
	var logs bytes.Buffer
	h := NewHandler(b, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: level})), WithMetrics("prod"))
	resp, err := h(context.Background(), ev)
	if err != nil {
		t.Fatalf("handler returned a Go error: %v", err)
	}
	return resp, logs.String()
}

func TestMetricsEmitted(t *testing.T) {
	capErr := &core.CapacityError{Reason: "capacity", Status: core.CapacityStatus{Limit: 3, Used: 3, Active: 2, Warm: 1}}
	deferred := core.SyncResult{Uploaded: 1, Deferred: []core.DeferredFile{{Path: "a", Reason: "max_files"}, {Path: "b", Reason: "deadline"}}}
	tests := []struct {
		name   string
		broker *fakeBroker
		ev     events.APIGatewayV2HTTPRequest
		status int
		want   map[string][]float64
	}{
		{"capacity read", &fakeBroker{capacity: core.CapacityStatus{Limit: 4, Used: 2}},
			event(RouteCapacity, "/v1/capacity", "", "acme", nil), 200,
			map[string][]float64{core.MetricCapacityUsed: {2}, core.MetricCapacityLimit: {4}}},
		{"429 capacity", &fakeBroker{err: capErr},
			event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil), 429,
			map[string][]float64{core.MetricCapacityRejected: {1}, core.MetricCapacityUsed: {3}, core.MetricCapacityLimit: {3}}},
		{"429 user quota: counted, no ledger gauges", &fakeBroker{err: &core.CapacityError{Reason: "user_quota", Status: core.CapacityStatus{Limit: 3}}},
			event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil), 429,
			map[string][]float64{core.MetricCapacityRejected: {1}}},
		{"503 draining: not a rejection", &fakeBroker{err: &core.CapacityError{Reason: "draining", Status: core.CapacityStatus{Limit: 3, Draining: true}}},
			event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil), 503,
			map[string][]float64{}},
		{"sync", &fakeBroker{sync: deferred},
			event(RouteSync, "/v1/sandboxes/sbx1/sync", "", "acme", map[string]string{"id": "sbx1"}), 200,
			map[string][]float64{core.MetricSyncDeferred: {2}}},
		{"sync with nothing deferred", &fakeBroker{sync: core.SyncResult{Uploaded: 3, Complete: true}},
			event(RouteSync, "/v1/sandboxes/sbx1/sync", "", "acme", map[string]string{"id": "sbx1"}), 200,
			map[string][]float64{core.MetricSyncDeferred: {0}}},
		{"release with sync", &fakeBroker{release: core.ReleaseResult{SandboxID: "sbx1", State: "warm", Sync: &deferred}},
			event(RouteRelease, "/v1/sandboxes/sbx1/release", "", "acme", map[string]string{"id": "sbx1"}), 200,
			map[string][]float64{core.MetricSyncDeferred: {2}}},
		{"release without sync", &fakeBroker{release: core.ReleaseResult{SandboxID: "sbx1", State: "destroyed"}},
			event(RouteRelease, "/v1/sandboxes/sbx1/release", "", "acme", map[string]string{"id": "sbx1"}), 200,
			map[string][]float64{}},
		{"acquire success", &fakeBroker{acquire: core.AcquireResult{Source: core.SourceCreated, Record: core.Record{SandboxID: "sbx1"}}},
			event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil), 200,
			map[string][]float64{}},
	}
	wantUnits := map[string]string{core.MetricCapacityUsed: "Count", core.MetricCapacityLimit: "Count",
		core.MetricCapacityRejected: "Count", core.MetricSyncDeferred: "Count"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// LevelError: metrics must not depend on LOG_LEVEL.
			resp, logs := serveWithMetrics(t, tt.broker, tt.ev, slog.LevelError)
			if resp.StatusCode != tt.status {
				t.Fatalf("status = %d, want %d (%s)", resp.StatusCode, tt.status, resp.Body)
			}
			got, units := emfLines(t, logs, "prod")
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("metrics = %v, want %v\nlogs: %s", got, tt.want, logs)
			}
			for name, u := range units {
				if wantUnits[name] != u {
					t.Errorf("unit of %s = %q, want %q", name, u, wantUnits[name])
				}
			}
			if n := strings.Count(logs, `"_aws"`); len(tt.want) > 0 && n != 1 {
				t.Errorf("%d EMF lines, want 1 per request", n)
			}
		})
	}
}

func TestNoMetricsWithoutOption(t *testing.T) {
	fb := &fakeBroker{err: &core.CapacityError{Reason: "capacity", Status: core.CapacityStatus{Limit: 1, Used: 1}}}
	resp, _, logs := serve(t, fb, event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u","thread_id":"t"}`, "acme", nil))
	if resp.StatusCode != 429 {
		t.Fatalf("status = %d, want 429", resp.StatusCode)
	}
	if strings.Contains(logs, `"_aws"`) {
		t.Errorf("EMF written without WithMetrics: %s", logs)
	}
}

// TestMetricNamesAreCores: the handler emits only names core declares
// (which the stack's alarm check reads through core.EmittedMetrics).
func TestMetricNamesAreCores(t *testing.T) {
	declared := core.EmittedMetrics()
	sort.Strings(declared)
	for _, name := range []string{core.MetricCapacityUsed, core.MetricCapacityLimit, core.MetricCapacityRejected, core.MetricSyncDeferred} {
		if i := sort.SearchStrings(declared, name); i == len(declared) || declared[i] != name {
			t.Errorf("%s is not in core.EmittedMetrics() %v", name, declared)
		}
	}
}
