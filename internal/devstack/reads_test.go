package devstack

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

// TestReadsAreNotQueuedBehindWaitingAcquires: with the repository's
// template, one tenant's flood of acquires that are all held (waiting for
// a slot) occupies the acquire function, and another tenant's capacity,
// status and admin requests still answer, before any of the acquires
// does: they are served by another function.
func TestReadsAreNotQueuedBehindWaitingAcquires(t *testing.T) {
	app, err := LoadTemplate(repoTemplate(t))
	if err != nil {
		t.Fatal(err)
	}
	acquireFn := ""
	for _, r := range app.Routes {
		if r.Key() == "POST /v1/sandboxes/acquire" {
			acquireFn = r.Function
		}
	}
	hold := make(chan struct{})
	held := make(chan struct{}, 1)
	var mu sync.Mutex
	var order []string // completions, in order
	done := func(what string) {
		mu.Lock()
		order = append(order, what)
		mu.Unlock()
	}
	fns := map[string]*lambdaFn{}
	for _, f := range app.Functions {
		rie := &fakeRIE{reply: func(ev events.APIGatewayV2HTTPRequest) (int, string) {
			if ev.RouteKey == "POST /v1/sandboxes/acquire" {
				select {
				case held <- struct{}{}:
				default:
				}
				<-hold // waiting for a slot
			}
			return 200, `{"statusCode":200,"body":"{}"}`
		}}
		fns[f.Name] = fakeFunction(t, f.Name, rie)
	}
	gw := &gateway{app: app, fns: fns, tokens: map[string]string{"tok-hog": "hog", "tok-acme": "acme"},
		log: slog.New(slog.DiscardHandler), apiHost: "local"}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
		}
	}
	t.Cleanup(release)

	send := func(ctx context.Context, method, path, token, body string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	const flood = 6
	var wg sync.WaitGroup
	for i := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, err := send(context.Background(), "POST", "/v1/sandboxes/acquire", "tok-hog", fmt.Sprintf(`{"user_id":"u","thread_id":"t%d"}`, i))
			if err != nil || status != 200 {
				t.Errorf("hog's acquire %d: status %d, %v", i, status, err)
			}
			done("acquire")
		}()
	}
	<-held // the acquire function is busy; the other acquires queue for it

	// A request queued behind the held acquires would wait for ever: the
	// deadline only turns that hang into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reads := []struct{ method, path string }{
		{"GET", "/v1/capacity"},
		{"GET", "/v1/sandboxes/sbx-1"},
		{"POST", "/v1/admin/drain"},
		{"POST", "/v1/admin/undrain"},
	}
	for _, r := range reads {
		route, _, _ := app.match(r.method, r.path)
		if route.Function == acquireFn {
			t.Errorf("%s %s is served by %s, the function holding waiting acquires", r.method, r.path, acquireFn)
			continue
		}
		status, err := send(ctx, r.method, r.path, "tok-acme", "")
		if err != nil || status != 200 {
			t.Errorf("acme's %s %s during the flood: status %d, %v", r.method, r.path, status, err)
		}
		done(r.method + " " + r.path)
	}
	release()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i, what := range order {
		if (i < len(reads)) == (what == "acquire") {
			t.Errorf("completion order %q: want every read answered before any held acquire", order)
			break
		}
	}
}
