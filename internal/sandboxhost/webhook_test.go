package sandboxhost

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bwebhook"
)

// TestWebhooksAreSignedLifecycleEvents: pausing, resuming and killing a
// sandbox each send E2B's signed webhook about it, with its metadata.
func TestWebhooksAreSignedLifecycleEvents(t *testing.T) {
	var mu sync.Mutex
	var got []e2bwebhook.Payload
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !e2bwebhook.Verify("whsec", body, r.Header.Get(e2bwebhook.HeaderSignature)) {
			t.Errorf("delivery not signed with the secret: %s", body)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		p, err := e2bwebhook.Parse(body)
		if err != nil {
			t.Errorf("delivery: %v", err)
		}
		mu.Lock()
		got = append(got, p)
		mu.Unlock()
	}))
	defer recv.Close()
	srv := startHostWith(t, Options{Isolation: IsolationNone, Webhook: Webhook{URL: recv.URL, Secret: "whsec"}})
	sb := createSandbox(t, srv, map[string]any{"templateID": "base", "metadata": map[string]string{"thread": "t1"}})
	for _, step := range []struct{ method, path string }{
		{"POST", "/sandboxes/" + sb.SandboxID + "/pause"},
		{"POST", "/sandboxes/" + sb.SandboxID + "/connect"},
		{"DELETE", "/sandboxes/" + sb.SandboxID},
	} {
		body := any(nil)
		if step.path[len(step.path)-7:] == "connect" {
			body = map[string]any{"timeout": 60}
		}
		if status, _ := apiCall(t, srv, step.method, step.path, body, nil); status >= 300 {
			t.Fatalf("%s %s: status %d", step.method, step.path, status)
		}
	}
	want := []string{e2bwebhook.TypePaused, e2bwebhook.TypeResumed, e2bwebhook.TypeKilled}
	waitFor(t, 5*time.Second, "three webhooks", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == len(want)
	})
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]bool{}
	for _, p := range got {
		seen[p.Type] = true
		if p.SandboxID != sb.SandboxID || p.EventData.Metadata["thread"] != "t1" || p.ID == "" {
			t.Errorf("webhook %+v; want the sandbox's id, its metadata and an event id", p)
		}
	}
	for _, typ := range want {
		if !seen[typ] {
			t.Errorf("no %s webhook (got %+v)", typ, got)
		}
	}
}
