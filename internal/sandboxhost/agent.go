package sandboxhost

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The sandbox agent is the one long-lived process of a sandbox, started
// once, inside the sandbox's namespaces and under its uid, by the host
// binary re-executed with agentArg. Every command of the sandbox is its
// child: the host sends it a start request over the control socket (fd
// agentControlFD, whose other end only the host holds) with the command's
// path, arguments, environment and working directory, and the write ends
// of the command's stdout and stderr pipes as SCM_RIGHTS; the agent
// answers with the command's pid in the sandbox, and later its wait
// status. So a command's environment is applied by execve inside the
// sandbox, never to a host-side process, and commands share one process
// table in which background processes live on until the sandbox ends.

// agentArg is the hidden argument that makes a binary linking this
// package run as a sandbox agent (see init).
const agentArg = "--sandboxhost-agent"

// Descriptors the agent inherits: the control socket and the host
// binary it was executed from (closed at once).
const (
	agentControlFD = 3
	agentExeFD     = 4
)

// maxAgentFrame bounds one control message (arguments and environment of
// a command are bounded far lower by the kernel's ARG_MAX).
const maxAgentFrame = 16 << 20

// agentMsg is one control message. Host to agent: start (ID, Path, Args,
// Env, Dir, two descriptors), signal (Pid, Signal), limits (NProc).
// Agent to host: ready (Pid), started (ID, Pid), failed (ID, Error),
// exited (Pid, Status).
type agentMsg struct {
	Op     string   `json:"op"`
	ID     uint64   `json:"id,omitempty"`
	Pid    int      `json:"pid,omitempty"`
	Path   string   `json:"path,omitempty"`
	Args   []string `json:"args,omitempty"`
	Env    []string `json:"env,omitempty"`
	Dir    string   `json:"dir,omitempty"`
	Signal int      `json:"signal,omitempty"`
	Status int      `json:"status,omitempty"`
	Error  string   `json:"error,omitempty"`
	NProc  int      `json:"nproc,omitempty"`
}

// init turns a binary that links this package into the sandbox agent
// when it is executed with agentArg alone: the host re-executes its own
// binary this way, so the agent needs no separate install.
func init() {
	if len(os.Args) == 2 && os.Args[1] == agentArg {
		os.Exit(runAgent())
	}
}

// frameConn reads and writes length-prefixed JSON frames, with
// descriptors attached to a frame's first byte.
type frameConn struct {
	c  *net.UnixConn
	wm sync.Mutex
}

// send writes msg with fds (may be none).
func (f *frameConn) send(msg agentMsg, fds ...int) error {
	body, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	if len(body) > maxAgentFrame {
		return errors.New("control message too large")
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	frame = append(frame, body...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	f.wm.Lock()
	defer f.wm.Unlock()
	n, _, err := f.c.WriteMsgUnix(frame, oob, nil)
	if err == nil && n < len(frame) {
		_, err = f.c.Write(frame[n:])
	}
	return err
}

// recv reads one frame and the descriptors that came with it.
func (f *frameConn) recv() (agentMsg, []int, error) {
	var msg agentMsg
	hdr := make([]byte, 4)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := f.c.ReadMsgUnix(hdr, oob)
	if err != nil {
		return msg, nil, err
	}
	fds := parseRights(oob[:oobn])
	if n == 0 {
		closeFDs(fds)
		return msg, nil, io.EOF
	}
	if _, err := io.ReadFull(f.c, hdr[n:]); err != nil {
		closeFDs(fds)
		return msg, nil, err
	}
	size := binary.BigEndian.Uint32(hdr)
	if size > maxAgentFrame {
		closeFDs(fds)
		return msg, nil, fmt.Errorf("control frame of %d bytes", size)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(f.c, body); err != nil {
		closeFDs(fds)
		return msg, nil, err
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		closeFDs(fds)
		return msg, nil, fmt.Errorf("control frame: %w", err)
	}
	return msg, fds, nil
}

// parseRights returns the descriptors of SCM_RIGHTS messages in oob.
func parseRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// agentServer is the agent's state: the control connection and the
// commands it started, by pid, waiting to be reaped.
type agentServer struct {
	conn *frameConn
	mu   sync.Mutex // held across a start and its registration, and by the reaper
	cmds map[int]bool
}

// runAgent serves the control socket until the host closes it, then
// kills every process of the sandbox and returns the exit code.
func runAgent() int {
	// The inherited executable's path is a host path: drop it, keep no
	// other stray descriptor for commands, and keep this process's /proc
	// entries (fd, exe, maps, environ) from the sandbox's own uid.
	_ = unix.Close(agentExeFD)
	cloexecInherited()
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	f := os.NewFile(agentControlFD, "control")
	c, err := net.FileConn(f)
	f.Close()
	uc, ok := c.(*net.UnixConn)
	if err != nil || !ok {
		fmt.Fprintln(os.Stderr, "sandbox agent: no control socket")
		return 2
	}
	a := &agentServer{conn: &frameConn{c: uc}, cmds: map[int]bool{}}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		for range sigs {
			a.reap()
		}
	}()
	if err := a.conn.send(agentMsg{Op: "ready", Pid: os.Getpid()}); err != nil {
		return 2
	}
	a.serve()
	killDescendants(os.Getpid())
	return 0
}

// cloexecInherited marks every inherited descriptor above the control
// socket close-on-exec, so no command inherits one.
func cloexecInherited() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > agentControlFD {
			syscall.CloseOnExec(fd)
		}
	}
}

