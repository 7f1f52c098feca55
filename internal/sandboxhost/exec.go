package sandboxhost

import (
	"context"
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
	done chan struct{} // closed once it exited and its output was read
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
}

// running is a started process and its output.
type running struct {
	*process
	events <-chan event // closed once the process exited and its output was read; then status is set
	status syscall.WaitStatus
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
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(outR, outW)
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	// sb.mu is held across the agent's round trip so that a pause or a
	// teardown never freezes or kills the agent in the middle of it.
	sb.mu.Lock()
	switch {
	case sb.dead:
		sb.mu.Unlock()
		closeAll(outR, outW, errR, errW)
		return nil, ErrNotFound
	case sb.state != stateRunning:
		sb.mu.Unlock()
		closeAll(outR, outW, errR, errW)
		return nil, errPaused
	}
	reply := sb.agent.start(req, outW, errW)
	closeAll(outW, errW) // the command holds its own copies
	if reply.err != nil {
		sb.mu.Unlock()
		closeAll(outR, errR)
		if errors.Is(reply.err, errSandboxEnded) {
			h.log.Warn("sandbox agent gone", "sandbox_id", sb.id, "error", reply.err.Error())
			return nil, ErrNotFound
		}
		return nil, reply.err
	}
	p := &process{spec: spec, pid: reply.pid, ag: sb.agent, done: make(chan struct{})}
	sb.procs[p.pid] = p
	sb.mu.Unlock()

	events := make(chan event, outputQueue)
	r := &running{process: p, events: events}
	r.stream(sb, events, reply.exit, outR, errR)
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
func (r *running) stream(sb *sandbox, events chan<- event, exit <-chan int, outR, errR *os.File) {
	p := r.process
	out := &outputSink{events: events}
	var readers sync.WaitGroup
	readers.Add(2)
	go out.pump(&readers, outR, false)
	go out.pump(&readers, errR, true)
	go func() {
		r.status = syscall.WaitStatus(<-exit)
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

// outputSink forwards output chunks to events until closed, then drops
// them.
type outputSink struct {
	mu     sync.Mutex
	closed bool
	events chan<- event
}

// pump reads rd until EOF, forwarding each chunk, and closes rd.
func (o *outputSink) pump(wg *sync.WaitGroup, rd *os.File, isErr bool) {
	defer wg.Done()
	defer rd.Close()
	for {
		buf := make([]byte, outputChunk)
		n, err := rd.Read(buf)
		if n > 0 {
			ev := event{stdout: buf[:n]}
			if isErr {
				ev = event{stderr: buf[:n]}
			}
			o.send(ev)
		}
		if err != nil {
			return
		}
	}
}

func (o *outputSink) send(ev event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.events <- ev
	}
}

func (o *outputSink) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.closed = true
		close(o.events)
	}
}

// pipeGrace is how long output is still forwarded after a process exited.
const pipeGrace = 2 * time.Second

// closeAll closes files, ignoring errors.
func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
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
	ws := r.status
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
