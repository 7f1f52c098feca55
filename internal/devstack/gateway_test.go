package devstack

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

// fakeRIE is an emulator stand-in: it records invocation payloads and
// answers with reply(payload).
type fakeRIE struct {
	mu     sync.Mutex
	events []events.APIGatewayV2HTTPRequest
	reply  func(ev events.APIGatewayV2HTTPRequest) (int, string)
}

func (f *fakeRIE) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != InvokePath || r.Method != "POST" {
		http.Error(w, "wrong path", 404)
		return
	}
	b, _ := io.ReadAll(r.Body)
	var ev events.APIGatewayV2HTTPRequest
	if err := json.Unmarshal(b, &ev); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	f.mu.Lock()
	f.events = append(f.events, ev)
	f.mu.Unlock()
	status, body := f.reply(ev)
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

func fakeFunction(t *testing.T, name string, rie *fakeRIE) *lambdaFn {
	t.Helper()
	srv := httptest.NewServer(rie)
	t.Cleanup(srv.Close)
	inst := &rieInstance{url: srv.URL + InvokePath, child: &child{name: name, cmd: &exec.Cmd{}, exited: make(chan struct{})}}
	lf := &lambdaFn{fn: Function{Name: name, Timeout: 5 * time.Second}, instances: []*rieInstance{inst}, free: make(chan *rieInstance, 1), client: srv.Client()}
	lf.free <- inst
	return lf
}

func newGateway(t *testing.T, rie *fakeRIE) *httptest.Server {
	t.Helper()
	app := App{Routes: []Route{
		{"POST", "/v1/sandboxes/acquire", "acquire", ""},
		{"GET", "/v1/sandboxes/{id}", "acquire", "Authorization"},
		{"POST", "/v1/sandboxes/{id}/release", "release", ""},
		{"POST", "/e2b/v2/sandboxes/{id}/connect", "acquire", "X-API-Key"},
	}}
	fn := fakeFunction(t, "acquire", rie)
	rel := fakeFunction(t, "release", rie)
	gw := &gateway{app: app, fns: map[string]*lambdaFn{"acquire": fn, "release": rel},
		tokens: map[string]string{"tok-a": "acme"}, log: slog.New(slog.DiscardHandler), apiHost: "local"}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return srv
}

func call(t *testing.T, method, url, token string, body []byte, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(string(body)))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestGatewayBuildsPayloadV2Event(t *testing.T) {
	rie := &fakeRIE{reply: func(ev events.APIGatewayV2HTTPRequest) (int, string) {
		return 200, `{"statusCode":201,"headers":{"Content-Type":"application/json","Retry-After":"3"},"multiValueHeaders":{"X-Multi":["a","b"]},"body":"{\"ok\":true}","cookies":["c=1"]}`
	}}
	srv := newGateway(t, rie)
	resp, body := call(t, "POST", srv.URL+"/v1/sandboxes/sb%2Fx/release?x=1&x=2", "tok-a", []byte(`{"a":1}`), map[string]string{"X-Custom": "v"})
	if resp.StatusCode != 201 || body != `{"ok":true}` || resp.Header.Get("Retry-After") != "3" ||
		!reflect.DeepEqual(resp.Header.Values("X-Multi"), []string{"a", "b"}) || resp.Header.Get("Set-Cookie") != "c=1" {
		t.Fatalf("response %d %v %q", resp.StatusCode, resp.Header, body)
	}
	if len(rie.events) != 1 {
		t.Fatalf("invocations = %d, want 1", len(rie.events))
	}
	ev := rie.events[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"version", ev.Version, "2.0"},
		{"routeKey", ev.RouteKey, "POST /v1/sandboxes/{id}/release"},
		{"requestContext.routeKey", ev.RequestContext.RouteKey, "POST /v1/sandboxes/{id}/release"},
		{"rawPath", ev.RawPath, "/v1/sandboxes/sb%2Fx/release"},
		{"rawQueryString", ev.RawQueryString, "x=1&x=2"},
		{"queryStringParameters", ev.QueryStringParameters, map[string]string{"x": "1,2"}},
		{"pathParameters", ev.PathParameters, map[string]string{"id": "sb/x"}},
		{"method", ev.RequestContext.HTTP.Method, "POST"},
		{"header", ev.Headers["x-custom"], "v"},
		{"body", ev.Body, `{"a":1}`},
		{"base64", ev.IsBase64Encoded, false},
		{"tenant", ev.RequestContext.Authorizer.Lambda["tenant"], "acme"},
		{"requestId set", ev.RequestContext.RequestID != "", true},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.name, c.got, c.want)
		}
	}
}

