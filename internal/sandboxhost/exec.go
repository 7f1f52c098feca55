package sandboxhost

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
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

// isolation is how sandboxes are wrapped.
type isolation struct {
	bwrap   string // bwrap path; "" = no isolation
	setpriv string // setpriv path; "" = keep the host's uid
}

// process is one command started through envd or the exec route. Its pid
// is its pid in the sandbox.
type process struct {
	spec startSpec
	pid  int
	ag   *sandboxAgent
	out  *outputSink
	done chan struct{} // closed once it exited and its output was read
	// status is its wait status, set before done is closed.
	status syscall.WaitStatus

	stdinMu sync.Mutex
	stdin   *os.File // write end of its stdin; nil: none or closed
}

// signal sends sig to the process's group, inside the sandbox.
func (p *process) signal(sig syscall.Signal) { p.ag.signal(p.pid, sig) }

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
	// stdin: the process reads what SendInput sends (else /dev/null).
	stdin bool
}

// running is a started process and its output.
type running struct {
	*process
	events <-chan event // closed once the process exited and its output was read; then status is set
	sub    *subscriber  // the starting client's attachment (events)
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

// start runs spec in sb, through its agent. The returned events channel
// streams output; when it is closed, wait on done and read status.
func (h *Host) start(sb *sandbox, spec startSpec) (*running, error) {
	if spec.cmd == "" {
		return nil, errEmptyCommand
	}
	for k := range spec.envs {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("%w: %q", errInvalidEnv, k)
		}
	}
	dir, err := h.commandDir(sb, spec.cwd)
	if err != nil {
		return nil, err
	}
	req := agentMsg{Path: spec.cmd, Args: spec.args, Env: h.env(sb, spec.envs), Dir: dir}
	pipes, err := newCommandPipes(spec.stdin)
	if err != nil {
		return nil, err
	}
	outR, errR := pipes.outR, pipes.errR
	// sb.mu is held across the agent's round trip so that a pause or a
	// teardown never freezes or kills the agent in the middle of it.
	sb.mu.Lock()
	switch {
	case sb.dead:
		sb.mu.Unlock()
		pipes.closeAll()
		return nil, ErrNotFound
	case sb.state != stateRunning:
		sb.mu.Unlock()
		pipes.closeAll()
		return nil, errPaused
	}
	reply := sb.agent.start(req, pipes.childEnds()...)
	pipes.closeChildEnds() // the command holds its own copies
	if reply.err != nil {
		sb.mu.Unlock()
		closeAll(outR, errR)
		if pipes.inW != nil {
			pipes.inW.Close()
		}
		if errors.Is(reply.err, errSandboxEnded) {
			h.log.Warn("sandbox agent gone", "sandbox_id", sb.id, "error", reply.err.Error())
			return nil, ErrNotFound
		}
		return nil, reply.err
	}
	p := &process{spec: spec, pid: reply.pid, ag: sb.agent, out: &outputSink{}, done: make(chan struct{}), stdin: pipes.inW}
	sb.procs[p.pid] = p
	sb.mu.Unlock()

	sub := p.out.subscribe()
	r := &running{process: p, events: sub.events, sub: sub}
	r.stream(sb, reply.exit, outR, errR)
	return r, nil
}

// commandDir checks a command's working directory and returns it as the
// agent applies it: a sandbox path under bubblewrap (one inside the
// sandbox's own directories must exist; elsewhere, e.g. /usr, the agent
// reports a bad one), else the host directory of a sandbox path.
func (h *Host) commandDir(sb *sandbox, cwd string) (string, error) {
	if cwd == "" {
		cwd = sandboxHome
	}
	if !h.Isolated() {
		return sb.hostPathForCwd(cwd)
	}
	vcwd, err := sb.virtualPath(cwd)
	if err != nil {
		return "", err
	}
	if vp, err := sb.resolve(vcwd); err == nil {
		if err := vp.isDir(); err != nil {
			return "", fmt.Errorf("cwd %s: %w", vcwd, err)
		}
	}
	return vcwd, nil
}

// stream reads the process's stdout and stderr (outR, errR) into events
// until it exited (its wait status arrives on exit) and its output ended,
// or pipeGrace after its exit: a background process it left may hold the
// pipes for the sandbox's life. Such output is drained and dropped (never
// a broken pipe for the background process). Then it closes events,
// forgets the process and marks it done.
func (r *running) stream(sb *sandbox, exit <-chan int, outR, errR *os.File) {
	p := r.process
	out := p.out
	var readers sync.WaitGroup
	readers.Add(2)
	go out.pump(&readers, outR, false)
	go out.pump(&readers, errR, true)
	go func() {
		p.status = syscall.WaitStatus(<-exit)
		p.closeStdin()
		drained := make(chan struct{})
		go func() { readers.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(pipeGrace):
		}
		out.close()
		sb.mu.Lock()
		delete(sb.procs, p.pid)
		sb.mu.Unlock()
		close(p.done)
	}()
}

// pipeGrace is how long output is still forwarded after a process exited.
const pipeGrace = 2 * time.Second

// commandPipes are a command's stdout and stderr pipes, and its stdin
// pipe when it reads input.
type commandPipes struct {
	outR, outW, errR, errW *os.File
	inR, inW               *os.File // nil without stdin
}

// newCommandPipes makes a command's pipes.
func newCommandPipes(stdin bool) (*commandPipes, error) {
	var p commandPipes
	var err error
	if p.outR, p.outW, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	if p.errR, p.errW, err = os.Pipe(); err != nil {
		p.closeAll()
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	if stdin {
		if p.inR, p.inW, err = os.Pipe(); err != nil {
			p.closeAll()
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
	}
	return &p, nil
}

// childEnds are the ends the command gets: stdout, stderr[, stdin].
func (p *commandPipes) childEnds() []*os.File {
	if p.inR != nil {
		return []*os.File{p.outW, p.errW, p.inR}
	}
	return []*os.File{p.outW, p.errW}
}

// closeChildEnds closes the host's copies of the command's ends.
func (p *commandPipes) closeChildEnds() { closeAll(p.childEnds()...) }

// closeAll closes every pipe made.
func (p *commandPipes) closeAll() {
	for _, f := range []*os.File{p.outR, p.outW, p.errR, p.errW, p.inR, p.inW} {
		if f != nil {
			_ = f.Close()
		}
	}
}

// closeAll closes files, ignoring errors.
func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// exitInfo reports exit code, exited flag and status text of a finished
// process, as envd does (exit code -1 when killed by a signal).
func (p *process) exitInfo() (code int, exited bool, status string, errText string) {
	ws := p.status
	switch {
	case ws.Exited():
		return ws.ExitStatus(), true, "exit status " + strconv.Itoa(ws.ExitStatus()), ""
	case ws.Signaled():
		status = "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			status += " (core dumped)"
		}
		return -1, false, status, ""
	default:
		return -1, false, "unknown", ""
	}
}
