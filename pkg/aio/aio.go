// Package aio is the subset of the AIO sandbox HTTP API that
// sandbox-broker speaks, as its public OpenAPI spec defines it
// (github.com/agent-infra/sandbox): routes, the Response envelope, command
// execution and file transfer messages. It is used by the provisioner
// provider (internal/provisioner), the Go client and CLI (pkg/client,
// internal/cli) and the local sandbox host that serves it
// (internal/sandboxhost).
//
// Failures come two ways: a non-2xx HTTP status, or a 200 whose envelope
// says success=false with a FileOperationError as its data.
//
// It is public because pkg/client is: a caller of the Go client may speak
// AIO with the same types.
package aio

import (
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strings"
)

// Routes, relative to a sandbox's AIO base URL.
const (
	// PathContext (GET) answers once the sandbox is ready.
	PathContext = "/v1/sandbox"
	// PathExec (POST ExecRequest) runs a command; in sync mode it answers
	// when the command has ended, with an ExecResult.
	PathExec = "/v1/bash/exec"
	// PathDownload (GET, "path" query parameter) streams a file's bytes.
	PathDownload = "/v1/file/download"
	// PathUpload (POST multipart/form-data, see UploadBody) writes a file.
	PathUpload = "/v1/file/upload"
	// PathWrite (POST WriteRequest) writes a file from JSON content.
	PathWrite = "/v1/file/write"
)

// Upload form fields: the destination path, then the file part.
const (
	FormPath = "path"
	FormFile = "file"
)

// ExecResult.Status values.
const (
	StatusCompleted = "completed"
	StatusTimedOut  = "timed_out"
	StatusKilled    = "killed"
)

// ErrorTypeNotFound is the FileOperationError.ErrorType of a missing path.
const ErrorTypeNotFound = "not_found"

// SetAuth sets the bearer token of an AIO call; an empty token is not sent.
func SetAuth(h http.Header, token string) {
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
}

// BearerToken is the token SetAuth sent ("" when none).
func BearerToken(h http.Header) string {
	tok, _ := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	return tok
}

// DownloadURL is the URL of file p under AIO base URL base.
func DownloadURL(base, p string) string {
	return strings.TrimRight(base, "/") + PathDownload + "?" + url.Values{"path": {p}}.Encode()
}

// UploadBody streams r as an upload of file p: the body to POST to
// PathUpload (read it to the end or close it) and its Content-Type.
func UploadBody(p string, r io.Reader) (*io.PipeReader, string) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		pw.CloseWithError(func() error {
			if err := mw.WriteField(FormPath, p); err != nil {
				return err
			}
			fw, err := mw.CreateFormFile(FormFile, path.Base(p))
			if err != nil {
				return err
			}
			if _, err := io.Copy(fw, r); err != nil {
				return err
			}
			return mw.Close()
		}())
	}()
	return pr, mw.FormDataContentType()
}

// Response is the Response[T] envelope of every JSON reply. Success is
// true when the reply omits it.
type Response[T any] struct {
	Success bool   `json:"success"`
	Message string `json:"message"`
	Data    T      `json:"data"`
}

// UnmarshalJSON reads an absent success as true.
func (r *Response[T]) UnmarshalJSON(b []byte) error {
	type plain Response[T]
	w := struct {
		plain
		Success *bool `json:"success"`
	}{}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = Response[T](w.plain)
	r.Success = w.Success == nil || *w.Success
	return nil
}

// Failure is why a reply said success=false: its FileOperationError, with
// Message taken from the envelope when the data has none; ok is false for
// a successful reply.
func Failure(r Response[json.RawMessage]) (fe FileOperationError, ok bool) {
	if r.Success {
		return FileOperationError{}, false
	}
	_ = json.Unmarshal(r.Data, &fe)
	if fe.Message == "" {
		fe.Message = r.Message
	}
	return fe, true
}

// FileOperationError is the data of a failed file call.
type FileOperationError struct {
	Path      string `json:"path"`
	Operation string `json:"operation"`
	Message   string `json:"message"`
	ErrorType string `json:"error_type"`
	Retryable bool   `json:"retryable"`
}

// ExecRequest is BashExecRequest. Nil fields take the server's defaults.
type ExecRequest struct {
	SessionID *string           `json:"session_id,omitempty"`
	Command   string            `json:"command"`
	ExecDir   string            `json:"exec_dir,omitempty"` // "" = the user's home
	Env       map[string]string `json:"env,omitempty"`
	AsyncMode bool              `json:"async_mode"`
	// Timeout and HardTimeout are seconds; at HardTimeout the command is
	// killed and the status is StatusTimedOut.
	Timeout     *float64 `json:"timeout,omitempty"`
	HardTimeout *float64 `json:"hard_timeout,omitempty"`
	// MaxOutputLength truncates each stream in the middle; 0 disables
	// truncation, nil means the server's default.
	MaxOutputLength *int `json:"max_output_length,omitempty"`
}

// ExecResult is BashExecResult. ExitCode is set only when the command
// completed.
type ExecResult struct {
	SessionID    string `json:"session_id"`
	CommandID    string `json:"command_id"`
	Command      string `json:"command"`
	Status       string `json:"status"`
	Stdout       string `json:"stdout"`
	Stderr       string `json:"stderr"`
	ExitCode     *int   `json:"exit_code"`
	Offset       int    `json:"offset"`
	StderrOffset int    `json:"stderr_offset"`
}

// WriteRequest is FileWriteRequest: Content is UTF-8 text, or base64 with
// Encoding "base64".
type WriteRequest struct {
	File     string  `json:"file"`
	Content  string  `json:"content"`
	Encoding *string `json:"encoding,omitempty"`
	Append   *bool   `json:"append,omitempty"`
}

// SyncExec is the request of a synchronous command: killed after
// hardTimeout seconds (the soft timeout 5 s later), output untruncated.
func SyncExec(command, dir string, env map[string]string, hardTimeout float64) ExecRequest {
	soft, zero := hardTimeout+5, 0
	return ExecRequest{Command: command, ExecDir: dir, Env: env, Timeout: &soft, HardTimeout: &hardTimeout, MaxOutputLength: &zero}
}
