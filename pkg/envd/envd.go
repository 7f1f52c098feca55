// Package envd is the wire protocol of E2B's in-sandbox daemon, envd, as
// every part of sandbox-broker speaks it: the E2B provider client
// (internal/e2b), the Go client and CLI (pkg/client, internal/cli) and the
// local sandbox host that serves it (internal/sandboxhost).
//
// It holds the routing and auth headers, the file routes (GET and POST
// /files?path=…), the Connect procedures of the process and filesystem
// services, their messages in the proto3 JSON mapping (lowerCamelCase
// names, bytes as standard base64; only the fields this project reads or
// writes), and Codec, Connect's "json" codec over encoding/json, so the
// messages are plain Go structs instead of generated protobuf code.
//
// It is public because pkg/client is: a caller of the Go client may speak
// envd with the same types.
package envd

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Port is the port envd listens on in every sandbox; it is sent as
// HeaderSandboxPort on every call (as E2B's SDKs send it).
const Port = 49983

// Headers of every envd call. The provider's API key is never one of them.
const (
	// HeaderSandboxID routes the call to its sandbox when one URL serves
	// many.
	HeaderSandboxID = "E2b-Sandbox-Id"
	// HeaderSandboxPort is Port.
	HeaderSandboxPort = "E2b-Sandbox-Port"
	// HeaderAccessToken carries the sandbox's envd access token (secret).
	HeaderAccessToken = "X-Access-Token"
	// HeaderKeepalive asks a streaming call for a keepalive event every
	// that many seconds.
	HeaderKeepalive = "Keepalive-Ping-Interval"
)

// Routes of envd's plain HTTP API.
const (
	// HealthPath answers 204 while envd runs; it needs no access token.
	HealthPath = "/health"
	// FilesPath reads (GET) or writes (POST, raw application/octet-stream
	// body; envd creates parent directories) the file named by the "path"
	// query parameter.
	FilesPath = "/files"
)

// Connect procedures of envd's process and filesystem services.
const (
	ProcedureStart      = "/process.Process/Start"   // server streaming
	ProcedureConnect    = "/process.Process/Connect" // server streaming, as Start's
	ProcedureSendSignal = "/process.Process/SendSignal"
	ProcedureSendInput  = "/process.Process/SendInput"
	ProcedureCloseStdin = "/process.Process/CloseStdin"
	ProcedureList       = "/process.Process/List"
	ProcedureStat       = "/filesystem.Filesystem/Stat"
	ProcedureMakeDir    = "/filesystem.Filesystem/MakeDir"
	ProcedureListDir    = "/filesystem.Filesystem/ListDir"
	ProcedureMove       = "/filesystem.Filesystem/Move"
	ProcedureRemove     = "/filesystem.Filesystem/Remove"
	ProcedureWatchDir   = "/filesystem.Filesystem/WatchDir" // server streaming
)

// SetHeaders sets the routing and auth headers of an envd call to sandbox
// id; an empty token is not sent.
func SetHeaders(h http.Header, id, token string) {
	h.Set(HeaderSandboxID, id)
	h.Set(HeaderSandboxPort, strconv.Itoa(Port))
	if token != "" {
		h.Set(HeaderAccessToken, token)
	}
}

// FileURL is the URL of file p under envd base URL base (trailing slashes
// of base are dropped).
func FileURL(base, p string) string {
	return strings.TrimRight(base, "/") + FilesPath + "?" + url.Values{"path": {p}}.Encode()
}
