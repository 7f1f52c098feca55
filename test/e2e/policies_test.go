package e2e

// Overflow policies and draining over HTTP, each policy in the end-to-end
// suite, one fresh local stack per case, on the E2B
// provider. Each case also checks the CloudWatch EMF lines the functions
// wrote to their logs.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/devstack"
)

// TestOverflowPolicies runs one stack per policy and one for draining.
func TestOverflowPolicies(t *testing.T) {
	t.Parallel()
	t.Run("reject", testReject)
	t.Run("wait", testWait)
	t.Run("burst", testBurst)
	t.Run("draining", testDraining)
}

// countedCapacity runs a reconcile pass, which counts the slots by state,
// then reads GET /v1/capacity (200), whose counts by state are that
// pass's.
func countedCapacity(t *testing.T, s *devstack.Stack, a api) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := s.InvokeScheduled(ctx, "reconcile"); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	c := a.do("GET", "/v1/capacity", tokenA, "")
	want(t, "capacity", c, 200)
	if _, ok := c.body["counted_at"].(string); !ok {
		t.Errorf("capacity %s after a reconcile pass: want counted_at", c.raw)
	}
	return c
}

// want429 checks the capacity refusal contract: 429, a positive integer
// Retry-After, code SANDBOX_CAPACITY_EXCEEDED, reason capacity, retryable,
// and details with the given limit and used.
func want429(t *testing.T, step string, r reply, limit, used int) {
	t.Helper()
	want(t, step, r, http.StatusTooManyRequests)
	if errCode(r) != "SANDBOX_CAPACITY_EXCEEDED" || str(r.body, "error", "reason") != "capacity" {
		t.Errorf("%s: body %s, want code SANDBOX_CAPACITY_EXCEEDED reason capacity", step, r.raw)
	}
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("%s: Retry-After %q, want a positive integer", step, r.header.Get("Retry-After"))
	}
	e, _ := r.body["error"].(map[string]any)
	d, _ := e["details"].(map[string]any)
	if e["retryable"] != true || d["limit"] != float64(limit) || d["used"] != float64(used) {
		t.Errorf("%s: body %s, want retryable with details limit %d used %d", step, r.raw, limit, used)
	}
}

// hostAlive asks the sandbox host's E2B control plane whether id runs.
func hostAlive(t *testing.T, s *devstack.Stack, id string) bool {
	t.Helper()
	req, _ := http.NewRequest("GET", s.Info.SandboxHost.APIURL+"/sandboxes/"+id, nil)
	req.Header.Set("X-API-Key", s.Info.SandboxHost.APIKey)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("sandbox host GET %s: %v", id, err)
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return true
	case http.StatusNotFound:
		return false
	}
	t.Fatalf("sandbox host GET %s: HTTP %d", id, resp.StatusCode)
	return false
}

// emf collects, from the logs of every instance of function fn, the values
// of metric in EMF lines (an "_aws" member declaring it, namespace
// SandboxBroker, dimension Deployment "default"), in log order per file.
func emf(t *testing.T, s *devstack.Stack, fn, metric string) []float64 {
	t.Helper()
	return emfValues(t, s, fn, metric, nil)
}

// emfTenant is emf for a metric with the dimensions Deployment and Tenant,
// of tenant's lines.
func emfTenant(t *testing.T, s *devstack.Stack, fn, metric, tenant string) []float64 {
	t.Helper()
	return emfValues(t, s, fn, metric, map[string]string{"Tenant": tenant})
}

// emfValues collects metric's values from fn's EMF lines whose dimension
// set is Deployment then the keys of extra, with Deployment "default" and
// extra's values (lines of other values are skipped).
func emfValues(t *testing.T, s *devstack.Stack, fn, metric string, extra map[string]string) []float64 {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(s.Info.LogDir, "fn-"+fn+"-*.log"))
	if len(files) == 0 {
		t.Fatalf("no logs of function %s in %s", fn, s.Info.LogDir)
	}
	dims := []string{"Deployment"}
	for k := range extra {
		dims = append(dims, k)
	}
	var vals []float64
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			l := sc.Bytes()
			if !bytes.HasPrefix(l, []byte("{")) || !bytes.Contains(l, []byte(`"_aws"`)) {
				continue
			}
			var line struct {
				AWS struct {
					CloudWatchMetrics []struct {
						Namespace  string
						Dimensions [][]string
						Metrics    []struct{ Name string }
					}
				} `json:"_aws"`
			}
			var members map[string]any
			if err := json.Unmarshal(l, &line); err != nil {
				t.Fatalf("%s: EMF line is not JSON: %v: %s", f, err, l)
			}
			if err := json.Unmarshal(l, &members); err != nil {
				t.Fatalf("%s: EMF line is not a JSON object: %v: %s", f, err, l)
			}
			for _, d := range line.AWS.CloudWatchMetrics {
				for _, m := range d.Metrics {
					if m.Name != metric {
						continue
					}
					if d.Namespace != "SandboxBroker" || len(d.Dimensions) != 1 || strings.Join(d.Dimensions[0], ",") != strings.Join(dims, ",") || members["Deployment"] != "default" {
						t.Errorf("%s: EMF line %s: want namespace SandboxBroker, dimensions %v, Deployment=default", f, l, dims)
					}
					skip := false
					for k, v := range extra {
						skip = skip || members[k] != v
					}
					if skip {
						continue
					}
					v, ok := members[metric].(float64)
					if !ok {
						t.Errorf("%s: metric %s has no numeric value: %s", f, metric, l)
					}
					vals = append(vals, v)
				}
			}
		}
	}
	return vals
}

