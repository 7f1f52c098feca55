package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// InvokePath is the Lambda Invoke API path the emulator serves.
const InvokePath = "/2015-03-31/functions/function/invocations"

// maxInvokeResponse bounds a function response read by the gateway (Lambda's
// synchronous payload limit is 6 MB).
const maxInvokeResponse = 6 << 20

// lambdaFn is one function of the template, run as a pool of emulator
// processes: the emulator serves one invocation at a time (a concurrent one
// is refused), while real Lambda runs invocations side by side.
type lambdaFn struct {
	fn        Function
	instances []*rieInstance
	free      chan *rieInstance
	client    *http.Client
	// restart starts instance i again when it died (nil: never).
	restart func(ctx context.Context, i int) (*rieInstance, error)
	log     *slog.Logger
}

// rieInstance is one emulator process. An invocation holds it
// exclusively (it is out of the free channel), and only that invocation
// replaces a dead one's process; mu guards url and child against stop.
type rieInstance struct {
	index int
	mu    sync.Mutex
	url   string // invoke URL
	child *child
}

// fnLaunch is how the emulators of one function are started.
type fnLaunch struct {
	rie       string   // the emulator binary
	bootstrap string   // the function's binary
	logDir    string   // fn-<name>-<i>.log go here
	env       []string // the stack's and the caller's environment
}

// startFunction starts n emulators for fn, each on its own free ports, and
// waits until they accept connections. Nothing is invoked yet.
func startFunction(ctx context.Context, fn Function, n int, l fnLaunch) (*lambdaFn, error) {
	bootstrap, env := l.bootstrap, l.env
	if _, err := os.Stat(bootstrap); err != nil {
		return nil, fmt.Errorf("function %s: %w (run make build)", fn.Name, err)
	}
	lf := &lambdaFn{fn: fn, free: make(chan *rieInstance, n), client: &http.Client{}, log: slog.Default()}
	// The template's values first: the stack's and the caller's override
	// them (os/exec keeps the last of duplicate keys).
	fnEnv := append(append(append([]string{}, fn.Env...), env...),
		"AWS_LAMBDA_FUNCTION_NAME="+fn.Name,
		"AWS_LAMBDA_FUNCTION_TIMEOUT="+strconv.Itoa(int(fn.Timeout/time.Second)),
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE="+strconv.Itoa(fn.MemoryMB),
		"_HANDLER=bootstrap",
	)
	launch := fnLaunch{rie: l.rie, bootstrap: bootstrap, logDir: l.logDir, env: fnEnv}
	lf.restart = func(ctx context.Context, i int) (*rieInstance, error) { return startInstance(ctx, fn, i, launch) }
	for i := 0; i < n; i++ {
		inst, err := startInstance(ctx, fn, i, launch)
		if err != nil {
			lf.stop()
			return nil, err
		}
		lf.instances = append(lf.instances, inst)
		lf.free <- inst
	}
	return lf, nil
}

// startInstance starts emulator i of fn (l.env is the function's whole
// environment).
func startInstance(ctx context.Context, fn Function, i int, l fnLaunch) (*rieInstance, error) {
	rie, bootstrap, logDir, env := l.rie, l.bootstrap, l.logDir, l.env
	name := fmt.Sprintf("%s-%d", fn.Name, i)
	var last error
	for attempt := 0; attempt < 3; attempt++ { // a port picked as free may be taken meanwhile
		addrs, err := freeAddrs(2)
		if err != nil {
			return nil, err
		}
		addr, apiAddr := addrs[0], addrs[1]
		c, err := startChild("aws-lambda-rie "+name, filepath.Dir(bootstrap), rie,
			[]string{"--runtime-interface-emulator-address", addr, "--runtime-api-address", apiAddr, "--log-level", "warn", bootstrap},
			env, filepath.Join(logDir, "fn-"+name+".log"))
		if err != nil {
			return nil, err
		}
		err = c.waitReady(ctx, 30*time.Second, func(ctx context.Context) error {
			if err := dialable(ctx, addr); err != nil {
				return err
			}
			// The emulator binds its runtime API in the background and
			// panics if that port was taken meanwhile: it is ready only
			// once it holds both.
			for _, a := range []string{addr, apiAddr} {
				if !ownsListener(c.cmd.Process.Pid, a) {
					return fmt.Errorf("%s is served by another process", a)
				}
			}
			return nil
		})
		if err == nil {
			return &rieInstance{index: i, url: "http://" + addr + InvokePath, child: c}, nil
		}
		c.stop(time.Second)
		last = err
	}
	return nil, fmt.Errorf("function %s: %w", fn.Name, last)
}

