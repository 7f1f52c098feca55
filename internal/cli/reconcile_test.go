package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// fakeFunction is a reconcile function's invoke endpoint (as the Lambda
// Runtime Interface Emulator serves it).
func fakeFunction(t *testing.T, reply string) (*httptest.Server, *[]map[string]any) {
	t.Helper()
	var events []map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev map[string]any
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Errorf("event is not JSON: %s", body)
		}
		events = append(events, ev)
		_, _ = io.WriteString(w, reply)
	}))
	t.Cleanup(srv.Close)
	return srv, &events
}

func runSbx(t *testing.T, dir string, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	a := &App{Stdout: &out, Stderr: &errb, Getenv: envOf(env), Dir: dir}
	return a.Run(context.Background(), args), out.String(), errb.String()
}

func TestReconcileCommand(t *testing.T) {
	srv, events := fakeFunction(t, `{"discovered":12,"adopted":1,"killed":2,"pages":2,"inventory_complete":true,"duration_ns":1500000}`)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, ".run"), 0o755); err != nil {
		t.Fatal(err)
	}
	stack := `{"api_url":"http://127.0.0.1:1","tokens":{"acme":"tok"},"functions":{"reconcile":"` + srv.URL + `/2015-03-31/functions/function/invocations"}}`
	if err := os.WriteFile(filepath.Join(dir, ".run", "stack.json"), []byte(stack), 0o644); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runSbx(t, dir, nil, "reconcile")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"reconciled in 2ms:", "12 discovered in 2 pages", "1 adopted", "2 killed", "inventory walk complete"} {
		if !strings.Contains(out, want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
	if len(*events) != 1 || (*events)[0]["detail-type"] != "Scheduled Event" {
		t.Errorf("events = %v, want one scheduled event", *events)
	}

	code, out, _ = runSbx(t, t.TempDir(), map[string]string{EnvReconcileURL: srv.URL}, "--json", "reconcile")
	var st core.ReconcileStats
	if code != ExitOK || json.Unmarshal([]byte(out), &st) != nil || st.Discovered != 12 {
		t.Errorf("--json: exit %d, output %q", code, out)
	}
}

// TestReconcileCommandReadsCoreStats feeds the command what the function
// sends (core.ReconcileStats marshalled) and checks every field it prints.
func TestReconcileCommandReadsCoreStats(t *testing.T) {
	reply, err := json.Marshal(core.ReconcileStats{
		Discovered: 9, Adopted: 1, Duplicates: 2, Orphans: 3, Deferred: 4, Killed: 5, Dead: 6, Expired: 7,
		Paused: 13, PausedExpired: 14, PausesFinished: 15, ReleasesTakenOver: 12, TombstonesRetried: 8, ReservationsSettled: 10, LedgerRepaired: -2, Pages: 3, BudgetExhausted: true,
		Errors: 11, Duration: 1250 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := fakeFunction(t, string(reply))
	code, out, errOut := runSbx(t, t.TempDir(), map[string]string{EnvReconcileURL: srv.URL}, "reconcile")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "reconciled in 1.25s: 9 discovered in 3 pages, 1 adopted, 2 duplicates, 3 orphans, 4 deferred, 5 killed, 6 dead, 7 expired, 13 paused, 14 paused expired, 15 pauses finished, 12 releases taken over, 8 tombstones retried, 10 reservations settled, ledger -2, 11 errors; inventory walk continues next pass (budget exhausted)\n"
	if out != want {
		t.Errorf("output = %q, want %q", out, want)
	}
}

func TestReconcileCommandErrors(t *testing.T) {
	srv, _ := fakeFunction(t, `{"errorMessage":"reconcile: list provider inventory: outage","errorType":"wrapError"}`)
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"function error", map[string]string{EnvReconcileURL: srv.URL}, "outage"},
		{"no function", nil, EnvReconcileURL},
	}
	for _, tt := range tests {
		code, _, errOut := runSbx(t, t.TempDir(), tt.env, "reconcile")
		if code != ExitError || !strings.Contains(errOut, tt.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 mentioning %q", tt.name, code, errOut, tt.want)
		}
	}
}
