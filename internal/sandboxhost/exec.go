package sandboxhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// defaultPath is PATH inside a sandbox unless the caller sets one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// outputChunk is the largest data event sent; output is streamed in chunks
// of at most this many bytes and at most outputQueue chunks are held in
// memory per process (a slow reader blocks the process's writes).
const (
	outputChunk = 32 << 10
	outputQueue = 32
)

// When the host runs as root, each sandbox runs as its own host uid (and
// gid of the same number), taken from [firstSandboxUID, firstSandboxUID +
// sandboxUIDs) and reused only after its sandbox is gone: per-uid kernel
// state (keyrings, RLIMIT_NPROC, signal permission) is then never shared
// between two live sandboxes of one host. No passwd entry is needed.
const (
	firstSandboxUID = 200000
	sandboxUIDs     = 65536
)

// confinement is what one sandbox process is confined by, besides the
// namespaces and mounts every sandbox gets.
type confinement struct {
	uid, gid int // host ids to drop to (root host only)
	// seccompFD is the child's descriptor of the seccomp program (0: none).
	seccompFD int
	// cgroupProcs are the cgroup.procs files the process joins before
	// bubblewrap starts (nil: no cgroup).
	cgroupProcs []string
	// nproc is RLIMIT_NPROC for the sandbox's uid (0: unchanged).
	nproc int
}

// isolation is how sandbox processes are wrapped.
type isolation struct {
	bwrap   string // bwrap path; "" = no isolation
	setpriv string // setpriv path; "" = keep the host's uid
}