// serve handles host requests until the connection ends.
func (a *agentServer) serve() {
	for {
		msg, fds, err := a.conn.recv()
		if err != nil {
			return
		}
		switch msg.Op {
		case "start":
			a.start(msg, fds)
		case "signal":
			closeFDs(fds)
			signalGroup(msg.Pid, syscall.Signal(msg.Signal))
		case "limits":
			closeFDs(fds)
			if msg.NProc > 0 {
				lim := &unix.Rlimit{Cur: uint64(msg.NProc), Max: uint64(msg.NProc)}
				_ = unix.Setrlimit(unix.RLIMIT_NPROC, lim)
			}
		default:
			closeFDs(fds)
		}
	}
}

// start runs one command with stdout and stderr on fds (and stdin on a
// third one; else /dev/null), in its own process group, and reports
// started or failed. The report is sent under a.mu, so the reaper never
// reports its exit first.
func (a *agentServer) start(msg agentMsg, fds []int) {
	fail := func(err error) {
		_ = a.conn.send(agentMsg{Op: "failed", ID: msg.ID, Error: err.Error()})
	}
	if len(fds) != 2 && len(fds) != 3 {
		closeFDs(fds)
		fail(errors.New("want stdout, stderr and optionally stdin descriptors"))
		return
	}
	stdout, stderr := os.NewFile(uintptr(fds[0]), "stdout"), os.NewFile(uintptr(fds[1]), "stderr")
	defer closeAll(stdout, stderr) // the command holds its own copies
	var stdin *os.File
	if len(fds) == 3 {
		stdin = os.NewFile(uintptr(fds[2]), "stdin")
		defer stdin.Close()
	}
	path, err := lookPathIn(msg.Path, msg.Env, msg.Dir)
	if err != nil {
		fail(err)
		return
	}
	if stdin == nil {
		if stdin, err = os.Open(os.DevNull); err != nil {
			fail(err)
			return
		}
		defer stdin.Close()
	}
	cmd := &exec.Cmd{Path: path, Args: append([]string{msg.Path}, msg.Args...), Env: msg.Env, Dir: msg.Dir,
		Stdin: stdin, Stdout: stdout, Stderr: stderr, SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := cmd.Start(); err != nil {
		fail(err)
		return
	}
	a.cmds[cmd.Process.Pid] = true
	_ = a.conn.send(agentMsg{Op: "started", ID: msg.ID, Pid: cmd.Process.Pid})
	_ = cmd.Process.Release() // reaped by reap, by pid
	go a.reap()               // in case it exited before SIGCHLD was watched for it
}

// reap collects every exited child: a command's status goes to the host;
// orphans adopted by the agent (a subreaper) are just collected.
func (a *agentServer) reap() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if a.cmds[pid] {
			delete(a.cmds, pid)
			_ = a.conn.send(agentMsg{Op: "exited", Pid: pid, Status: int(ws)})
		}
	}
}

// signalGroup sends sig to pid's process group, and to pid itself in case
// it left the group.
func signalGroup(pid int, sig syscall.Signal) {
	if pid <= 1 {
		return
	}
	_ = syscall.Kill(-pid, sig)
	_ = syscall.Kill(pid, sig)
}

// lookPathIn finds file as execvp would with the command's own PATH (from
// env), relative directories taken from dir.
func lookPathIn(file string, env []string, dir string) (string, error) {
	if file == "" {
		return "", errEmptyCommand
	}
	if strings.Contains(file, "/") {
		return file, nil
	}
	path := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		check := p
		if !filepath.IsAbs(p) {
			check = filepath.Join(dir, p)
		}
		if fi, err := os.Stat(check); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return check, nil
		}
	}
	return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
}

// killDescendants SIGKILLs every descendant of pid until none is left
// (a process killed cannot fork again; what it forked before is found on
// the next look).
func killDescendants(pid int) {
	for range 100 {
		found := false
		for _, c := range descendants(pid) {
			if !isZombie(c) {
				found = true
				_ = syscall.Kill(c, syscall.SIGKILL)
			}
		}
		if !found {
			return
		}
		if pid == os.Getpid() {
			reapAll()
		}
	}
}

// reapAll collects the calling process's exited children without waiting.
func reapAll() {
	for {
		var ws unix.WaitStatus
		if p, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); err != nil || p <= 0 {
			return
		}
	}
}

// descendants lists pid's descendants from /proc, parents first.
func descendants(pid int) []int {
	var out []int
	queue := childPIDs(pid)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, p)
		queue = append(queue, childPIDs(p)...)
	}
	return out
}

// isZombie reports whether pid has exited but is not yet reaped (or is
// gone).
func isZombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}
