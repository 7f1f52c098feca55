package provisioner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
	"github.com/sandbox-broker/sandbox-broker/pkg/aio"
)

// AIO client errors.
var (
	// ErrImageTooOld: the sandbox answers but has no /v1/bash/exec (an AIO
	// sandbox image older than the exec API). Not retryable.
	ErrImageTooOld = errors.New("AIO sandbox image too old: no /v1/bash/exec")
	// ErrCommandTimeout: a command passed its hard timeout and was killed
	// (AIO status timed_out). Run wraps it with context.DeadlineExceeded.
	ErrCommandTimeout = errors.New("command timed out")
	// ErrNotReady: a new sandbox's AIO API did not answer in Timeouts.Ready.
	ErrNotReady = errors.New("AIO sandbox not ready")
)

// envNamePattern is the shape of core.Command.Env keys.
var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// aioEnvelope is the AIO API's response wrapper; a 200 with success=false
// is an error whose data may be a FileOperationError.
type aioEnvelope = aio.Response[json.RawMessage]

// aioFailed returns the error of a success=false envelope, or nil.
func aioFailed(e aioEnvelope, op string) error {
	fe, failed := aio.Failure(e)
	if !failed {
		return nil
	}
	msg := fe.Message
	if fe.ErrorType != "" {
		msg = fe.ErrorType + ": " + msg
	}
	pe := &core.ProviderError{Op: op, StatusCode: http.StatusOK, Message: msg, Ambiguous: fe.Retryable}
	if fe.ErrorType == aio.ErrorTypeNotFound {
		return providerhttp.WithCause(pe, core.ErrFileNotFound)
	}
	return pe
}

// aioBase returns the AIO API base of ref (its endpoint URL).
func aioBase(ref core.SandboxRef) (string, error) {
	if ref.Endpoint.URL == "" {
		return "", &core.ValidationError{Field: "sandbox_url", Message: "sandbox has no AIO URL"}
	}
	return strings.TrimRight(ref.Endpoint.URL, "/"), nil
}

// aioHeaders sets the bearer token (AIO JWT auth) when ref carries one.
func aioHeaders(h http.Header, ref core.SandboxRef) {
	aio.SetAuth(h, ref.Endpoint.AccessToken)
}

// goneOr asks the provisioner whether ref's sandbox still exists after an
// AIO call failed: core.ErrSandboxGone when it says 404, else fallback.
func (c *Client) goneOr(ctx context.Context, ref core.SandboxRef, op string, fallback error) error {
	gctx, cancel := core.CleanupContext(ctx, c.timeouts.Get)
	defer cancel()
	if _, err := c.GetSandbox(gctx, ref.ID); errors.Is(err, core.ErrSandboxGone) {
		return fmt.Errorf("provisioner %s in %s: %w", op, ref.ID, core.ErrSandboxGone)
	}
	return fallback
}

// WaitReady polls GET /v1/sandbox until it answers 200 (without
// success=false), for at most Timeouts.Ready.
//
// Errors: ErrNotReady (wrapped in a certain *core.ProviderError) with the
// last failure; ctx's error when it ends first.
func (c *Client) WaitReady(ctx context.Context, ref core.SandboxRef) error {
	base, err := aioBase(ref)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(c.timeouts.Ready)
	var last error
	for {
		last = c.readyOnce(ctx, base, ref)
		if last == nil {
			return nil
		}
		if ctx.Err() != nil {
			return providerhttp.Transport("wait ready", ctx.Err())
		}
		if time.Now().After(deadline) {
			return providerhttp.WithCause(certain("wait ready", fmt.Sprintf("%v after %s: %v", ErrNotReady, c.timeouts.Ready, last)), ErrNotReady)
		}
		if err := sleepCtx(ctx, c.opts.PollInterval); err != nil {
			return providerhttp.Transport("wait ready", err)
		}
	}
}

// readyOnce is one GET /v1/sandbox bounded by 5 s.
func (c *Client) readyOnce(ctx context.Context, base string, ref core.SandboxRef) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+aio.PathContext, nil)
	if err != nil {
		return err
	}
	aioHeaders(req.Header, ref)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, replyMessage(b))
	}
	var env aioEnvelope
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("malformed /v1/sandbox reply: %w", err)
	}
	return aioFailed(env, "wait ready")
}

