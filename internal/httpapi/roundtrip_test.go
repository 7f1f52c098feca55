package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// Every reply the handler encodes decodes into the type the Go client
// reads it with, with no field the client does not know, and encodes back
// to the same JSON: server and client cannot drift apart.
func TestRepliesRoundTripThroughTheClientTypes(t *testing.T) {
	when := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	sb := core.Record{SandboxID: "sbx1", State: core.StateActive, Backend: "e2b", ExpiresAt: when,
		ThreadKey: core.ThreadKey{Tenant: "acme", User: "u1", Thread: "t1"}, CreatedAt: when, UpdatedAt: when}
	aio := sb
	aio.Endpoint = core.Endpoint{Protocol: core.ProtocolAIO, URL: "http://127.0.0.1:8/aio/sbx1"}
	sb.Endpoint = core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://127.0.0.1:9", AccessToken: "tok"}
	sync := core.SyncResult{Uploaded: 2, Skipped: 1, Bytes: 10, Complete: false,
		Deferred: []core.DeferredFile{{Path: "outputs/a", Reason: "max_files"}},
		Excluded: []core.DeferredFile{{Path: "outputs/b", Reason: "file_too_large"}}}
	acquire := event(RouteAcquire, "/v1/sandboxes/acquire", `{"user_id":"u1","thread_id":"t1"}`, "acme", nil)
	id := map[string]string{"id": "sbx1"}
	tests := []struct {
		name   string
		broker *fakeBroker
		route  string
		path   string
		into   any // a pointer to the type the client decodes the reply into
	}{
		{"acquire envd", &fakeBroker{acquire: core.AcquireResult{Record: sb, Source: core.SourceCreated}}, RouteAcquire, "", new(client.Sandbox)},
		{"acquire aio", &fakeBroker{acquire: core.AcquireResult{Record: aio, Source: core.SourceReused}}, RouteAcquire, "", new(client.Sandbox)},
		{"acquire with restore", &fakeBroker{acquire: core.AcquireResult{Record: sb, Source: core.SourceCreated,
			Restore: &core.SyncResult{Uploaded: 3, Remaining: 2, Bytes: 7, Deferred: []core.DeferredFile{{Path: "outputs/c", Reason: "deadline"}}}}},
			RouteAcquire, "", new(client.Sandbox)},
		{"acquire without expiry", &fakeBroker{acquire: core.AcquireResult{Record: core.Record{SandboxID: "x",
			Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd}}, Source: core.SourceReclaimed}}, RouteAcquire, "", new(client.Sandbox)},
		{"get", &fakeBroker{record: sb}, RouteGet, "/v1/sandboxes/sbx1", new(api.Record)},
		{"get without times", &fakeBroker{record: core.Record{SandboxID: "sbx1", State: core.StateWarm}}, RouteGet, "/v1/sandboxes/sbx1", new(api.Record)},
		{"capacity", &fakeBroker{capacity: core.CapacityStatus{Limit: 5, Used: 3, Active: 1, Warm: 1, Reserved: 1, Transitioning: 1,
			Tombstones: 1, Policy: "wait", Draining: true}}, RouteCapacity, "/v1/capacity", new(client.Capacity)},
		{"release with sync", &fakeBroker{release: core.ReleaseResult{SandboxID: "sbx1", State: "warm", Sync: &sync}}, RouteRelease, "/v1/sandboxes/sbx1/release", new(client.ReleaseResult)},
		{"release without sync", &fakeBroker{release: core.ReleaseResult{SandboxID: "sbx1", State: "destroyed", SyncError: "boom"}}, RouteRelease, "/v1/sandboxes/sbx1/release", new(client.ReleaseResult)},
		{"sync", &fakeBroker{sync: sync}, RouteSync, "/v1/sandboxes/sbx1/sync", new(client.SyncResult)},
		{"sync continuing a restore", &fakeBroker{sync: core.SyncResult{Uploaded: 1, Remaining: 4}}, RouteSync, "/v1/sandboxes/sbx1/sync", new(client.SyncResult)},
		{"empty sync", &fakeBroker{sync: core.SyncResult{Complete: true}}, RouteSync, "/v1/sandboxes/sbx1/sync", new(client.SyncResult)},
		{"capacity refusal", &fakeBroker{err: &core.CapacityError{Reason: api.RefusalCapacity, RetryAfter: 2 * time.Second,
			Status: core.CapacityStatus{Limit: 1, Used: 1, Active: 1}}}, RouteAcquire, "", new(api.ErrorReply)},
		{"validation error", &fakeBroker{err: &core.ValidationError{Field: "user_id", Message: "bad"}}, RouteAcquire, "", new(api.ErrorReply)},
		{"not found", &fakeBroker{err: core.ErrNotFound}, RouteGet, "/v1/sandboxes/sbx1", new(api.ErrorReply)},
		{"store outage", &fakeBroker{err: core.ErrStoreUnavailable}, RouteCapacity, "/v1/capacity", new(api.ErrorReply)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := acquire
			if tt.route != RouteAcquire {
				ev = event(tt.route, tt.path, "", "acme", id)
			}
			resp, _, _ := serve(t, tt.broker, ev)
			roundTrip(t, resp.Body, tt.into)
		})
	}
	t.Run("drain", func(t *testing.T) {
		h := NewHandler(&fakeBroker{}, nil, WithAdminTenants("ops"))
		resp, err := h(context.Background(), event(RouteDrain, "/v1/admin/drain", "", "ops", nil))
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, resp.Body, new(client.DrainStatus))
	})
}

// roundTrip decodes body strictly into into and checks that it encodes
// back to the same JSON.
func roundTrip(t *testing.T, body string, into any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("decode %s into %T: %v", body, into, err)
	}
	again, err := json.Marshal(into)
	if err != nil {
		t.Fatalf("encode %T: %v", into, err)
	}
	var want, got any
	if err := json.Unmarshal([]byte(body), &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(again, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%T round trip:\n got %s\nwant %s", into, again, body)
	}
}
