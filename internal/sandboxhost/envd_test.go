package sandboxhost

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// isolations returns the modes to test: always none, bwrap when installed.
func isolations(t *testing.T) []string {
	modes := []string{IsolationNone}
	if _, err := os.Stat("/usr/bin/bwrap"); err == nil {
		modes = append(modes, IsolationBwrap)
	}
	return modes
}

func TestEnvdRoutingAndAuth(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, nil)
	good := newEnvd(srv, sb)
	ctx := context.Background()

	tests := []struct {
		name       string
		c          envdClient
		wantHealth int
		wantCode   connect.Code
	}{
		// Without the sandbox's own token every id answers alike.
		{"unknown sandbox", envdClient{srv: srv, id: "nosuchsandbox", token: sb.EnvdAccessToken}, http.StatusUnauthorized, connect.CodeUnauthenticated},
		{"missing sandbox id", envdClient{srv: srv, token: sb.EnvdAccessToken}, http.StatusUnauthorized, connect.CodeUnauthenticated},
		{"wrong token", envdClient{srv: srv, id: sb.SandboxID, token: "wrong"}, http.StatusUnauthorized, connect.CodeUnauthenticated},
		{"missing token", envdClient{srv: srv, id: sb.SandboxID}, http.StatusUnauthorized, connect.CodeUnauthenticated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", srv.EnvdURL+"/health", nil)
			tc.c.headers(req.Header)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.wantHealth {
				t.Errorf("health status = %d, want %d", resp.StatusCode, tc.wantHealth)
			}
			_, err = unary[envd.ListDirRequest, envd.ListDirResponse](ctx, tc.c, envd.ProcedureListDir, &envd.ListDirRequest{Path: "/home/user"})
			if got := connect.CodeOf(err); got != tc.wantCode {
				t.Errorf("ListDir code = %v (%v), want %v", got, err, tc.wantCode)
			}
			_, err = tc.c.runReq(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/true"}})
			if got := connect.CodeOf(err); got != tc.wantCode {
				t.Errorf("Start code = %v (%v), want %v", got, err, tc.wantCode)
			}
			if status, _ := tc.c.files(t, "GET", "path=x", nil, nil); status != tc.wantHealth {
				t.Errorf("GET /files status = %d", status)
			}
		})
	}
	if res := good.run(t, "true", nil); res.end.ExitCode != 0 {
		t.Errorf("good client: exit %d", res.end.ExitCode)
	}
}

func TestRunCommand(t *testing.T) {
	for _, mode := range isolations(t) {
		t.Run(mode, func(t *testing.T) {
			srv := startHost(t, mode)
			sb := createSandbox(t, srv, map[string]any{"envVars": map[string]string{"SB_VAR": "sandbox", "OVERRIDE": "sandbox"}})
			c := newEnvd(srv, sb)

			res := c.run(t, `echo "$SB_VAR $OVERRIDE $CALL_VAR"; echo err >&2; printf '%s' "$HOME"; exit 3`,
				map[string]string{"OVERRIDE": "call", "CALL_VAR": "x y;$(rm -rf /)"})
			if res.events[0].Start == nil || res.events[0].Start.Pid == 0 {
				t.Errorf("first event = %+v, want start with a pid", res.events[0])
			}
			wantHome := "/home/user"
			if mode == IsolationNone {
				wantHome = srv.Host.mustGet(t, sb.SandboxID).home
			}
			if want := "sandbox call x y;$(rm -rf /)\n" + wantHome; res.stdout != want {
				t.Errorf("stdout = %q, want %q", res.stdout, want)
			}
			if res.stderr != "err\n" {
				t.Errorf("stderr = %q, want %q", res.stderr, "err\n")
			}
			if res.end.ExitCode != 3 || !res.end.Exited || res.end.Status != "exit status 3" {
				t.Errorf("end = %+v, want exit 3", res.end)
			}

			// Default cwd is the home; an explicit cwd is honoured.
			if err := os.Mkdir(filepath.Join(srv.Host.mustGet(t, sb.SandboxID).home, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			cwd := "/home/user/sub"
			r2, err := c.runReq(context.Background(), &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "basename $PWD"}, Cwd: cwd}})
			if err != nil || strings.TrimSpace(r2.stdout) != "sub" {
				t.Errorf("cwd run: stdout %q err %v, want sub", r2.stdout, err)
			}

			// Large output streams through intact.
			r3 := c.run(t, "head -c 5000000 /dev/zero | tr '\\0' a; echo", nil)
			if len(r3.stdout) != 5000001 || strings.Trim(r3.stdout, "a\n") != "" {
				t.Errorf("large output: %d bytes, want 5000001 a's and a newline", len(r3.stdout))
			}
			if n := len(r3.events); n < 5000000/outputChunk {
				t.Errorf("large output in %d events, want it chunked", n)
			}
		})
	}
}

