package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Renew keeps the caller's active sandbox for seconds from now (0: the
// deployment's active timeout): POST /v1/sandboxes/{id}/renew. It never
// moves the sandbox's end earlier; renewing to the same end again changes
// nothing. A 503 *APIError renewed nothing: renew again.
func (c *Client) Renew(ctx context.Context, sandboxID string, seconds int) (RenewResult, error) {
	var body any
	if seconds != 0 {
		body = map[string]int{"seconds": seconds}
	}
	var out RenewResult
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/renew", body, &out)
	return out, err
}

// KeepAlive renews sandboxID for lease at a time while the caller's run
// holds it, each time a third of the lease left, until stop is called
// (after the caller's release, or when its run ends) or ctx ends. A
// renewal that fails is tried again at the next tick while the lease
// lasts; stop returns the last renewal that could not be made (nil when
// every one was), and so does Err at any time. Renewals use the clock and
// sleep of opts (tests).
func (c *Client) KeepAlive(ctx context.Context, sandboxID string, lease time.Duration, opts ...KeepAliveOption) *KeepAlive {
	k := &KeepAlive{now: time.Now, sleep: sleepCtx, done: make(chan struct{})}
	for _, o := range opts {
		o(k)
	}
	ctx, k.cancel = context.WithCancel(ctx)
	go k.run(ctx, c, sandboxID, lease)
	return k
}

// KeepAliveOption customises a KeepAlive (tests).
type KeepAliveOption func(*KeepAlive)

// WithKeepAliveClock sets the clock and the sleep a KeepAlive uses; sleep
// must return ctx.Err() when ctx ends first.
func WithKeepAliveClock(now func() time.Time, sleep func(ctx context.Context, d time.Duration) error) KeepAliveOption {
	return func(k *KeepAlive) { k.now, k.sleep = now, sleep }
}

// KeepAlive is a running keep-alive (Client.KeepAlive).
type KeepAlive struct {
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	cancel context.CancelFunc
	done   chan struct{}
	err    error // what Stop returns; written before done closes

	mu   sync.Mutex
	last error
}

func (k *KeepAlive) setLast(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.last = err
}

// Stop ends the renewals and returns the last renewal that could not be
// made (nil when none failed or a later one succeeded).
func (k *KeepAlive) Stop() error {
	k.cancel()
	<-k.done
	return k.err
}

// Done is closed when the renewals end: Stop, ctx's end, or a renewal
// answering that the sandbox is no longer the caller's active one (404,
// 409; Stop returns it).
func (k *KeepAlive) Done() <-chan struct{} { return k.done }

// Err is the last renewal that could not be made so far (nil: none, or a
// later one succeeded).
func (k *KeepAlive) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.last
}

func (k *KeepAlive) run(ctx context.Context, c *Client, id string, lease time.Duration) {
	defer close(k.done)
	end := k.now().Add(lease)
	for {
		wait := max(end.Sub(k.now())/3, time.Second)
		if err := k.sleep(ctx, wait); err != nil {
			k.err = k.Err()
			return
		}
		rctx, cancel := context.WithTimeout(ctx, min(max(end.Sub(k.now())/3, 5*time.Second), 30*time.Second))
		res, err := c.Renew(rctx, id, int(lease/time.Second))
		cancel()
		var ae *APIError
		if errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusConflict) {
			k.setLast(err)
			k.err = err // released or gone: nothing more to renew
			return
		}
		if ctx.Err() != nil {
			k.err = k.Err() // stopped: a renewal cut short is not a failure
			return
		}
		if err != nil {
			k.setLast(err)
			continue
		}
		k.setLast(nil)
		if t, perr := time.Parse(time.RFC3339, res.ExpiresAt); perr == nil {
			end = t
		}
	}
}
