package sandboxhost

import (
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
)

func TestAPIAuth(t *testing.T) {
	srv := startHost(t, IsolationNone)
	tests := []struct {
		name, key  string
		wantStatus int
	}{
		{"missing key", "", http.StatusUnauthorized},
		{"wrong key", "nope", http.StatusUnauthorized},
		{"right key, any header case", testAPIKey, http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body e2bapi.Error
			status, hdr := apiCallKey(t, srv, tc.key, "GET", "/v2/sandboxes", nil, nil)
			if status != tc.wantStatus {
				t.Fatalf("status = %d, want %d", status, tc.wantStatus)
			}
			if tc.wantStatus == http.StatusUnauthorized {
				apiCallKey(t, srv, tc.key, "POST", "/sandboxes", map[string]any{}, &body)
				if body.Code != 401 || body.Message == "" {
					t.Errorf("401 body = %+v, want code 401 and a message", body)
				}
				if ct := hdr.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type = %q, want application/json", ct)
				}
			}
		})
	}
	if n := len(srv.Host.list()); n != 0 {
		t.Errorf("unauthenticated create made %d sandboxes, want 0", n)
	}
}

func TestCreateGetKill(t *testing.T) {
	srv := startHost(t, IsolationNone)
	before := time.Now()
	sb := createSandbox(t, srv, map[string]any{"templateID": "tpl", "timeout": 120, "metadata": map[string]string{"k": "v"}})
	if len(sb.SandboxID) != 20 || !isLowerAlnum(sb.SandboxID) {
		t.Errorf("sandboxID = %q, want 20 lowercase alphanumerics", sb.SandboxID)
	}
	if sb.EnvdAccessToken == "" || sb.EnvdVersion != DefaultEnvdVersion || sb.TemplateID != "tpl" || sb.Domain != nil {
		t.Errorf("create reply = %+v, want token, envdVersion %s, templateID tpl, domain null", sb, DefaultEnvdVersion)
	}
	var d e2bapi.SandboxDetail
	if status, _ := apiCall(t, srv, "GET", "/sandboxes/"+sb.SandboxID, nil, &d); status != 200 {
		t.Fatalf("get status = %d, want 200", status)
	}
	if d.SandboxID != sb.SandboxID || d.State != "running" || d.Metadata["k"] != "v" || d.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("detail = %+v", d)
	}
	if left := d.EndAt.Sub(before); left < 119*time.Second || left > 125*time.Second {
		t.Errorf("endAt - now = %v, want ~120s", left)
	}
	// Reads never extend life.
	var d2 e2bapi.SandboxDetail
	apiCall(t, srv, "GET", "/sandboxes/"+sb.SandboxID, nil, &d2)
	apiCall(t, srv, "GET", "/v2/sandboxes", nil, nil)
	if !d2.EndAt.Equal(d.EndAt) {
		t.Errorf("endAt moved from %v to %v after reads", d.EndAt, d2.EndAt)
	}
	// Connect never shortens, only extends.
	var c e2bapi.Sandbox
	if status, _ := apiCall(t, srv, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 10}, &c); status != 200 || c.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("connect: status %d reply %+v", status, c)
	}
	apiCall(t, srv, "GET", "/sandboxes/"+sb.SandboxID, nil, &d2)
	if !d2.EndAt.Equal(d.EndAt) {
		t.Errorf("connect with a shorter timeout moved endAt from %v to %v", d.EndAt, d2.EndAt)
	}
	apiCall(t, srv, "POST", "/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 600}, nil)
	apiCall(t, srv, "GET", "/sandboxes/"+sb.SandboxID, nil, &d2)
	if !d2.EndAt.After(d.EndAt) {
		t.Errorf("connect with a longer timeout left endAt at %v", d2.EndAt)
	}

	if status, _ := apiCall(t, srv, "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil); status != http.StatusNoContent {
		t.Fatalf("delete status = %d, want 204", status)
	}
	for _, tc := range []struct{ method, path string }{
		{"GET", "/sandboxes/" + sb.SandboxID},
		{"DELETE", "/sandboxes/" + sb.SandboxID},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout"},
		{"POST", "/v2/sandboxes/" + sb.SandboxID + "/connect"},
	} {
		var e e2bapi.Error
		status, _ := apiCall(t, srv, tc.method, tc.path, map[string]any{"timeout": 5}, &e)
		if status != 404 || e.Code != 404 {
			t.Errorf("%s %s after kill: status %d body %+v, want 404 with code 404", tc.method, tc.path, status, e)
		}
	}
}

