package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/aio"
)

// aioCallMargin is added to a command's timeout to bound its HTTP call
// (the server answers only when the command has ended).
const aioCallMargin = 30 * time.Second

// AIOError is a failed answer of the AIO sandbox API: a non-2xx status, or
// a 200 whose envelope says success=false (Status 200, ErrorType set when
// the server named one, e.g. not_found, permission_denied).
type AIOError struct {
	Op        string
	Status    int
	ErrorType string
	Message   string
}

// Error renders "aio OP: HTTP status: [error_type: ]message".
func (e *AIOError) Error() string {
	msg := e.Message
	if e.ErrorType != "" {
		msg = e.ErrorType + ": " + msg
	}
	return fmt.Sprintf("aio %s: HTTP %d: %s", e.Op, e.Status, msg)
}

// AIO works in one provisioner-backed sandbox through its AIO sandbox API
// with the acquire response's connection only (sandbox_url, and
// access_token sent as "Authorization: Bearer" when set). Wire format: the
// AIO sandbox's public OpenAPI spec (agent-infra/sandbox,
// website/docs/public/v1/openapi.json), as internal/provisioner speaks it:
// POST /v1/bash/exec, GET /v1/file/download, POST /v1/file/upload.
//
// Unlike Envd, Exec does not stream: the API answers once the command has
// ended, then the output is written to the request's writers.
type AIO struct {
	sandboxID string
	conn      Connection
	base      string
	http      *http.Client
}

// NewAIO returns a helper for sandboxID reached through conn.SandboxURL. It
// fails when that is not an absolute http(s) URL or the id is empty.
// httpClient may be nil (a client without its own timeout; every call is
// bounded by its context and the per-call limits).
func NewAIO(sandboxID string, conn Connection, httpClient *http.Client) (*AIO, error) {
	base, httpClient, err := sandboxBase("aio", "sandbox url", sandboxID, conn.SandboxURL, httpClient)
	if err != nil {
		return nil, err
	}
	return &AIO{sandboxID: sandboxID, conn: conn, base: base, http: httpClient}, nil
}

func (a *AIO) setHeaders(h http.Header) {
	aio.SetAuth(h, a.conn.AccessToken)
}

// aioFailed returns the *AIOError of a success=false envelope, or nil.
func aioFailed(e aio.Response[json.RawMessage], op string) error {
	fe, failed := aio.Failure(e)
	if !failed {
		return nil
	}
	ae := &AIOError{Op: op, Status: http.StatusOK, ErrorType: fe.ErrorType, Message: fe.Message}
	if fe.ErrorType == aio.ErrorTypeNotFound {
		return fmt.Errorf("%w: %w", ErrFileNotFound, ae)
	}
	return ae
}

// aioStatusErr maps a non-200 answer: 404 (with notFound), 502 and 503 to
// the sentinels, anything else to *AIOError.
func aioStatusErr(op string, resp *http.Response, notFound error) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	msg := strings.TrimSpace(string(raw))
	var m struct {
		Detail  any    `json:"detail"`
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &m) == nil {
		switch d := m.Detail.(type) {
		case string:
			msg = d
		case nil:
			if m.Message != "" {
				msg = m.Message
			}
		default:
			b, _ := json.Marshal(d)
			msg = string(b)
		}
	}
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	ae := &AIOError{Op: op, Status: resp.StatusCode, Message: msg}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return fmt.Errorf("%w: %w", notFound, ae)
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return fmt.Errorf("%w: %w", ErrSandboxUnreachable, ae)
	}
	return ae
}