func TestGatewayBinaryBodiesAreBase64(t *testing.T) {
	rie := &fakeRIE{reply: func(ev events.APIGatewayV2HTTPRequest) (int, string) {
		return 200, `{"statusCode":200,"body":"` + base64.StdEncoding.EncodeToString([]byte{0xff, 0x00}) + `","isBase64Encoded":true}`
	}}
	srv := newGateway(t, rie)
	resp, body := call(t, "POST", srv.URL+"/v1/sandboxes/acquire", "tok-a", []byte{0xff, 0xfe}, nil)
	if resp.StatusCode != 200 || body != string([]byte{0xff, 0x00}) {
		t.Fatalf("response %d %q", resp.StatusCode, body)
	}
	ev := rie.events[0]
	if !ev.IsBase64Encoded || ev.Body != base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe}) {
		t.Errorf("event body %q base64 %v", ev.Body, ev.IsBase64Encoded)
	}
}

func TestGatewayRefusalsNeverInvoke(t *testing.T) {
	rie := &fakeRIE{reply: func(events.APIGatewayV2HTTPRequest) (int, string) { return 200, `{"statusCode":200,"body":"{}"}` }}
	srv := newGateway(t, rie)
	tests := []struct {
		name, method, path, token string
		want                      int
	}{
		{"unknown route", "GET", "/v2/x", "tok-a", 404},
		{"wrong method", "DELETE", "/v1/sandboxes/abc", "tok-a", 405},
		{"no token", "GET", "/v1/sandboxes/abc", "", 401},
		{"bad token", "GET", "/v1/sandboxes/abc", "nope", 401},
	}
	for _, tt := range tests {
		resp, body := call(t, tt.method, srv.URL+tt.path, tt.token, nil, nil)
		if resp.StatusCode != tt.want || !strings.Contains(body, `"message"`) {
			t.Errorf("%s: %d %q, want %d with a message", tt.name, resp.StatusCode, body, tt.want)
		}
	}
	// Basic auth is not a bearer token.
	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes/abc", nil)
	req.SetBasicAuth("tok-a", "")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Errorf("basic auth: %v %v, want 401", resp.StatusCode, err)
	}
	if len(rie.events) != 0 {
		t.Errorf("refused requests invoked the function %d times", len(rie.events))
	}
}