func sum(vs []float64) (n float64) {
	for _, v := range vs {
		n += v
	}
	return n
}

// testReject: one slot, policy reject. A second thread gets 429 at once;
// after the first thread releases, the second thread's acquire evicts the
// warm sandbox (of another thread) and gets a new one.
func testReject(t *testing.T) {
	s := startStackWith(t, stackOptions{provider: "e2b", env: []string{
		"SANDBOX_REPLICAS=1", "SANDBOX_OVERFLOW_POLICY=reject", "LOG_LEVEL=DEBUG"}})
	a := newAPI(t, s)

	r := a.acquire(tokenA, "u", "t-a")
	want(t, "thread A acquire", r, 200)
	first := connOf(r)

	start := time.Now()
	want429(t, "thread B acquire while A is active", a.acquire(tokenA, "u", "t-b"), 1, 1)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("reject answered after %s, want at once", d)
	}

	r = a.do("POST", "/v1/sandboxes/"+first.id+"/release", tokenA, "")
	want(t, "thread A release", r, 200)
	if str(r.body, "state") != "warm" {
		t.Fatalf("release: %s, want state warm", r.raw)
	}
	r = a.acquire(tokenA, "u", "t-b")
	want(t, "thread B acquire after A released", r, 200)
	if second := connOf(r); second.id == first.id || str(r.body, "source") != "created" {
		t.Errorf("thread B: %s, want a new sandbox (not %s), source created", r.raw, first.id)
	}
	if hostAlive(t, s, first.id) {
		t.Errorf("thread A's warm sandbox %s still runs: want it evicted for thread B", first.id)
	}
	c := countedCapacity(t, s, a)
	if c.body["used"] != float64(1) || c.body["warm"] != float64(0) {
		t.Errorf("capacity %s, want used 1, warm 0", c.raw)
	}

	// Metrics: the 429 counted once with the ledger's gauges; the capacity
	// read's gauges; the release's sync pass.
	if got := emf(t, s, "acquire", "CapacityRejected"); sum(got) != 1 {
		t.Errorf("CapacityRejected values %v, want one 429 counted", got)
	}
	// The 429 is counted by acquire, GET /v1/capacity by status.
	for _, fn := range []string{"acquire", "status"} {
		if got := emf(t, s, fn, "CapacityUsed"); len(got) != 1 || got[0] != 1 {
			t.Errorf("%s: CapacityUsed values %v, want one gauge of 1", fn, got)
		}
		if got := emf(t, s, fn, "CapacityLimit"); len(got) != 1 || got[0] != 1 {
			t.Errorf("%s: CapacityLimit values %v, want one gauge of 1", fn, got)
		}
	}
	if got := emf(t, s, "release", "SyncDeferredFiles"); len(got) != 1 || got[0] != 0 {
		t.Errorf("SyncDeferredFiles values %v, want one pass deferring nothing", got)
	}
}

