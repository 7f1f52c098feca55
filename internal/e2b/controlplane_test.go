package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
)

const testKey = "test-api-key"

// newTestClient returns a Client for a control plane at apiURL and envd at
// sandboxURL ("" = derived).
func newTestClient(t *testing.T, apiURL, sandboxURL string, mod func(*Options)) *Client {
	t.Helper()
	opts := Options{APIURL: apiURL, SandboxURL: sandboxURL, APIKey: testKey}
	if mod != nil {
		mod(&opts)
	}
	c, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// hungServer never answers until the test ends.
func hungServer(t *testing.T) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	return srv
}

func TestNewValidatesOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		ok   bool
	}{
		{"valid", Options{APIURL: "https://api.e2b.app", APIKey: "k"}, true},
		{"valid with sandbox url", Options{APIURL: "http://127.0.0.1:1", SandboxURL: "http://127.0.0.1:2/", APIKey: "k"}, true},
		{"empty api url", Options{APIKey: "k"}, false},
		{"relative api url", Options{APIURL: "api.e2b.app", APIKey: "k"}, false},
		{"ftp api url", Options{APIURL: "ftp://api.e2b.app", APIKey: "k"}, false},
		{"bad sandbox url", Options{APIURL: "https://api.e2b.app", SandboxURL: "nope", APIKey: "k"}, false},
		{"query in url", Options{APIURL: "https://api.e2b.app?x=1", APIKey: "k"}, false},
		{"empty key", Options{APIURL: "https://api.e2b.app"}, false},
		{"blank key", Options{APIURL: "https://api.e2b.app", APIKey: "  "}, false},
		{"page size too big", Options{APIURL: "https://api.e2b.app", APIKey: "k", ListPageSize: 101}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.opts)
			if got := err == nil; got != tt.ok {
				t.Fatalf("New(%+v) error = %v, want ok=%v", tt.opts, err, tt.ok)
			}
			if err == nil && c.Name() != "e2b" {
				t.Errorf("Name() = %q, want e2b", c.Name())
			}
		})
	}
}

