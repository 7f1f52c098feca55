package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestWebhookFreesKilledSandboxAtOnce: a sandbox killed behind the
// broker's back (through the sandbox host directly) frees its slot
// within 2 s through the host's signed webhook, with no reconcile pass
// (the schedule is an hour); its record names the reason, and the
// thread's next acquire names it once. A forged webhook, sent through
// the gateway without a token as E2B would, changes nothing.
func TestWebhookFreesKilledSandboxAtOnce(t *testing.T) {
	t.Parallel()
	s := startStackWith(t, stackOptions{provider: "e2b", schedule: time.Hour,
		env: []string{"SANDBOX_REPLICAS=1", "SANDBOX_OVERFLOW_POLICY=reject"}})
	a := newAPI(t, s)
	first := a.acquire(tokenA, "alice", "hook")
	if first.status != http.StatusOK {
		t.Fatalf("acquire: %d %s", first.status, first.raw)
	}
	id := str(first.body, "sandbox_id")

	forged := `{"version":"v2","id":"forged-1","type":"sandbox.lifecycle.killed","eventData":{},"sandboxId":"` + id +
		`","timestamp":"` + time.Now().UTC().Format(time.RFC3339) + `"}`
	req, _ := http.NewRequest("POST", s.Info.APIURL+"/webhooks/e2b", strings.NewReader(forged))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("E2b-Signature", "bm90LXRoZS1zaWduYXR1cmU")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("forged webhook: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("forged webhook: HTTP %d, want 401", resp.StatusCode)
	}
	if rec := a.do("GET", "/v1/sandboxes/"+id, tokenA, ""); str(rec.body, "state") != "active" {
		t.Fatalf("after a forged webhook the record is %s, want active", rec.raw)
	}

	e2bFace.kill(t, s, id)
	deadline := time.Now().Add(2 * time.Second)
	for {
		c := a.do("GET", "/v1/capacity", tokenA, "")
		if used, _ := c.body["used"].(float64); used == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed sandbox still holds its slot 2 s later: %s", c.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rec := a.do("GET", "/v1/sandboxes/"+id, tokenA, "")
	if str(rec.body, "state") != "gone" || str(rec.body, "end_reason") != "provider_killed" {
		t.Errorf("record after the webhook: %s; want gone, end_reason provider_killed", rec.raw)
	}
	next := a.acquire(tokenA, "alice", "hook")
	if next.status != http.StatusOK || str(next.body, "previous", "sandbox_id") != id || str(next.body, "previous", "reason") != "provider_killed" {
		t.Errorf("next acquire: %d %s; want a new sandbox naming %s provider_killed", next.status, next.raw, id)
	}
}
