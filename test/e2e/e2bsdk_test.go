package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// e2bCall POSTs (or sends method to) <api>/e2b<path> with the token as
// X-API-Key, as the E2B SDKs do, through a's contract-checking client.
func e2bCall(t *testing.T, a api, method, path, key string) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.base+"/e2b"+path, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		t.Fatalf("%s /e2b%s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("%s /e2b%s: status %d, body %q is not a JSON object", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, body
}

// TestE2BSDKOnBrokeredSandbox: with E2B_API_URL=<api_url>/e2b and the
// tenant's token as E2B_API_KEY, the official E2B JS SDK runs a whole
// agent session on brokered sandboxes (test/e2b-sdk/broker-connect.mjs:
// commands, files, metrics, pause and connect, list order, a capacity
// refusal it retries, kill and create again); under the provisioner
// backend connect answers a clear refusal.
func TestE2BSDKOnBrokeredSandbox(t *testing.T) {
	t.Parallel()
	t.Run("e2b", func(t *testing.T) {
		dir := filepath.Join(repoRoot(t), "test", "e2b-sdk")
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
			t.Fatalf("the E2B SDK is not installed in %s (run make deps): %v", dir, err)
		}
		node, err := exec.LookPath("node")
		if err != nil {
			t.Fatalf("node not found (install Node.js 20+, then run make deps): %v", err)
		}
		// Two slots, refusing more: the session holds both, then sees a
		// third create refused and retried.
		s := startStackWith(t, stackOptions{provider: "e2b", env: []string{
			"SANDBOX_REPLICAS=2", "SANDBOX_OVERFLOW_POLICY=reject", "LOG_LEVEL=DEBUG"}})
		a := newAPI(t, s)

		// The replies the SDK gets, checked against the OpenAPI document.
		r := a.acquire(tokenA, "u-e2b", "t-e2b")
		want(t, "acquire", r, 200)
		id := str(r.body, "sandbox_id")
		if status, body := e2bCall(t, a, "POST", "/v2/sandboxes/"+id+"/connect", tokenA); status != 200 || body["envdAccessToken"] != str(r.body, "connection", "envd_access_token") {
			t.Fatalf("connect: %d %v", status, body)
		}
		for _, c := range []struct {
			method, path, key string
			want              int
		}{
			{"POST", "/sandboxes/" + id + "/connect", tokenB, 404}, // another tenant's
			{"POST", "/sandboxes/" + id + "/connect", "", 401},
			{"GET", "/sandboxes/" + id, tokenB, 404},
			{"POST", "/templates", tokenA, 501}, // not offered, in E2B's shape
		} {
			if status, body := e2bCall(t, a, c.method, c.path, c.key); status != c.want {
				t.Errorf("%s /e2b%s: %d %v, want %d", c.method, c.path, status, body, c.want)
			}
		}
		want(t, "release", a.do("POST", "/v1/sandboxes/"+id+"/release", tokenA, ""), 200)
		// Connect takes a parked sandbox back for its thread.
		if status, body := e2bCall(t, a, "POST", "/v2/sandboxes/"+id+"/connect", tokenA); (status != 200 && status != 201) || body["sandboxID"] != id {
			t.Errorf("connect after release: %d %v, want the sandbox taken back", status, body)
		}
		want(t, "release again", a.do("POST", "/v1/sandboxes/"+id+"/release", tokenA, ""), 200)
		if status, body := e2bCall(t, a, "POST", "/v2/sandboxes/nosuchsandbox/connect", tokenA); status != 404 || body["code"] != float64(404) {
			t.Errorf("connect to an unknown id: %d %v, want E2B's not-found", status, body)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, "broker-connect.mjs")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(),
			"BROKER_API_URL="+s.Info.APIURL,
			"BROKER_TOKEN="+tokenA,
			"BROKER_OTHER_TOKEN="+tokenB,
			"E2B_SANDBOX_URL="+s.Info.SandboxHost.EnvdURL,
			"E2B_API_URL=", "E2B_API_KEY=", "E2B_DEBUG=",
		)
		out, err := cmd.CombinedOutput()
		t.Logf("broker-connect output:\n%s", out)
		if err != nil {
			t.Fatalf("broker-connect failed: %v", err)
		}
	})
	t.Run("provisioner", func(t *testing.T) {
		s := startStack(t, "provisioner")
		a := newAPI(t, s)
		r := a.acquire(tokenA, "u-e2b", "t-e2b")
		want(t, "acquire", r, 200)
		id := str(r.body, "sandbox_id")
		status, body := e2bCall(t, a, "POST", "/v2/sandboxes/"+id+"/connect", tokenA)
		msg, _ := body["message"].(string)
		if status != 400 || !strings.Contains(msg, "provisioner") || !strings.Contains(msg, "/v1/sandboxes/acquire") {
			t.Errorf("connect under the provisioner backend: %d %v, want 400 naming the backend and acquire", status, body)
		}
		want(t, "release", a.do("POST", "/v1/sandboxes/"+id+"/release", tokenA, ""), 200)
	})
}