func TestCreateSendsSpecAndReturnsRef(t *testing.T) {
	type seen struct {
		method, path, key string
		body              map[string]any
	}
	var got seen
	domain := "example.dev"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path, got.key, got.body = r.Method, r.URL.Path, r.Header.Get("X-API-Key"), nil
		_ = json.NewDecoder(r.Body).Decode(&got.body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"sandboxID":"sbx1","templateID":"base","envdVersion":"0.6.4","envdAccessToken":"tok","domain":%q,"clientID":"x"}`, domain)
	}))
	defer srv.Close()

	c := newTestClient(t, srv.URL, "", nil)
	ref, err := c.Create(context.Background(), core.CreateSpec{
		Timeout:  1500 * time.Millisecond,
		Metadata: map[string]string{"tenant": "t1"},
		EnvVars:  map[string]string{"A": "1"},
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if got.method != http.MethodPost || got.path != "/v2/sandboxes" || got.key != testKey {
		t.Errorf("request = %s %s key %q, want POST /v2/sandboxes key %q", got.method, got.path, got.key, testKey)
	}
	if got.body["templateID"] != "base" || got.body["timeout"] != float64(2) {
		t.Errorf("body = %v, want templateID base and timeout 2 (ceil of 1.5 s)", got.body)
	}
	if md, _ := got.body["metadata"].(map[string]any); md["tenant"] != "t1" {
		t.Errorf("metadata = %v, want tenant=t1", got.body["metadata"])
	}
	if ev, _ := got.body["envVars"].(map[string]any); ev["A"] != "1" {
		t.Errorf("envVars = %v, want A=1", got.body["envVars"])
	}
	want := core.SandboxRef{ID: "sbx1", Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, URL: "https://49983-sbx1.example.dev", AccessToken: "tok"}}
	if ref != want {
		t.Errorf("ref = %+v, want %+v", ref, want)
	}

	// A configured SandboxURL wins; a null domain falls back to e2b.app.
	c2 := newTestClient(t, srv.URL, "http://127.0.0.1:9/", nil)
	if ref, _ := c2.Create(context.Background(), core.CreateSpec{}); ref.Endpoint.URL != "http://127.0.0.1:9" {
		t.Errorf("EnvdURL with SandboxURL = %q, want http://127.0.0.1:9", ref.Endpoint.URL)
	}
	domain = ""
	if ref, _ := c.Create(context.Background(), core.CreateSpec{}); ref.Endpoint.URL != "https://49983-sbx1.e2b.app" {
		t.Errorf("EnvdURL without domain = %q, want https://49983-sbx1.e2b.app", ref.Endpoint.URL)
	}
	if _, ok := got.body["timeout"]; ok {
		t.Errorf("zero Timeout sent timeout %v, want it omitted (server default)", got.body["timeout"])
	}
}

func TestCreateErrorClassification(t *testing.T) {
	tests := []struct {
		status        int
		body          string
		wantAmbiguous bool
		wantInMessage string
	}{
		{400, `{"code":400,"message":"bad template"}`, false, "bad template"},
		{401, `{"code":401,"message":"Invalid API key"}`, false, "check the E2B API key"},
		{403, `{"code":403,"message":"nope"}`, false, "forbidden"},
		{404, `{"code":404,"message":"template not found"}`, true, "template not found"},
		{408, ``, true, ""},
		{409, `{"code":409,"message":"conflict"}`, true, "conflict"},
		{429, `{"code":429,"message":"slow down"}`, true, "rate limited"},
		{500, `{"code":500,"message":"boom"}`, true, "boom"},
		{502, `bad gateway`, true, "bad gateway"},
		{503, `{"code":503,"message":"busy"}`, true, "busy"},
		{201, `not json`, true, "unreadable"},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			_, err := newTestClient(t, srv.URL, "", nil).Create(context.Background(), core.CreateSpec{})
			var pe *core.ProviderError
			if !errors.As(err, &pe) {
				t.Fatalf("Create error = %v (%T), want *core.ProviderError", err, err)
			}
			if pe.Ambiguous != tt.wantAmbiguous || core.IsAmbiguous(err) != tt.wantAmbiguous {
				t.Errorf("Ambiguous = %v, want %v (err %v)", pe.Ambiguous, tt.wantAmbiguous, err)
			}
			if pe.StatusCode != tt.status {
				t.Errorf("StatusCode = %d, want %d", pe.StatusCode, tt.status)
			}
			if !strings.Contains(err.Error(), tt.wantInMessage) {
				t.Errorf("error %q does not contain %q", err, tt.wantInMessage)
			}
		})
	}
}

func TestCreateTimeoutAndTransportErrorsAreAmbiguous(t *testing.T) {
	hung := hungServer(t)
	c := newTestClient(t, hung.URL, "", func(o *Options) { o.Timeouts.Create = 200 * time.Millisecond })
	start := time.Now()
	_, err := c.Create(context.Background(), core.CreateSpec{})
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Create took %s, want about the 200ms create timeout", elapsed)
	}
	if !core.IsAmbiguous(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hung create error = %v, want ambiguous and DeadlineExceeded", err)
	}

	// The caller's ctx is honoured too.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	c = newTestClient(t, hung.URL, "", nil)
	if _, err := c.Info(ctx, "sbx1"); !errors.Is(err, context.DeadlineExceeded) || !core.IsAmbiguous(err) {
		t.Errorf("Info with expired ctx = %v, want ambiguous DeadlineExceeded", err)
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	_, err = newTestClient(t, closed.URL, "", nil).Create(context.Background(), core.CreateSpec{})
	var pe *core.ProviderError
	if !errors.As(err, &pe) || !pe.Ambiguous || pe.StatusCode != 0 {
		t.Errorf("connection refused error = %v, want ambiguous ProviderError with status 0", err)
	}
}

func TestCreateRejectsBadEnvKey(t *testing.T) {
	c := newTestClient(t, "http://127.0.0.1:9", "", nil)
	_, err := c.Create(context.Background(), core.CreateSpec{EnvVars: map[string]string{"A-B": "x"}})
	var ve *core.ValidationError
	if !errors.As(err, &ve) {
		t.Errorf("Create with env key A-B = %v, want *core.ValidationError", err)
	}
}

// fakeInventory serves GET /v2/sandboxes with paging like E2B.
type fakeInventory struct {
	mu       sync.Mutex
	items    []e2bapi.ListedSandbox
	queries  []url.Values
	repeat   bool // always return the same token
	pageSize int
}

func (f *fakeInventory) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-API-Key") != testKey {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"code":401,"message":"Invalid API key"}`)
		return
	}
	if r.URL.Path != "/v2/sandboxes" {
		http.NotFound(w, r)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	q := r.URL.Query()
	f.queries = append(f.queries, q)
	filter, err := url.ParseQuery(q.Get("metadata"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	states := strings.Split(q.Get("state"), ",")
	limit, _ := strconv.Atoi(q.Get("limit"))
	start, _ := strconv.Atoi(q.Get("nextToken"))
	var match []e2bapi.ListedSandbox
	for _, it := range f.items {
		ok := contains(states, it.State)
		for k := range filter {
			ok = ok && it.Metadata[k] == filter.Get(k)
		}
		if ok {
			match = append(match, it)
		}
	}
	end := min(start+limit, len(match))
	if end < len(match) || f.repeat {
		w.Header().Set("X-Next-Token", strconv.Itoa(end))
		if f.repeat {
			w.Header().Set("X-Next-Token", "same")
		}
	}
	_ = json.NewEncoder(w).Encode(match[start:end])
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func TestListFollowsNextTokenAndDoubleEncodesMetadata(t *testing.T) {
	inv := &fakeInventory{}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range 7 {
		md := map[string]string{"thread": "a&b=c d", "n": strconv.Itoa(i)}
		if i == 3 {
			md["thread"] = "other"
		}
		inv.items = append(inv.items, e2bapi.ListedSandbox{SandboxID: fmt.Sprintf("sbx%d", i), TemplateID: "base", Metadata: md, State: []string{"running", "paused"}[i%2], StartedAt: t0, EndAt: t0.Add(time.Hour)})
	}
	srv := httptest.NewServer(inv)
	defer srv.Close()
	c := newTestClient(t, srv.URL, "", func(o *Options) { o.ListPageSize = 2 })

	got, err := c.List(context.Background(), core.ListFilter{Metadata: map[string]string{"thread": "a&b=c d"}})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var ids []string
	for _, s := range got {
		ids = append(ids, s.ID)
	}
	sort.Strings(ids)
	if want := "sbx0,sbx1,sbx2,sbx4,sbx5,sbx6"; strings.Join(ids, ",") != want {
		t.Errorf("ids = %v, want %s", ids, want)
	}
	if len(inv.queries) != 3 {
		t.Errorf("pages fetched = %d, want 3 (6 matches, limit 2)", len(inv.queries))
	}
	q := inv.queries[0]
	if q.Get("state") != "running,paused" || q.Get("limit") != "2" || q.Has("nextToken") {
		t.Errorf("first query = %v, want state=running,paused limit=2 and no nextToken", q)
	}
	if got[0].StartedAt != t0 || got[0].EndAt != t0.Add(time.Hour) || got[0].TemplateID != "base" {
		t.Errorf("info = %+v, want times and template from the reply", got[0])
	}

	paused, err := c.List(context.Background(), core.ListFilter{States: []string{"paused"}})
	if err != nil || len(paused) != 3 {
		t.Errorf("List paused = %d items, %v; want 3", len(paused), err)
	}
}

func TestListGuardsAgainstEndlessPaging(t *testing.T) {
	inv := &fakeInventory{items: []e2bapi.ListedSandbox{{SandboxID: "a", State: "running"}}, repeat: true}
	srv := httptest.NewServer(inv)
	defer srv.Close()
	if _, err := newTestClient(t, srv.URL, "", nil).List(context.Background(), core.ListFilter{}); err == nil || !strings.Contains(err.Error(), "repeated") {
		t.Errorf("List with a repeating token = %v, want a repeated-token error", err)
	}

	many := &fakeInventory{}
	for i := range 10 {
		many.items = append(many.items, e2bapi.ListedSandbox{SandboxID: strconv.Itoa(i), State: "running"})
	}
	srv2 := httptest.NewServer(many)
	defer srv2.Close()
	c := newTestClient(t, srv2.URL, "", func(o *Options) { o.ListPageSize = 1; o.MaxListPages = 3 })
	if _, err := c.List(context.Background(), core.ListFilter{}); err == nil || !strings.Contains(err.Error(), "more than 3 pages") {
		t.Errorf("List past MaxListPages = %v, want a page-guard error", err)
	}
}

func TestUnauthorizedIsClearAndCertain(t *testing.T) {
	srv := httptest.NewServer(&fakeInventory{})
	defer srv.Close()
	c, _ := New(Options{APIURL: srv.URL, APIKey: "wrong"})
	_, err := c.List(context.Background(), core.ListFilter{})
	var pe *core.ProviderError
	if !errors.As(err, &pe) || pe.StatusCode != 401 || pe.Ambiguous || !strings.Contains(err.Error(), "API key") {
		t.Errorf("List with a wrong key = %v, want non-ambiguous 401 mentioning the API key", err)
	}
}

func TestSandboxCallsMapNotFound(t *testing.T) {
	type reply struct {
		status int
		body   string
	}
	var next reply
	var last *http.Request
	var lastBody []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		last = r
		lastBody, _ = io.ReadAll(r.Body)
		w.WriteHeader(next.status)
		io.WriteString(w, next.body)
	}))
	defer srv.Close()
	c := newTestClient(t, srv.URL, "", nil)
	ctx := context.Background()

	tests := []struct {
		name     string
		reply    reply
		call     func() error
		wantGone bool
		wantNil  bool
	}{
		{"info 404 json", reply{404, `{"code":404,"message":"sandbox not found"}`}, func() error { _, err := c.Info(ctx, "sbx1"); return err }, true, false},
		{"info empty 200", reply{200, ``}, func() error { _, err := c.Info(ctx, "sbx1"); return err }, true, false},
		{"info router 404", reply{404, "404 page not found"}, func() error { _, err := c.Info(ctx, "sbx1"); return err }, false, false},
		{"info 500", reply{500, `{"code":500,"message":"x"}`}, func() error { _, err := c.Info(ctx, "sbx1"); return err }, false, false},
		{"kill 204", reply{204, ``}, func() error { return c.Kill(ctx, "sbx1") }, false, true},
		{"kill 404 json", reply{404, `{"code":404,"message":"not found"}`}, func() error { return c.Kill(ctx, "sbx1") }, false, true},
		{"kill router 404", reply{404, "404 page not found"}, func() error { return c.Kill(ctx, "sbx1") }, false, false},
		{"kill 500", reply{500, `{"code":500,"message":"x"}`}, func() error { return c.Kill(ctx, "sbx1") }, false, false},
		{"timeout 204", reply{204, ``}, func() error { return c.SetTimeout(ctx, "sbx1", 90*time.Second) }, false, true},
		{"timeout 404", reply{404, `{"code":404,"message":"x"}`}, func() error { return c.SetTimeout(ctx, "sbx1", time.Second) }, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next = tt.reply
			err := tt.call()
			if got := errors.Is(err, core.ErrSandboxGone); got != tt.wantGone {
				t.Errorf("err = %v, gone = %v, want %v", err, got, tt.wantGone)
			}
			if got := err == nil; got != tt.wantNil {
				t.Errorf("err = %v, want nil = %v", err, tt.wantNil)
			}
		})
	}

	next = reply{204, ``}
	_ = c.SetTimeout(ctx, "sbx1", 1500*time.Millisecond)
	if last.Method != http.MethodPost || last.URL.Path != "/sandboxes/sbx1/timeout" || string(lastBody) != `{"timeout":2}` {
		t.Errorf("set timeout sent %s %s %s, want POST /sandboxes/sbx1/timeout {\"timeout\":2}", last.Method, last.URL.Path, lastBody)
	}
	_ = c.Kill(ctx, "sbx1")
	if last.Method != http.MethodDelete || last.URL.Path != "/sandboxes/sbx1" {
		t.Errorf("kill sent %s %s, want DELETE /sandboxes/sbx1", last.Method, last.URL.Path)
	}
	if err := c.Kill(ctx, "../x"); err == nil {
		t.Errorf("Kill(../x) = nil, want a validation error")
	}
}
