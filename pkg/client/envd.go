package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// SandboxHome is the sandbox user's home directory; relative paths given to
// the envd helper are resolved against it (E2B's default user home; the
// broker prepares uploads/, outputs/ and workspace/ there).
const SandboxHome = "/home/user"

// DefaultFileTimeout bounds PutFile and GetFile unless their ctx is earlier.
const DefaultFileTimeout = 10 * time.Minute

// DefaultExecTimeout is a command's limit when Exec is given 0.
const DefaultExecTimeout = 10 * time.Minute

// envKeyPattern is what a per-call environment variable name must match
// (values never go into the command string, so they need no quoting).
var envKeyPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ErrFileNotFound means the path does not exist in the sandbox.
var ErrFileNotFound = errors.New("file not found in sandbox")

// ErrSandboxUnreachable means envd answered that the sandbox is not running
// (HTTP 502/503, or Connect code unavailable/not_found for a process start).
var ErrSandboxUnreachable = errors.New("sandbox not running or unreachable")

// EnvdError is a non-2xx answer from envd's file API.
type EnvdError struct {
	Op      string
	Status  int
	Message string
}

// Error renders "envd OP: HTTP status: message".
func (e *EnvdError) Error() string {
	return fmt.Sprintf("envd %s: HTTP %d: %s", e.Op, e.Status, e.Message)
}

// Envd talks to one sandbox's in-sandbox daemon with the acquire response's
// connection only (no provider API key): Connect RPC with the JSON codec for
// process.Process/Start (server streaming) and SendSignal, plain HTTP for
// GET/POST /files. Wire facts, as the official E2B JS SDK (npm e2b 2.x)
// sends them: headers E2b-Sandbox-Id, E2b-Sandbox-Port 49983,
// X-Access-Token, Connect-Protocol-Version 1.
type Envd struct {
	sandboxID string
	conn      Connection
	base      string
	http      *http.Client
}

// NewEnvd returns a helper for sandboxID reached through conn. It fails when
// the envd URL is not an absolute http(s) URL or the id is empty.
// httpClient may be nil (a client without its own timeout; every call is
// bounded by its context and the per-call limits).
func NewEnvd(sandboxID string, conn Connection, httpClient *http.Client) (*Envd, error) {
	base, httpClient, err := sandboxBase("envd", "envd url", sandboxID, conn.EnvdURL, httpClient)
	if err != nil {
		return nil, err
	}
	return &Envd{sandboxID: sandboxID, conn: conn, base: base, http: httpClient}, nil
}

// sandboxBase checks what NewEnvd and NewAIO are given: a non-empty
// sandboxID (the error is prefixed kind) and rawURL, an absolute http(s)
// URL (named what in the error). It returns rawURL without trailing
// slashes, and httpClient or, when nil, a client without its own timeout.
func sandboxBase(kind, what, sandboxID, rawURL string, httpClient *http.Client) (string, *http.Client, error) {
	if sandboxID == "" {
		return "", nil, fmt.Errorf("%s: empty sandbox id", kind)
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", nil, fmt.Errorf("%s %q: want an absolute http:// or https:// URL", what, rawURL)
	}
	if httpClient == nil {
		httpClient = &http.Client{}
	}
	return strings.TrimRight(rawURL, "/"), httpClient, nil
}

// getFile GETs u (headers set by setHeaders) and copies the body to w,
// returning the byte count. failed returns the error for an unsuccessful
// answer and nil for a successful one; request and copy errors are
// prefixed op. Envd and AIO GetFile share it.
func getFile(ctx context.Context, hc *http.Client, u string, setHeaders func(http.Header), op string, w io.Writer, failed func(*http.Response) error) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	setHeaders(req.Header)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	defer resp.Body.Close()
	if err := failed(resp); err != nil {
		return 0, err
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("%s: %w", op, err)
	}
	return n, nil
}

// ResolvePath makes p absolute: a relative path is taken from SandboxHome.
// The result is cleaned ("a/../b" -> "/home/user/b").
func ResolvePath(p string) string {
	if strings.HasPrefix(p, "/") {
		return path.Clean(p)
	}
	return path.Join(SandboxHome, p)
}