// Exec runs req.Script with bash through POST /v1/bash/exec (sync mode,
// exec_dir req.Cwd resolved like ResolvePath, else SandboxHome; hard
// timeout req.Timeout or DefaultExecTimeout, rounded up to seconds; output
// untruncated) and returns its exit code after writing its stdout and
// stderr to the writers. A non-zero exit code is not an error.
// Errors: ErrExecTimeout (wrapped) when the command passed its timeout,
// ErrSandboxUnreachable (404, 502, 503), *AIOError, or ctx's error.
func (a *AIO) Exec(ctx context.Context, req ExecRequest) (int, error) {
	const op = "exec"
	timeout, err := req.limit()
	if err != nil {
		return -1, err
	}
	secs := math.Ceil(timeout.Seconds())
	cwd := SandboxHome
	if req.Cwd != "" {
		cwd = ResolvePath(req.Cwd)
	}
	body, err := json.Marshal(aio.SyncExec(req.Script, cwd, req.Env, secs))
	if err != nil {
		return -1, fmt.Errorf("exec: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout+aioCallMargin)
	defer cancel()
	hreq, err := http.NewRequestWithContext(rctx, http.MethodPost, a.base+aio.PathExec, bytes.NewReader(body))
	if err != nil {
		return -1, fmt.Errorf("exec: %w", err)
	}
	a.setHeaders(hreq.Header)
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return -1, fmt.Errorf("exec: %w", ctx.Err())
		}
		if deadlinePassed(ctx) {
			return -1, fmt.Errorf("exec: %w", context.DeadlineExceeded)
		}
		if deadlinePassed(rctx) {
			return -1, fmt.Errorf("exec: %w", ErrExecTimeout)
		}
		return -1, fmt.Errorf("exec: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return -1, fmt.Errorf("exec: %w", aioStatusErr(op, resp, ErrSandboxUnreachable))
	}
	var env aio.Response[json.RawMessage]
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxResponseBody*8)).Decode(&env); err != nil {
		return -1, fmt.Errorf("exec: decode reply: %w", err)
	}
	if err := aioFailed(env, op); err != nil {
		return -1, fmt.Errorf("exec: %w", err)
	}
	var res aio.ExecResult
	if err := json.Unmarshal(env.Data, &res); err != nil {
		return -1, fmt.Errorf("exec: decode result: %w", err)
	}
	for _, o := range []struct {
		w io.Writer
		s string
	}{{req.Stdout, res.Stdout}, {req.Stderr, res.Stderr}} {
		if o.w != nil && o.s != "" {
			if _, err := io.WriteString(o.w, o.s); err != nil {
				return -1, fmt.Errorf("exec: write output: %w", err)
			}
		}
	}
	switch res.Status {
	case aio.StatusCompleted:
		if res.ExitCode == nil {
			return -1, fmt.Errorf("exec: %w", &AIOError{Op: op, Status: resp.StatusCode, Message: "completed without an exit code"})
		}
		return *res.ExitCode, nil
	case aio.StatusTimedOut:
		return -1, fmt.Errorf("exec: %w after %s", ErrExecTimeout, timeout)
	default: // killed, running, pending
		return -1, fmt.Errorf("exec: %w", &AIOError{Op: op, Status: resp.StatusCode, Message: "command ended with status " + res.Status})
	}
}

// PutFile writes r to path in the sandbox (relative paths are under
// SandboxHome): parent directories are created with `mkdir -p` through
// Exec (the upload API does not promise to), then the bytes are streamed
// with POST /v1/file/upload (multipart/form-data: a "path" field, then a
// "file" part). Bounded by DefaultFileTimeout. Errors: those of Exec,
// *AIOError.
func (a *AIO) PutFile(ctx context.Context, p string, r io.Reader) error {
	ctx, cancel := context.WithTimeout(ctx, DefaultFileTimeout)
	defer cancel()
	p = ResolvePath(p)
	if dir := path.Dir(p); dir != "/" {
		var stderr bytes.Buffer
		code, err := a.Exec(ctx, ExecRequest{Script: `mkdir -p -- "$SBX_DIR"`, Env: map[string]string{"SBX_DIR": dir}, Timeout: 30 * time.Second, Stderr: &stderr})
		if err != nil {
			return fmt.Errorf("put %s: mkdir: %w", p, err)
		}
		if code != 0 {
			return fmt.Errorf("put %s: mkdir %s: exit %d: %s", p, dir, code, bytes.TrimSpace(stderr.Bytes()))
		}
	}
	pr, contentType := aio.UploadBody(p, r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+aio.PathUpload, pr)
	if err != nil {
		pr.CloseWithError(err)
		return fmt.Errorf("put %s: %w", p, err)
	}
	a.setHeaders(req.Header)
	req.Header.Set("Content-Type", contentType)
	resp, err := a.http.Do(req)
	if err != nil {
		pr.CloseWithError(err)
		return fmt.Errorf("put %s: %w", p, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("put %s: %w", p, aioStatusErr("upload", resp, ErrSandboxUnreachable))
	}
	var env aio.Response[json.RawMessage]
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&env); err != nil {
		return fmt.Errorf("put %s: decode reply: %w", p, err)
	}
	if err := aioFailed(env, "upload"); err != nil {
		return fmt.Errorf("put %s: %w", p, err)
	}
	return nil
}

// GetFile copies the bytes of path in the sandbox (relative paths are under
// SandboxHome) to w: GET /v1/file/download?path=…. It returns the byte
// count. Errors: ErrFileNotFound (wrapped) on a 404, ErrSandboxUnreachable
// (502, 503), *AIOError. Bounded by DefaultFileTimeout.
func (a *AIO) GetFile(ctx context.Context, p string, w io.Writer) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultFileTimeout)
	defer cancel()
	p = ResolvePath(p)
	return getFile(ctx, a.http, aio.DownloadURL(a.base, p), a.setHeaders, "get "+p, w,
		func(resp *http.Response) error {
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("get %s: %w", p, aioStatusErr("download", resp, ErrFileNotFound))
			}
			return nil
		})
}
