package sandboxhost

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/aio"
)

// AIO sandbox API subset served under /aio/{id} by the provisioner face.
// Wire format: the AIO sandbox OpenAPI spec (agent-infra/sandbox,
// website/docs/public/v1/openapi.json): Response[T] envelopes {success,
// message, data}; file failures are 200 with success=false and a
// FileOperationError {path, operation, message, error_type}; downloads use
// HTTP statuses.
const (
	// aioVersion is reported by GET /v1/sandbox.
	aioVersion = "local-sandboxhost"
	// aioDefaultMaxOutput is BashExecRequest.max_output_length's default.
	aioDefaultMaxOutput = 50000
	// aioMaxExecOutput caps what one exec keeps in memory per stream.
	aioMaxExecOutput = 64 << 20
	// aioMaxWriteBody caps a /v1/file/write JSON body.
	aioMaxWriteBody = 64 << 20
)

// aioResponse is the Response[T] envelope of every JSON reply.
type aioResponse = aio.Response[any]

// aioHandler routes the AIO subset; the sandbox is in the request context.
func (p *Provisioner) aioHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+aio.PathContext, p.handleAIOContext)
	mux.HandleFunc("POST "+aio.PathExec, p.handleAIOExec)
	mux.HandleFunc("GET "+aio.PathDownload, p.h.handleReadFile)
	mux.HandleFunc("POST "+aio.PathWrite, p.handleAIOWrite)
	mux.HandleFunc("POST "+aio.PathUpload, p.handleAIOUpload)
	return mux
}

// serveAIO checks the bearer token first (access.go): without the
// sandbox's own token every id answers 401; with the token of one that
// ended, 404. Then it serves sub with the AIO routes for a live sandbox of
// this provisioner.
func (p *Provisioner) serveAIO(w http.ResponseWriter, r *http.Request, id, sub string, routes http.Handler) {
	sb, acc := p.h.access(id, aio.BearerToken(r.Header))
	if acc == accessDenied {
		writeJSON(w, http.StatusUnauthorized, provError{Detail: "invalid or missing bearer token"})
		return
	}
	if _, _, ok := p.live(id); !ok || acc != accessGranted {
		writeJSON(w, http.StatusNotFound, provError{Detail: fmt.Sprintf("sandbox %q not found", id)})
		return
	}
	if sb.paused() {
		// Paused through the E2B face: its processes are frozen.
		writeJSON(w, http.StatusConflict, provError{Detail: fmt.Sprintf("sandbox %q is paused", id)})
		return
	}
	r2 := r.Clone(context.WithValue(r.Context(), sandboxKey{}, sb))
	r2.URL.Path = sub
	r2.URL.RawPath = ""
	routes.ServeHTTP(w, r2)
}

// handleAIOContext serves GET /v1/sandbox (SandboxResponse): readiness.
func (p *Provisioner) handleAIOContext(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"success": true, "message": "Operation successful", "data": nil,
		"home_dir": sandboxHome, "workspace": sandboxHome, "version": aioVersion,
		"detail": map[string]any{
			"system": map[string]any{"os": "linux", "os_version": "", "arch": runtime.GOARCH, "user": "user",
				"home_dir": sandboxHome, "timezone": "UTC", "occupied_ports": []int{}},
			"runtime": map[string]any{"python": nil, "nodejs": nil},
			"utils":   []any{},
		},
	})
}

// aioFailure writes a 200 success=false reply.
func aioFailure(w http.ResponseWriter, msg string, data any) {
	writeJSON(w, http.StatusOK, aioResponse{Success: false, Message: msg, Data: data})
}

// capBuffer keeps at most max bytes, counting what it dropped.
type capBuffer struct {
	buf     bytes.Buffer
	max     int
	dropped int
}

func (b *capBuffer) add(p []byte) {
	room := b.max - b.buf.Len()
	if room >= len(p) {
		b.buf.Write(p)
		return
	}
	if room > 0 {
		b.buf.Write(p[:room])
	}
	b.dropped += len(p) - max(room, 0)
}

// truncateMiddle keeps the head and tail of s when it exceeds n (> 0)
// bytes, as the AIO API's max_output_length does.
func truncateMiddle(s string, n int) string {
	if n <= 0 || len(s) <= n {
		return s
	}
	half := n / 2
	return s[:half] + fmt.Sprintf("\n... [%d bytes truncated] ...\n", len(s)-2*half) + s[len(s)-half:]
}