// InvokeError is a failed invocation: the emulator refused, the function
// timed out or crashed (a reply that is not JSON), or the handler returned
// an error (Lambda's errorMessage/errorType reply).
type InvokeError struct {
	Function string
	Status   int    // emulator HTTP status (200 for handler errors)
	Body     string // emulator reply, truncated
}

func (e *InvokeError) Error() string {
	return fmt.Sprintf("invoke %s: HTTP %d: %s", e.Function, e.Status, e.Body)
}

// invoke sends payload to a free instance (waiting for one) and returns the
// function's response payload. A handler error is an *InvokeError with
// Status 200. ctx bounds the wait for a free instance; the invocation
// itself is bounded by the function's timeout plus 10 s.
func (f *lambdaFn) invoke(ctx context.Context, payload []byte) ([]byte, error) {
	var inst *rieInstance
	select {
	case inst = <-f.free:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { f.free <- inst }()
	if err := f.revive(ctx, inst); err != nil {
		return nil, err
	}
	// Once sent, an invocation runs to its end even if the caller goes away
	// (as in Lambda): the emulator would refuse the next one meanwhile, so
	// the instance returns to the pool only when it is done.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.fn.Timeout+10*time.Second)
	defer cancel()
	inst.mu.Lock()
	url := inst.url
	inst.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("invoke %s: %w", f.fn.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxInvokeResponse+1))
	if err != nil {
		return nil, fmt.Errorf("invoke %s: read reply: %w", f.fn.Name, err)
	}
	if len(body) > maxInvokeResponse {
		return nil, fmt.Errorf("invoke %s: reply exceeds %d bytes", f.fn.Name, maxInvokeResponse)
	}
	if resp.StatusCode != http.StatusOK || isHandlerError(body) || !json.Valid(body) {
		// A reply that is not JSON is no function response: the emulator's
		// own report of a timeout ("Task timed out after …") or a crash.
		return nil, &InvokeError{Function: f.fn.Name, Status: resp.StatusCode, Body: truncate(string(body), 2000)}
	}
	return body, nil
}

// invokeWithin is invoke bounded by ctx: when ctx ends first it returns
// errIntegrationTimeout (ctx's deadline) or ctx's error, and an
// invocation already sent runs on to its end, as in Lambda.
func (f *lambdaFn) invokeWithin(ctx context.Context, payload []byte) ([]byte, error) {
	type reply struct {
		out []byte
		err error
	}
	done := make(chan reply, 1)
	go func() {
		out, err := f.invoke(ctx, payload)
		done <- reply{out, err}
	}()
	select {
	case r := <-done:
		if r.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, errIntegrationTimeout // it ended waiting for a free instance
		}
		return r.out, r.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, errIntegrationTimeout
		}
		return nil, ctx.Err()
	}
}

// isHandlerError recognises Lambda's error reply {"errorMessage", "errorType"}.
func isHandlerError(body []byte) bool {
	var v struct {
		ErrorMessage *string `json:"errorMessage"`
		StatusCode   *int    `json:"statusCode"`
	}
	return jsonUnmarshal(body, &v) == nil && v.ErrorMessage != nil && v.StatusCode == nil
}

// revive starts inst's emulator again when it died (a crash, or a
// concurrent invocation sent to it from outside the stack, which the
// emulator answers by exiting). The function's other instances and the
// rest of the stack go on meanwhile.
func (f *lambdaFn) revive(ctx context.Context, inst *rieInstance) error {
	inst.mu.Lock()
	old := inst.child
	inst.mu.Unlock()
	select {
	case <-old.exited:
	default:
		return nil
	}
	if f.restart == nil {
		return fmt.Errorf("function %s: emulator exited (%v)", f.fn.Name, old.cmd.ProcessState)
	}
	f.log.Warn("function emulator exited; starting it again", "function", f.fn.Name, "instance", inst.index,
		"state", fmt.Sprint(old.cmd.ProcessState))
	ni, err := f.restart(ctx, inst.index)
	if err != nil {
		return fmt.Errorf("function %s: restart emulator %d: %w", f.fn.Name, inst.index, err)
	}
	inst.mu.Lock()
	inst.url, inst.child = ni.url, ni.child
	inst.mu.Unlock()
	return nil
}

func (f *lambdaFn) stop() {
	for _, inst := range f.instances {
		inst.mu.Lock()
		c := inst.child
		inst.mu.Unlock()
		c.stop(3 * time.Second)
	}
}

var errNoFunction = errors.New("no such function")

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