// testWait: one slot, policy wait, one emulator per function (the
// acquire function limited to one concurrent invocation). Thread B's
// acquire waits while thread A is active and succeeds, within
// SANDBOX_ACQUIRE_TIMEOUT_SECONDS, once A releases (A's warm sandbox is
// evicted for B). A third thread then waits the whole timeout and gets
// 429. Then testWaitFairness, with B's sandbox as the slot held.
func testWait(t *testing.T) {
	const timeout = 8 * time.Second
	s := startStackWith(t, stackOptions{provider: "e2b", instances: 1, env: []string{
		"SANDBOX_REPLICAS=1", "SANDBOX_OVERFLOW_POLICY=wait",
		"SANDBOX_ACQUIRE_TIMEOUT_SECONDS=" + strconv.Itoa(int(timeout/time.Second)), "LOG_LEVEL=DEBUG"}})
	a := newAPI(t, s)

	r := a.acquire(tokenA, "u", "t-a")
	want(t, "thread A acquire", r, 200)
	first := connOf(r)

	type result struct {
		r       reply
		elapsed time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		r, err := rawAcquire(a, tokenA, "u", "t-b")
		if err != nil {
			r.status, r.raw = -1, err.Error()
		}
		done <- result{r, time.Since(start)}
	}()

	// B is waiting: no answer while A holds the only slot.
	const held = 1500 * time.Millisecond
	select {
	case res := <-done:
		t.Fatalf("thread B answered %d after %s while thread A held the only slot: %s", res.r.status, res.elapsed, res.r.raw)
	case <-time.After(held):
	}
	r = a.do("POST", "/v1/sandboxes/"+first.id+"/release", tokenA, "")
	want(t, "thread A release", r, 200)

	var res result
	select {
	case res = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("thread B's acquire never answered")
	}
	want(t, "thread B acquire (waited)", res.r, 200)
	if id := str(res.r.body, "sandbox_id"); id == "" || id == first.id || str(res.r.body, "source") != "created" {
		t.Errorf("thread B: %s, want a new sandbox (not %s), source created", res.r.raw, first.id)
	}
	// The acquire timeout bounds the waiting only; the eviction, create and
	// bootstrap that follow a freed slot come on top (core keeps up to
	// 10 s for them), so allow that on a loaded CI machine.
	if limit := timeout + 10*time.Second; res.elapsed < held || res.elapsed > limit {
		t.Errorf("thread B's acquire took %s, want between %s (A's hold) and %s (acquire timeout + create)", res.elapsed, held, limit)
	}
	if hostAlive(t, s, first.id) {
		t.Errorf("thread A's warm sandbox %s still runs: want it evicted for thread B", first.id)
	}

	// Nobody releases now: a third thread waits out the timeout, then 429.
	start = time.Now()
	r = a.acquire(tokenA, "u", "t-c")
	elapsed := time.Since(start)
	want429(t, "thread C acquire (nothing freed)", r, 1, 1)
	if elapsed < timeout-2*time.Second || elapsed > timeout+10*time.Second {
		t.Errorf("thread C's 429 after %s, want about the acquire timeout %s", elapsed, timeout)
	}
	if got := emf(t, s, "acquire", "CapacityRejected"); sum(got) != 1 {
		t.Errorf("CapacityRejected values %v, want one 429 counted (waiting attempts are not refusals)", got)
	}
	testWaitFairness(t, a, str(res.r.body, "sandbox_id"))
}

// testBurst: one replica, burst limit 2, policy burst: of four threads
// acquiring at once exactly three get sandboxes, the fourth 429 (limit 3).
func testBurst(t *testing.T) {
	s := startStackWith(t, stackOptions{provider: "e2b", instances: 4, env: []string{
		"SANDBOX_REPLICAS=1", "SANDBOX_OVERFLOW_POLICY=burst", "SANDBOX_BURST_LIMIT=2", "LOG_LEVEL=DEBUG"}})
	a := newAPI(t, s)

	type result struct {
		thread string
		status int
		raw    string
		r      reply
	}
	threads := []string{"t-1", "t-2", "t-3", "t-4"}
	out := make(chan result, len(threads))
	for _, th := range threads {
		go func() {
			r, err := rawAcquire(a, tokenA, "u", th)
			if err != nil {
				out <- result{thread: th, status: -1, raw: err.Error()}
				return
			}
			out <- result{th, r.status, r.raw, r}
		}()
	}
	ok, refused := map[string]bool{}, 0
	for range threads {
		res := <-out
		switch res.status {
		case 200:
			ok[str(res.r.body, "sandbox_id")] = true
		case 429:
			refused++
			want429(t, "the fourth thread", res.r, 3, 3)
		default:
			t.Errorf("thread %s: status %d %s, want 200 or 429", res.thread, res.status, res.raw)
		}
	}
	if len(ok) != 3 || refused != 1 {
		t.Fatalf("%d distinct sandboxes and %d refusals, want exactly 3 (replicas 1 + burst 2) and 1", len(ok), refused)
	}
	c := countedCapacity(t, s, a)
	if c.body["limit"] != float64(3) || c.body["used"] != float64(3) || c.body["active"] != float64(3) || c.body["policy"] != "burst" {
		t.Errorf("capacity %s, want limit 3, used 3, active 3, policy burst", c.raw)
	}
	for id := range ok {
		if !hostAlive(t, s, id) {
			t.Errorf("sandbox %s handed out but not running", id)
		}
	}
}

// rawAcquire is api.acquire without t.Fatal (safe off the test goroutine).
func rawAcquire(a api, token, user, thread string) (reply, error) {
	body := acquireBody(user, thread, "")
	for range maxAsks {
		r, err := rawAsk(a, token, body)
		if err != nil || r.status != http.StatusAccepted {
			return r, err
		}
		time.Sleep(askAgainAfter(r))
		body = acquireBody(user, thread, str(r.body, "ticket"))
	}
	return reply{}, fmt.Errorf("acquire %s/%s: still waiting after %d asks", user, thread, maxAsks)
}

