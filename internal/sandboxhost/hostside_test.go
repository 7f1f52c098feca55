package sandboxhost

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/aio"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// runner runs a bash script with per-call environment variables in one
// sandbox through one of the host's faces and returns its stdout.
type runner struct {
	name string
	run  func(t *testing.T, script string, env map[string]string) string
}

// faces creates a sandbox through the E2B face and one through the
// provisioner face of srv, and returns a runner for each (envd
// process.Start and the AIO exec route) with its sandbox.
func faces(t *testing.T, srv *Server) ([]runner, []*sandbox) {
	t.Helper()
	created := createSandbox(t, srv, nil)
	c := newEnvd(srv, created)
	envdRun := func(t *testing.T, script string, env map[string]string) string {
		t.Helper()
		// Not a login shell: /etc/profile would set PATH anew.
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		res, err := c.runReq(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}, Envs: env}})
		if err != nil {
			t.Fatalf("run %q: %v", script, err)
		}
		return res.stdout
	}
	base, err := srv.StartProvisioner("127.0.0.1:0", ProvisionerOptions{APIKey: "prov-key"})
	if err != nil {
		t.Fatal(err)
	}
	id := "prov-" + randomID(8)
	var box provSandbox
	postJSON(t, base+"/api/sandboxes", map[string]string{"X-API-Key": "prov-key"},
		map[string]any{"sandbox_id": id, "user_id": "u"}, &box)
	aioRun := func(t *testing.T, script string, env map[string]string) string {
		t.Helper()
		var reply struct {
			Success bool           `json:"success"`
			Data    aio.ExecResult `json:"data"`
		}
		postJSON(t, box.SandboxURL+aio.PathExec, map[string]string{"Authorization": "Bearer " + box.AccessToken},
			aio.ExecRequest{Command: script, Env: env}, &reply)
		if !reply.Success || reply.Data.Status != aio.StatusCompleted {
			t.Fatalf("exec %q: %+v", script, reply)
		}
		return reply.Data.Stdout
	}
	return []runner{{"envd", envdRun}, {"aio", aioRun}},
		[]*sandbox{srv.Host.mustGet(t, created.SandboxID), srv.Host.mustGet(t, id)}
}