// handleAIOExec serves POST /v1/bash/exec in sync mode: bash -c command
// with per-call env and exec_dir, killed at hard_timeout (status
// timed_out), by a client that goes away, or with the sandbox (killed).
// async_mode and sessions are not supported (422 / ignored).
func (p *Provisioner) handleAIOExec(w http.ResponseWriter, r *http.Request) {
	sb := sandboxFrom(r.Context())
	var req aio.ExecRequest
	if err := readBody(r, &req); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: err.Error()})
		return
	}
	if req.AsyncMode {
		writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: "async_mode is not supported by the local sandbox host"})
		return
	}
	var hard time.Duration
	if req.HardTimeout != nil {
		d, err := p.h.seconds(*req.HardTimeout, "hard_timeout")
		if err != nil {
			writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: err.Error()})
			return
		}
		hard = d
	}
	spec := startSpec{cmd: "/bin/bash", args: []string{"-c", req.Command}, envs: req.Env, cwd: req.ExecDir}
	run, err := p.h.start(sb, spec)
	if errors.Is(err, ErrNotFound) {
		writeJSON(w, http.StatusNotFound, provError{Detail: fmt.Sprintf("sandbox %q not found", sb.id)})
		return
	}
	if err != nil {
		aioFailure(w, "failed to start command: "+err.Error(), nil)
		return
	}
	var (
		mu       sync.Mutex
		timedOut bool
	)
	if hard > 0 {
		t := time.AfterFunc(hard, func() {
			mu.Lock()
			timedOut = true
			mu.Unlock()
			run.signal(syscall.SIGKILL)
		})
		defer t.Stop()
	}
	go func() {
		select {
		case <-r.Context().Done():
			run.signal(syscall.SIGKILL)
		case <-run.done:
		}
	}()
	stdout := &capBuffer{max: aioMaxExecOutput}
	stderr := &capBuffer{max: aioMaxExecOutput}
	for ev := range run.events {
		stdout.add(ev.stdout)
		stderr.add(ev.stderr)
	}
	<-run.done
	code, exited, _, _ := run.exitInfo()
	res := aio.ExecResult{SessionID: "local-" + sb.id, CommandID: fmt.Sprint(run.pid), Command: req.Command}
	mu.Lock()
	switch {
	case timedOut:
		res.Status = aio.StatusTimedOut
	case sb.ctx.Err() != nil || !exited:
		res.Status = aio.StatusKilled
	default:
		res.Status = aio.StatusCompleted
		res.ExitCode = &code
	}
	mu.Unlock()
	maxOut := aioDefaultMaxOutput
	if req.MaxOutputLength != nil {
		maxOut = *req.MaxOutputLength
	}
	res.Stdout = truncateMiddle(stdout.buf.String(), maxOut)
	res.Stderr = truncateMiddle(stderr.buf.String(), maxOut)
	res.Offset, res.StderrOffset = stdout.buf.Len(), stderr.buf.Len()
	writeJSON(w, http.StatusOK, aioResponse{Success: true, Message: "Operation successful", Data: res})
}

// aioErrorType maps a file error to the AIO error_type vocabulary.
func aioErrorType(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return aio.ErrorTypeNotFound
	case errors.Is(err, ErrOutsideSandbox), errors.Is(err, fs.ErrPermission):
		return "permission_denied"
	case errors.Is(err, errIsDir):
		return "invalid_target"
	case errors.Is(err, errBadUpload):
		return "invalid_path"
	case errors.Is(err, syscall.ENOSPC):
		return "no_space_left"
	case errors.Is(err, syscall.EROFS):
		return "read_only_filesystem"
	default:
		return "io_error"
	}
}

// fileFailure writes a success=false FileOperationError reply.
func fileFailure(w http.ResponseWriter, op, path string, err error) {
	msg := fmt.Sprintf("Failed to %s file: %v", op, err)
	aioFailure(w, msg, aio.FileOperationError{Path: path, Operation: op, Message: msg, ErrorType: aioErrorType(err)})
}

// handleAIOWrite serves POST /v1/file/write (utf-8 or base64 content;
// parents created; append not supported).
func (p *Provisioner) handleAIOWrite(w http.ResponseWriter, r *http.Request) {
	sb := sandboxFrom(r.Context())
	var req aio.WriteRequest
	b, err := io.ReadAll(io.LimitReader(r.Body, aioMaxWriteBody+1))
	if err == nil && len(b) > aioMaxWriteBody {
		err = errors.New("body too large")
	}
	if err == nil {
		err = json.Unmarshal(b, &req)
	}
	if err != nil || req.File == "" {
		if err == nil {
			err = errors.New("file is required")
		}
		writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: err.Error()})
		return
	}
	if req.Append != nil && *req.Append {
		writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: "append is not supported by the local sandbox host"})
		return
	}
	content := []byte(req.Content)
	if req.Encoding != nil && *req.Encoding == "base64" {
		if content, err = base64.StdEncoding.DecodeString(req.Content); err != nil {
			fileFailure(w, "write", req.File, fmt.Errorf("%w: base64: %v", errBadUpload, err))
			return
		}
	}
	if _, err := sb.writeFile(req.File, bytes.NewReader(content), nil); err != nil {
		fileFailure(w, "write", req.File, err)
		return
	}
	writeJSON(w, http.StatusOK, aioResponse{Success: true, Message: "File written successfully",
		Data: map[string]any{"file": req.File, "bytes_written": len(content)}})
}

// handleAIOUpload serves POST /v1/file/upload: multipart/form-data with a
// "path" field (before the file) and a "file" part, streamed to disk.
// Without a path the part's file name is used.
func (p *Provisioner) handleAIOUpload(w http.ResponseWriter, r *http.Request) {
	sb := sandboxFrom(r.Context())
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "multipart/form-data" {
		writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: "want multipart/form-data"})
		return
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	var dest string
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: "multipart: " + err.Error()})
			return
		}
		switch part.FormName() {
		case aio.FormPath:
			v, _ := io.ReadAll(io.LimitReader(part, 4096))
			dest = string(v)
		case aio.FormFile:
			target := dest
			if target == "" {
				target = rawFileName(part)
			}
			if target == "" {
				part.Close()
				writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: "no path"})
				return
			}
			cw := &countWriter{}
			_, err := sb.writeFile(target, io.TeeReader(part, cw), nil)
			part.Close()
			if err != nil {
				fileFailure(w, "upload", target, err)
				return
			}
			writeJSON(w, http.StatusOK, aioResponse{Success: true, Message: "File uploaded successfully",
				Data: map[string]any{"file_path": target, "file_size": cw.n, "success": true}})
			return
		}
		part.Close()
	}
	writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: `no part named "file"`})
}

// countWriter counts bytes written to it.
type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }
