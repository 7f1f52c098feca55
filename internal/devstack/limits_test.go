package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

func TestGatewayRefusesOversizeRequestHeads(t *testing.T) {
	rie := &fakeRIE{reply: func(events.APIGatewayV2HTTPRequest) (int, string) { return 200, `{"statusCode":200,"body":"{}"}` }}
	srv := newGateway(t, rie)
	for _, tt := range []struct {
		name string
		size int
		want int
	}{
		{"within the quota", 8 << 10, 200},
		{"over the quota", 11 << 10, http.StatusRequestHeaderFieldsTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rie.mu.Lock()
			rie.events = nil
			rie.mu.Unlock()
			resp, body := call(t, "GET", srv.URL+"/v1/sandboxes/abc", "tok-a", nil, map[string]string{"X-Pad": strings.Repeat("a", tt.size)})
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tt.want)
			}
			rie.mu.Lock()
			invoked := len(rie.events)
			rie.mu.Unlock()
			if (tt.want == 200) != (invoked == 1) {
				t.Errorf("function invoked %d times for a %d answer", invoked, tt.want)
			}
		})
	}
}

// blockingGateway is a gateway whose one function instance answers only
// once release is closed, with a short integration timeout.
func blockingGateway(t *testing.T, release chan struct{}) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	rie := &fakeRIE{reply: func(events.APIGatewayV2HTTPRequest) (int, string) {
		calls.Add(1)
		<-release
		return 200, `{"statusCode":200,"body":"{}"}`
	}}
	app := App{Routes: []Route{{"GET", "/v1/sandboxes/{id}", "status", ""}}}
	gw := &gateway{app: app, fns: map[string]*lambdaFn{"status": fakeFunction(t, "status", rie)},
		tokens: map[string]string{"tok-a": "acme"}, log: slog.New(slog.DiscardHandler), apiHost: "local",
		timeout: 300 * time.Millisecond}
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { close(release); srv.Close() })
	return srv, &calls
}

func TestGatewayEndsTheIntegrationAtItsTimeout(t *testing.T) {
	srv, calls := blockingGateway(t, make(chan struct{}))
	// The first request holds the only instance past the timeout; the
	// second waits for a free instance and is ended at the timeout too,
	// without being sent.
	first := make(chan int, 1)
	go func() {
		resp, body := call(t, "GET", srv.URL+"/v1/sandboxes/a", "tok-a", nil, nil)
		t.Log("running request's answer: ", body)
		first <- resp.StatusCode
	}()
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	resp, body := call(t, "GET", srv.URL+"/v1/sandboxes/b", "tok-a", nil, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "Service Unavailable") {
		t.Errorf("waiting request: %d %s, want 503 Service Unavailable", resp.StatusCode, body)
	}
	if got := <-first; got != http.StatusServiceUnavailable {
		t.Errorf("running request: %d, want 503", got)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("function invoked %d times, want 1 (the waiting request is never sent)", n)
	}
}

func TestGatewayOversizeE2BBodyInE2BShape(t *testing.T) {
	rie := &fakeRIE{reply: func(events.APIGatewayV2HTTPRequest) (int, string) { return 200, `{}` }}
	srv := newGateway(t, rie)
	req, _ := http.NewRequest("POST", srv.URL+"/e2b/v2/sandboxes/abc/connect", strings.NewReader(strings.Repeat("x", maxRequestBody+1)))
	req.Header.Set("X-API-Key", "tok-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != 413 || e.Code != 413 || e.Message == "" {
		t.Errorf("got %d %+v (%v), want 413 with E2B's {code: 413, message}", resp.StatusCode, e, err)
	}
}

func TestDeadEmulatorIsRestartedNotFatal(t *testing.T) {
	rie := &fakeRIE{reply: func(events.APIGatewayV2HTTPRequest) (int, string) { return 200, `{"ok":true}` }}
	lf := fakeFunction(t, "reconcile", rie)
	exited := make(chan struct{})
	dead := &child{name: "old", cmd: &exec.Cmd{}, exited: exited}
	lf.instances[0].child = dead
	close(exited) // as the emulator exits when sent a second invocation
	restarted := 0
	alive := make(chan struct{})
	lf.log = slog.New(slog.DiscardHandler)
	lf.restart = func(ctx context.Context, i int) (*rieInstance, error) {
		restarted++
		srv := httptest.NewServer(rie)
		t.Cleanup(srv.Close)
		return &rieInstance{index: i, url: srv.URL + InvokePath, child: &child{name: "new", cmd: &exec.Cmd{}, exited: alive}}, nil
	}
	out, err := lf.invoke(context.Background(), []byte(`{}`))
	if err != nil || string(out) != `{"ok":true}` {
		t.Fatalf("invoke after the emulator died: %s, %v", out, err)
	}
	if restarted != 1 || lf.instances[0].child == dead {
		t.Errorf("restarted %d times; the instance still holds the dead emulator: %v", restarted, lf.instances[0].child == dead)
	}
	if _, err := lf.invoke(context.Background(), []byte(`{}`)); err != nil || restarted != 1 {
		t.Errorf("second invoke: %v, restarts %d, want none more", err, restarted)
	}

	lf.restart = func(context.Context, int) (*rieInstance, error) { return nil, errors.New("no port") }
	close(alive)
	if _, err := lf.invoke(context.Background(), []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Errorf("invoke with a failed restart: %v, want the restart's error", err)
	}
}

func TestStackFileNamesTheQueuedInvokeURL(t *testing.T) {
	s := &Stack{}
	url := s.functionURL("reconcile")
	if url != "" {
		t.Errorf("before the Invoke API listens: %q, want empty", url)
	}
	if err := s.listenInvoke(); err != nil {
		t.Fatal(err)
	}
	defer s.invokeLn.Close()
	url = s.functionURL("reconcile")
	if !strings.HasSuffix(url, "/2015-03-31/functions/reconcile/invocations") || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Errorf("stack file URL %q: want the Invoke API's, which queues on the function's instances", url)
	}
}

func TestGatewayEndsASlowBody(t *testing.T) {
	srv, calls := blockingGateway(t, make(chan struct{}))
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = pw.Write([]byte(`{"user_id":`)) }() // and nothing more
	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes/a", pr)
	req.Header.Set("Authorization", "Bearer tok-a")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("a body that never ends: status %d, want a refusal", resp.StatusCode)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("function invoked %d times for a body that never ended", n)
	}
}
