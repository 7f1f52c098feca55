package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/devstack"
)

// deliveredEvent is a line of the stack's events file: an event as
// EventBridge delivers it.
type deliveredEvent struct {
	DetailType string    `json:"detail-type"`
	Source     string    `json:"source"`
	Time       time.Time `json:"time"`
	Detail     struct {
		Kind           string    `json:"kind"`
		Deployment     string    `json:"deployment"`
		Tenant         string    `json:"tenant"`
		User           string    `json:"user_id"`
		Thread         string    `json:"thread_id"`
		SandboxID      string    `json:"sandbox_id"`
		Backend        string    `json:"backend"`
		From           string    `json:"from_state"`
		To             string    `json:"to_state"`
		Reason         string    `json:"reason"`
		Time           time.Time `json:"time"`
		RunningSeconds *float64  `json:"running_seconds"`
		PausedSeconds  *float64  `json:"paused_seconds"`
	} `json:"detail"`
}

// stackEvents reads the stack's events file (.run/events.jsonl).
func stackEvents(t *testing.T, s *devstack.Stack) []deliveredEvent {
	t.Helper()
	if filepath.Base(s.Info.Events.File) != devstack.EventsFile || filepath.Dir(s.Info.Events.File) != filepath.Dir(s.StackFile) {
		t.Errorf("events file %s, want %s next to %s", s.Info.Events.File, devstack.EventsFile, s.StackFile)
	}
	b, err := os.ReadFile(s.Info.Events.File)
	if err != nil {
		t.Fatalf("events file: %v", err)
	}
	var out []deliveredEvent
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var ev deliveredEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("events file line %q: %v", sc.Bytes(), err)
		}
		out = append(out, ev)
	}
	return out
}

// TestLifecycleEvents: a thread's create, release, reclaim and release are
// published to EventBridge, in order, with the thread, the sandbox and the
// transition (make run records them in .run/events.jsonl); the usage of
// the sandbox is metered under its tenant's dimension.
func TestLifecycleEvents(t *testing.T) {
	t.Parallel()
	s := startStack(t, "e2b")
	a := newAPI(t, s)

	r := a.acquire(tokenA, "u-ev", "t-ev")
	want(t, "acquire", r, 200)
	id := str(r.body, "sandbox_id")
	want(t, "release", a.do("POST", "/v1/sandboxes/"+id+"/release", tokenA, ""), 200)
	r = a.acquire(tokenA, "u-ev", "t-ev")
	want(t, "reclaim", r, 200)
	if str(r.body, "source") != "reclaimed" || str(r.body, "sandbox_id") != id {
		t.Fatalf("second acquire: %s, want %s reclaimed", r.raw, id)
	}
	want(t, "release again", a.do("POST", "/v1/sandboxes/"+id+"/release", tokenA, ""), 200)

	var got []string
	var last time.Time
	for _, ev := range stackEvents(t, s) {
		d := ev.Detail
		if d.SandboxID != id {
			continue
		}
		got = append(got, fmt.Sprintf("%s %s %s->%s", ev.DetailType, d.Kind, d.From, d.To))
		if ev.Source != "sandbox-broker" || d.Tenant != tenantA || d.User != "u-ev" || d.Thread != "t-ev" ||
			d.Backend != "e2b" || d.Deployment != "default" {
			t.Errorf("event %+v: want source sandbox-broker, thread acme/u-ev/t-ev on e2b in deployment default", ev)
		}
		if d.RunningSeconds == nil || d.PausedSeconds == nil || d.Time.Before(last) || !ev.Time.Equal(d.Time.Truncate(time.Second)) {
			t.Errorf("event %+v: want running and paused seconds, times in order, the envelope's time the event's", ev)
		}
		last = d.Time
	}
	wantEvents := []string{
		"sandbox.created created creating->active",
		"sandbox.released released active->warm",
		"sandbox.reclaimed reclaimed warm->active",
		"sandbox.released released active->warm",
	}
	if strings.Join(got, "\n") != strings.Join(wantEvents, "\n") {
		t.Errorf("events of %s:\n%s\nwant:\n%s", id, strings.Join(got, "\n"), strings.Join(wantEvents, "\n"))
	}
	// Two intervals per release: the active one its claim ends, and the
	// releasing one its park ends.
	if got := emfTenant(t, s, "release", "SandboxRunningSeconds", tenantA); len(got) != 4 {
		t.Errorf("release: SandboxRunningSeconds of %s = %v, want two intervals per release", tenantA, got)
	}
}
