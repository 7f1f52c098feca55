package sandboxhost

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// rpcStart runs a process and streams its events: start{pid} first (sent
// at once), data chunks, keepalives every Keepalive-Ping-Interval seconds,
// then end{exitCode, exited, status}. A client that goes away (or whose
// Connect-Timeout-Ms passes) kills the process group. With stdin, the
// process reads what SendInput sends until CloseStdin.
func (h *Host) rpcStart(ctx context.Context, req *connect.Request[envd.StartRequest], stream *connect.ServerStream[envd.StartResponse]) error {
	sb := sandboxFrom(ctx)
	msg := req.Msg
	if len(msg.Pty) > 0 && string(msg.Pty) != "null" {
		return connect.NewError(connect.CodeUnimplemented, errors.New("pty is not supported by the local sandbox host"))
	}
	spec := startSpec{cmd: msg.Process.Cmd, args: msg.Process.Args, envs: msg.Process.Envs, cwd: msg.Process.Cwd, tag: msg.Tag, stdin: msg.Stdin}
	r, err := h.start(sb, spec)
	if err != nil {
		return startError(err)
	}
	h.log.Debug("process started", "sandbox_id", sb.id, "pid", r.pid)
	gone := func() {
		r.signal(syscall.SIGKILL)
		r.sub.leave()
	}
	return h.streamProcess(ctx, sb, r.process, r.sub, keepalive(req.Header()), gone, stream.Send)
}

// rpcConnect attaches to a running process (by pid or tag): start{pid},
// then its output from now on and its end, as Start streams them. A
// client that goes away only detaches.
func (h *Host) rpcConnect(ctx context.Context, req *connect.Request[envd.ProcessRequest], stream *connect.ServerStream[envd.StartResponse]) error {
	sb := sandboxFrom(ctx)
	p := sb.findProcess(req.Msg.Process)
	if p == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	sub := p.out.subscribe()
	if sub == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("process ended"))
	}
	return h.streamProcess(ctx, sb, p, sub, keepalive(req.Header()), sub.leave, stream.Send)
}

// keepalive is the keepalive interval a streaming request asks for
// (default 50 s).
func keepalive(hdr http.Header) time.Duration {
	if n, err := strconv.Atoi(hdr.Get(envd.HeaderKeepalive)); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 50 * time.Second
}

// streamProcess sends p's events to one client attached as sub: start,
// output, keepalives every interval, then end. When the client goes away
// (or a send fails) it calls gone and returns. When the sandbox itself
// ended under the process, the stream is dropped without an end event,
// as E2B's is when its sandbox dies: the SDK then probes the sandbox and
// reports it killed, not a command exit.
func (h *Host) streamProcess(ctx context.Context, sb *sandbox, p *process, sub *subscriber, interval time.Duration,
	gone func(), send func(*envd.StartResponse) error) error {
	if err := send(&envd.StartResponse{Event: envd.ProcessEvent{Start: &envd.StartEvent{Pid: uint32(p.pid)}}}); err != nil {
		gone()
		return err
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for done := false; !done; {
		var err error
		select {
		case ev, ok := <-sub.events:
			if !ok {
				done = true
				break
			}
			err = send(&envd.StartResponse{Event: envd.ProcessEvent{Data: &envd.DataEvent{Stdout: ev.stdout, Stderr: ev.stderr}}})
		case <-tick.C:
			err = send(&envd.StartResponse{Event: envd.ProcessEvent{Keepalive: &struct{}{}}})
		case <-ctx.Done():
			err = connect.NewError(connect.CodeCanceled, ctx.Err())
		}
		if err != nil {
			gone()
			return err
		}
	}
	<-p.done
	if sb.ctx.Err() != nil {
		h.log.Debug("sandbox ended under a process; dropping its stream", "sandbox_id", sb.id, "pid", p.pid)
		panic(http.ErrAbortHandler)
	}
	code, exited, status, errText := p.exitInfo()
	end := &envd.EndEvent{ExitCode: int32(code), Exited: exited, Status: status, Error: errText}
	h.log.Debug("process ended", "sandbox_id", sb.id, "pid", p.pid, "exit_code", code)
	return send(&envd.StartResponse{Event: envd.ProcessEvent{End: end}})
}

// rpcSendInput writes input to a process's stdin (started with stdin).
func (h *Host) rpcSendInput(ctx context.Context, req *connect.Request[envd.SendInputRequest]) (*connect.Response[envd.Empty], error) {
	sb := sandboxFrom(ctx)
	if len(req.Msg.Input.Pty) > 0 {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("pty is not supported by the local sandbox host"))
	}
	p := sb.findProcess(req.Msg.Process)
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	if err := p.writeStdin(req.Msg.Input.Stdin); err != nil {
		if errors.Is(err, errNoStdin) {
			return nil, connect.NewError(connect.CodeFailedPrecondition, err)
		}
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&envd.Empty{}), nil
}

// rpcCloseStdin closes a process's stdin, so that it reads end of file.
func (h *Host) rpcCloseStdin(ctx context.Context, req *connect.Request[envd.ProcessRequest]) (*connect.Response[envd.Empty], error) {
	p := sandboxFrom(ctx).findProcess(req.Msg.Process)
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	p.closeStdin()
	return connect.NewResponse(&envd.Empty{}), nil
}
