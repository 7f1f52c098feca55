package eventpub_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/eventpub"
	"github.com/sandbox-broker/sandbox-broker/internal/standin"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// delivered reads the events the bus wrote to file.
func delivered(t *testing.T, file string) []standin.Delivered {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []standin.Delivered
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var d standin.Delivered
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			t.Fatalf("bus line %s: %v", sc.Bytes(), err)
		}
		out = append(out, d)
	}
	return out
}

// bus is an EventBridge stand-in on loopback, with the SDK's client of
// it and a count of PutEvents calls.
type bus struct {
	*standin.EventBus
	file  string // what it delivered, one event a line
	calls atomic.Int32
	url   string
}

func newBus(t *testing.T) *bus {
	t.Helper()
	b := &bus{file: filepath.Join(t.TempDir(), "events.jsonl")}
	f, err := os.Create(b.file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	b.EventBus = standin.NewEventBus(f)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.calls.Add(1)
		b.EventBus.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

func (b *bus) publisher(name string) *eventpub.Publisher {
	return eventpub.New(standin.EventBridgeClient(b.url, standin.Region, 5*time.Second), name)
}

func event(kind core.EventKind, id string) core.Event {
	return core.Event{Kind: kind, Deployment: "prod", Tenant: "acme", User: "alice", Thread: "t1", SandboxID: id,
		Backend: "e2b", From: core.StateActive, To: core.StateWarm, Time: time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC),
		RunningSeconds: 42.5}
}

// TestPublishDeliversTheEvent: source, detail-type per kind, the event as
// detail, its time; nothing else.
func TestPublishDeliversTheEvent(t *testing.T) {
	b := newBus(t)
	ev := event(core.EventReleased, "sb1")
	if err := b.publisher("").Publish(context.Background(), ev); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got := delivered(t, b.file)
	if len(got) != 1 {
		t.Fatalf("delivered %d events, want 1", len(got))
	}
	d := got[0]
	if d.Source != eventpub.Source || d.DetailType != "sandbox.released" || !d.Time.Equal(ev.Time) {
		t.Errorf("delivered source %q detail-type %q time %s; want %q, sandbox.released, %s", d.Source, d.DetailType, d.Time, eventpub.Source, ev.Time)
	}
	var detail core.Event
	if err := json.Unmarshal(d.Detail, &detail); err != nil {
		t.Fatalf("detail %s: %v", d.Detail, err)
	}
	if detail != ev {
		t.Errorf("detail = %+v, want %+v", detail, ev)
	}
	for _, field := range []string{`"tenant":"acme"`, `"user_id":"alice"`, `"thread_id":"t1"`, `"sandbox_id":"sb1"`, `"backend":"e2b"`,
		`"from_state":"active"`, `"to_state":"warm"`, `"kind":"released"`, `"running_seconds":42.5`, `"paused_seconds":0`} {
		if !strings.Contains(string(d.Detail), field) {
			t.Errorf("detail %s lacks %s", d.Detail, field)
		}
	}
}

// TestPublishRetriesFailedEntriesOnce: entries EventBridge reports failed
// (FailedEntryCount) are sent again once, alone; entries that fail twice
// are reported with their code, and the others are delivered once.
func TestPublishRetriesFailedEntriesOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failures  int // how many times the bus refuses each "reused" entry
		wantErr   bool
		wantCalls int32
	}{
		{"transient", 1, false, 2},
		{"persistent", 2, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBus(t)
			var mu sync.Mutex
			refused := map[string]int{}
			b.SetFail(func(detailType, detail string) string {
				mu.Lock()
				defer mu.Unlock()
				if detailType != eventpub.DetailType(core.EventReused) || refused[detail] >= tc.failures {
					return ""
				}
				refused[detail]++
				return "ThrottlingException"
			})
			evs := []core.Event{event(core.EventCreated, "a"), event(core.EventReused, "b"), event(core.EventReleased, "c"), event(core.EventReused, "d")}
			err := b.publisher("broker-bus").PublishAll(context.Background(), evs)
			if (err != nil) != tc.wantErr || (err != nil && !strings.Contains(err.Error(), "2 of 4 events not published: ThrottlingException")) {
				t.Errorf("PublishAll error = %v, want error %v naming 2 of 4 and the code", err, tc.wantErr)
			}
			var ids []string
			for _, d := range delivered(t, b.file) {
				var ev core.Event
				_ = json.Unmarshal(d.Detail, &ev)
				ids = append(ids, ev.SandboxID)
			}
			want := "a c b d"
			if tc.wantErr {
				want = "a c"
			}
			if strings.Join(ids, " ") != want {
				t.Errorf("delivered %v, want %s (each once)", ids, want)
			}
			if n := b.calls.Load(); n != tc.wantCalls {
				t.Errorf("PutEvents calls = %d, want %d", n, tc.wantCalls)
			}
		})
	}
}

