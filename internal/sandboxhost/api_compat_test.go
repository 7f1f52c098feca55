package sandboxhost

import (
	"net/http"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
)

// TestListOrderStartedAfterTemplate checks list as E2B does it: newest
// first by default, order=asc oldest first (paging either way), and the
// startedAfter and template filters.
func TestListOrderStartedAfterTemplate(t *testing.T) {
	clock := newTestClock()
	srv := startHostWith(t, Options{Isolation: IsolationNone, Now: clock.now})
	var ids []string // in start order
	var starts []time.Time
	for i := range 4 {
		tmpl := "base"
		if i%2 == 1 {
			tmpl = "other"
		}
		starts = append(starts, clock.now())
		ids = append(ids, createSandbox(t, srv, map[string]any{"templateID": tmpl}).SandboxID)
		clock.advance(time.Minute)
	}
	reversed := slices.Clone(ids)
	slices.Reverse(reversed)
	pageAll := func(query string) []string {
		var got []string
		token := ""
		for range 10 {
			q, _ := url.ParseQuery(query)
			q.Set("limit", "1")
			if token != "" {
				q.Set("nextToken", token)
			}
			var page []e2bapi.ListedSandbox
			status, hdr := apiCall(t, srv, "GET", "/v2/sandboxes?"+q.Encode(), nil, &page)
			if status != http.StatusOK {
				t.Fatalf("list ?%s: status %d", q.Encode(), status)
			}
			for _, s := range page {
				got = append(got, s.SandboxID)
			}
			if token = hdr.Get(headerNextToken); token == "" {
				return got
			}
		}
		t.Fatalf("list ?%s: paging does not end", query)
		return nil
	}
	tests := []struct {
		query string
		want  []string
	}{
		{"", reversed},
		{"order=desc", reversed},
		{"order=asc", ids},
		{"order=asc&startedAfter=" + url.QueryEscape(starts[2].Format(time.RFC3339)), ids[2:]},
		{"startedAfter=" + url.QueryEscape(starts[1].Format(time.RFC3339Nano)), []string{ids[3], ids[2], ids[1]}},
		{"order=asc&template=other", []string{ids[1], ids[3]}},
		{"template=base", []string{ids[2], ids[0]}},
	}
	for _, tc := range tests {
		if got := pageAll(tc.query); !slices.Equal(got, tc.want) {
			t.Errorf("list ?%s = %v, want %v", tc.query, got, tc.want)
		}
	}
	for _, q := range []string{"order=up", "startedAfter=yesterday"} {
		if status, _ := apiCall(t, srv, "GET", "/v2/sandboxes?"+q, nil, nil); status != http.StatusBadRequest {
			t.Errorf("list ?%s: status %d, want 400", q, status)
		}
	}
}

// TestMetrics checks GET /sandboxes/{id}/metrics: E2B's shape, disk use
// that grows with the sandbox's files, memory from its cgroup where it
// has one, and 404 code 404 for an unknown id.
func TestMetrics(t *testing.T) {
	mode := IsolationNone
	if _, err := exec.LookPath("bwrap"); err == nil {
		mode = IsolationBwrap
	}
	srv := startHost(t, mode)
	sb := createSandbox(t, srv, nil)
	c := newEnvd(srv, sb)
	if status, body := c.files(t, "POST", "path=big.bin", strings.NewReader(strings.Repeat("x", 200<<10)), nil); status != 200 {
		t.Fatalf("upload: %d %s", status, body)
	}
	var ms []e2bapi.SandboxMetric
	if status, _ := apiCall(t, srv, "GET", "/sandboxes/"+sb.SandboxID+"/metrics", nil, &ms); status != http.StatusOK || len(ms) != 1 {
		t.Fatalf("metrics: status %d, %d items; want 200 with one", status, len(ms))
	}
	m := ms[0]
	if m.CPUCount <= 0 || m.MemTotal <= 0 || m.DiskTotal <= 0 || m.Timestamp.IsZero() || m.TimestampUnix == 0 {
		t.Errorf("metric %+v: want positive totals and a timestamp", m)
	}
	if m.DiskUsed < 200<<10 {
		t.Errorf("diskUsed = %d, want at least the 200 KiB written", m.DiskUsed)
	}
	if srv.Host.mustGet(t, sb.SandboxID).cgroup != nil && m.MemUsed <= 0 {
		t.Errorf("memUsed = %d for a sandbox with a cgroup, want > 0", m.MemUsed)
	}
	var e e2bapi.Error
	if status, _ := apiCall(t, srv, "GET", "/sandboxes/nosuchsandbox/metrics", nil, &e); status != http.StatusNotFound || e.Code != 404 {
		t.Errorf("metrics of an unknown id: %d %+v, want 404 code 404", status, e)
	}
}

// TestAutoPause checks that a sandbox created with autoPause is paused,
// not killed, when its timeout passes, and that connect resumes it.
func TestAutoPause(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, map[string]any{"timeout": 1, "autoPause": true})
	waitFor(t, 30*time.Second, "the timeout to pause the sandbox", func() bool {
		var d e2bapi.SandboxDetail
		status, _ := apiCall(t, srv, "GET", "/sandboxes/"+sb.SandboxID, nil, &d)
		if status != http.StatusOK {
			t.Fatalf("sandbox gone at its timeout (status %d), want it paused", status)
		}
		return d.State == "paused"
	})
	if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+sb.SandboxID+"/connect", map[string]any{}, nil); status != http.StatusCreated {
		t.Fatalf("connect of the auto-paused sandbox: %d, want 201", status)
	}
	if res := newEnvd(srv, sb).run(t, "echo back", nil); res.stdout != "back\n" {
		t.Errorf("command after the resume: %q", res.stdout)
	}
	if status, _ := apiCall(t, srv, "POST", "/sandboxes", map[string]any{"autoPause": true, "autoPauseMemory": false}, nil); status != http.StatusBadRequest {
		t.Errorf("create with a files-only auto-pause: %d, want 400", status)
	}
}