// postJSON posts body as JSON with headers and decodes a 200 reply.
func postJSON(t *testing.T, url string, headers map[string]string, body, out any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: HTTP %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// plantPayload writes, in the sandbox's home, a program that appends the
// uid it runs as to hostMarker (a host file no sandbox can see) and to
// /home/user/ran-inside (a file only a process inside it can see), under
// the names a host-side launcher could call by bare name (bin/), and, when
// a C compiler is at hand, as a shared object with the same effect
// (lib/payload.so, and lib/ under the names of the launcher's libraries).
func plantPayload(t *testing.T, sb *sandbox, hostMarker string) {
	t.Helper()
	script := "#!/bin/sh\n/usr/bin/id -u >> " + shellQuote(hostMarker) + " 2>/dev/null\n" +
		"/usr/bin/id -u >> /home/user/ran-inside 2>/dev/null\n"
	for _, d := range []string{"bin", "lib", "gconv"} {
		if err := os.MkdirAll(filepath.Join(sb.home, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"payload", "prlimit", "bwrap", "setpriv", "sh", "bash", "env", "nsenter", "usr", "cat"} {
		if err := os.WriteFile(filepath.Join(sb.home, "bin", name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Log("no C compiler: LD_PRELOAD, LD_AUDIT and LD_LIBRARY_PATH point at a library that does not exist")
		return
	}
	src := filepath.Join(t.TempDir(), "payload.c")
	code := `#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
static void mark(const char *p) { int fd = open(p, O_WRONLY|O_CREAT|O_APPEND, 0666); if (fd >= 0) { dprintf(fd, "%d\n", (int)getuid()); close(fd); } }
__attribute__((constructor)) static void payload(void) { mark(` + strconv.Quote(hostMarker) + `); mark("/home/user/ran-inside"); }
unsigned int la_version(unsigned int v) { return v; }
`
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(sb.home, "lib", "payload.so")
	if out, err := exec.Command("cc", "-shared", "-fPIC", "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	b, err := os.ReadFile(so)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"libselinux.so.1", "libcap.so.2", "libcap-ng.so.0"} {
		if err := os.WriteFile(filepath.Join(sb.home, "lib", name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	gconv := "module INTERNAL PAYLOAD// " + filepath.Join(sb.home, "lib", "payload") + " 1\n"
	if err := os.WriteFile(filepath.Join(sb.home, "gconv", "gconv-modules"), []byte(gconv), 0o644); err != nil {
		t.Fatal(err)
	}
}

// hostileEnvs are environment variables that make a program run a file of
// the caller's choice, with the home's host path and, where a command can
// take it up, with its sandbox path (inside: the payload must then run, in
// the sandbox, as the sandbox's uid).
func hostileEnvs(home string) []struct {
	name   string
	env    map[string]string
	inside bool
} {
	type c = struct {
		name   string
		env    map[string]string
		inside bool
	}
	return []c{
		{"PATH", map[string]string{"PATH": home + "/bin:/usr/bin:/bin"}, false},
		{"PATH inside", map[string]string{"PATH": "/home/user/bin:/usr/bin:/bin"}, true},
		{"LD_PRELOAD", map[string]string{"LD_PRELOAD": home + "/lib/payload.so"}, false},
		{"LD_PRELOAD inside", map[string]string{"LD_PRELOAD": "/home/user/lib/payload.so"}, true},
		{"LD_AUDIT", map[string]string{"LD_AUDIT": home + "/lib/payload.so"}, false},
		{"LD_LIBRARY_PATH", map[string]string{"LD_LIBRARY_PATH": home + "/lib"}, false},
		{"BASH_ENV", map[string]string{"BASH_ENV": home + "/bin/payload"}, false},
		{"BASH_ENV inside", map[string]string{"BASH_ENV": "/home/user/bin/payload"}, true},
		{"ENV", map[string]string{"ENV": home + "/bin/payload"}, false},
		{"SHELLOPTS and PS4", map[string]string{"SHELLOPTS": "xtrace", "PS4": "$(" + home + "/bin/payload)"}, false},
		{"IFS", map[string]string{"IFS": "/", "PATH": home + "/bin"}, false},
		{"GCONV_PATH", map[string]string{"GCONV_PATH": home + "/gconv"}, false},
		{"exported function", map[string]string{"BASH_FUNC_prlimit%%": "() { " + home + "/bin/payload; }"}, false},
	}
}

// TestCallerEnvironmentNeverRunsOnTheHost plants a program in a
// sandbox's home and runs commands whose environment points host-side
// programs at it, through both faces: it must never run outside the
// sandbox (the marker on the host stays absent), and where the command
// itself takes it up it runs inside, as the sandbox's uid.
func TestCallerEnvironmentNeverRunsOnTheHost(t *testing.T) {
	needBwrap(t)
	srv := startHost(t, IsolationBwrap)
	runners, sandboxes := faces(t, srv)
	for i, r := range runners {
		sb := sandboxes[i]
		t.Run(r.name, func(t *testing.T) {
			markerDir := t.TempDir()
			if err := os.Chmod(markerDir, 0o777); err != nil {
				t.Fatal(err)
			}
			hostMarker := filepath.Join(markerDir, "ran-on-host")
			plantPayload(t, sb, hostMarker)
			for _, tc := range hostileEnvs(sb.home) {
				inside := filepath.Join(sb.home, "ran-inside")
				_ = os.Remove(inside)
				out := r.run(t, "prlimit --pid $$ >/dev/null 2>&1; echo done", tc.env)
				if b, err := os.ReadFile(hostMarker); err == nil {
					t.Fatalf("%s: the sandbox's file ran on the host side as uid %q", tc.name, strings.TrimSpace(string(b)))
				}
				if !strings.Contains(out, "done") {
					t.Errorf("%s: command output %q, want it to run", tc.name, out)
				}
				if tc.inside {
					assertRanInsideAsSandbox(t, tc.name, sb, inside)
				}
			}
			assertLauncherEnv(t, sb)
		})
	}
}

// assertRanInsideAsSandbox checks the payload's record of running inside
// the sandbox: present, and never uid 0 (as root, the sandbox's own uid).
func assertRanInsideAsSandbox(t *testing.T, name string, sb *sandbox, inside string) {
	t.Helper()
	b, err := os.ReadFile(inside)
	if err != nil {
		t.Errorf("%s: the command did not take the variable up inside the sandbox: %v", name, err)
		return
	}
	want := strconv.Itoa(os.Getuid())
	if sb.chown {
		want = strconv.Itoa(sb.uid)
	}
	for _, uid := range strings.Fields(string(b)) {
		if uid != want {
			t.Errorf("%s: the payload ran inside as uid %s, want %s", name, uid, want)
		}
	}
}

// assertLauncherEnv checks that the sandbox's launcher (its outermost
// host process) still has the fixed environment.
func assertLauncherEnv(t *testing.T, sb *sandbox) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(sb.agent.pid) + "/environ")
	if os.IsPermission(err) && os.Geteuid() != 0 {
		t.Log("the launcher is the agent, not dumpable: its environment is closed to a host that is not root")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	// The cgroup-joining shell adds its working directory, "/".
	got := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	got = slices.DeleteFunc(got, func(kv string) bool { return kv == "PWD=/" })
	if !slices.Equal(got, launcherEnv) {
		t.Errorf("launcher environment = %q, want %q", got, launcherEnv)
	}
}

// TestCallerEnvironmentReachesTheCommand: per-call variables, PATH
// included, are the command's, on both faces and without isolation too,
// and never the launcher's.
func TestCallerEnvironmentReachesTheCommand(t *testing.T) {
	for _, mode := range isolations(t) {
		t.Run(mode, func(t *testing.T) {
			srv := startHost(t, mode)
			runners, sandboxes := faces(t, srv)
			for i, r := range runners {
				env := map[string]string{"CALL_VAR": "v;$(x)", "PATH": "/opt/nowhere:/usr/bin:/bin", "LD_PRELOAD": ""}
				out := r.run(t, `printf '%s|%s|%s' "$CALL_VAR" "$PATH" "${LD_PRELOAD-unset}"`, env)
				if want := "v;$(x)|/opt/nowhere:/usr/bin:/bin|"; out != want {
					t.Errorf("%s: command saw %q, want %q", r.name, out, want)
				}
				assertLauncherEnv(t, sandboxes[i])
			}
		})
	}
}

// TestBackgroundProcessLivesOn: a server one command leaves running (its
// output still on the command's pipes) is seen by the next command in the
// process list, answers it over loopback, and keeps running, the same
// process, through a pause and a resume.
func TestBackgroundProcessLivesOn(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3 for a server")
	}
	for _, mode := range pauseModes() {
		t.Run(mode.name, func(t *testing.T) {
			srv, created, c, sb := startInMode(t, mode)
			if err := os.WriteFile(filepath.Join(sb.home, "page.txt"), []byte("served"), 0o644); err != nil {
				t.Fatal(err)
			}
			port := 20000 + int(time.Now().UnixNano()%20000)
			server := fmt.Sprintf("/usr/bin/python3 -m http.server %d --bind 127.0.0.1", port)
			if res := c.run(t, "("+server+" &); echo started", nil); res.stdout != "started\n" {
				t.Fatalf("start server: %q %q", res.stdout, res.stderr)
			}
			probe := fmt.Sprintf(`for i in $(seq 200); do curl -sf http://127.0.0.1:%d/page.txt && break; sleep 0.05; done; echo; pgrep -f '[h]ttp.server %d'`, port, port)
			before := c.run(t, probe, nil)
			lines := strings.Split(strings.TrimSpace(before.stdout), "\n")
			if len(lines) != 2 || lines[0] != "served" || lines[1] == "" {
				t.Fatalf("next command: stdout %q stderr %q, want the page and the server's pid", before.stdout, before.stderr)
			}
			if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+created.SandboxID+"/pause", nil, nil); status != http.StatusNoContent {
				t.Fatalf("pause: %d", status)
			}
			if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+created.SandboxID+"/connect", map[string]any{"timeout": 600}, nil); status != http.StatusCreated {
				t.Fatalf("resume: %d", status)
			}
			after := c.run(t, probe, nil)
			if after.stdout != before.stdout {
				t.Errorf("after pause and resume: %q, want %q (the same server answering)", after.stdout, before.stdout)
			}
		})
	}
}

// TestNoHostPathInside: nothing a sandbox can read of its mount table or
// of its process list (command lines, environments, links) names a host
// path: not the host's root dir, the sandbox's directory or the host's
// binary.
func TestNoHostPathInside(t *testing.T) {
	needBwrap(t)
	if os.Geteuid() != 0 {
		t.Skip("a host that is not root binds the sandbox's directories from host paths")
	}
	srv := startHost(t, IsolationBwrap)
	created := createSandbox(t, srv, nil)
	c := newEnvd(srv, created)
	sb := srv.Host.mustGet(t, created.SandboxID)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	c.run(t, "(sleep 1000 &); true", nil)
	script := `cat /proc/self/mountinfo; for p in /proc/[0-9]*; do
	  echo "== $p"; tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; tr '\0' ' ' < $p/environ 2>/dev/null; echo
	  readlink $p/exe $p/cwd $p/root 2>/dev/null; ls -l $p/fd/ 2>/dev/null; cat $p/maps 2>/dev/null | awk '{print $6}' | sort -u
	done; ps -eo pid,user,args`
	res := c.run(t, script, nil)
	for _, host := range []string{srv.Host.opts.RootDir, sb.dir, exe, wd, filepath.Dir(exe)} {
		if strings.Contains(res.stdout, host) {
			t.Errorf("the sandbox sees host path %s:\n%s", host, res.stdout)
		}
	}
	for _, want := range []string{" /home/user ", "sleep 1000", agentArg} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("the sandbox's view lacks %q (the check would prove nothing):\n%s", want, res.stdout)
		}
	}
}

// TestEnvdAnswersAlikeWithoutToken: without the sandbox's own token, a
// live, a paused, an ended and an unknown sandbox answer envd alike, so
// the answer tells nothing of whether an id exists or is paused; with the
// token of one that ended, envd says it is not running (502).
func TestEnvdAnswersAlikeWithoutToken(t *testing.T) {
	srv := startHost(t, IsolationNone)
	live := createSandbox(t, srv, nil)
	paused := createSandbox(t, srv, nil)
	ended := createSandbox(t, srv, nil)
	if status, _ := apiCall(t, srv, "POST", "/sandboxes/"+paused.SandboxID+"/pause", nil, nil); status != http.StatusNoContent {
		t.Fatalf("pause: %d", status)
	}
	if status, _ := apiCall(t, srv, "DELETE", "/sandboxes/"+ended.SandboxID, nil, nil); status != http.StatusNoContent {
		t.Fatalf("kill: %d", status)
	}
	replies := map[string]string{}
	for _, id := range []string{live.SandboxID, paused.SandboxID, ended.SandboxID, "nosuchsandbox"} {
		for _, tok := range []string{"", "wrong", live.EnvdAccessToken} {
			if id == live.SandboxID && tok == live.EnvdAccessToken {
				continue
			}
			c := envdClient{srv: srv, id: id, token: tok}
			for _, path := range []string{"/health", "/files?path=x"} {
				status, body := envdStatus(t, c, http.MethodGet, path)
				replies[fmt.Sprintf("%s %d %s", path, status, body)] = id
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := c.runReq(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/true"}})
			cancel()
			replies[fmt.Sprintf("Start %v", err)] = id
		}
	}
	if len(replies) != 3 {
		t.Errorf("requests without a valid token got %d different answers, want one per route:\n%v", len(replies), replies)
	}
	for reply := range replies {
		if !strings.Contains(reply, "401") && !strings.Contains(reply, "unauthenticated") {
			t.Errorf("answer %q, want 401 (unauthenticated)", reply)
		}
	}
	// A paused sandbox's envd is unreachable: /health answers 502, which
	// the SDK's isRunning reads as "not running" (409 makes it throw).
	if status, _ := envdStatus(t, newEnvd(srv, paused), http.MethodGet, "/health"); status != http.StatusBadGateway {
		t.Errorf("paused sandbox's /health with its token: %d, want 502", status)
	}
	if status, _ := envdStatus(t, newEnvd(srv, paused), http.MethodGet, "/files?path=x"); status != http.StatusConflict {
		t.Errorf("paused sandbox's /files with its token: %d, want 409", status)
	}
	if status, _ := envdStatus(t, newEnvd(srv, ended), http.MethodGet, "/health"); status != http.StatusBadGateway {
		t.Errorf("ended sandbox with its token: %d, want 502", status)
	}
}

// TestSandboxEndsWithItsAgent: a sandbox that kills its own agent ends
// (its processes die, it is no longer listed) instead of lingering.
func TestSandboxEndsWithItsAgent(t *testing.T) {
	for _, mode := range isolations(t) {
		t.Run(mode, func(t *testing.T) {
			srv := startHost(t, mode)
			created := createSandbox(t, srv, nil)
			c := newEnvd(srv, created)
			dir := srv.Host.mustGet(t, created.SandboxID).dir
			marker, done := startSleeper(t, c)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Inside its own PID namespace the sandbox sees only its own
			// agent; without one (isolation none) it is killed by its pid,
			// never by a pattern that would match every host's agents.
			kill := envd.ProcessConfig{Cmd: "/usr/bin/pkill", Args: []string{"-KILL", "-f", "^/proc/self/fd/[0-9]+ " + agentArg + "$"}}
			if mode == IsolationNone {
				kill = envd.ProcessConfig{Cmd: "/bin/kill", Args: []string{"-KILL", strconv.Itoa(srv.Host.mustGet(t, created.SandboxID).agent.pid)}}
			}
			_, _ = c.runReq(ctx, &envd.StartRequest{Process: kill})
			waitFor(t, 20*time.Second, "the sandbox to end", func() bool {
				status, _ := apiCall(t, srv, "GET", "/sandboxes/"+created.SandboxID, nil, nil)
				return status == http.StatusNotFound
			})
			assertDead(t, srv, c, dir, marker, done)
		})
	}
}
