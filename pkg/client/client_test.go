package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// fakeBroker answers one canned response per request and records the request.
type fakeBroker struct {
	status int
	header map[string]string
	body   string

	gotMethod, gotPath, gotRawPath, gotAuth, gotCT string
	gotBody                                        []byte
}

func (f *fakeBroker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.gotMethod, f.gotPath, f.gotRawPath = r.Method, r.URL.Path, r.URL.RawPath
	f.gotAuth, f.gotCT = r.Header.Get("Authorization"), r.Header.Get("Content-Type")
	f.gotBody, _ = io.ReadAll(r.Body)
	for k, v := range f.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(f.status)
	io.WriteString(w, f.body)
}

func newClient(t *testing.T, h http.Handler, opts ...client.Option) *client.Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, "tok-1", opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func TestAcquireSendsRequestAndDecodesSandbox(t *testing.T) {
	fb := &fakeBroker{status: 200, header: map[string]string{"Content-Type": "application/json"}, body: `{
		"sandbox_id":"sbx123","state":"active","source":"created","backend":"e2b",
		"connection":{"envd_url":"http://127.0.0.1:9","envd_access_token":"secret"},
		"expires_at":"2026-11-29T10:00:00Z","extra":"ignored"}`}
	c := newClient(t, fb)
	got, err := c.Acquire(context.Background(), "u1", "t1")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	want := client.Sandbox{
		SandboxID: "sbx123", State: "active", Source: "created", Backend: "e2b",
		Connection: client.Connection{EnvdURL: "http://127.0.0.1:9", EnvdAccessToken: "secret"},
		ExpiresAt:  time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
	}
	if !got.ExpiresAt.Equal(want.ExpiresAt) {
		t.Errorf("ExpiresAt = %v, want %v", got.ExpiresAt, want.ExpiresAt)
	}
	got.ExpiresAt = want.ExpiresAt
	if got != want {
		t.Errorf("Acquire = %+v, want %+v", got, want)
	}
	if fb.gotMethod != "POST" || fb.gotPath != "/v1/sandboxes/acquire" {
		t.Errorf("request = %s %s, want POST /v1/sandboxes/acquire", fb.gotMethod, fb.gotPath)
	}
	if fb.gotAuth != "Bearer tok-1" {
		t.Errorf("Authorization = %q, want %q", fb.gotAuth, "Bearer tok-1")
	}
	if fb.gotCT != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", fb.gotCT)
	}
	var body map[string]string
	if err := json.Unmarshal(fb.gotBody, &body); err != nil || body["user_id"] != "u1" || body["thread_id"] != "t1" || len(body) != 2 {
		t.Errorf("body = %s (err %v), want {user_id:u1, thread_id:t1}", fb.gotBody, err)
	}
}

func TestAcquireAcceptsEmptyExpiresAt(t *testing.T) {
	c := newClient(t, &fakeBroker{status: 200, body: `{"sandbox_id":"s","state":"active","expires_at":""}`})
	got, err := c.Acquire(context.Background(), "u", "t")
	if err != nil || got.SandboxID != "s" || !got.ExpiresAt.IsZero() {
		t.Errorf("Acquire = %+v, %v; want id s and a zero ExpiresAt", got, err)
	}
	c = newClient(t, &fakeBroker{status: 200, body: `{"sandbox_id":"s","expires_at":"tomorrow"}`})
	if _, err := c.Acquire(context.Background(), "u", "t"); err == nil || !strings.Contains(err.Error(), "expires_at") {
		t.Errorf("Acquire with a bad expires_at: error = %v, want one naming expires_at", err)
	}
}

