package sandboxhost

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// launcherEnv is the whole environment of every host-side program the host
// starts for a sandbox (its shell prefix, bwrap, setpriv, the agent): fixed,
// so nothing a caller sends reaches a process that runs on the host side.
var launcherEnv = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}

// agentReadyTimeout bounds a sandbox's start-up, and a start request's
// round trip to its agent.
const agentReadyTimeout = 10 * time.Second

// errSandboxEnded: the sandbox's agent is gone.
var errSandboxEnded = errors.New("sandbox ended")

// errStartFailed: the agent could not start a command (missing binary,
// bad working directory).
var errStartFailed = errors.New("cannot start command")

// sandboxAgent is the host's side of a sandbox's agent: the launcher (the
// outermost host process of the sandbox) and the control connection.
type sandboxAgent struct {
	conn   *frameConn
	cmd    *exec.Cmd
	pid    int           // launcher's host pid
	exited chan struct{} // closed once the launcher was reaped
	stderr bytes.Buffer  // launcher's first diagnostics (bwrap errors)

	mu      sync.Mutex
	dead    bool
	endErr  error // why the control connection ended
	nextID  uint64
	pending map[uint64]chan startReply
	exits   map[int]chan int // wait status of each running command, by sandbox pid
}

// startReply is the agent's answer to a start request.
type startReply struct {
	pid  int
	exit <-chan int
	err  error
}