func TestCreateValidation(t *testing.T) {
	srv := startHost(t, IsolationNone)
	for _, body := range []any{
		map[string]any{"timeout": -1},
		map[string]any{"timeout": 0},
		map[string]any{"timeout": 10 * 24 * 3600},
		map[string]any{"metadata": map[string]any{"n": 1}},
		map[string]any{"envVars": map[string]string{"A=B": "x"}},
		"not an object",
	} {
		var e e2bapi.Error
		if status, _ := apiCall(t, srv, "POST", "/v2/sandboxes", body, &e); status != 400 || e.Code != 400 {
			t.Errorf("create %v: status %d body %+v, want 400", body, status, e)
		}
	}
	if n := len(srv.Host.list()); n != 0 {
		t.Errorf("invalid creates made %d sandboxes, want 0", n)
	}
	// No template and no timeout: "base" and the default 300 s.
	sb := createSandbox(t, srv, nil)
	var d e2bapi.SandboxDetail
	apiCall(t, srv, "GET", "/sandboxes/"+sb.SandboxID, nil, &d)
	if d.TemplateID != "base" {
		t.Errorf("templateID = %q, want base", d.TemplateID)
	}
	if life := d.EndAt.Sub(d.StartedAt); life != 300*time.Second {
		t.Errorf("life = %v, want 300s", life)
	}
}

func TestListMetadataFilterAndPaging(t *testing.T) {
	srv := startHost(t, IsolationNone)
	var want []string
	for i := range 7 {
		md := map[string]string{"group": "a b&c=d", "i": string(rune('0' + i))}
		if i%3 == 2 {
			md["group"] = "other"
		}
		sb := createSandbox(t, srv, map[string]any{"metadata": md})
		if md["group"] != "other" {
			want = append(want, sb.SandboxID)
		}
	}
	// The SDK double-encodes: metadata=<urlencoded "k=v" with k, v escaped>.
	inner := url.Values{"group": {"a b&c=d"}}.Encode()
	var got []string
	pages := 0
	token := ""
	for {
		q := url.Values{"metadata": {inner}, "state": {"running,paused"}, "limit": {"2"}}
		if token != "" {
			q.Set("nextToken", token)
		}
		var page []e2bapi.ListedSandbox
		status, hdr := apiCall(t, srv, "GET", "/v2/sandboxes?"+q.Encode(), nil, &page)
		if status != 200 {
			t.Fatalf("list status = %d", status)
		}
		if len(page) > 2 {
			t.Fatalf("page of %d, want at most 2", len(page))
		}
		for _, s := range page {
			if s.State != "running" || s.Metadata["group"] != "a b&c=d" {
				t.Errorf("listed %+v does not match the filter", s)
			}
			got = append(got, s.SandboxID)
		}
		pages++
		token = hdr.Get(headerNextToken)
		if token == "" {
			break
		}
		if pages > 10 {
			t.Fatal("paging does not end")
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v", got, want)
	}
	if pages != 3 {
		t.Errorf("pages = %d, want 3 for 5 items at limit 2", pages)
	}

	tests := []struct {
		name, query string
		want        int
	}{
		{"no filter", "", 7},
		{"paused only", "state=paused", 0},
		{"running only", "state=running", 7},
		{"two pairs", "metadata=" + url.QueryEscape("group=other&i=2"), 1},
		{"unknown value", "metadata=" + url.QueryEscape("group=zzz"), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var page []e2bapi.ListedSandbox
			if status, _ := apiCall(t, srv, "GET", "/v2/sandboxes?"+tc.query, nil, &page); status != 200 {
				t.Fatalf("status = %d", status)
			}
			if len(page) != tc.want {
				t.Errorf("v2 got %d sandboxes, want %d", len(page), tc.want)
			}
			if !slices.Contains([]string{"state=paused", "state=running"}, tc.query) {
				var v1 []e2bapi.ListedSandbox
				apiCall(t, srv, "GET", "/sandboxes?"+tc.query, nil, &v1)
				if len(v1) != tc.want {
					t.Errorf("v1 got %d sandboxes, want %d", len(v1), tc.want)
				}
			}
		})
	}
	for _, q := range []string{"limit=0", "limit=101", "limit=x", "nextToken=not*base64", "state=frozen"} {
		if status, _ := apiCall(t, srv, "GET", "/v2/sandboxes?"+q, nil, nil); status != 400 {
			t.Errorf("list ?%s: status %d, want 400", q, status)
		}
	}
}

func isLowerAlnum(s string) bool {
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return s != ""
}

func TestRandomID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := randomID(20)
		if len(id) != 20 || !isLowerAlnum(id) || seen[id] {
			t.Fatalf("randomID = %q (dup %v)", id, seen[id])
		}
		seen[id] = true
	}
}

func TestInjectedClock(t *testing.T) {
	base := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	h, err := New(Options{APIKey: "k", RootDir: t.TempDir(), Isolation: IsolationNone, Now: func() time.Time { return base }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	sb, err := h.create(createSpec{templateID: "base", timeout: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := h.listed(sb)
	if !got.StartedAt.Equal(base) || !got.EndAt.Equal(base.Add(90*time.Second)) {
		t.Errorf("startedAt %v endAt %v, want %v and +90s", got.StartedAt, got.EndAt, base)
	}
}

func TestNewValidation(t *testing.T) {
	for _, opts := range []Options{
		{RootDir: t.TempDir()},
		{APIKey: "k"},
		{APIKey: "k", RootDir: t.TempDir(), Isolation: "docker"},
	} {
		if _, err := New(opts); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", opts)
		}
	}
	if _, err := listenLoopback("0.0.0.0:0"); err == nil {
		t.Error("listen on 0.0.0.0 allowed, want loopback only")
	}
}
