package sandboxhost

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os/exec"
	"syscall"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// maxRPCBytes caps a Connect request message.
const maxRPCBytes = 8 << 20

// sandboxKey carries the routed *sandbox in a request context.
type sandboxKey struct{}

func sandboxFrom(ctx context.Context) *sandbox {
	sb, _ := ctx.Value(sandboxKey{}).(*sandbox)
	return sb
}

// EnvdHandler serves the in-sandbox daemon API for every sandbox, routed by
// the E2b-Sandbox-Id header: GET /health, GET/POST /files and
// Connect RPC (JSON codec) for process.Process/{Start, Connect,
// SendSignal, SendInput, CloseStdin, List} and filesystem.Filesystem/{Stat,
// MakeDir, ListDir, Move, Remove, WatchDir}.
//
// A signed file URL (signed.go) stands in for the token on /files.
//
// The access token is checked first, on every route (access.go): a
// request without the sandbox's own X-Access-Token gets 401, whatever the
// id, so it learns nothing of whether an id exists or is paused. With the
// token of a sandbox that ended it gets 502 (the SDK's isRunning relies
// on it); with the token of a paused one, /health answers 502 (the SDK's
// isRunning and connect-after-pause read only 502 as "not running") and
// every other route 409 with E2B's "sandbox paused" body (pausedReply).
func (h *Host) EnvdHandler() http.Handler {
	opts := []connect.HandlerOption{connect.WithCodec(envd.Codec{}), connect.WithReadMaxBytes(maxRPCBytes)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", h.handleReadFile)
	mux.HandleFunc("POST /files", h.handleWriteFile)
	mux.Handle(envd.ProcedureStart, connect.NewServerStreamHandler(envd.ProcedureStart, h.rpcStart, opts...))
	mux.Handle(envd.ProcedureConnect, connect.NewServerStreamHandler(envd.ProcedureConnect, h.rpcConnect, opts...))
	mux.Handle(envd.ProcedureSendSignal, connect.NewUnaryHandler(envd.ProcedureSendSignal, h.rpcSendSignal, opts...))
	mux.Handle(envd.ProcedureSendInput, connect.NewUnaryHandler(envd.ProcedureSendInput, h.rpcSendInput, opts...))
	mux.Handle(envd.ProcedureCloseStdin, connect.NewUnaryHandler(envd.ProcedureCloseStdin, h.rpcCloseStdin, opts...))
	mux.Handle(envd.ProcedureList, connect.NewUnaryHandler(envd.ProcedureList, h.rpcList, opts...))
	mux.Handle(envd.ProcedureStat, connect.NewUnaryHandler(envd.ProcedureStat, h.rpcStat, opts...))
	mux.Handle(envd.ProcedureMakeDir, connect.NewUnaryHandler(envd.ProcedureMakeDir, h.rpcMakeDir, opts...))
	mux.Handle(envd.ProcedureListDir, connect.NewUnaryHandler(envd.ProcedureListDir, h.rpcListDir, opts...))
	mux.Handle(envd.ProcedureMove, connect.NewUnaryHandler(envd.ProcedureMove, h.rpcMove, opts...))
	mux.Handle(envd.ProcedureRemove, connect.NewUnaryHandler(envd.ProcedureRemove, h.rpcRemove, opts...))
	mux.Handle(envd.ProcedureWatchDir, connect.NewServerStreamHandler(envd.ProcedureWatchDir, h.rpcWatchDir, opts...))

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		isRPC := r.URL.Path != "/health" && r.URL.Path != "/files"
		id := sandboxIDOf(r)
		tok := r.Header.Get(envd.HeaderAccessToken)
		sb, acc := h.access(id, tok)
		if acc == accessDenied && tok == "" && r.URL.Path == envd.FilesPath && r.URL.Query().Has("signature") {
			sb, acc = h.signedAccess(id, r) // signed.go
		}
		switch acc {
		case accessDenied:
			envdError(w, isRPC, http.StatusUnauthorized, "invalid or missing access token")
			return
		case accessGone:
			// Connect clients map a non-JSON error by HTTP status:
			// 502 -> unavailable ("sandbox not running" in the SDK).
			envdError(w, isRPC, http.StatusBadGateway, fmt.Sprintf("sandbox %q is not running", id))
			return
		}
		if sb.paused() && r.URL.Path == envd.HealthPath {
			envdError(w, false, http.StatusBadGateway, fmt.Sprintf("sandbox %q is paused", id))
			return
		}
		if sb.paused() {
			writeJSON(w, http.StatusConflict, pausedReply{SandboxID: id, Message: "The sandbox is paused", Code: http.StatusConflict})
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey{}, sb)))
	})
}