// command returns the argv that runs argv in a sandbox whose home, tmp and
// mnt live at the given host paths, starting in cwd (a sandbox path).
//
// Verified on Debian 12 with bubblewrap 0.8, as root and as nobody: a fresh
// network namespace holds only its own loopback, so there is no network;
// /usr and /etc are read-only binds. As root, bubblewrap creates no user
// namespace, so a process that is uid 0 inside could still write host
// sysctls under /proc/sys; the host therefore runs bwrap without a user
// namespace and drops to sandboxUID with setpriv (no capabilities, no new
// privileges) before the command. As any other user, bwrap's user
// namespace maps the caller's uid and --cap-drop ALL removes capabilities.
//
// conf adds the sandbox's own uid, seccomp filter, cgroup and process
// limit: a /bin/sh prefix writes its own pid into the cgroup (so bwrap and
// everything below it start inside, race-free) and execs prlimit for the
// uid's process limit.
func (iso isolation) command(home, tmp, mnt, cwd string, argv []string, conf confinement) []string {
	var args []string
	if len(conf.cgroupProcs) > 0 || conf.nproc > 0 {
		var script strings.Builder
		for _, f := range conf.cgroupProcs {
			script.WriteString("echo $$ > " + shellQuote(f) + " || exit 125; ")
		}
		script.WriteString(`exec "$@"`)
		args = append(args, "/bin/sh", "-c", script.String(), "sh")
		if conf.nproc > 0 {
			n := strconv.Itoa(conf.nproc)
			args = append(args, "prlimit", "--nproc="+n+":"+n, "--")
		}
	}
	args = append(args, iso.bwrap)
	if iso.setpriv != "" {
		args = append(args, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")
	} else {
		args = append(args, "--unshare-all", "--cap-drop", "ALL")
	}
	args = append(args,
		"--die-with-parent",
		"--new-session",
		"--hostname", "sandbox",
		"--ro-bind", "/usr", "/usr",
		"--ro-bind", "/etc", "/etc",
	)
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		fi, err := os.Lstat("/" + d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink("/" + d)
			if err != nil {
				continue
			}
			args = append(args, "--symlink", target, "/"+d)
		case fi.IsDir():
			args = append(args, "--ro-bind", "/"+d, "/"+d)
		}
	}
	if fi, err := os.Stat("/opt"); err == nil && fi.IsDir() {
		args = append(args, "--ro-bind", "/opt", "/opt")
	}
	if conf.seccompFD > 0 {
		args = append(args, "--seccomp", strconv.Itoa(conf.seccompFD))
	}
	args = append(args,
		"--proc", "/proc",
		"--dev", "/dev",
		"--bind", tmp, sandboxTmp,
		"--bind", mnt, sandboxMnt,
		"--dir", "/home",
		"--bind", home, sandboxHome,
		"--chdir", cwd,
		"--",
	)
	if iso.setpriv != "" {
		uid, gid := conf.uid, conf.gid
		if uid == 0 {
			uid, gid = firstSandboxUID, firstSandboxUID // probe runs
		}
		args = append(args, iso.setpriv,
			"--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(gid), "--clear-groups",
			"--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--")
	}
	return append(args, argv...)
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// process is one running command in a sandbox.
type process struct {
	spec startSpec
	pid  int
	cmd  *exec.Cmd
	done chan struct{} // closed after Wait returned
}

// signal sends sig to the process's whole process group. For SIGKILL it
// also kills the process's direct children first: under bubblewrap that
// is the sandbox's PID-namespace init, whose death makes the kernel kill
// everything in the namespace, even processes that left the group with
// setsid.
func (p *process) signal(sig syscall.Signal) {
	if sig == syscall.SIGKILL {
		for _, c := range childPIDs(p.pid) {
			_ = syscall.Kill(c, sig)
		}
	}
	// The process leads its own group (Setpgid), so -pid is the group.
	_ = syscall.Kill(-p.pid, sig)
}

// childPIDs lists pid's children from /proc (empty if it is gone).
func childPIDs(pid int) []int {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return nil
	}
	var out []int
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + task.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// event is one item of a process's output stream.
type event struct {
	stdout, stderr []byte
}

// startSpec is a command to run.
type startSpec struct {
	cmd  string
	args []string
	envs map[string]string
	cwd  string // sandbox path; "" = /home/user
	tag  *string
}

// running is a started process and its output.
type running struct {
	*process
	events <-chan event // closed once the process exited and its output was read; then state and err are set
	state  *os.ProcessState
	err    error // from Wait (not exit status)
}

// hostPathForCwd maps a sandbox cwd to a host directory (no isolation).
func (sb *sandbox) hostPathForCwd(cwd string) (string, error) {
	r, err := sb.resolve(cwd)
	if err != nil {
		return "", err
	}
	if err := r.isDir(); err != nil {
		return "", fmt.Errorf("cwd %s: %w", cwd, err)
	}
	return r.hostPath(), nil
}

// env builds the process environment: defaults, then sandbox envVars, then
// per-call envs (later wins).
func (h *Host) env(sb *sandbox, envs map[string]string) []string {
	home := sandboxHome
	if !h.Isolated() {
		home = sb.home
	}
	m := map[string]string{
		"PATH":            defaultPath,
		"HOME":            home,
		"USER":            "user",
		"LOGNAME":         "user",
		"SHELL":           "/bin/bash",
		"LANG":            "C.UTF-8",
		"TERM":            "xterm",
		"E2B_SANDBOX":     "true",
		"E2B_SANDBOX_ID":  sb.id,
		"E2B_TEMPLATE_ID": sb.templateID,
	}
	if !h.Isolated() {
		m["TMPDIR"] = sb.tmp
	}
	for k, v := range sb.envVars {
		m[k] = v
	}
	for k, v := range envs {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// Start errors for bad requests.
var (
	errInvalidEnv   = errors.New("invalid environment variable name")
	errEmptyCommand = errors.New("empty command")
)

// start runs spec in sb. The returned events channel streams output; when it
// is closed, wait on done and read state.
func (h *Host) start(sb *sandbox, spec startSpec) (*running, error) {
	if spec.cmd == "" {
		return nil, errEmptyCommand
	}
	for k := range spec.envs {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("%w: %q", errInvalidEnv, k)
		}
	}
	cmd, release, err := h.command(sb, spec)
	if err != nil {
		return nil, err
	}
	defer release() // the child holds its own copies once started
	cmd.Env = h.env(sb, spec.envs)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW

	sb.mu.Lock()
	if sb.dead {
		sb.mu.Unlock()
		closeAll(outR, outW, errR, errW)
		return nil, ErrNotFound
	}
	if sb.state != stateRunning {
		sb.mu.Unlock()
		closeAll(outR, outW, errR, errW)
		return nil, errPaused
	}
	if err := cmd.Start(); err != nil {
		sb.mu.Unlock()
		closeAll(outR, outW, errR, errW)
		return nil, fmt.Errorf("start process: %w", err)
	}
	p := &process{spec: spec, pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{})}
	sb.procs[p.pid] = p
	sb.mu.Unlock()
	closeAll(outW, errW) // the child holds its own copies

	events := make(chan event, outputQueue)
	r := &running{process: p, events: events}
	r.stream(sb, events, outR, errR)
	return r, nil
}

// command builds the command of spec in sb: under the isolation tool
// (bwrap, with the sandbox's uid, limits and seccomp filter) when the host
// isolates, else as a plain child in the sandbox's home. release closes
// what the child inherits, once it started.
func (h *Host) command(sb *sandbox, spec startSpec) (cmd *exec.Cmd, release func(), err error) {
	release = func() {}
	cwd := spec.cwd
	if cwd == "" {
		cwd = sandboxHome
	}
	if !h.Isolated() {
		dir, err := sb.hostPathForCwd(cwd)
		if err != nil {
			return nil, release, err
		}
		cmd = exec.Command(spec.cmd, spec.args...)
		cmd.Dir = dir
		return cmd, release, nil
	}
	vcwd, err := sb.virtualPath(cwd)
	if err != nil {
		return nil, release, err
	}
	// A cwd inside the sandbox's own directories must exist (outside
	// them, e.g. /usr, bwrap itself reports a bad one).
	if vp, err := sb.resolve(vcwd); err == nil {
		if err := vp.isDir(); err != nil {
			return nil, release, fmt.Errorf("cwd %s: %w", vcwd, err)
		}
	}
	conf := confinement{uid: sb.uid, gid: sb.gid, nproc: sb.nproc}
	if sb.cgroup != nil {
		conf.cgroupProcs = sb.cgroup.procsFiles()
	}
	var extra []*os.File
	if h.seccomp != nil {
		f, err := seccompFile(h.seccomp)
		if err != nil {
			return nil, release, err
		}
		release = func() { f.Close() }
		conf.seccompFD = 3 // the first of ExtraFiles
		extra = append(extra, f)
	}
	argv := h.iso.command(sb.home, sb.tmp, sb.mnt, vcwd, append([]string{spec.cmd}, spec.args...), conf)
	cmd = exec.Command(argv[0], argv[1:]...)
	cmd.ExtraFiles = extra
	return cmd, release, nil
}

// stream reads the process's stdout and stderr (outR, errR) into events
// (r's) and, once it exited, kills what is left of its process group,
// records its exit, closes events and marks it done.
func (r *running) stream(sb *sandbox, events chan<- event, outR, errR *os.File) {
	p, cmd := r.process, r.process.cmd
	var readers sync.WaitGroup
	pump := func(rd io.Reader, isErr bool) {
		defer readers.Done()
		for {
			buf := make([]byte, outputChunk)
			n, err := rd.Read(buf)
			if n > 0 {
				ev := event{}
				if isErr {
					ev.stderr = buf[:n]
				} else {
					ev.stdout = buf[:n]
				}
				events <- ev
			}
			if err != nil {
				return
			}
		}
	}
	readers.Add(2)
	go pump(outR, false)
	go pump(errR, true)
	go func() {
		// Wait for the exit without reaping, so the process group id cannot
		// be reused while we kill what is left in it (e.g. `sleep 100 &`).
		waitExitedNoReap(p.pid)
		p.signal(syscall.SIGKILL)
		r.err = cmd.Wait()
		r.state = cmd.ProcessState
		// Output pipes may be held open by a process that left the group
		// (setsid): stop reading after a grace period.
		t := time.AfterFunc(pipeGrace, func() { closeAll(outR, errR) })
		readers.Wait()
		t.Stop()
		closeAll(outR, errR)
		close(events)
		sb.mu.Lock()
		delete(sb.procs, p.pid)
		sb.mu.Unlock()
		close(p.done)
	}()
}

// pipeGrace is how long output is still read after a process exited.
const pipeGrace = 2 * time.Second

// closeAll closes files, ignoring errors.
func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// waitExitedNoReap blocks until pid has exited but leaves it a zombie
// (waitid with WNOWAIT), so its pid and process group stay reserved.
func waitExitedNoReap(pid int) {
	const (
		pPID    = 1
		wExited = 0x4
		wNoWait = 0x1000000
	)
	var info [128]byte
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info[0])), wExited|wNoWait, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}

// discard drains r's output so the process never blocks on a full pipe.
func (r *running) discard() {
	for range r.events {
	}
}

// exitInfo reports exit code, exited flag and status text of a finished
// process, as envd does (exit code -1 when killed by a signal).
func (r *running) exitInfo() (code int, exited bool, status string, errText string) {
	if r.state == nil {
		if r.err != nil {
			return -1, false, "error", r.err.Error()
		}
		return -1, false, "unknown", ""
	}
	return r.state.ExitCode(), r.state.Exited(), r.state.String(), ""
}

// runToEnd waits for the process to finish, discarding output, honouring
// ctx by killing the process group.
func (r *running) runToEnd(ctx context.Context) {
	go func() {
		select {
		case <-ctx.Done():
			r.signal(syscall.SIGKILL)
		case <-r.done:
		}
	}()
	r.discard()
	<-r.done
}