// Run runs cmd.Script with bash through POST /v1/bash/exec in sync mode:
// per-call env, exec_dir = cmd.Cwd (else Options.Home), hard_timeout =
// cmd.Timeout (else Timeouts.Command, rounded up to seconds), output
// untruncated. The HTTP call is bounded by the timeout plus
// Timeouts.CommandMargin. A non-zero exit code is not an error.
//
// Errors: *core.ValidationError for a bad env name; core.ErrSandboxGone
// when the call fails and the provisioner says the sandbox is gone;
// ErrImageTooOld on a 404 from a live sandbox; ErrCommandTimeout (with
// context.DeadlineExceeded, and the partial output) on status timed_out;
// else a *core.ProviderError (ambiguous for transport errors and 5xx).
func (c *Client) Run(ctx context.Context, ref core.SandboxRef, cmd core.Command) (core.CommandResult, error) {
	const op = "run command"
	for k := range cmd.Env {
		if !envNamePattern.MatchString(k) {
			return core.CommandResult{}, &core.ValidationError{Field: "env", Message: fmt.Sprintf("%q must match %s", k, envNamePattern)}
		}
	}
	base, err := aioBase(ref)
	if err != nil {
		return core.CommandResult{}, err
	}
	timeout := cmd.Timeout
	if timeout <= 0 {
		timeout = c.timeouts.Command
	}
	secs := math.Ceil(timeout.Seconds())
	cwd := cmd.Cwd
	if cwd == "" {
		cwd = c.opts.Home
	}
	body, err := json.Marshal(aio.SyncExec(cmd.Script, cwd, cmd.Env, secs))
	if err != nil {
		return core.CommandResult{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout+c.timeouts.CommandMargin)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, base+aio.PathExec, bytes.NewReader(body))
	if err != nil {
		return core.CommandResult{}, err
	}
	aioHeaders(req.Header, ref)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		if isCtxErr(ctx, err) {
			return core.CommandResult{}, providerhttp.Transport(op, err)
		}
		return core.CommandResult{}, c.goneOr(ctx, ref, op, providerhttp.Transport(op, err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return core.CommandResult{}, providerhttp.Transport(op, err)
	}
	r := reply{status: resp.StatusCode, body: b}
	switch {
	case r.status == http.StatusNotFound:
		return core.CommandResult{}, c.goneOr(ctx, ref, op, providerhttp.WithCause(certain(op, ErrImageTooOld.Error()+": "+replyMessage(b)), ErrImageTooOld))
	case r.status == http.StatusBadGateway || r.status == http.StatusServiceUnavailable || r.status == http.StatusGatewayTimeout:
		return core.CommandResult{}, c.goneOr(ctx, ref, op, statusError(op, r))
	case r.status != http.StatusOK:
		return core.CommandResult{}, statusError(op, r)
	}
	var env aioEnvelope
	if err := json.Unmarshal(b, &env); err != nil {
		return core.CommandResult{}, &core.ProviderError{Op: op, StatusCode: r.status, Message: "malformed exec reply", Ambiguous: true}
	}
	if err := aioFailed(env, op); err != nil {
		return core.CommandResult{}, err
	}
	return execResult(env.Data, r.status, timeout)
}

// execResult reads a sync exec's result (data, in a reply of status):
// the command's output and exit code, or why its outcome is unknown.
func execResult(data json.RawMessage, status int, timeout time.Duration) (core.CommandResult, error) {
	const op = "run command"
	var res aio.ExecResult
	if err := json.Unmarshal(data, &res); err != nil {
		return core.CommandResult{}, &core.ProviderError{Op: op, StatusCode: status, Message: "malformed exec result", Ambiguous: true}
	}
	out := core.CommandResult{ExitCode: -1}
	if res.Stdout != "" {
		out.Stdout = []byte(res.Stdout)
	}
	if res.Stderr != "" {
		out.Stderr = []byte(res.Stderr)
	}
	if res.ExitCode != nil {
		out.ExitCode = *res.ExitCode
	}
	switch res.Status {
	case aio.StatusCompleted:
		if res.ExitCode == nil {
			return out, &core.ProviderError{Op: op, Message: "completed without an exit code", Ambiguous: true}
		}
		return out, nil
	case aio.StatusTimedOut:
		return out, fmt.Errorf("provisioner %s: %w after %s: %w", op, ErrCommandTimeout, timeout, context.DeadlineExceeded)
	default: // killed, running, pending: the outcome is unknown
		return out, &core.ProviderError{Op: op, Message: "command ended with status " + res.Status, Ambiguous: true}
	}
}

// OpenFile streams path with GET /v1/file/download?path=… . The wait for
// headers is bounded by Timeouts.FileHeader, the body by ctx (or Close).
// With maxBytes > 0 the reader fails with *core.FileTooLargeError as soon
// as byte maxBytes+1 arrives (or at once when Content-Length says so).
//
// Errors: core.ErrFileNotFound on 404 from a live sandbox;
// core.ErrSandboxGone when the provisioner says it is gone; else a
// *core.ProviderError.
func (c *Client) OpenFile(ctx context.Context, ref core.SandboxRef, path string, maxBytes int64) (io.ReadCloser, error) {
	const op = "read file"
	base, err := aioBase(ref)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, aio.DownloadURL(base, path), nil)
	if err != nil {
		return nil, err
	}
	aioHeaders(req.Header, ref)
	resp, cancel, err := providerhttp.DoHeaderTimeout(c.http, req, c.timeouts.FileHeader)
	if err != nil {
		if isCtxErr(ctx, err) {
			return nil, providerhttp.Transport(op, err)
		}
		return nil, c.goneOr(ctx, ref, op, providerhttp.Transport(op, err))
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel(nil)
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		r := reply{status: resp.StatusCode, body: b}
		switch {
		case r.status == http.StatusNotFound:
			return nil, c.goneOr(ctx, ref, op, fmt.Errorf("provisioner %s %q in %s: %w", op, path, ref.ID, core.ErrFileNotFound))
		case r.status >= 500:
			return nil, c.goneOr(ctx, ref, op, statusError(op, r))
		default:
			return nil, statusError(op, r)
		}
	}
	if maxBytes > 0 && resp.ContentLength > maxBytes {
		resp.Body.Close()
		cancel(nil)
		return nil, &core.FileTooLargeError{Path: path, MaxBytes: maxBytes}
	}
	return core.CappedReader(resp.Body, cancel, path, maxBytes), nil
}

