// Package faults injects failures in front of the broker's dependencies
// (the provider's control plane and envd, DynamoDB, S3) for tests. A
// Transport is an http.RoundTripper placed in a client's http.Client: for
// a request an armed rule matches, it fails, stalls past the caller's
// timeout, cuts the response, or applies the request and loses the reply
// (or, no fault, holds it until the rule is disarmed); every other
// request passes through untouched.
package faults

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Kind is what an armed rule does to a matching request.
type Kind string

// Fault kinds.
const (
	// Fail refuses the request without sending it (a connection error):
	// certainly not applied, though the caller cannot tell.
	Fail Kind = "fail"
	// Stall holds the request, never sent, until its context ends: a
	// dependency that stopped answering, past any timeout.
	Stall Kind = "stall"
	// Cut sends the request and returns the reply with its body cut in
	// the middle: applied, answer unreadable.
	Cut Kind = "cut"
	// Lost sends the request and loses the reply (the connection drops
	// after the dependency applied it).
	Lost Kind = "lost"
	// Hold holds the request, unsent, until the rule is disarmed, then
	// sends it (or fails it with its context's error if that ends
	// first): a caller too slow, not a fault, so not among Kinds. Placed
	// under another Transport, it holds some calls while that one faults
	// others.
	Hold Kind = "hold"
)

// Kinds lists every fault kind.
func Kinds() []Kind { return []Kind{Fail, Stall, Cut, Lost} }

// ErrInjected is the error of Fail and Lost (wrapped).
var ErrInjected = errors.New("faults: injected")

// Request is what a rule sees of a request: its method, path, headers and
// body (read in full and restored for sending).
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// Match selects the requests a rule applies to.
type Match func(r Request) bool

// Transport wraps Next (http.DefaultTransport when nil) with one armed
// rule at a time. It is safe for concurrent use.
type Transport struct {
	Next http.RoundTripper

	mu     sync.Mutex
	choose func(Request) (Kind, bool)
	hits   int
	// released is closed by Disarm: held requests go on.
	released chan struct{}
}

var _ http.RoundTripper = (*Transport)(nil)

// Arm makes every later request m matches suffer kind, until Disarm.
func (t *Transport) Arm(kind Kind, m Match) {
	t.ArmFunc(func(r Request) (Kind, bool) { return kind, m(r) })
}

// ArmFunc makes every later request suffer the kind choose returns, when
// it returns true, until Disarm (random faults: choose rolls dice).
func (t *Transport) ArmFunc(choose func(Request) (Kind, bool)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.release()
	t.choose, t.hits, t.released = choose, 0, make(chan struct{})
}

// Disarm stops injecting, lets held requests go on and returns how many
// requests the rule hit.
func (t *Transport) Disarm() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.release()
	t.choose = nil
	return t.hits
}

// release lets the requests held so far go on (t.mu held).
func (t *Transport) release() {
	if t.released != nil {
		close(t.released)
		t.released = nil
	}
}

// Hits reports how many requests the armed rule hit so far.
func (t *Transport) Hits() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.hits
}

func (t *Transport) next() http.RoundTripper {
	if t.Next != nil {
		return t.Next
	}
	return http.DefaultTransport
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	choose, released := t.choose, t.released
	t.mu.Unlock()
	if choose == nil {
		return t.next().RoundTrip(req)
	}
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(b))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	kind, hit := choose(Request{Method: req.Method, Path: req.URL.Path, Header: req.Header, Body: body})
	if !hit {
		return t.next().RoundTrip(req)
	}
	t.mu.Lock()
	t.hits++
	t.mu.Unlock()
	switch kind {
	case Fail:
		return nil, fmt.Errorf("%w: connection refused (%s %s)", ErrInjected, req.Method, req.URL.Path)
	case Stall:
		<-req.Context().Done()
		return nil, req.Context().Err()
	case Hold:
		select {
		case <-released:
			return t.next().RoundTrip(req)
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	case Lost:
		resp, err := t.next().RoundTrip(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, fmt.Errorf("%w: connection reset after the request was applied (%s %s)", ErrInjected, req.Method, req.URL.Path)
	case Cut:
		resp, err := t.next().RoundTrip(req)
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		resp.Body = &cutBody{r: bytes.NewReader(b[:len(b)/2])}
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return resp, nil
	}
	return nil, fmt.Errorf("faults: unknown kind %q", kind)
}

// cutBody reads its bytes, then fails as a dropped connection would.
type cutBody struct{ r *bytes.Reader }

func (c *cutBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err == io.EOF {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func (c *cutBody) Close() error { return nil }

// Matchers.

// PathSuffix matches requests of method (any when "") whose path ends in
// suffix.
func PathSuffix(method, suffix string) Match {
	return func(r Request) bool {
		return (method == "" || r.Method == method) && strings.HasSuffix(r.Path, suffix)
	}
}

// PathContains matches requests of method (any when "") whose path
// contains part.
func PathContains(method, part string) Match {
	return func(r Request) bool {
		return (method == "" || r.Method == method) && strings.Contains(r.Path, part)
	}
}

// BodyContains narrows m to requests whose body contains part.
func BodyContains(m Match, part string) Match {
	return func(r Request) bool { return m(r) && bytes.Contains(r.Body, []byte(part)) }
}

// BodyLacks narrows m to requests whose body does not contain part.
func BodyLacks(m Match, part string) Match {
	return func(r Request) bool { return m(r) && !bytes.Contains(r.Body, []byte(part)) }
}

// DynamoDB matches DynamoDB calls of operation op (e.g. "UpdateItem",
// "TransactWriteItems"; "" for all) by their X-Amz-Target header.
func DynamoDB(op string) Match {
	return func(r Request) bool {
		target := r.Header.Get("X-Amz-Target")
		return strings.HasPrefix(target, "DynamoDB_") && (op == "" || strings.HasSuffix(target, "."+op))
	}
}