func TestCallsUseRoutesAndDecodeBodies(t *testing.T) {
	tests := []struct {
		name       string
		call       func(c *client.Client) (any, error)
		body       string
		wantMethod string
		wantPath   string
		want       any
	}{
		{
			name:       "release",
			call:       func(c *client.Client) (any, error) { return c.Release(context.Background(), "sb1") },
			body:       `{"sandbox_id":"sb1","state":"warm","sync":{"uploaded":2,"skipped":1,"deferred":[{"path":"outputs/big","reason":"file_too_large"}],"bytes":10,"complete":false}}`,
			wantMethod: "POST", wantPath: "/v1/sandboxes/sb1/release",
			want: client.ReleaseResult{SandboxID: "sb1", State: "warm", Sync: &client.SyncResult{
				Uploaded: 2, Skipped: 1, Bytes: 10, Deferred: []client.DeferredFile{{Path: "outputs/big", Reason: "file_too_large"}},
			}},
		},
		{
			name:       "sync",
			call:       func(c *client.Client) (any, error) { return c.Sync(context.Background(), "sb1") },
			body:       `{"uploaded":1,"skipped":0,"deferred":[],"bytes":5,"complete":true}`,
			wantMethod: "POST", wantPath: "/v1/sandboxes/sb1/sync",
			want: client.SyncResult{Uploaded: 1, Bytes: 5, Complete: true, Deferred: []client.DeferredFile{}},
		},
		{
			name:       "capacity",
			call:       func(c *client.Client) (any, error) { return c.Capacity(context.Background()) },
			body:       `{"limit":3,"used":2,"active":1,"warm":1,"reserved":0,"transitioning":0,"policy":"wait"}`,
			wantMethod: "GET", wantPath: "/v1/capacity",
			want: client.Capacity{Limit: 3, Used: 2, Active: 1, Warm: 1, Policy: "wait"},
		},
		{
			name:       "drain",
			call:       func(c *client.Client) (any, error) { return c.Drain(context.Background()) },
			body:       `{"draining":true}`,
			wantMethod: "POST", wantPath: "/v1/admin/drain",
			want: client.DrainStatus{Draining: true},
		},
		{
			name:       "undrain",
			call:       func(c *client.Client) (any, error) { return c.Undrain(context.Background()) },
			body:       `{"draining":false}`,
			wantMethod: "POST", wantPath: "/v1/admin/undrain",
			want: client.DrainStatus{Draining: false},
		},
		{
			name: "get",
			call: func(c *client.Client) (any, error) {
				r, err := c.Get(context.Background(), "sb1")
				return string(r), err
			},
			body:       `{"sandbox_id":"sb1","state":"warm"}`,
			wantMethod: "GET", wantPath: "/v1/sandboxes/sb1",
			want: `{"sandbox_id":"sb1","state":"warm"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := &fakeBroker{status: 200, body: tt.body}
			c := newClient(t, fb)
			got, err := tt.call(c)
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if fb.gotMethod != tt.wantMethod || fb.gotPath != tt.wantPath {
				t.Errorf("request = %s %s, want %s %s", fb.gotMethod, fb.gotPath, tt.wantMethod, tt.wantPath)
			}
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(tt.want)
			if string(gj) != string(wj) {
				t.Errorf("result = %s, want %s", gj, wj)
			}
		})
	}
}

func TestErrorsAreDecodedIntoAPIError(t *testing.T) {
	tests := []struct {
		name         string
		status       int
		header       map[string]string
		body         string
		want         client.APIError
		wantCapacity bool
		wantNotFound bool
	}{
		{
			name:   "capacity with retry_after_seconds",
			status: 429, header: map[string]string{"Retry-After": "7"},
			body: `{"error":{"code":"SANDBOX_CAPACITY_EXCEEDED","message":"all 1 slots are held","reason":"capacity","retryable":true,"retry_after_seconds":5,"details":{"limit":1,"used":1}}}`,
			want: client.APIError{Status: 429, Code: "SANDBOX_CAPACITY_EXCEEDED", Message: "all 1 slots are held",
				Reason: "capacity", Retryable: true, RetryAfter: 5 * time.Second, Details: map[string]any{"limit": 1.0, "used": 1.0}},
			wantCapacity: true,
		},
		{
			name:   "capacity with only the Retry-After header",
			status: 429, header: map[string]string{"Retry-After": "7"},
			body:         `{"error":{"code":"SANDBOX_CAPACITY_EXCEEDED","message":"full","reason":"draining","retryable":true}}`,
			want:         client.APIError{Status: 429, Code: "SANDBOX_CAPACITY_EXCEEDED", Message: "full", Reason: "draining", Retryable: true, RetryAfter: 7 * time.Second},
			wantCapacity: true,
		},
		{
			name:         "not found",
			status:       404,
			body:         `{"error":{"code":"SANDBOX_NOT_FOUND","message":"no such sandbox","retryable":false}}`,
			want:         client.APIError{Status: 404, Code: "SANDBOX_NOT_FOUND", Message: "no such sandbox"},
			wantNotFound: true,
		},
		{
			name:   "validation",
			status: 400,
			body:   `{"error":{"code":"INVALID_REQUEST","message":"user_id: must match ^[A-Za-z0-9_-]{1,64}$"}}`,
			want:   client.APIError{Status: 400, Code: "INVALID_REQUEST", Message: "user_id: must match ^[A-Za-z0-9_-]{1,64}$"},
		},
		{
			name:   "gateway 401 without the error envelope",
			status: 401,
			body:   `{"message":"Unauthorized"}`,
			want:   client.APIError{Status: 401, Code: "HTTP_401", Message: "Unauthorized"},
		},
		{
			name:   "plain text 502",
			status: 502, header: map[string]string{"Retry-After": "2"},
			body: "bad gateway\n",
			want: client.APIError{Status: 502, Code: "HTTP_502", Message: "bad gateway", Retryable: true, RetryAfter: 2 * time.Second},
		},
		{
			name:   "empty 503",
			status: 503,
			want:   client.APIError{Status: 503, Code: "HTTP_503", Message: "Service Unavailable", Retryable: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, &fakeBroker{status: tt.status, header: tt.header, body: tt.body})
			_, err := c.Acquire(context.Background(), "u", "t")
			var ae *client.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("error = %v (%T), want *APIError", err, err)
			}
			if !reflect.DeepEqual(*ae, tt.want) {
				t.Errorf("APIError = %+v, want %+v", *ae, tt.want)
			}
			if got := client.IsCapacity(err); got != tt.wantCapacity {
				t.Errorf("IsCapacity = %v, want %v", got, tt.wantCapacity)
			}
			if got := client.IsNotFound(err); got != tt.wantNotFound {
				t.Errorf("IsNotFound = %v, want %v", got, tt.wantNotFound)
			}
			if !strings.Contains(err.Error(), tt.want.Code) {
				t.Errorf("Error() = %q, want it to name the code %s", err.Error(), tt.want.Code)
			}
		})
	}
}

func TestEveryCallHasATimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	c := newClient(t, h, client.WithTimeout(50*time.Millisecond))
	start := time.Now()
	_, err := c.Capacity(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("call took %s, want about 50ms", d)
	}
}

func TestIDsAreEscapedAndBasePathKept(t *testing.T) {
	fb := &fakeBroker{status: 200, body: `{}`}
	srv := httptest.NewServer(fb)
	defer srv.Close()
	c, err := client.New(srv.URL+"/stage/", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(context.Background(), "a/b?c"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if want := "/stage/v1/sandboxes/a%2Fb%3Fc/release"; fb.gotRawPath != want {
		t.Errorf("escaped path = %q, want %q", fb.gotRawPath, want)
	}
	if fb.gotAuth != "" {
		t.Errorf("Authorization = %q, want none for an empty token", fb.gotAuth)
	}
}

func TestNewRejectsBadURLs(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8787", "ftp://x", "http://"} {
		if _, err := client.New(u, "t"); err == nil {
			t.Errorf("New(%q) = nil error, want an error", u)
		}
	}
}

func TestDrainForbiddenForNonAdmin(t *testing.T) {
	for _, call := range []struct {
		name string
		f    func(c *client.Client) (client.DrainStatus, error)
	}{
		{"drain", func(c *client.Client) (client.DrainStatus, error) { return c.Drain(context.Background()) }},
		{"undrain", func(c *client.Client) (client.DrainStatus, error) { return c.Undrain(context.Background()) }},
	} {
		t.Run(call.name, func(t *testing.T) {
			c := newClient(t, &fakeBroker{status: 403, body: `{"error":{"code":"FORBIDDEN","message":"admin route: this tenant is not an administrator","reason":"not_admin","retryable":false}}`})
			_, err := call.f(c)
			if !client.IsForbidden(err) {
				t.Fatalf("error = %v, want a 403 (IsForbidden)", err)
			}
			var ae *client.APIError
			if !errors.As(err, &ae) || ae.Code != client.ErrorCodeForbidden || ae.Reason != "not_admin" {
				t.Errorf("APIError = %+v, want code FORBIDDEN reason not_admin", ae)
			}
			if client.IsCapacity(err) || client.IsNotFound(err) {
				t.Errorf("a 403 counts as capacity or not found: %v", err)
			}
		})
	}
}

func TestAcquireDecodesRestore(t *testing.T) {
	c := newClient(t, &fakeBroker{status: 200, body: `{"sandbox_id":"s","state":"active","source":"created",
		"restore":{"complete":false,"restored":20,"skipped":0,"remaining":25,"bytes":200,"deferred":[{"path":"outputs/f20.txt","reason":"max_files"}]}}`})
	got, err := c.Acquire(context.Background(), "u", "t")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	want := &client.RestoreResult{Restored: 20, Remaining: 25, Bytes: 200,
		Deferred: []client.DeferredFile{{Path: "outputs/f20.txt", Reason: "max_files"}}}
	if !reflect.DeepEqual(got.Restore, want) {
		t.Errorf("Restore = %+v, want %+v", got.Restore, want)
	}
}