// TestGatewayTokenHeader: each route reads the token from its authorizer's
// identity source: Authorization (with "Bearer ") by default, X-API-Key
// (bare or with "Bearer ") where the template says so, and no other.
func TestGatewayTokenHeader(t *testing.T) {
	rie := &fakeRIE{reply: func(events.APIGatewayV2HTTPRequest) (int, string) { return 200, `{"statusCode":200,"body":"{}"}` }}
	srv := newGateway(t, rie)
	tests := []struct {
		name, path string
		hdr        map[string]string
		want       int
	}{
		{"bearer on a v1 route", "/v1/sandboxes/abc", map[string]string{"Authorization": "Bearer tok-a"}, 200},
		{"bare Authorization", "/v1/sandboxes/abc", map[string]string{"Authorization": "tok-a"}, 401},
		{"X-API-Key on a v1 route", "/v1/sandboxes/abc", map[string]string{"X-API-Key": "tok-a"}, 401},
		{"X-API-Key on an e2b route", "/e2b/v2/sandboxes/abc/connect", map[string]string{"X-API-Key": "tok-a"}, 200},
		{"X-API-Key with Bearer", "/e2b/v2/sandboxes/abc/connect", map[string]string{"X-API-Key": "Bearer tok-a"}, 200},
		{"wrong X-API-Key", "/e2b/v2/sandboxes/abc/connect", map[string]string{"X-API-Key": "nope"}, 401},
		{"bearer on an e2b route", "/e2b/v2/sandboxes/abc/connect", map[string]string{"Authorization": "Bearer tok-a"}, 401},
	}
	for _, tt := range tests {
		method := "GET"
		if strings.HasPrefix(tt.path, "/e2b") {
			method = "POST"
		}
		resp, body := call(t, method, srv.URL+tt.path, "", nil, tt.hdr)
		if resp.StatusCode != tt.want {
			t.Errorf("%s: %d %q, want %d", tt.name, resp.StatusCode, body, tt.want)
		}
	}
	for _, ev := range rie.events {
		if got := ev.RequestContext.Authorizer.Lambda["tenant"]; got != "acme" {
			t.Errorf("%s: tenant %v, want acme", ev.RawPath, got)
		}
	}
}

func TestGatewayFunctionFailures(t *testing.T) {
	tests := []struct {
		name         string
		status       int
		body         string
		wantStatus   int
		wantContains string
	}{
		{"handler error", 200, `{"errorMessage":"boom","errorType":"errorString"}`, 500, `{"message":"Internal Server Error"}`},
		{"emulator timeout", 504, ``, 500, `{"message":"Internal Server Error"}`},
		{"function timeout reported as text", 200, `2026-12-01T02:00:00Z 1b2c Task timed out after 29.00 seconds`, 500, `{"message":"Internal Server Error"}`},
		{"init failure", 502, `{"errorMessage":"exit status 1"}`, 500, "Internal Server Error"},
		{"no statusCode", 200, `{"hello":"world"}`, 200, `{"hello":"world"}`},
		{"bad status", 200, `{"statusCode":42,"body":""}`, 500, "Internal Server Error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rie := &fakeRIE{reply: func(events.APIGatewayV2HTTPRequest) (int, string) { return tt.status, tt.body }}
			srv := newGateway(t, rie)
			resp, body := call(t, "GET", srv.URL+"/v1/sandboxes/abc", "tok-a", nil, nil)
			if resp.StatusCode != tt.wantStatus || !strings.Contains(body, tt.wantContains) {
				t.Errorf("got %d %q, want %d containing %q", resp.StatusCode, body, tt.wantStatus, tt.wantContains)
			}
		})
	}
}

