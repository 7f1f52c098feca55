package sandboxhost

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// serverStream calls an envd server-streaming procedure.
func serverStream[Req, Res any](ctx context.Context, c envdClient, procedure string, msg *Req) (*connect.ServerStreamForClient[Res], error) {
	cl := connect.NewClient[Req, Res](http.DefaultClient, c.srv.EnvdURL+procedure, connect.WithCodec(envd.Codec{}))
	req := connect.NewRequest(msg)
	c.headers(req.Header())
	return cl.CallServerStream(ctx, req)
}

// drain reads a process stream to its end: its stdout and end event.
func drain(s *connect.ServerStreamForClient[envd.StartResponse]) (string, *envd.EndEvent, error) {
	var out strings.Builder
	var end *envd.EndEvent
	for s.Receive() {
		ev := s.Msg().Event
		if ev.Data != nil {
			out.Write(ev.Data.Stdout)
		}
		if ev.End != nil {
			end = ev.End
		}
	}
	return out.String(), end, s.Err()
}

// TestStdinAndConnect checks SendInput and CloseStdin on a process
// started with stdin, and that Process/Connect attaches a second client
// that gets the same output and end.
func TestStdinAndConnect(t *testing.T) {
	srv := startHost(t, IsolationNone)
	c := newEnvd(srv, createSandbox(t, srv, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first, err := c.startStream(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "cat; echo done"}}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Receive() || first.Msg().Event.Start == nil {
		t.Fatalf("no start event: %v", first.Err())
	}
	pid := envd.Uint(first.Msg().Event.Start.Pid)
	second, err := serverStream[envd.ProcessRequest, envd.StartResponse](ctx, c, envd.ProcedureConnect, &envd.ProcessRequest{Process: envd.ProcessSelector{Pid: pid}})
	if err != nil {
		t.Fatal(err)
	}
	if !second.Receive() || second.Msg().Event.Start == nil || envd.Uint(second.Msg().Event.Start.Pid) != pid {
		t.Fatalf("Connect: no start event with pid %d: %v", pid, second.Err())
	}
	sel := envd.ProcessSelector{Pid: pid}
	if _, err := unary[envd.SendInputRequest, envd.Empty](ctx, c, envd.ProcedureSendInput, &envd.SendInputRequest{Process: sel, Input: envd.ProcessInput{Stdin: []byte("hello\n")}}); err != nil {
		t.Fatalf("SendInput: %v", err)
	}
	if _, err := unary[envd.ProcessRequest, envd.Empty](ctx, c, envd.ProcedureCloseStdin, &envd.ProcessRequest{Process: sel}); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	for name, s := range map[string]*connect.ServerStreamForClient[envd.StartResponse]{"Start": first, "Connect": second} {
		out, end, err := drain(s)
		if err != nil || end == nil || end.ExitCode != 0 || out != "hello\ndone\n" {
			t.Errorf("%s stream: stdout %q end %+v err %v; want hello, done and exit 0", name, out, end, err)
		}
	}

	// Without stdin, input is refused; an unknown process is not found.
	res := c.run(t, "true", nil)
	if _, err := unary[envd.SendInputRequest, envd.Empty](ctx, c, envd.ProcedureSendInput, &envd.SendInputRequest{Process: envd.ProcessSelector{Pid: envd.Uint(res.pid)}, Input: envd.ProcessInput{Stdin: []byte("x")}}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("SendInput to an ended process: %v, want not_found", err)
	}
	bg, err := c.startStream(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "sleep 100"}}})
	if err != nil || !bg.Receive() {
		t.Fatalf("start: %v", err)
	}
	bgSel := envd.ProcessSelector{Pid: envd.Uint(bg.Msg().Event.Start.Pid)}
	if _, err := unary[envd.SendInputRequest, envd.Empty](ctx, c, envd.ProcedureSendInput, &envd.SendInputRequest{Process: bgSel, Input: envd.ProcessInput{Stdin: []byte("x")}}); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("SendInput to a process without stdin: %v, want failed_precondition", err)
	}
	unknown, err := serverStream[envd.ProcessRequest, envd.StartResponse](ctx, c, envd.ProcedureConnect, &envd.ProcessRequest{Process: envd.ProcessSelector{Pid: 1 << 30}})
	if err == nil && (unknown.Receive() || connect.CodeOf(unknown.Err()) != connect.CodeNotFound) {
		t.Errorf("Connect to an unknown pid: %v, want not_found", unknown.Err())
	}
	bg.Close()
}

// TestSandboxKilledDuringCommand: a sandbox killed while a command
// streams drops the stream without an end event, as E2B's does.
func TestSandboxKilledDuringCommand(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, nil)
	c := newEnvd(srv, sb)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := c.startStream(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "sleep 1000"}}})
	if err != nil || !s.Receive() || s.Msg().Event.Start == nil {
		t.Fatalf("start: %v", err)
	}
	if status, _ := apiCall(t, srv, "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil); status != http.StatusNoContent {
		t.Fatalf("kill: %d", status)
	}
	_, end, err := drain(s)
	if end != nil || err == nil {
		t.Errorf("stream of a killed sandbox ended with %+v, error %v; want it dropped without an end event", end, err)
	}
}
