package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// waitingBroker answers 202 with a new ticket to the first waits acquires,
// then the sandbox, and records each request's body.
type waitingBroker struct {
	mu     sync.Mutex
	waits  int
	bodies []api.AcquireRequest
}

func (b *waitingBroker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var req api.AcquireRequest
	_ = json.Unmarshal(raw, &req)
	b.mu.Lock()
	b.bodies = append(b.bodies, req)
	n := len(b.bodies)
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if n <= b.waits {
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(api.AcquireWaiting{Ticket: "t" + string(rune('0'+n)), RetryAfterSeconds: 2, WaitUntil: time.Unix(0, 0).UTC()})
		return
	}
	_, _ = io.WriteString(w, `{"sandbox_id":"sbx1","state":"active","source":"created","backend":"local","connection":{},"expires_at":""}`)
}

func TestAcquireWaitsWithItsTicket(t *testing.T) {
	b := &waitingBroker{waits: 2}
	var slept []time.Duration
	c := newClient(t, b, client.WithSleep(func(_ context.Context, d time.Duration) error {
		slept = append(slept, d)
		return nil
	}))
	sb, err := c.Acquire(context.Background(), "u1", "th1")
	if err != nil || sb.SandboxID != "sbx1" {
		t.Fatalf("Acquire: %+v, %v", sb, err)
	}
	want := []string{"", "t1", "t2"}
	if len(b.bodies) != len(want) {
		t.Fatalf("%d acquires sent, want %d", len(b.bodies), len(want))
	}
	for i, req := range b.bodies {
		if req.Ticket != want[i] || req.UserID != "u1" || req.ThreadID != "th1" {
			t.Errorf("acquire %d sent %+v, want ticket %q for u1/th1", i, req, want[i])
		}
	}
	if len(slept) != 2 || slept[0] != 2*time.Second {
		t.Errorf("slept %v, want the answers' retry_after_seconds twice", slept)
	}
}

func TestAcquireWaitEndsWithItsContext(t *testing.T) {
	b := &waitingBroker{waits: 1 << 30}
	ctx, cancel := context.WithCancel(context.Background())
	c := newClient(t, b, client.WithSleep(func(ctx context.Context, _ time.Duration) error {
		cancel()
		return ctx.Err()
	}))
	if _, err := c.Acquire(ctx, "u1", "th1"); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire with its context cancelled while waiting: %v, want context.Canceled", err)
	}
}
