package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// testWaitFairness measures fair waiting on testWait's stack, where the
// acquire function is limited to one concurrent invocation (one emulator
// per function): one slot, which tenant a holds (hold, an active sandbox
// of tenantA); tenant a queues six waiters, and tenant b one a second
// later. Each waiter asks again with its ticket every second, as the
// clients do, and each one served releases at once, handing the slot on.
// Tenant b is served first or second.
func testWaitFairness(t *testing.T, a api, hold string) {
	var ws []*waiter
	queue := func(token, thread string) {
		r := a.do("POST", "/v1/sandboxes/acquire", token, acquireBody("u", thread, ""))
		want(t, thread+" queues", r, http.StatusAccepted)
		ws = append(ws, &waiter{token: token, thread: thread, ticket: str(r.body, "ticket")})
	}
	for i := range 6 {
		queue(tokenA, fmt.Sprint("a", i+1))
	}
	time.Sleep(time.Second)
	queue(tokenB, "b1")
	queuedB := time.Now()
	want(t, "release the hold", a.do("POST", "/v1/sandboxes/"+hold+"/release", tokenA, ""), 200)

	var (
		mu    sync.Mutex
		order []string
		after []time.Duration
		wg    sync.WaitGroup
	)
	stop := make(chan struct{})
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w.askUntilServed(t, a, stop) {
				mu.Lock()
				order, after = append(order, w.thread), append(after, time.Since(queuedB))
				mu.Unlock()
			}
		}()
	}
	deadline := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case <-deadline:
			done = true
		case <-time.After(200 * time.Millisecond):
			mu.Lock()
			done = len(order) >= 2
			mu.Unlock()
		}
	}
	close(stop)
	wg.Wait()
	for i := range order {
		t.Logf("served %d: %s, %s after b queued", i+1, order[i], after[i].Round(time.Millisecond))
	}
	if len(order) < 2 || (order[0] != "b1" && order[1] != "b1") {
		t.Errorf("served %v: want b1 among the first two", order)
	}
}

// waiter is one waiting acquire of testWaitFairness.
type waiter struct{ token, thread, ticket string }

// askUntilServed asks again with w's ticket every second until it is
// served (then it releases the sandbox at once and reports true), its
// wait runs out (a 429), or stop closes.
func (w *waiter) askUntilServed(t *testing.T, a api, stop <-chan struct{}) bool {
	for {
		select {
		case <-stop:
			return false
		case <-time.After(time.Second):
		}
		r, err := rawAsk(a, w.token, acquireBody("u", w.thread, w.ticket))
		switch {
		case err != nil:
			t.Errorf("%s asks again: %v", w.thread, err)
			return false
		case r.status == http.StatusAccepted:
			w.ticket = str(r.body, "ticket")
			continue
		case r.status == http.StatusTooManyRequests && errCode(r) == "SANDBOX_CAPACITY_EXCEEDED":
			// Its wait (SANDBOX_ACQUIRE_TIMEOUT_SECONDS from its first
			// ask) ran out before its turn: not served, as designed.
			t.Logf("%s: wait ran out before its turn", w.thread)
			return false
		case r.status != http.StatusOK:
			t.Errorf("%s asks again: %d %s", w.thread, r.status, r.raw)
			return false
		}
		if err := rawRelease(a, w.token, str(r.body, "sandbox_id")); err != nil {
			t.Errorf("%s releases: %v", w.thread, err)
		}
		return true
	}
}

// rawRelease releases sandbox id without t.Fatal (safe off the test
// goroutine).
func rawRelease(a api, token, id string) error {
	req, err := http.NewRequest("POST", a.base+"/v1/sandboxes/"+id+"/release", strings.NewReader(""))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("release %s: HTTP %d", id, resp.StatusCode)
	}
	return nil
}