func TestParseTokens(t *testing.T) {
	tests := []struct {
		in      string
		want    map[string]string
		wantErr bool
	}{
		{"dev:dev-token", map[string]string{"dev-token": "dev"}, false},
		{" a:t1 , b:t2 ,", map[string]string{"t1": "a", "t2": "b"}, false},
		{"a:t1,a:t2", map[string]string{"t1": "a", "t2": "a"}, false},
		{"a:tok:with:colons", map[string]string{"tok:with:colons": "a"}, false},
		{"", nil, true},
		{"notoken", nil, true},
		{"a:", nil, true},
		{"a b:t", nil, true},
		{"a:t,b:t", nil, true},
	}
	for _, tt := range tests {
		got, err := ParseTokens(tt.in)
		if (err != nil) != tt.wantErr || (!tt.wantErr && !reflect.DeepEqual(got, tt.want)) {
			t.Errorf("ParseTokens(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "BROKER_DEV_TOKENS") {
			t.Errorf("error %q does not name BROKER_DEV_TOKENS", err)
		}
	}
}

func TestPassThroughEnv(t *testing.T) {
	got := PassThroughEnv([]string{"SANDBOX_REPLICAS=1", "HOME=/root", "E2B_API_KEY=secret", "LOG_LEVEL=debug", "AWS_PROFILE=x", "SANDBOX_TEMPLATE=py",
		"SYNC_MAX_FILES=5", "RECONCILE_MAX_ITEMS=9", "BROKER_ADMIN_TENANTS=ops", "BROKER_ADDR=127.0.0.1:1", "PROVISIONER_URL=http://x", "TABLE_NAME=t"})
	want := []string{"BROKER_ADMIN_TENANTS=ops", "LOG_LEVEL=debug", "RECONCILE_MAX_ITEMS=9", "SANDBOX_REPLICAS=1", "SANDBOX_TEMPLATE=py", "SYNC_MAX_FILES=5"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PassThroughEnv = %v, want %v", got, want)
	}
}

// endlessReader yields zeros forever and counts what was read.
type endlessReader struct{ n int64 }

func (r *endlessReader) Read(p []byte) (int, error) {
	clear(p)
	r.n += int64(len(p))
	return len(p), nil
}

// TestGatewayRefusesLargeBodiesUnread: a body over the API's limit gets 413
// with the broker's error code before any function is invoked, and is not
// read whole (declared too large: not read at all; undeclared length: read
// at most one buffer past the limit). A body at the limit is passed on.
func TestGatewayRefusesLargeBodiesUnread(t *testing.T) {
	rie := &fakeRIE{reply: func(events.APIGatewayV2HTTPRequest) (int, string) { return 200, `{"statusCode":200,"body":"{}"}` }}
	app := App{Routes: []Route{{"POST", "/v1/sandboxes/acquire", "acquire", ""}}}
	gw := &gateway{app: app, fns: map[string]*lambdaFn{"acquire": fakeFunction(t, "acquire", rie)},
		tokens: map[string]string{"tok-a": "acme"}, log: slog.New(slog.DiscardHandler), apiHost: "local"}
	const limit = 16 << 10
	tests := []struct {
		name        string
		size        int64 // -1: endless, no Content-Length
		declared    bool
		wantStatus  int
		maxRead     int64
		wantInvoked int
	}{
		{"at the limit", limit, true, 200, limit + 1, 1},
		{"declared one byte over", limit + 1, true, 413, 0, 0},
		{"declared 8 MiB", 8 << 20, true, 413, 0, 0},
		{"undeclared endless", -1, false, 413, limit + 64<<10, 0},
		{"undeclared one byte over", limit + 1, false, 413, limit + 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rie.mu.Lock()
			rie.events = nil
			rie.mu.Unlock()
			src := &endlessReader{}
			var body io.Reader = src
			if tt.size >= 0 {
				body = io.LimitReader(src, tt.size)
			}
			req := httptest.NewRequest("POST", "/v1/sandboxes/acquire", body)
			req.Header.Set("Authorization", "Bearer tok-a")
			req.ContentLength = -1
			if tt.declared {
				req.ContentLength = tt.size
			}
			w := httptest.NewRecorder()
			gw.ServeHTTP(w, req)
			if w.Code != tt.wantStatus {
				t.Fatalf("status = %d, want %d (body %s)", w.Code, tt.wantStatus, w.Body)
			}
			if src.n > tt.maxRead {
				t.Errorf("gateway read %d bytes of the body, want at most %d", src.n, tt.maxRead)
			}
			if got := len(rie.events); got != tt.wantInvoked {
				t.Errorf("function invoked %d times, want %d", got, tt.wantInvoked)
			}
			if tt.wantStatus == 413 {
				var e struct {
					Error struct{ Code, Reason string }
				}
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code != "REQUEST_TOO_LARGE" {
					t.Errorf("body %s: code %q (%v), want REQUEST_TOO_LARGE", w.Body, e.Error.Code, err)
				}
			}
		})
	}
}