// WriteFile creates path's parent directories (mkdir -p through Run, as
// the upload API does not promise to) and streams r to path with
// POST /v1/file/upload (multipart/form-data: file, path), bounded by ctx.
//
// Errors: those of Run for the mkdir; core.ErrSandboxGone when the
// provisioner says the sandbox is gone; a success=false reply as a
// *core.ProviderError carrying its error_type; else a *core.ProviderError.
func (c *Client) WriteFile(ctx context.Context, ref core.SandboxRef, path string, r io.Reader) error {
	const op = "write file"
	base, err := aioBase(ref)
	if err != nil {
		return err
	}
	if dir := parentDir(path); dir != "" {
		res, err := c.Run(ctx, ref, core.Command{Script: `mkdir -p -- "$SBX_DIR"`, Env: map[string]string{"SBX_DIR": dir}, Timeout: 30 * time.Second})
		if err != nil {
			return err
		}
		if res.ExitCode != 0 {
			return certain(op, fmt.Sprintf("mkdir %s: exit %d: %s", dir, res.ExitCode, bytes.TrimSpace(res.Stderr)))
		}
	}
	pr, contentType := aio.UploadBody(path, r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+aio.PathUpload, pr)
	if err != nil {
		pr.CloseWithError(err)
		return err
	}
	aioHeaders(req.Header, ref)
	req.Header.Set("Content-Type", contentType)
	resp, err := c.http.Do(req)
	if err != nil {
		pr.CloseWithError(err)
		if isCtxErr(ctx, err) {
			return providerhttp.Transport(op, err)
		}
		return c.goneOr(ctx, ref, op, providerhttp.Transport(op, err))
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	rep := reply{status: resp.StatusCode, body: b}
	switch {
	case rep.status == http.StatusNotFound || rep.status >= 500:
		return c.goneOr(ctx, ref, op, statusError(op, rep))
	case rep.status != http.StatusOK:
		return statusError(op, rep)
	}
	var env aioEnvelope
	if err := json.Unmarshal(b, &env); err != nil {
		return &core.ProviderError{Op: op, StatusCode: rep.status, Message: "malformed upload reply", Ambiguous: true}
	}
	return aioFailed(env, op)
}

// parentDir returns the directory part of a slash path ("" for none or "/").
func parentDir(p string) string {
	i := strings.LastIndex(p, "/")
	if i <= 0 {
		return ""
	}
	return p[:i]
}
