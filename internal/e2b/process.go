package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// envKey is the shape of environment variable names accepted by Run: a
// name that is not a shell identifier is refused before anything is sent.
var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ErrCommandTimeout: a process did not end within its timeout. Run wraps it
// together with context.DeadlineExceeded.
var ErrCommandTimeout = errors.New("command timed out")

// OutputTruncatedError: a process wrote more than MaxOutputBytes to a
// stream. Run returns it together with a filled CommandResult whose output
// holds the last MaxOutputBytes of each stream.
type OutputTruncatedError struct {
	Stream string // "stdout" or "stderr"
	Total  int64  // bytes the process wrote to the stream
	Kept   int64  // bytes kept (the tail)
}

func (e *OutputTruncatedError) Error() string {
	return fmt.Sprintf("%s truncated: kept the last %d of %d bytes", e.Stream, e.Kept, e.Total)
}

// statusRecorder remembers the HTTP status of the last response, which
// Connect folds into a code (502 and 503 both become unavailable).
type statusRecorder struct {
	doer   connect.HTTPClient
	status atomic.Int32
}

func (s *statusRecorder) Do(r *http.Request) (*http.Response, error) {
	resp, err := s.doer.Do(r)
	if resp != nil {
		s.status.Store(int32(resp.StatusCode))
	}
	return resp, err
}

// errRunDeadline is the cancel cause when Run's own bound passes.
var errRunDeadline = errors.New("run deadline")