// rawAsk is one acquire request.
func rawAsk(a api, token, body string) (reply, error) {
	req, err := http.NewRequest("POST", a.base+"/v1/sandboxes/acquire", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return reply{}, err
	}
	r := reply{status: resp.StatusCode, header: resp.Header, raw: buf.String()}
	if err := json.Unmarshal(buf.Bytes(), &r.body); err != nil {
		return r, err
	}
	return r, nil
}

// testDraining: an admin tenant (BROKER_ADMIN_TENANTS) drains; acquires
// get 503 reason draining; releasing an active sandbox destroys it; a
// reconcile pass destroys the warm one; undrain restores acquires.
func testDraining(t *testing.T) {
	const tokenOps, tenantOps = "token-ops", "ops"
	s := startStackWith(t, stackOptions{provider: "e2b",
		tokens: map[string]string{tokenA: tenantA, tokenB: tenantB, tokenOps: tenantOps},
		env: []string{"SANDBOX_REPLICAS=2", "SANDBOX_OVERFLOW_POLICY=reject", "LOG_LEVEL=DEBUG",
			"BROKER_ADMIN_TENANTS=" + tenantOps}})
	a := newAPI(t, s)

	r := a.acquire(tokenA, "u", "t-active")
	want(t, "acquire t-active", r, 200)
	active := connOf(r)
	r = a.acquire(tokenA, "u", "t-warm")
	want(t, "acquire t-warm", r, 200)
	warm := connOf(r)
	want(t, "release t-warm", a.do("POST", "/v1/sandboxes/"+warm.id+"/release", tokenA, ""), 200)

	r = a.do("POST", "/v1/admin/drain", tokenA, "")
	if r.status != 403 || errCode(r) != "FORBIDDEN" {
		t.Errorf("drain by a non-admin tenant: %d %s, want 403 FORBIDDEN", r.status, r.raw)
	}
	r = a.do("POST", "/v1/admin/drain", tokenOps, "")
	want(t, "drain", r, 200)
	if r.body["draining"] != true {
		t.Errorf("drain: %s, want draining true", r.raw)
	}

	for _, th := range []string{"t-new", "t-active"} {
		r = a.acquire(tokenA, "u", th)
		want(t, "acquire "+th+" while draining", r, http.StatusServiceUnavailable)
		if errCode(r) != "SANDBOX_CAPACITY_EXCEEDED" || str(r.body, "error", "reason") != "draining" {
			t.Errorf("acquire %s while draining: %s, want reason draining", th, r.raw)
		}
		if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("acquire %s while draining: Retry-After %q, want a positive integer", th, r.header.Get("Retry-After"))
		}
	}

	r = a.do("POST", "/v1/sandboxes/"+active.id+"/release", tokenA, "")
	want(t, "release while draining", r, 200)
	if str(r.body, "state") != "destroyed" {
		t.Errorf("release while draining: %s, want state destroyed", r.raw)
	}
	if hostAlive(t, s, active.id) {
		t.Errorf("released sandbox %s still runs while draining", active.id)
	}
	c := a.do("GET", "/v1/capacity", tokenA, "")
	if c.body["draining"] != true || c.body["used"] != float64(1) {
		t.Errorf("capacity while draining %s, want draining, used 1 (the warm sandbox)", c.raw)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stats, err := s.InvokeScheduled(ctx, "reconcile")
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	var st map[string]any
	if err := json.Unmarshal(stats, &st); err != nil || st["expired"] != float64(1) || st["errors"] != float64(0) {
		t.Errorf("reconcile while draining: %s (%v), want expired 1, errors 0", stats, err)
	}
	if hostAlive(t, s, warm.id) {
		t.Errorf("warm sandbox %s still runs after a reconcile pass while draining", warm.id)
	}
	if c := a.do("GET", "/v1/capacity", tokenA, ""); c.body["used"] != float64(0) {
		t.Errorf("capacity after reconcile %s, want used 0", c.raw)
	}

	r = a.do("POST", "/v1/admin/undrain", tokenOps, "")
	want(t, "undrain", r, 200)
	if r.body["draining"] != false {
		t.Errorf("undrain: %s, want draining false", r.raw)
	}
	r = a.acquire(tokenA, "u", "t-active")
	want(t, "acquire after undrain", r, 200)
	if str(r.body, "source") != "created" || connOf(r).id == active.id {
		t.Errorf("acquire after undrain: %s, want a new sandbox", r.raw)
	}
	if c := a.do("GET", "/v1/capacity", tokenA, ""); c.body["draining"] != false || c.body["used"] != float64(1) {
		t.Errorf("capacity after undrain %s, want not draining, used 1", c.raw)
	}
}