func (e *Envd) setHeaders(h http.Header) {
	envd.SetHeaders(h, e.sandboxID, e.conn.EnvdAccessToken)
}

// ExecRequest is one command to run in the sandbox.
type ExecRequest struct {
	// Script is run by "/bin/bash -l -c". Pass untrusted values in Env,
	// never inside Script.
	Script string
	// Env is the per-call environment; keys must match ^[A-Za-z_][A-Za-z0-9_]*$.
	Env map[string]string
	// Cwd is the working directory ("" = the sandbox user's home).
	Cwd string
	// Timeout ends the command (SIGKILL) after this long; 0 = DefaultExecTimeout.
	Timeout time.Duration
	// Stdout and Stderr receive the output as it arrives (nil discards).
	Stdout, Stderr io.Writer
}

// limit checks req.Env's keys against envKeyPattern and returns the
// command's limit: req.Timeout, or DefaultExecTimeout when not positive.
func (req ExecRequest) limit() (time.Duration, error) {
	for k := range req.Env {
		if !envKeyPattern.MatchString(k) {
			return 0, fmt.Errorf("env key %q: must match %s", k, envKeyPattern)
		}
	}
	if req.Timeout <= 0 {
		return DefaultExecTimeout, nil
	}
	return req.Timeout, nil
}

// ErrExecTimeout means the command ran past its timeout and was killed.
var ErrExecTimeout = errors.New("command timed out")

// Exec runs req.Script to completion and returns its exit code, streaming
// stdout and stderr to the writers as envd sends them. A non-zero exit code
// is not an error. Errors: ErrExecTimeout (wrapped) after req.Timeout,
// ErrSandboxUnreachable, a Connect error (*connect.Error) or ctx's error.
// When ctx ends or the timeout passes the process is sent SIGKILL.
func (e *Envd) Exec(ctx context.Context, req ExecRequest) (int, error) {
	timeout, err := req.limit()
	if err != nil {
		return -1, err
	}
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}

	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cl := connect.NewClient[envd.StartRequest, envd.StartResponse](e.http, e.base+envd.ProcedureStart, connect.WithCodec(envd.Codec{}))
	creq := connect.NewRequest(&envd.StartRequest{Process: envd.ProcessConfig{
		Cmd:  "/bin/bash",
		Args: []string{"-l", "-c", req.Script},
		Envs: req.Env,
		Cwd:  req.Cwd,
	}})
	e.setHeaders(creq.Header())
	creq.Header().Set(envd.HeaderKeepalive, "50")

	stream, err := cl.CallServerStream(runCtx, creq)
	if err != nil {
		return -1, e.execErr(ctx, runCtx, err)
	}
	defer stream.Close()
	var pid uint32
	for stream.Receive() {
		ev := stream.Msg().Event
		switch {
		case ev.Start != nil:
			pid = ev.Start.Pid
		case ev.Data != nil:
			if len(ev.Data.Stdout) > 0 {
				if _, err := stdout.Write(ev.Data.Stdout); err != nil {
					e.kill(pid)
					return -1, fmt.Errorf("write stdout: %w", err)
				}
			}
			if len(ev.Data.Stderr) > 0 {
				if _, err := stderr.Write(ev.Data.Stderr); err != nil {
					e.kill(pid)
					return -1, fmt.Errorf("write stderr: %w", err)
				}
			}
			if len(ev.Data.Pty) > 0 {
				if _, err := stdout.Write(ev.Data.Pty); err != nil {
					e.kill(pid)
					return -1, fmt.Errorf("write stdout: %w", err)
				}
			}
		case ev.End != nil:
			// Drain to the end-stream envelope so a server error is seen.
			for stream.Receive() {
			}
			if err := stream.Err(); err != nil {
				return -1, e.execErr(ctx, runCtx, err)
			}
			if ev.End.Error != "" && ev.End.ExitCode == 0 && !ev.End.Exited {
				return -1, fmt.Errorf("process ended without an exit code: %s", ev.End.Error)
			}
			return int(ev.End.ExitCode), nil
		}
	}
	err = stream.Err()
	if err == nil {
		err = errors.New("process exited without a result (stream ended before its end event)")
	}
	if pid != 0 {
		e.kill(pid)
	}
	return -1, e.execErr(ctx, runCtx, err)
}