// TestPublishAllBatchesByTen: PutEvents takes at most ten entries.
func TestPublishAllBatchesByTen(t *testing.T) {
	b := newBus(t)
	var evs []core.Event
	for i := range 23 {
		evs = append(evs, event(core.EventCreated, fmt.Sprintf("sb%02d", i)))
	}
	if err := b.publisher("").PublishAll(context.Background(), evs); err != nil {
		t.Fatalf("PublishAll: %v", err)
	}
	if n, got := b.calls.Load(), len(delivered(t, b.file)); n != 3 || got != 23 {
		t.Errorf("calls %d, delivered %d; want 3 calls delivering 23", n, got)
	}
}

// TestPublishRefusesOversizedEntry: an entry over 256 KB (as EventBridge
// counts it) is never sent.
func TestPublishRefusesOversizedEntry(t *testing.T) {
	b := newBus(t)
	ev := event(core.EventDestroyed, "sb1")
	ev.Reason = strings.Repeat("x", eventpub.MaxEntryBytes)
	err := b.publisher("").Publish(context.Background(), ev)
	if !errors.Is(err, eventpub.ErrTooLarge) || b.calls.Load() != 0 {
		t.Errorf("Publish = %v after %d calls, want ErrTooLarge and no call", err, b.calls.Load())
	}
}

// TestFailingPublisherNeverFailsAcquireOrRelease: whether EventBridge
// refuses every entry, stalls, or cannot be reached, acquire, release and
// reclaim answer as without events; each lost event is logged and counted
// (EventsPublishFailed), and a stalled publish is cut at its own deadline
// (else the acquire would outlive its context).
func TestFailingPublisherNeverFailsAcquireOrRelease(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(t *testing.T, b *bus) string // returns the endpoint to use
	}{
		{"entries refused", func(t *testing.T, b *bus) string {
			b.SetFail(func(string, string) string { return "InternalFailure" })
			return b.url
		}},
		{"stalls", func(t *testing.T, _ *bus) string {
			stop := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
				case <-stop:
				}
			}))
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(stop) }) // first: Close waits for the handlers
			return srv.URL
		}},
		{"unreachable", func(t *testing.T, _ *bus) string {
			srv := httptest.NewServer(http.NotFoundHandler())
			srv.Close()
			return srv.URL
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBus(t)
			pub := eventpub.New(standin.EventBridgeClient(tc.fault(t, b), standin.Region, time.Minute), "")
			var logs bytes.Buffer
			db, table := testenv.DynamoTable(t, "eventpub")
			s := core.DefaultSettings()
			s.Deployment = "events"
			eng, err := core.New(s, ddbstore.New(db, table, s.Deployment), coretest.NewFakeProvider(), nil,
				core.WithEventSink(pub), core.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
			if err != nil {
				t.Fatalf("core.New: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
			defer cancel()
			k := core.ThreadKey{Tenant: "acme", User: "alice", Thread: "t1"}
			for i, want := range []core.Source{core.SourceCreated, core.SourceReclaimed} {
				res, err := eng.Acquire(ctx, k)
				if err != nil || res.Source != want {
					t.Fatalf("acquire %d = %v, %v; want %s", i, res.Source, err, want)
				}
				rel, err := eng.Release(ctx, "acme", res.Record.SandboxID)
				if err != nil || rel.State != "warm" {
					t.Fatalf("release %d = %+v, %v; want warm", i, rel, err)
				}
			}
			if got := len(delivered(t, b.file)); got != 0 {
				t.Errorf("%d events delivered, want none", got)
			}
			if n := strings.Count(logs.String(), `"EventsPublishFailed":1`); n != 4 {
				t.Errorf("EventsPublishFailed records = %d, want 4 (created, released, reclaimed, released)", n)
			}
		})
	}
}
