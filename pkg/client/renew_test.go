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

	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// renewServer answers renewals with the end its clock says, failing the
// ones fail names (by their number, from 1).
type renewServer struct {
	mu    sync.Mutex
	now   func() time.Time
	calls int
	fail  map[int]int // call -> HTTP status
	asked []string
}

func (s *renewServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	b, _ := io.ReadAll(r.Body)
	s.asked = append(s.asked, r.URL.Path+" "+string(b))
	w.Header().Set("Content-Type", "application/json")
	if st, ok := s.fail[s.calls]; ok {
		w.WriteHeader(st)
		io.WriteString(w, `{"error":{"code":"PROVIDER_UNAVAILABLE","message":"down","retryable":true}}`)
		return
	}
	var req struct{ Seconds int }
	_ = json.Unmarshal(b, &req)
	end := s.now().Add(time.Duration(req.Seconds) * time.Second).UTC().Format(time.RFC3339)
	io.WriteString(w, `{"sandbox_id":"sb1","expires_at":"`+end+`"}`)
}

// fakeTime is a clock whose sleeps advance it and report each wait.
type fakeTime struct {
	mu     sync.Mutex
	t      time.Time
	waits  chan time.Duration
	resume chan struct{}
}

func (f *fakeTime) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }

func (f *fakeTime) sleep(ctx context.Context, d time.Duration) error {
	select {
	case f.waits <- d:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-f.resume:
		f.mu.Lock()
		f.t = f.t.Add(d)
		f.mu.Unlock()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A keep-alive renews at a third of the lease left, reports a renewal it
// could not make until a later one succeeds, and stops on Stop.
func TestKeepAliveRenewsAtAThirdAndReportsFailures(t *testing.T) {
	ft := &fakeTime{t: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), waits: make(chan time.Duration), resume: make(chan struct{})}
	srv := &renewServer{now: ft.now, fail: map[int]int{2: 503}}
	c := newClient(t, srv)
	k := c.KeepAlive(context.Background(), "sb1", 90*time.Second, client.WithKeepAliveClock(ft.now, ft.sleep))
	for i, want := range []time.Duration{30 * time.Second, 30 * time.Second, 20 * time.Second} {
		if got := <-ft.waits; got != want {
			t.Errorf("wait %d = %s, want %s (a third of the lease left)", i, got, want)
		}
		ft.resume <- struct{}{}
		if i == 1 {
			// The second renewal fails: reported until a later one succeeds.
			if got := <-ft.waits; got != 20*time.Second {
				t.Errorf("wait after a failure = %s, want a third of what is left", got)
			}
			var ae *client.APIError
			if err := k.Err(); !errors.As(err, &ae) || ae.Status != 503 {
				t.Errorf("Err after a failed renewal = %v, want the 503", err)
			}
			ft.resume <- struct{}{}
			<-ft.waits
			if err := k.Err(); err != nil {
				t.Errorf("Err after a later renewal = %v, want nil", err)
			}
			break
		}
	}
	if err := k.Stop(); err != nil {
		t.Errorf("Stop = %v, want nil", err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.calls != 3 || srv.asked[0] != `/v1/sandboxes/sb1/renew {"seconds":90}` {
		t.Errorf("renewals = %d %v, want 3 of 90 s", srv.calls, srv.asked)
	}
}

// A keep-alive whose sandbox was released (409) stops and reports it.
func TestKeepAliveStopsWhenReleased(t *testing.T) {
	ft := &fakeTime{t: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), waits: make(chan time.Duration), resume: make(chan struct{})}
	srv := &renewServer{now: ft.now, fail: map[int]int{1: 409}}
	k := newClient(t, srv).KeepAlive(context.Background(), "sb1", time.Minute, client.WithKeepAliveClock(ft.now, ft.sleep))
	<-ft.waits
	ft.resume <- struct{}{}
	<-k.Done()
	var ae *client.APIError
	if err := k.Stop(); !errors.As(err, &ae) || ae.Status != 409 {
		t.Errorf("Stop after a 409 = %v, want it", err)
	}
}