// pausedReply is what E2B's edge (its client proxy) answers, with status
// 409, to any envd request for a paused sandbox it will not resume by
// itself (auto-resume off, as for every sandbox of this host); browsers get
// an HTML page instead. Connect clients map the status (409: unknown).
type pausedReply struct {
	SandboxID     string `json:"sandboxId"`
	Message       string `json:"message"`
	Code          int    `json:"code"`
	CanAutoResume bool   `json:"canAutoResume"`
}

// envdError writes an error outside the Connect handlers: plain text for
// RPC routes (so Connect clients map the status), JSON {code, message}
// for the HTTP routes.
func envdError(w http.ResponseWriter, rpc bool, status int, msg string) {
	if rpc {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(msg))
		return
	}
	writeJSON(w, status, e2bapi.Error{Code: status, Message: msg})
}

// startError maps a start failure to a Connect error.
func startError(err error) error {
	var execErr *exec.Error
	switch {
	case errors.Is(err, ErrNotFound):
		return connect.NewError(connect.CodeUnavailable, err)
	case errors.Is(err, errPaused):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, ErrOutsideSandbox), errors.Is(err, errInvalidEnv), errors.As(err, &execErr),
		errors.Is(err, fs.ErrNotExist), errors.Is(err, errEmptyCommand), errors.Is(err, errNotDir), errors.Is(err, errStartFailed):
		return connect.NewError(connect.CodeInvalidArgument, err)
	default:
		return connect.NewError(connect.CodeInternal, err)
	}
}

// rpcSendSignal signals a process's group: SIGNAL_SIGKILL (9) or
// SIGNAL_SIGTERM (15).
func (h *Host) rpcSendSignal(ctx context.Context, req *connect.Request[envd.SendSignalRequest]) (*connect.Response[envd.Empty], error) {
	sb := sandboxFrom(ctx)
	var sig syscall.Signal
	switch {
	case req.Msg.Signal.Name == "SIGNAL_SIGKILL" || req.Msg.Signal.Number == 9:
		sig = syscall.SIGKILL
	case req.Msg.Signal.Name == "SIGNAL_SIGTERM" || req.Msg.Signal.Number == 15:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %q", req.Msg.Signal.Name))
	}
	p := sb.findProcess(req.Msg.Process)
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	p.signal(sig)
	return connect.NewResponse(&envd.Empty{}), nil
}

// findProcess returns the live process selected by pid or tag, or nil.
func (sb *sandbox) findProcess(sel envd.ProcessSelector) *process {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sel.Pid != 0 {
		return sb.procs[int(sel.Pid)]
	}
	if sel.Tag != nil {
		for _, p := range sb.procs {
			if p.spec.tag != nil && *p.spec.tag == *sel.Tag {
				return p
			}
		}
	}
	return nil
}

// rpcList lists the sandbox's running processes.
func (h *Host) rpcList(ctx context.Context, _ *connect.Request[envd.Empty]) (*connect.Response[envd.ListResponse], error) {
	sb := sandboxFrom(ctx)
	out := &envd.ListResponse{Processes: []envd.ProcessInfo{}}
	sb.mu.Lock()
	for _, p := range sb.procs {
		cfg := envd.ProcessConfig{Cmd: p.spec.cmd, Args: p.spec.args, Envs: p.spec.envs, Cwd: p.spec.cwd}
		out.Processes = append(out.Processes, envd.ProcessInfo{Config: cfg, Pid: uint32(p.pid), Tag: p.spec.tag})
	}
	sb.mu.Unlock()
	return connect.NewResponse(out), nil
}
