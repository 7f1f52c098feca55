package e2b

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// TestMetrics: Metrics reads GET /sandboxes/{id}/metrics with the asked
// interval in Unix seconds and the API key; E2B's not-found is
// ErrSandboxGone, a 5xx an ambiguous provider error.
func TestMetrics(t *testing.T) {
	var gotQuery, gotKey string
	status, body := http.StatusOK, `[{"timestamp":"2026-12-07T09:00:00Z","timestampUnix":1796634000,"cpuCount":2,"cpuUsedPct":7.5,"memUsed":1024,"memTotal":4096,"memCache":8,"diskUsed":16,"diskTotal":32}]`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/sandboxes/sb1/metrics" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusTeapot)
			return
		}
		gotQuery, gotKey = r.URL.RawQuery, r.Header.Get("X-API-Key")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	c := newTestClient(t, srv.URL, "", nil)
	ctx := context.Background()

	ms, err := c.Metrics(ctx, "sb1", time.Unix(100, 0), time.Unix(160, 0))
	want := core.SandboxMetric{Timestamp: time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC), CPUCount: 2, CPUUsedPct: 7.5, MemUsed: 1024,
		MemTotal: 4096, MemCache: 8, DiskUsed: 16, DiskTotal: 32}
	if err != nil || len(ms) != 1 || ms[0] != want {
		t.Fatalf("Metrics = %+v, %v; want [%+v]", ms, err, want)
	}
	if gotQuery != "end=160&start=100" || gotKey != testKey {
		t.Errorf("query %q, key %q; want end=160&start=100 and the API key", gotQuery, gotKey)
	}
	if _, err := c.Metrics(ctx, "sb1", time.Time{}, time.Time{}); err != nil || gotQuery != "" {
		t.Errorf("no interval: query %q, err %v; want none", gotQuery, err)
	}
	status, body = http.StatusNotFound, `{"code":404,"message":"sandbox not found"}`
	if _, err := c.Metrics(ctx, "sb1", time.Time{}, time.Time{}); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("404: %v, want ErrSandboxGone", err)
	}
	status, body = http.StatusBadGateway, `{"code":502,"message":"down"}`
	if _, err := c.Metrics(ctx, "sb1", time.Time{}, time.Time{}); !core.IsAmbiguous(err) {
		t.Errorf("502: %v, want an ambiguous error", err)
	}
	if c.Capabilities().Metrics == nil {
		t.Error("Capabilities declare no Metrics")
	}
}