// Run runs cmd.Script with `/bin/bash -l -c` through envd's
// process.Process/Start (Connect server streaming, JSON codec) and collects
// its output until the end event. Env values travel only in the process's
// envs, never in the script.
//
// The process timeout (Command.Timeout, else Timeouts.Command) is sent as
// Connect-Timeout-Ms (capped by ctx's deadline); the call as a whole is
// bounded by that plus Timeouts.CommandMargin. A non-zero exit code is not
// an error.
//
// Errors: *core.ValidationError for a bad env key or empty sandbox id
// (nothing is sent); core.ErrSandboxGone when envd answers 502, or
// not_found/unavailable and the control plane confirms the sandbox is gone;
// a certain *core.ProviderError when envd answers 409 (E2B refuses envd
// calls to a paused sandbox so; nothing ran);
// ErrCommandTimeout (with context.DeadlineExceeded) when the process
// outlives its timeout (the result then holds the output so far and the
// process is sent SIGKILL); *OutputTruncatedError with a filled result;
// otherwise a *core.ProviderError (Ambiguous unless envd refused the call,
// e.g. unauthenticated). A stream that ends without an end event is an
// error: the command's outcome is unknown.
func (c *Client) Run(ctx context.Context, ref core.SandboxRef, cmd core.Command) (core.CommandResult, error) {
	const op = "run"
	for k := range cmd.Env {
		if !envKey.MatchString(k) {
			return core.CommandResult{}, &core.ValidationError{Field: "env", Message: fmt.Sprintf("key %q must match %s", k, envKey)}
		}
	}
	if err := core.ValidateSandboxID(ref.ID); err != nil {
		return core.CommandResult{}, err
	}
	timeout := or(cmd.Timeout, c.timeouts.Command)
	serverTimeout := timeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < serverTimeout {
		serverTimeout = time.Until(dl)
	}

	// Connect derives Connect-Timeout-Ms from the ctx deadline; the call's
	// ctx carries none (cancellation only) so the header states the process
	// timeout while the call itself gets the margin on top.
	runCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	stopParent := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stopParent()
	timer := time.AfterFunc(timeout+c.timeouts.CommandMargin, func() { cancel(errRunDeadline) })
	defer timer.Stop()

	rec := &statusRecorder{doer: c.http}
	client := connect.NewClient[envd.StartRequest, envd.StartResponse](rec, c.envdBase(ref)+envd.ProcedureStart,
		connect.WithCodec(envd.Codec{}), connect.WithReadMaxBytes(maxReplyBytes))
	started := time.Now()
	call := runCall{ctx: ctx, runCtx: runCtx, ref: ref, timeout: timeout, serverDeadline: started.Add(serverTimeout), rec: rec}
	stream, err := client.CallServerStream(runCtx, startRequest(ref, cmd, serverTimeout))
	if err != nil {
		return core.CommandResult{}, c.runError(call, err, 0)
	}
	defer stream.Close()

	stdout := tailBuffer{max: c.maxOutput}
	stderr := tailBuffer{max: c.maxOutput}
	var pid uint32
	var end *envd.EndEvent
	for stream.Receive() {
		ev := stream.Msg().Event
		switch {
		case ev.Start != nil:
			pid = ev.Start.Pid
		case ev.Data != nil:
			stdout.Write(ev.Data.Stdout)
			stderr.Write(ev.Data.Stderr)
		case ev.End != nil:
			end = ev.End
		}
	}
	result := core.CommandResult{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	if err := stream.Err(); err != nil {
		return result, c.runError(call, err, pid)
	}
	if end == nil {
		return result, &core.ProviderError{Op: op, Message: "process stream ended without an end event: outcome unknown", Ambiguous: true}
	}
	result.ExitCode = int(end.ExitCode)
	if !end.Exited && time.Since(started) >= serverTimeout {
		// envd stopped the process at its deadline.
		return result, fmt.Errorf("e2b %s: %w after %s (%s): %w", op, ErrCommandTimeout, timeout, end.Status, context.DeadlineExceeded)
	}
	return result, truncated(&stdout, &stderr)
}

// startRequest is the process.Process/Start request running cmd's script
// in bash, its env only in the process's envs, with the process timeout
// serverTimeout.
func startRequest(ref core.SandboxRef, cmd core.Command, serverTimeout time.Duration) *connect.Request[envd.StartRequest] {
	req := connect.NewRequest(&envd.StartRequest{Process: envd.ProcessConfig{
		Cmd:  "/bin/bash",
		Args: []string{"-l", "-c", cmd.Script},
		Envs: cmd.Env,
		Cwd:  cmd.Cwd,
	}})
	setEnvdHeaders(req.Header(), ref)
	req.Header().Set(envd.HeaderKeepalive, "50")
	req.Header().Set("Connect-Timeout-Ms", strconv.FormatInt(max(serverTimeout.Milliseconds(), 1), 10))
	return req
}

// truncated is an *OutputTruncatedError for the first of stdout and stderr
// that kept less than it received, else nil.
func truncated(stdout, stderr *tailBuffer) error {
	for _, t := range []struct {
		name string
		b    *tailBuffer
	}{{"stdout", stdout}, {"stderr", stderr}} {
		if kept := min(t.b.total, int64(t.b.max)); t.b.total > kept {
			return &OutputTruncatedError{Stream: t.name, Total: t.b.total, Kept: kept}
		}
	}
	return nil
}

// runCall is one process.Process/Start call, as runError needs it.
type runCall struct {
	ctx            context.Context // the caller's
	runCtx         context.Context // the call's own, canceled (errRunDeadline) at its deadline
	ref            core.SandboxRef
	timeout        time.Duration // the process timeout
	serverDeadline time.Time     // when envd was told to stop the process
	rec            *statusRecorder
}

// runError classifies a failed Start call. serverDeadline is when envd was
// told to stop the process; a canceled or deadline_exceeded stream after it
// is the process timeout.
func (c *Client) runError(call runCall, err error, pid uint32) error {
	const op = "run"
	ctx, runCtx, ref, timeout, serverDeadline, rec := call.ctx, call.runCtx, call.ref, call.timeout, call.serverDeadline, call.rec
	code := connect.CodeOf(err)
	timedOut := errors.Is(context.Cause(runCtx), errRunDeadline) || code == connect.CodeDeadlineExceeded ||
		(code == connect.CodeCanceled && !time.Now().Before(serverDeadline))
	if timedOut || ctx.Err() != nil {
		if pid != 0 {
			c.killProcess(ctx, ref, pid)
		}
	}
	if ctx.Err() != nil {
		return providerhttp.WithCause(&core.ProviderError{Op: op, Message: "canceled: " + context.Cause(ctx).Error(), Ambiguous: true}, context.Cause(ctx))
	}
	if timedOut {
		return fmt.Errorf("e2b %s: %w after %s: %w", op, ErrCommandTimeout, timeout, context.DeadlineExceeded)
	}
	return c.envdError(ctx, ref, op, int(rec.status.Load()), connect.CodeOf(err), err)
}

// envdError classifies a failed envd call from its HTTP status and Connect
// code (connect.CodeUnknown for plain HTTP calls).
func (c *Client) envdError(ctx context.Context, ref core.SandboxRef, op string, status int, code connect.Code, err error) error {
	if status == http.StatusBadGateway {
		// E2B's edge answers 502 for a sandbox that is not running; the SDK
		// reads it so (isRunning, "sandbox not running").
		return fmt.Errorf("e2b %s in %s: envd HTTP 502: %w", op, ref.ID, core.ErrSandboxGone)
	}
	if status == http.StatusServiceUnavailable || code == connect.CodeNotFound || code == connect.CodeUnavailable {
		if c.confirmGone(ctx, ref.ID) {
			return fmt.Errorf("e2b %s in %s: %w", op, ref.ID, core.ErrSandboxGone)
		}
	}
	var pe *core.ProviderError
	if errors.As(err, &pe) {
		return err // already classified from the reply
	}
	pe = &core.ProviderError{Op: op, StatusCode: status, Message: err.Error(), Ambiguous: true}
	switch {
	case status == http.StatusUnauthorized || code == connect.CodeUnauthenticated:
		pe.Message = "envd refused the access token: " + pe.Message
		pe.Ambiguous = false
	case code == connect.CodeInvalidArgument || code == connect.CodePermissionDenied:
		pe.Ambiguous = false
	case status == http.StatusConflict:
		// E2B's edge refuses every envd call to a paused sandbox with 409.
		pe.Message = "sandbox is paused: " + pe.Message
		pe.Ambiguous = false
	}
	return providerhttp.WithCause(pe, err)
}

// confirmTimeout bounds the clean-ups after a failed command (is the
// sandbox gone, kill the timed-out process), within the invocation's time.
const confirmTimeout = 5 * time.Second

// confirmGone asks the control plane whether sandbox id is gone.
func (c *Client) confirmGone(ctx context.Context, id string) bool {
	ctx, cancel := core.CleanupContext(ctx, confirmTimeout)
	defer cancel()
	_, err := c.Info(ctx, id)
	return errors.Is(err, core.ErrSandboxGone)
}

// killProcess sends SIGKILL to pid (envd SendSignal), best effort.
func (c *Client) killProcess(ctx context.Context, ref core.SandboxRef, pid uint32) {
	ctx, cancel := core.CleanupContext(ctx, confirmTimeout)
	defer cancel()
	client := connect.NewClient[envd.SendSignalRequest, envd.Empty](c.http, c.envdBase(ref)+envd.ProcedureSendSignal,
		connect.WithCodec(envd.Codec{}))
	req := connect.NewRequest(&envd.SendSignalRequest{Process: envd.ProcessSelector{Pid: envd.Uint(pid)}, Signal: envd.Enum{Name: envd.SignalKill}})
	setEnvdHeaders(req.Header(), ref)
	if _, err := client.CallUnary(ctx, req); err != nil {
		c.log.WarnContext(ctx, "e2b: kill of timed-out process failed", "sandbox_id", ref.ID, "pid", pid, "error", err)
	}
}

// envdBase is the envd base URL for ref.
func (c *Client) envdBase(ref core.SandboxRef) string {
	if ref.Endpoint.URL != "" {
		return ref.Endpoint.URL
	}
	return c.envdURL(ref.ID, DefaultDomain)
}

// setEnvdHeaders sets the routing and auth headers of every envd call
// (E2b-Sandbox-Id, X-Access-Token): never the API key.
func setEnvdHeaders(h http.Header, ref core.SandboxRef) {
	envd.SetHeaders(h, ref.ID, ref.Endpoint.AccessToken)
}

// tailBuffer keeps the last max bytes written and counts all of them.
type tailBuffer struct {
	max   int
	buf   []byte
	total int64
}

func (t *tailBuffer) Write(p []byte) {
	t.total += int64(len(p))
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		n := copy(t.buf, t.buf[len(t.buf)-t.max:])
		t.buf = t.buf[:n]
	}
}

func (t *tailBuffer) Bytes() []byte {
	if len(t.buf) > t.max {
		return append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
	return t.buf
}
