package devstack

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// TestInvokeAPIRunsEventInvocationsInTheBackground: an Event invocation is
// answered 202 while the function still runs, and reaches it; a
// RequestResponse invocation answers the function's reply; unknown
// functions, operations and invocation types are refused without
// invoking anything.
func TestInvokeAPIRunsEventInvocationsInTheBackground(t *testing.T) {
	release := make(chan struct{})
	got := make(chan string, 4)
	rie := &fakeRIE{reply: func(ev events.APIGatewayV2HTTPRequest) (int, string) {
		got <- ev.RawPath
		if ev.RawPath == "/block" {
			<-release
		}
		return 200, `{"ok":true}`
	}}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stack{log: slog.New(slog.DiscardHandler), fns: map[string]*lambdaFn{"reconcile": fakeFunction(t, "reconcile", rie)}}
	srv := httptest.NewServer(&invokeAPI{s: s, ctx: ctx})
	t.Cleanup(func() {
		cancel()
		srv.Close()
		s.wg.Wait()
	})
	invoke := func(path, typ, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		if typ != "" {
			req.Header.Set("X-Amz-Invocation-Type", typ)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const fn = "/2015-03-31/functions/reconcile/invocations"
	if status, _ := invoke(fn, "Event", `{"rawPath":"/block"}`); status != http.StatusAccepted {
		t.Fatalf("Event invocation status = %d, want 202 while the function still runs", status)
	}
	if p := <-got; p != "/block" {
		t.Errorf("function received %q, want the event's payload", p)
	}
	close(release)
	if status, body := invoke(fn, "", `{"rawPath":"/sync"}`); status != http.StatusOK || body != `{"ok":true}` {
		t.Errorf("RequestResponse invocation = %d %s, want the function's reply", status, body)
	}
	if p := <-got; p != "/sync" {
		t.Errorf("function received %q, want the second payload", p)
	}
	tests := []struct {
		name, path, typ string
		want            int
	}{
		{"unknown function", "/2015-03-31/functions/nope/invocations", "Event", http.StatusNotFound},
		{"other operation", "/2015-03-31/functions/reconcile/configuration", "", http.StatusNotFound},
		{"unknown invocation type", fn, "DryRunLater", http.StatusBadRequest},
	}
	for _, tc := range tests {
		if status, _ := invoke(tc.path, tc.typ, `{}`); status != tc.want {
			t.Errorf("%s: status = %d, want %d", tc.name, status, tc.want)
		}
	}
	select {
	case p := <-got:
		t.Errorf("a refused request reached the function (%q)", p)
	default:
	}
}