func (h *Host) mustGet(t *testing.T, id string) *sandbox {
	t.Helper()
	sb, err := h.get(id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return sb
}

func TestStartErrors(t *testing.T) {
	for _, mode := range isolations(t) {
		t.Run(mode, func(t *testing.T) { testStartErrors(t, mode) })
	}
}

func testStartErrors(t *testing.T, mode string) {
	srv := startHost(t, mode)
	c := newEnvd(srv, createSandbox(t, srv, nil))
	outside, missing, file := "/etc", "/home/user/missing", "/home/user/f"
	if err := os.WriteFile(filepath.Join(srv.Host.mustGet(t, c.id).home, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  *envd.StartRequest
		want connect.Code
	}{
		{"empty command", &envd.StartRequest{}, connect.CodeInvalidArgument},
		{"missing binary", &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/no/such/binary"}}, connect.CodeInvalidArgument},
		{"bad env key", &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"A=B": "x"}}}, connect.CodeInvalidArgument},
		{"cwd outside sandbox", &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/true", Cwd: outside}}, connect.CodeInvalidArgument},
		{"missing cwd", &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/true", Cwd: missing}}, connect.CodeInvalidArgument},
		{"cwd is a file", &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/true", Cwd: file}}, connect.CodeInvalidArgument},
		{"pty", &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/true"}, Pty: []byte(`{"size":{"cols":80,"rows":24}}`)}, connect.CodeUnimplemented},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.runReq(context.Background(), tc.req)
			if mode == IsolationBwrap && tc.name == "cwd outside sandbox" {
				// Under bwrap /etc exists in the sandbox (read-only): a valid cwd.
				if err != nil {
					t.Errorf("cwd /etc under bwrap: %v, want success", err)
				}
				return
			}
			if got := connect.CodeOf(err); got != tc.want {
				t.Errorf("code = %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}

// markerRunning reports whether any host process has marker in its
// command line.
func markerRunning(t *testing.T, marker string) bool {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), marker) {
			continue
		}
		if !processGone(mustAtoi(e.Name())) {
			return true
		}
	}
	return false
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// startSleeper starts a long command whose processes carry a unique
// marker in their command lines and waits until they run. It returns the
// marker and a channel that yields the stream's outcome.
func startSleeper(t *testing.T, c envdClient) (string, <-chan error) {
	t.Helper()
	secs := 100000 + time.Now().UnixNano()%100000
	marker := fmt.Sprintf("sleep %d", secs)
	// A background child and a foreground one: both must die.
	script := fmt.Sprintf("sleep %d & sleep %d; wait", secs, secs)
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		stream, err := c.startStream(context.Background(), &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}})
		if err != nil {
			close(started)
			done <- err
			return
		}
		defer stream.Close()
		first := true
		var end *envd.EndEvent
		for stream.Receive() {
			if first {
				close(started)
				first = false
			}
			if e := stream.Msg().Event.End; e != nil {
				end = e
			}
		}
		if first {
			close(started)
		}
		if err := stream.Err(); err != nil {
			done <- err
			return
		}
		if end == nil {
			done <- errors.New("no end event")
			return
		}
		done <- fmt.Errorf("ended: exit %d status %s", end.ExitCode, end.Status)
	}()
	<-started
	waitFor(t, 10*time.Second, "sleepers to start", func() bool { return markerRunning(t, marker) })
	return marker, done
}

func TestTimeoutExpiryKillsSandbox(t *testing.T) {
	for _, mode := range isolations(t) {
		t.Run(mode, func(t *testing.T) {
			srv := startHost(t, mode)
			sb := createSandbox(t, srv, map[string]any{"timeout": 60})
			c := newEnvd(srv, sb)
			dir := srv.Host.mustGet(t, sb.SandboxID).dir
			marker, done := startSleeper(t, c)

			if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", map[string]any{"timeout": 1}, nil); status != http.StatusNoContent {
				t.Fatalf("set timeout: status %d, want 204", status)
			}
			var d e2bapi.SandboxDetail
			apiCall(t, srv, "GET", "/sandboxes/"+sb.SandboxID, nil, &d)
			if left := time.Until(d.EndAt); left > 1500*time.Millisecond {
				t.Errorf("endAt %v from now after timeout 1, want <= 1s", left)
			}
			waitFor(t, 10*time.Second, "sandbox to expire", func() bool {
				status, _ := apiCall(t, srv, "GET", "/sandboxes/"+sb.SandboxID, nil, nil)
				return status == http.StatusNotFound
			})
			assertDead(t, srv, c, dir, marker, done)
		})
	}
}

func TestKillKillsSandbox(t *testing.T) {
	for _, mode := range isolations(t) {
		t.Run(mode, func(t *testing.T) {
			srv := startHost(t, mode)
			sb := createSandbox(t, srv, map[string]any{"timeout": 60})
			c := newEnvd(srv, sb)
			dir := srv.Host.mustGet(t, sb.SandboxID).dir
			marker, done := startSleeper(t, c)
			if status, _ := apiCall(t, srv, "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil); status != http.StatusNoContent {
				t.Fatalf("kill status = %d, want 204", status)
			}
			assertDead(t, srv, c, dir, marker, done)
		})
	}
}

// assertDead checks that a sandbox is gone everywhere: processes, stream,
// directory, envd and listing.
func assertDead(t *testing.T, srv *Server, c envdClient, dir, marker string, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for markerRunning(t, marker) {
		if time.Now().After(deadline) {
			out, _ := exec.Command("ps", "-eo", "pid,ppid,pgid,sid,stat,args").CombinedOutput()
			t.Fatalf("sandbox processes (%s) still running 10s after death:\n%s", marker, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Logf("stream outcome: %v", err)
	case <-time.After(10 * time.Second):
		t.Error("process stream still open after the sandbox died")
	}
	waitFor(t, 10*time.Second, "sandbox dir removal", func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	})
	req, _ := http.NewRequest("GET", srv.EnvdURL+"/health", nil)
	c.headers(req.Header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("health after death = %d, want 502", resp.StatusCode)
	}
	var list []e2bapi.ListedSandbox
	apiCall(t, srv, "GET", "/v2/sandboxes", nil, &list)
	if len(list) != 0 {
		t.Errorf("list after death = %d sandboxes, want 0", len(list))
	}
}

func TestSendSignalAndDisconnect(t *testing.T) {
	srv := startHost(t, IsolationNone)
	c := newEnvd(srv, createSandbox(t, srv, nil))

	// SIGKILL via SendSignal ends the process with exit code -1.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := c.startStream(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "sleep 1000"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().Event.Start == nil {
		t.Fatalf("first event missing: %v", stream.Err())
	}
	pid := stream.Msg().Event.Start.Pid
	p := envd.Uint(pid)
	if _, err := unary[envd.SendSignalRequest, envd.Empty](ctx, c, envd.ProcedureSendSignal, &envd.SendSignalRequest{Process: envd.ProcessSelector{Pid: p}, Signal: envd.Enum{Name: "SIGNAL_SIGKILL"}}); err != nil {
		t.Fatalf("SendSignal: %v", err)
	}
	var end *envd.EndEvent
	for stream.Receive() {
		if e := stream.Msg().Event.End; e != nil {
			end = e
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	stream.Close()
	if end == nil || end.ExitCode != -1 || end.Exited || !strings.Contains(end.Status, "killed") {
		t.Errorf("end = %+v, want killed with exit code -1", end)
	}
	missing := envd.Uint(1)
	_, err = unary[envd.SendSignalRequest, envd.Empty](ctx, c, envd.ProcedureSendSignal, &envd.SendSignalRequest{Process: envd.ProcessSelector{Pid: missing}, Signal: envd.Enum{Number: 9}})
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("SendSignal to unknown pid: %v, want not_found", err)
	}

	// A client that goes away takes its process with it.
	marker := fmt.Sprintf("sleep %d", 200000+time.Now().UnixNano()%100000)
	ctx2, cancel2 := context.WithCancel(context.Background())
	s2, err := c.startStream(ctx2, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", marker}}})
	if err != nil {
		t.Fatal(err)
	}
	if !s2.Receive() {
		t.Fatalf("no start event: %v", s2.Err())
	}
	waitFor(t, 10*time.Second, "process to start", func() bool { return markerRunning(t, marker) })
	cancel2()
	s2.Close()
	waitFor(t, 10*time.Second, "process to die after disconnect", func() bool { return !markerRunning(t, marker) })
}

func TestBwrapIsolation(t *testing.T) {
	needBwrap(t)
	srv := startHost(t, IsolationBwrap)
	if !srv.Host.Isolated() {
		t.Fatal("Isolation bwrap but host not isolated")
	}
	sb := createSandbox(t, srv, nil)
	c := newEnvd(srv, sb)
	apiPort := srv.APIURL[strings.LastIndexByte(srv.APIURL, ':')+1:]
	tests := []struct {
		name, script string
		wantExit     int32
		wantOut      string
	}{
		{"usr read-only", "touch /usr/x 2>/dev/null", 1, ""},
		{"etc read-only", "echo x >> /etc/hostname 2>/dev/null", 1, ""},
		{"no host loopback", "exec 3<>/dev/tcp/127.0.0.1/" + apiPort, 1, ""},
		{"only lo", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", 0, "lo\n"},
		{"home is /home/user", "pwd; echo $HOME", 0, "/home/user\n/home/user\n"},
		{"home writable", "echo hi > f && cat f", 0, "hi\n"},
		{"tmp writable", "echo t > /tmp/t && cat /tmp/t", 0, "t\n"},
		{"tmp persists", "cat /tmp/t", 0, "t\n"},
		{"mnt symlink without sudo", "ln -sfn /home/user /mnt/user-data && cat /mnt/user-data/f", 0, "hi\n"},
		{"mnt persists", "readlink /mnt/user-data", 0, "/home/user\n"},
		{"host sysctls read-only", "echo 60 > /proc/sys/vm/swappiness 2>/dev/null", 1, ""},
		{"no capabilities", "grep CapEff /proc/self/status | tr -d '\t'", 0, "CapEff:0000000000000000\n"},
		{"host root not visible", "ls /root 2>/dev/null; ls " + srv.Host.opts.RootDir + " 2>/dev/null; true", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := c.run(t, tc.script, nil)
			if res.end.ExitCode != tc.wantExit || res.stdout != tc.wantOut {
				t.Errorf("exit %d stdout %q stderr %q, want exit %d stdout %q", res.end.ExitCode, res.stdout, res.stderr, tc.wantExit, tc.wantOut)
			}
		})
	}
	if os.Geteuid() == 0 {
		res := c.run(t, "id -u", nil)
		if uid, err := strconv.Atoi(strings.TrimSpace(res.stdout)); err != nil || uid < firstSandboxUID || uid >= firstSandboxUID+sandboxUIDs {
			t.Errorf("uid inside = %q, want one of the sandbox uids (the host runs as root, sandboxes must not)", res.stdout)
		}
	}
	// Files the host writes for the sandbox are the sandbox's own.
	if status, body := c.files(t, "POST", "path=up/loaded.txt", strings.NewReader("a"), nil); status != 200 {
		t.Fatalf("upload: %d %s", status, body)
	}
	if res := c.run(t, "echo b >> up/loaded.txt && touch up/new && cat up/loaded.txt", nil); res.end.ExitCode != 0 || res.stdout != "ab\n" {
		t.Errorf("sandbox editing an uploaded file: exit %d stdout %q stderr %q", res.end.ExitCode, res.stdout, res.stderr)
	}
	// What the sandbox wrote is in its home on the host.
	b, err := os.ReadFile(filepath.Join(srv.Host.mustGet(t, sb.SandboxID).home, "f"))
	if err != nil || string(b) != "hi\n" {
		t.Errorf("host view of home/f = %q, %v", b, err)
	}
}

func TestStartCancelKillsEverything(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := t.TempDir()
	srv, err := Start(ctx, Options{APIKey: testAPIKey, RootDir: root, Isolation: IsolationNone}, "", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	sb := createSandbox(t, srv, nil)
	dir := srv.Host.mustGet(t, sb.SandboxID).dir
	marker, _ := startSleeper(t, newEnvd(srv, sb))
	cancel()
	waitFor(t, 10*time.Second, "processes to die after cancel", func() bool { return !markerRunning(t, marker) })
	waitFor(t, 10*time.Second, "sandbox dir removal after cancel", func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	})
	waitFor(t, 10*time.Second, "API to stop listening", func() bool {
		resp, err := http.Get(srv.APIURL + "/v2/sandboxes")
		if err == nil {
			resp.Body.Close()
		}
		return err != nil
	})
	if _, err := srv.Host.create(createSpec{timeout: time.Minute}); !errors.Is(err, ErrClosed) {
		t.Errorf("create after close: %v, want ErrClosed", err)
	}
}
