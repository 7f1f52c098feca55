package e2b

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// OpenFile streams the bytes of path with envd's GET /files?path=… . The
// body is bounded by ctx (cancel it, or Close the reader, to stop); the wait
// for response headers by Timeouts.FileHeader.
//
// With maxBytes > 0 the reader never yields more than maxBytes bytes: it
// fails with *core.FileTooLargeError as soon as byte maxBytes+1 arrives (or
// at once when Content-Length already says so), without buffering the file.
//
// Errors: core.ErrFileNotFound on 404; core.ErrSandboxGone on 502 (or 503
// confirmed by the control plane); else a *core.ProviderError.
func (c *Client) OpenFile(ctx context.Context, ref core.SandboxRef, path string, maxBytes int64) (io.ReadCloser, error) {
	const op = "read file"
	if err := core.ValidateSandboxID(ref.ID); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, envd.FileURL(c.envdBase(ref), path), nil)
	if err != nil {
		return nil, fmt.Errorf("e2b %s: %w", op, err)
	}
	setEnvdHeaders(req.Header, ref)
	resp, cancel, err := providerhttp.DoHeaderTimeout(c.http, req, c.timeouts.FileHeader)
	if err != nil {
		return nil, providerhttp.Transport(op, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel(nil)
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("e2b %s %q in %s: %w", op, path, ref.ID, core.ErrFileNotFound)
		}
		return nil, c.fileError(ctx, ref, op, resp.StatusCode, body)
	}
	if maxBytes > 0 && resp.ContentLength > maxBytes {
		resp.Body.Close()
		cancel(nil)
		return nil, &core.FileTooLargeError{Path: path, MaxBytes: maxBytes}
	}
	return core.CappedReader(resp.Body, cancel, path, maxBytes), nil
}

// fileError classifies an unsuccessful envd /files reply.
func (c *Client) fileError(ctx context.Context, ref core.SandboxRef, op string, status int, body []byte) error {
	return c.envdError(ctx, ref, op, status, connect.CodeUnknown, replyError(op, status, body, providerhttp.AmbiguousStatus(status), "envd refused the access token"))
}

// WriteFile writes r to path with envd's POST /files?path=… as a raw
// application/octet-stream body (envd >= 0.5.7), streamed from r; envd
// creates the parent directories and overwrites an existing file. The call
// is bounded by ctx.
//
// Errors: core.ErrSandboxGone on 502 (or 503 confirmed by the control
// plane); else a *core.ProviderError (507 = no space left).
func (c *Client) WriteFile(ctx context.Context, ref core.SandboxRef, path string, r io.Reader) error {
	const op = "write file"
	if err := core.ValidateSandboxID(ref.ID); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, envd.FileURL(c.envdBase(ref), path), r)
	if err != nil {
		return fmt.Errorf("e2b %s: %w", op, err)
	}
	setEnvdHeaders(req.Header, ref)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.http.Do(req)
	if err != nil {
		return providerhttp.Transport(op, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return c.fileError(ctx, ref, op, resp.StatusCode, body)
	}
	return nil
}