// sandboxOptions are bwrap's options for one sandbox (passed through a
// descriptor, so no host path shows in the sandbox's process list). Its
// home, tmp and mnt live at the given host paths.
//
// Verified on Debian 12 with bubblewrap 0.8, as root and as nobody: a fresh
// network namespace holds only its own loopback; /usr and /etc are
// read-only binds. As root, bubblewrap creates no user namespace, so the
// agent drops to the sandbox's uid with setpriv (no capabilities, no new
// privileges); as any other user, bwrap's user namespace maps the caller's
// uid and --cap-drop ALL removes capabilities.
func (iso isolation) sandboxOptions(home, tmp, mnt string, seccompFD int) []string {
	var args []string
	if iso.setpriv != "" {
		args = append(args, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")
	} else {
		args = append(args, "--unshare-all", "--cap-drop", "ALL")
	}
	args = append(args, "--die-with-parent", "--new-session", "--hostname", "sandbox",
		"--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc")
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		fi, err := os.Lstat("/" + d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink("/" + d); err == nil {
				args = append(args, "--symlink", target, "/"+d)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", "/"+d, "/"+d)
		}
	}
	if fi, err := os.Stat("/opt"); err == nil && fi.IsDir() {
		args = append(args, "--ro-bind", "/opt", "/opt")
	}
	if seccompFD > 0 {
		args = append(args, "--seccomp", strconv.Itoa(seccompFD))
	}
	return append(args, "--proc", "/proc", "--dev", "/dev",
		"--bind", tmp, sandboxTmp, "--bind", mnt, sandboxMnt,
		"--dir", "/home", "--bind", home, sandboxHome, "--chdir", "/")
}

// launcherArgv is the host command line that starts a sandbox running
// inner (the agent's argv inside it): every program by absolute path. A
// /bin/sh prefix first moves itself into the sandbox's cgroups (so bwrap
// and all below it start inside, race-free); bwrap reads its options from
// descriptor argsFD; as root, setpriv drops to the sandbox's uid.
func (iso isolation) launcherArgv(cgroupProcs []string, argsFD, uid, gid int, inner []string) []string {
	var args []string
	if len(cgroupProcs) > 0 {
		var script strings.Builder
		for _, f := range cgroupProcs {
			script.WriteString("echo $$ > " + shellQuote(f) + " || exit 125; ")
		}
		script.WriteString(`exec "$@"`)
		args = append(args, "/bin/sh", "-c", script.String(), "sh")
	}
	args = append(args, iso.bwrap, "--args", strconv.Itoa(argsFD), "--")
	if iso.setpriv != "" {
		if uid == 0 {
			uid, gid = firstSandboxUID, firstSandboxUID // probe runs
		}
		args = append(args, iso.setpriv,
			"--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(gid), "--clear-groups",
			"--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--")
	}
	return append(args, inner...)
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// dataFile returns a readable descriptor holding b (the read end of a
// pipe; b must fit in a pipe's buffer).
func dataFile(b []byte) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	_, err = w.Write(b)
	w.Close()
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// startLauncher starts cmd, whose files include the agent's executable,
// unless the host closed it (ErrClosed).
func (h *Host) startLauncher(cmd *exec.Cmd) error {
	h.exeMu.RLock()
	defer h.exeMu.RUnlock()
	if h.exeClosed {
		return ErrClosed
	}
	return cmd.Start()
}

// launch starts sb's agent: under bubblewrap (its namespaces, uid,
// seccomp filter and cgroup) when the host isolates, else as a plain
// child. It returns once the agent reported ready.
func (h *Host) launch(sb *sandbox) (*sandboxAgent, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	hostEnd, agentEnd := os.NewFile(uintptr(fds[0]), "control"), os.NewFile(uintptr(fds[1]), "agent-control")
	defer hostEnd.Close() // net.FileConn holds its own descriptor
	cmd, extra, err := h.launcherCommand(sb, agentEnd)
	if err != nil {
		return nil, err
	}
	c, err := net.FileConn(hostEnd)
	if err != nil {
		closeAll(extra...)
		return nil, fmt.Errorf("control socket: %w", err)
	}
	ag := &sandboxAgent{conn: &frameConn{c: c.(*net.UnixConn)}, cmd: cmd, exited: make(chan struct{}),
		pending: map[uint64]chan startReply{}, exits: map[int]chan int{}}
	cmd.Stderr = &limitedWriter{w: &ag.stderr, n: 4096}
	err = h.startLauncher(cmd)
	closeAll(extra...) // the launcher holds its own copies
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	ag.pid = cmd.Process.Pid
	go func() {
		_ = cmd.Wait()
		close(ag.exited)
		h.launcherExited(sb)
	}()
	if err := ag.awaitReady(); err != nil {
		ag.kill(h.Isolated())
		ag.awaitExit()
		return nil, fmt.Errorf("start sandbox: %w (%s)", err, strings.TrimSpace(ag.stderr.String()))
	}
	go ag.read()
	if sb.nproc > 0 {
		_ = ag.conn.send(agentMsg{Op: "limits", NProc: sb.nproc})
	}
	return ag, nil
}

// launcherExited ends sb when its launcher exited while sb is still live
// (its agent was killed from inside): a sandbox without its agent can run
// nothing more.
func (h *Host) launcherExited(sb *sandbox) {
	if live, err := h.get(sb.id); err != nil || live != sb {
		return // torn down, or never listed
	}
	h.log.Warn("sandbox agent exited; ending the sandbox", "sandbox_id", sb.id)
	_ = h.kill(sb.id)
}

// launcherCommand builds the launcher of sb; extra are the descriptors it
// inherits (the caller closes them once it started).
func (h *Host) launcherCommand(sb *sandbox, agentEnd *os.File) (*exec.Cmd, []*os.File, error) {
	extra := []*os.File{agentEnd, h.exe} // agentControlFD, agentExeFD
	inner := []string{"/proc/self/fd/" + strconv.Itoa(agentExeFD), agentArg}
	argv := inner
	if h.Isolated() {
		seccompFD := 0
		if h.seccomp != nil {
			seccompFD = agentExeFD + 2
		}
		args, err := dataFile([]byte(strings.Join(h.iso.sandboxOptions(sb.home, sb.tmp, sb.mnt, seccompFD), "\x00") + "\x00"))
		if err != nil {
			agentEnd.Close()
			return nil, nil, fmt.Errorf("bwrap options: %w", err)
		}
		extra = append(extra, args)
		if seccompFD > 0 {
			f, err := dataFile(h.seccomp)
			if err != nil {
				closeAll(agentEnd, args)
				return nil, nil, fmt.Errorf("seccomp pipe: %w", err)
			}
			extra = append(extra, f)
		}
		var procs []string
		if sb.cgroup != nil {
			procs = sb.cgroup.procsFiles()
		}
		argv = h.iso.launcherArgv(procs, agentExeFD+1, sb.uid, sb.gid, inner)
	}
	// Its own session: without a PID namespace, the session is how the
	// host finds what the sandbox left running should its agent die.
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Env: launcherEnv, Dir: "/", ExtraFiles: extra,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}}
	// All but the host's own executable are closed once it started.
	return cmd, append([]*os.File{agentEnd}, extra[2:]...), nil
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
	n  int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.n - l.w.Len(); room > 0 {
		l.w.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// awaitReady waits for the agent's ready message.
func (ag *sandboxAgent) awaitReady() error {
	type result struct {
		msg agentMsg
		err error
	}
	got := make(chan result, 1)
	go func() {
		msg, fds, err := ag.conn.recv()
		closeFDs(fds)
		got <- result{msg, err}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			return r.err
		}
		if r.msg.Op != "ready" {
			return fmt.Errorf("agent said %q first", r.msg.Op)
		}
		return nil
	case <-time.After(agentReadyTimeout):
		return errors.New("agent not ready in time")
	}
}

// read dispatches the agent's messages until the connection ends; then
// every pending start fails and every running command is reported killed
// (the sandbox is gone).
func (ag *sandboxAgent) read() {
	var end error
	for end == nil {
		var msg agentMsg
		var fds []int
		msg, fds, end = ag.conn.recv()
		closeFDs(fds) // the agent never sends descriptors
		if end == nil {
			ag.dispatch(msg)
		}
	}
	ag.mu.Lock()
	defer ag.mu.Unlock()
	ag.dead, ag.endErr = true, end
	for id, ch := range ag.pending {
		ch <- startReply{err: errSandboxEnded}
		delete(ag.pending, id)
	}
	for pid, ch := range ag.exits {
		ch <- int(syscall.SIGKILL) // a wait status: killed by SIGKILL
		delete(ag.exits, pid)
	}
}

// dispatch handles one message of the agent.
func (ag *sandboxAgent) dispatch(msg agentMsg) {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	switch msg.Op {
	case "started", "failed":
		ch, ok := ag.pending[msg.ID]
		if !ok {
			return
		}
		delete(ag.pending, msg.ID)
		if msg.Op == "failed" || msg.Pid <= 0 {
			ch <- startReply{err: fmt.Errorf("%w: %s", errStartFailed, msg.Error)}
			return
		}
		exit := make(chan int, 1)
		ag.exits[msg.Pid] = exit
		ch <- startReply{pid: msg.Pid, exit: exit}
	case "exited":
		if ch, ok := ag.exits[msg.Pid]; ok {
			ch <- msg.Status
			delete(ag.exits, msg.Pid)
		}
	}
}

// start asks the agent to run path with args, env and dir, writing to
// stdout and stderr and, when given, reading stdin (the files: stdout,
// stderr[, stdin]; the host closes its copies).
func (ag *sandboxAgent) start(spec agentMsg, files ...*os.File) startReply {
	ag.mu.Lock()
	if ag.dead {
		err := ag.endErr
		ag.mu.Unlock()
		return startReply{err: fmt.Errorf("%w: %v", errSandboxEnded, err)}
	}
	ag.nextID++
	spec.Op, spec.ID = "start", ag.nextID
	reply := make(chan startReply, 1)
	ag.pending[spec.ID] = reply
	ag.mu.Unlock()
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	if err := ag.conn.send(spec, fds...); err != nil {
		ag.mu.Lock()
		delete(ag.pending, spec.ID)
		ag.mu.Unlock()
		return startReply{err: fmt.Errorf("%w: %v", errSandboxEnded, err)}
	}
	select {
	case r := <-reply:
		return r
	case <-time.After(agentReadyTimeout):
		ag.mu.Lock()
		delete(ag.pending, spec.ID)
		ag.mu.Unlock()
		return startReply{err: errors.New("sandbox agent did not answer")}
	}
}

// signal asks the agent to send sig to the process group of pid.
func (ag *sandboxAgent) signal(pid int, sig syscall.Signal) {
	_ = ag.conn.send(agentMsg{Op: "signal", Pid: pid, Signal: int(sig)})
}

// kill ends the sandbox from the host: under bubblewrap, SIGKILL to the
// PID namespace's init kills every process in it; without, every
// descendant of the agent (a subreaper, so it keeps its orphans) is
// killed.
func (ag *sandboxAgent) kill(isolated bool) {
	if isolated {
		for _, c := range childPIDs(ag.pid) {
			_ = syscall.Kill(c, syscall.SIGKILL)
		}
	} else {
		killDescendants(ag.pid)
		for range 100 {
			left := sessionPIDs(ag.pid)
			if len(left) == 0 {
				break
			}
			for _, p := range left {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	}
	_ = syscall.Kill(ag.pid, syscall.SIGKILL)
}

// sessionPIDs lists the live processes of session sid (from /proc).
func sessionPIDs(sid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == sid || isZombie(pid) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...
		i := bytes.LastIndexByte(b, ')')
		if f := strings.Fields(string(b[i+1:])); i >= 0 && len(f) > 3 && f[3] == strconv.Itoa(sid) {
			out = append(out, pid)
		}
	}
	return out
}

// awaitExit waits up to 10 s for the launcher to be reaped, then closes
// the control connection. It reports whether the launcher exited.
func (ag *sandboxAgent) awaitExit() bool {
	defer ag.conn.c.Close()
	select {
	case <-ag.exited:
		return true
	case <-time.After(10 * time.Second):
		return false
	}
}