// execErr classifies a failed process stream.
func (e *Envd) execErr(parent, run context.Context, err error) error {
	if parent.Err() != nil {
		return fmt.Errorf("exec: %w", parent.Err())
	}
	if deadlinePassed(parent) {
		return fmt.Errorf("exec: %w", context.DeadlineExceeded)
	}
	if deadlinePassed(run) {
		return fmt.Errorf("exec: %w", ErrExecTimeout)
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable:
		return fmt.Errorf("exec: %w: %v", ErrSandboxUnreachable, err)
	case connect.CodeDeadlineExceeded:
		return fmt.Errorf("exec: %w: %v", ErrExecTimeout, err)
	}
	return fmt.Errorf("exec: %w", err)
}

// deadlinePassed reports whether ctx's deadline has passed. A call may
// fail on the deadline (the transport compares the clock with it) before
// the context's own timer ends it, so its Err alone can still be nil.
func deadlinePassed(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// kill sends SIGKILL to pid, best effort, bounded by 5 s.
func (e *Envd) kill(pid uint32) {
	if pid == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl := connect.NewClient[envd.SendSignalRequest, envd.Empty](e.http, e.base+envd.ProcedureSendSignal, connect.WithCodec(envd.Codec{}))
	req := connect.NewRequest(&envd.SendSignalRequest{Process: envd.ProcessSelector{Pid: envd.Uint(pid)}, Signal: envd.Enum{Name: envd.SignalKill}})
	e.setHeaders(req.Header())
	_, _ = cl.CallUnary(ctx, req)
}

// PutFile writes r to path in the sandbox (relative paths are under
// SandboxHome), creating parent directories: POST /files?path=… with a raw
// application/octet-stream body (accepted by envd >= 0.5.7). Bounded by
// DefaultFileTimeout.
func (e *Envd) PutFile(ctx context.Context, p string, r io.Reader) error {
	ctx, cancel := context.WithTimeout(ctx, DefaultFileTimeout)
	defer cancel()
	p = ResolvePath(p)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, envd.FileURL(e.base, p), r)
	if err != nil {
		return fmt.Errorf("put %s: %w", p, err)
	}
	e.setHeaders(req.Header)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := e.http.Do(req)
	if err != nil {
		return fmt.Errorf("put %s: %w", p, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fileErr("put "+p, resp)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return nil
}

// GetFile copies the bytes of path in the sandbox (relative paths are under
// SandboxHome) to w: GET /files?path=…. It returns the byte count.
// Errors: ErrFileNotFound (wrapped) for a missing file, ErrSandboxUnreachable,
// *EnvdError. Bounded by DefaultFileTimeout.
func (e *Envd) GetFile(ctx context.Context, p string, w io.Writer) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultFileTimeout)
	defer cancel()
	p = ResolvePath(p)
	return getFile(ctx, e.http, envd.FileURL(e.base, p), e.setHeaders, "get "+p, w,
		func(resp *http.Response) error {
			if resp.StatusCode/100 != 2 {
				return fileErr("get "+p, resp)
			}
			return nil
		})
}

// fileErr maps a failed /files answer: 404 for a missing path, 502/503
// when the sandbox is not running (envd's /files API).
func fileErr(op string, resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	msg := strings.TrimSpace(string(raw))
	var m struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &m) == nil && m.Message != "" {
		msg = m.Message
	}
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return fmt.Errorf("%s: %w: %s", op, ErrFileNotFound, msg)
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return fmt.Errorf("%s: %w: HTTP %d: %s", op, ErrSandboxUnreachable, resp.StatusCode, msg)
	}
	return &EnvdError{Op: op, Status: resp.StatusCode, Message: msg}
}
