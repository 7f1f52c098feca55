// Package sandboxhost is a local, E2B-compatible sandbox host: it speaks
// the E2B control-plane REST API (APIHandler) and the in-sandbox daemon
// ("envd") API (EnvdHandler, one endpoint for every sandbox, routed by the
// E2b-Sandbox-Id header) on loopback, and runs every sandbox as real
// processes in its own directory, isolated with bubblewrap when available.
//
// Facts about the wire format come from the E2B OpenAPI spec, the envd
// protobuf definitions (process.proto, filesystem.proto) and what the
// official E2B JS SDK 2.51.0 was observed to send and expect
// on loopback. The official SDK drives this host in TestOfficialE2BSDK.
// envd's Connect RPC is served by connect-go with a JSON codec over plain
// Go structs (no generated protobuf code).
//
// Sandbox filesystem view: /home/user is <RootDir>/<id>/home; /tmp and /mnt
// are <RootDir>/<id>/tmp and <RootDir>/<id>/mnt, writable and kept for the
// sandbox's life (bind mounts rather than per-command tmpfs, so that
// `ln -sfn /home/user /mnt/user-data` in one command is still there for
// the next, and so the file API reaches them). /usr, /etc (and /opt) are the
// host's, read-only. The envd file API accepts only paths that resolve,
// following symlinks as the sandbox would see them, inside those three
// directories; every access goes through os.Root, so a symlink swapped in
// later cannot lead out either.
//
// A sandbox is one long-lived environment: created once, it runs an agent
// (this binary re-executed, agent.go) that starts every command inside
// it, so commands share one process table and what a command leaves
// running in the background lives until the sandbox ends. The host starts
// its own programs (a cgroup-joining /bin/sh, bwrap, setpriv, the agent)
// by absolute path with a fixed environment; a command's environment,
// arguments and working directory travel to the agent over a socket only
// the host holds and are applied there, by execve inside the sandbox
// (launch.go).
//
// Isolation under bubblewrap: new PID, IPC, UTS, cgroup and network
// namespaces (only the sandbox's own loopback: no network), no
// capabilities, a seccomp filter (seccomp.go: no keyring, no nested user
// namespace, no mounts), per-sandbox cgroup limits on processes, memory
// and CPU where the host can make cgroups (cgroup.go), a sticky /tmp of
// its own, and, when the host runs as root, each sandbox's own host uid
// (root in the host's user namespace could write host sysctls; a shared
// uid would share keyrings and the per-uid process limit) and its own
// tmpfs for <RootDir>/<id> (of the size reported as its disk), so that no
// host path shows in its mount table. bwrap reads its options from a
// descriptor, so none shows in the sandbox's process list either.
// Without bubblewrap (Isolation "none") the agent and commands run directly
// on the host with HOME set to the real home directory: paths such as
// /home/user do not exist for them, and nothing is isolated. Tests that
// run commands with sandbox paths need bubblewrap.
//
// Process semantics: a command's pid is its pid in the sandbox; it runs
// in its own process group. When the client of a Start stream goes away
// or its Connect-Timeout-Ms passes, that process group is killed. Output
// is streamed in chunks of at most 32 KiB with at most 1 MiB queued per
// process (a slow client slows the process); output a background process
// writes more than 2 s after its command ended is dropped. A sandbox dies
// (every process SIGKILLed, directory removed, state gone) when its
// timeout passes or on DELETE. A sandbox can be paused and resumed as on
// E2B (pause.go). PTY is not supported; stdin is (SendInput,
// CloseStdin), and Process/Connect attaches more clients to a command.
package sandboxhost

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bwebhook"
)

// Isolation modes accepted in Options.Isolation.
const (
	// IsolationAuto uses bubblewrap when a working `bwrap` is on PATH and
	// plain processes otherwise.
	IsolationAuto = "auto"
	// IsolationBwrap requires bubblewrap; New fails without it.
	IsolationBwrap = "bwrap"
	// IsolationNone runs plain host processes (no isolation at all).
	IsolationNone = "none"
)

// DefaultEnvdVersion is the envd version the host claims. The E2B JS SDK
// enables every feature (raw and gzip uploads, no Basic auth) from 0.6.4
// on (the SDK gates them on the version /health reports).
const DefaultEnvdVersion = "0.6.4"

// Sandbox home, tmp and mnt as seen from inside a sandbox.
const (
	sandboxHome = "/home/user"
	sandboxTmp  = "/tmp"
	sandboxMnt  = "/mnt"
)

// Errors returned by Host operations.
var (
	// ErrNotFound means no live sandbox has the given id.
	ErrNotFound = errors.New("sandbox not found")
	// ErrClosed means the host was closed.
	ErrClosed = errors.New("sandbox host closed")
	// ErrNoBwrap means Isolation "bwrap" was asked for but bubblewrap does
	// not work on this machine.
	ErrNoBwrap = errors.New("bubblewrap (bwrap) not available")
)

// Options configures a Host.
type Options struct {
	// APIKey is the control-plane key every request must carry in
	// X-API-Key. Required.
	APIKey string
	// RootDir holds one directory per sandbox (<RootDir>/<id>/home is its
	// /home/user). Created if missing. Required.
	RootDir string
	// DefaultTimeout is a sandbox's life when create does not say;
	// 0 means 300 s (the E2B API default).
	DefaultTimeout time.Duration
	// Isolation is "auto" (default when empty), "bwrap" or "none".
	Isolation string
	// EnvdVersion is reported as envdVersion; empty means
	// DefaultEnvdVersion.
	EnvdVersion string
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Now is the clock used for startedAt/endAt; nil means time.Now.
	// Kill deadlines are armed as real timers of endAt-Now().
	Now func() time.Time
	// MaxTimeout caps the timeout a client may ask for; 0 means 24 h.
	MaxTimeout time.Duration
	// Limits bound each sandbox under bubblewrap (zero fields: the
	// defaults), through cgroups where the host can make them and, as
	// root, through each sandbox's own uid.
	Limits Limits
	// Webhook receives signed lifecycle webhooks (none when its URL is
	// empty).
	Webhook Webhook
}

// Host runs sandboxes. Create it with New; it is safe for concurrent use.
type Host struct {
	opts Options
	log  *slog.Logger
	now  func() time.Time
	iso  isolation
	// seccomp is the filter program of sandbox processes (nil without
	// bubblewrap); cg makes per-sandbox cgroups (nil where none can be
	// made).
	seccomp []byte
	cg      *cgroups
	// exe is this binary, run inside each sandbox as its agent. exeMu
	// guards it: a launch reads its descriptor while it starts a
	// process, and Close closes it (exeClosed) only once none does.
	exe       *os.File
	exeMu     sync.RWMutex
	exeClosed bool
	// ownFS gives each sandbox a tmpfs of its own for its directories
	// (root host under bubblewrap), so that its mount table shows no
	// host path.
	ownFS    bool
	envdVer  string
	clientID string

	mu     sync.Mutex
	closed bool
	// signalPause pauses with signals even where the cgroup freezer
	// works (tests of the fallback).
	signalPause bool
	sandboxes   map[string]*sandbox
	creating    map[string]bool // ids of sandboxes being made
	tombs       tombstones      // tokens of ended sandboxes (access.go)
	uids        map[int]bool    // sandbox uids in use (root host)
	nextUID     int
	wg          sync.WaitGroup // sandbox teardowns in flight
}

// sandbox is one live sandbox. Fields above mu are immutable.
type sandbox struct {
	id         string
	templateID string
	alias      string
	token      string
	metadata   map[string]string
	envVars    map[string]string
	startedAt  time.Time
	dir        string // <RootDir>/<id>
	home       string // <dir>/home = /home/user
	tmp        string // <dir>/tmp  = /tmp
	mnt        string // <dir>/mnt  = /mnt
	uid, gid   int    // owner of files the host creates for the sandbox
	chown      bool   // whether to chown them to uid:gid
	nproc      int    // RLIMIT_NPROC of uid (root host), 0 = unchanged
	cgroup     *sandboxCgroup
	agent      *sandboxAgent // set before the sandbox is listed
	mounted    bool          // dir is the sandbox's own tmpfs
	autoPause  bool          // its timeout pauses it instead of killing it
	cpu        cpuSample     // last CPU sample of the metrics route

	ctx    context.Context // cancelled when the sandbox dies
	cancel context.CancelFunc

	// transition is held through a pause, a resume and the teardown, which
	// freeze or thaw processes outside mu.
	transition sync.Mutex

	mu    sync.Mutex
	endAt time.Time // while paused: when it was paused
	timer *time.Timer
	dead  bool
	procs map[int]*process // by host pid
	gen   uint64           // bumped on every deadline change
	state runState
	// remaining is the time to its deadline the sandbox had when paused.
	remaining time.Duration
}

// New validates opts, prepares RootDir and probes bubblewrap.
//
// Errors: missing APIKey or RootDir, an unknown Isolation, ErrNoBwrap when
// Isolation is "bwrap" and `bwrap --version` fails, RootDir not creatable.
func New(opts Options) (*Host, error) {
	if opts.APIKey == "" {
		return nil, errors.New("sandboxhost: APIKey is required")
	}
	if opts.RootDir == "" {
		return nil, errors.New("sandboxhost: RootDir is required")
	}
	root, err := filepath.Abs(opts.RootDir)
	if err != nil {
		return nil, fmt.Errorf("sandboxhost: root dir: %w", err)
	}
	opts.RootDir = root
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("sandboxhost: create root dir: %w", err)
	}
	if opts.DefaultTimeout <= 0 {
		opts.DefaultTimeout = 300 * time.Second
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = 24 * time.Hour
	}
	if opts.Isolation == "" {
		opts.Isolation = IsolationAuto
	}
	h := &Host{
		opts:      opts,
		log:       opts.Logger,
		now:       opts.Now,
		envdVer:   opts.EnvdVersion,
		sandboxes: map[string]*sandbox{},
		creating:  map[string]bool{},
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	if h.envdVer == "" {
		h.envdVer = DefaultEnvdVersion
	}
	h.clientID = "local-" + randomID(8)
	switch opts.Isolation {
	case IsolationNone:
	case IsolationAuto, IsolationBwrap:
		iso, err := probeBwrap()
		if err != nil {
			if opts.Isolation == IsolationBwrap {
				return nil, fmt.Errorf("sandboxhost: %w: %v", ErrNoBwrap, err)
			}
			h.log.Warn("bubblewrap not usable; sandboxes run as plain host processes", "error", err.Error())
		} else {
			h.iso = iso
		}
	default:
		return nil, fmt.Errorf("sandboxhost: unknown isolation %q (want auto, bwrap or none)", opts.Isolation)
	}
	h.opts.Limits = opts.Limits.withDefaults()
	if h.exe, err = os.Open("/proc/self/exe"); err != nil {
		return nil, fmt.Errorf("sandboxhost: own executable: %w", err)
	}
	h.ownFS = h.Isolated() && os.Geteuid() == 0
	if h.Isolated() {
		if h.seccomp, err = seccompProgram(); err != nil {
			return nil, fmt.Errorf("sandboxhost: %w", err)
		}
		if h.cg, err = probeCgroups(); err != nil {
			h.log.Warn("sandboxes run without cgroup limits on memory, CPU and processes", "error", err.Error())
		}
		h.uids = map[int]bool{}
		// Start at a random uid so that two hosts on one machine (tests
		// run several) are unlikely to hand out the same uids.
		h.nextUID = mathrand.IntN(sandboxUIDs)
	}
	return h, nil
}

// Isolated reports whether sandbox processes run under bubblewrap.
func (h *Host) Isolated() bool { return h.iso.bwrap != "" }

// allocUID takes a sandbox uid no live sandbox has (root host only).
func (h *Host) allocUID() (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for range sandboxUIDs {
		uid := firstSandboxUID + h.nextUID%sandboxUIDs
		h.nextUID++
		if !h.uids[uid] {
			h.uids[uid] = true
			return uid, nil
		}
	}
	return 0, errors.New("every sandbox uid is in use")
}

func (h *Host) freeUID(uid int) {
	h.mu.Lock()
	delete(h.uids, uid)
	h.mu.Unlock()
}

// probeBwrap finds bwrap (and setpriv when running as root) and checks
// that a sandbox really starts with the command line used for sandboxes.
func probeBwrap() (isolation, error) {
	var iso isolation
	p, err := exec.LookPath("bwrap")
	if err != nil {
		return iso, err
	}
	iso.bwrap = p
	if os.Geteuid() == 0 {
		if iso.setpriv, err = exec.LookPath("setpriv"); err != nil {
			return iso, fmt.Errorf("running as root needs setpriv (util-linux) to drop privileges: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, p, "--version").CombinedOutput(); err != nil {
		return iso, fmt.Errorf("bwrap --version: %w: %s", err, strings.TrimSpace(string(out)))
	}
	dir, err := os.MkdirTemp("", "sandboxhost-probe-")
	if err != nil {
		return iso, err
	}
	defer os.RemoveAll(dir)
	opts, err := dataFile([]byte(strings.Join(iso.sandboxOptions(dir, dir, dir, 0), "\x00") + "\x00"))
	if err != nil {
		return iso, err
	}
	defer opts.Close()
	argv := iso.launcherArgv(nil, 3, 0, 0, []string{"/bin/true"})
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.ExtraFiles = launcherEnv, []*os.File{opts}
	if out, err := cmd.CombinedOutput(); err != nil {
		return iso, fmt.Errorf("bwrap trial run: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return iso, nil
}

// randomID returns n random lowercase alphanumeric characters.
func randomID(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	// 252 is the largest multiple of 36 below 256: reject above it to avoid bias.
	buf := make([]byte, 2*n)
	i := 0
	for i < n {
		if _, err := rand.Read(buf); err != nil {
			panic(err) // crypto/rand never fails on Linux
		}
		for _, c := range buf {
			if c < 252 && i < n {
				b[i] = alphabet[int(c)%36]
				i++
			}
		}
	}
	return string(b)
}

// createSpec is what a create call asks for.
type createSpec struct {
	id         string // "" = a fresh random id
	templateID string
	timeout    time.Duration
	metadata   map[string]string
	envVars    map[string]string
	autoPause  bool
}

// create starts a new sandbox: its uid, cgroup, directories and agent,
// then its state and kill timer.
func (h *Host) create(spec createSpec) (*sandbox, error) {
	sb := h.newSandbox(spec)
	if err := h.reserve(sb.id); err != nil {
		return nil, err
	}
	defer h.unreserve(sb.id)
	if err := h.prepare(sb); err != nil {
		h.teardown(sb)
		return nil, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.teardown(sb)
		return nil, ErrClosed
	}
	h.sandboxes[sb.id] = sb
	h.mu.Unlock()

	h.setDeadlineFrom(sb, sb.startedAt, spec.timeout, false)
	h.log.Info("sandbox created", "sandbox_id", sb.id, "template_id", spec.templateID,
		"timeout_s", spec.timeout.Seconds(), "isolated", h.Isolated())
	return sb, nil
}

// newSandbox is the state of a sandbox about to be made.
func (h *Host) newSandbox(spec createSpec) *sandbox {
	id := spec.id
	if id == "" {
		id = randomID(20)
	}
	dir := filepath.Join(h.opts.RootDir, id)
	sb := &sandbox{
		id:         id,
		templateID: spec.templateID,
		alias:      spec.templateID,
		token:      randomID(32),
		metadata:   spec.metadata,
		envVars:    spec.envVars,
		autoPause:  spec.autoPause,
		startedAt:  h.now().UTC(),
		dir:        dir,
		home:       filepath.Join(dir, "home"),
		tmp:        filepath.Join(dir, "tmp"),
		mnt:        filepath.Join(dir, "mnt"),
		procs:      map[int]*process{},
	}
	if sb.metadata == nil {
		sb.metadata = map[string]string{}
	}
	if sb.envVars == nil {
		sb.envVars = map[string]string{}
	}
	sb.ctx, sb.cancel = context.WithCancel(context.Background())
	return sb
}

// reserve claims id for a sandbox being made (ErrClosed, errDuplicateID).
func (h *Host) reserve(id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	if _, live := h.sandboxes[id]; live || h.creating[id] {
		return errDuplicateID
	}
	h.creating[id] = true
	return nil
}

func (h *Host) unreserve(id string) {
	h.mu.Lock()
	delete(h.creating, id)
	h.mu.Unlock()
}

// prepare takes sb's uid and cgroup, makes its directories and starts its
// agent. What it made is undone by teardown.
func (h *Host) prepare(sb *sandbox) error {
	if h.iso.setpriv != "" {
		uid, err := h.allocUID()
		if err != nil {
			return err
		}
		sb.uid, sb.gid, sb.chown = uid, uid, true
		if n := h.opts.Limits.Processes; n > 0 {
			sb.nproc = n
		}
	}
	if h.cg != nil {
		g, err := h.cg.create(sb.id, h.opts.Limits)
		if err != nil {
			return fmt.Errorf("sandbox cgroup: %w", err)
		}
		sb.cgroup = g
	}
	if err := h.makeDirs(sb); err != nil {
		return err
	}
	ag, err := h.launch(sb)
	if err != nil {
		return err
	}
	sb.agent = ag
	return nil
}

// makeDirs makes sb's directory (its own tmpfs when ownFS) with home,
// tmp and mnt, owned by the sandbox's uid.
func (h *Host) makeDirs(sb *sandbox) error {
	if err := os.Mkdir(sb.dir, 0o755); err != nil {
		return fmt.Errorf("create sandbox dir: %w", err)
	}
	if h.ownFS {
		opts := "mode=0755,size=" + strconv.Itoa(reportedDiskMB<<20)
		if err := unix.Mount("tmpfs", sb.dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount sandbox tmpfs: %w", err)
		}
		sb.mounted = true
	}
	for _, d := range []string{sb.home, sb.tmp, sb.mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("create sandbox dir: %w", err)
		}
		if sb.chown {
			if err := os.Chown(d, sb.uid, sb.gid); err != nil {
				return fmt.Errorf("chown sandbox dir: %w", err)
			}
		}
	}
	if err := os.Chmod(sb.tmp, 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("chmod sandbox tmp: %w", err)
	}
	return nil
}

// get returns the live sandbox with id.
func (h *Host) get(id string) (*sandbox, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sb, ok := h.sandboxes[id]
	if !ok {
		return nil, ErrNotFound
	}
	return sb, nil
}

// list returns every live sandbox ordered by (startedAt, id).
func (h *Host) list() []*sandbox {
	h.mu.Lock()
	out := make([]*sandbox, 0, len(h.sandboxes))
	for _, sb := range h.sandboxes {
		out = append(out, sb)
	}
	h.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].startedAt.Equal(out[j].startedAt) {
			return out[i].startedAt.Before(out[j].startedAt)
		}
		return out[i].id < out[j].id
	})
	return out
}

// setDeadline makes sb die d from now. With extendOnly, an earlier
// deadline than the current one is ignored (E2B connect semantics). It
// reports false, changing nothing, when sb is dead or paused (a paused
// sandbox's clock is stopped: E2B answers 404 to set its timeout).
func (h *Host) setDeadline(sb *sandbox, d time.Duration, extendOnly bool) bool {
	return h.setDeadlineFrom(sb, h.now().UTC(), d, extendOnly)
}

// setDeadlineFrom is setDeadline with an explicit "now".
func (h *Host) setDeadlineFrom(sb *sandbox, now time.Time, d time.Duration, extendOnly bool) bool {
	end := now.Add(d)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.dead || sb.state != stateRunning {
		return false
	}
	if extendOnly && !sb.endAt.IsZero() && !end.After(sb.endAt) {
		return true
	}
	sb.endAt = end
	sb.disarm()
	gen := sb.gen
	sb.timer = time.AfterFunc(d, func() {
		sb.mu.Lock()
		stale := sb.gen != gen
		sb.mu.Unlock()
		if stale {
			return
		}
		h.timedOut(sb)
	})
	return true
}

// timedOut ends sb at its timeout: paused when created with autoPause
// (killed should the pause fail), else killed.
func (h *Host) timedOut(sb *sandbox) {
	h.log.Info("sandbox timeout reached", "sandbox_id", sb.id, "auto_pause", sb.autoPause)
	if sb.autoPause {
		err := h.pause(sb)
		if err == nil || errors.Is(err, errAlreadyPaused) || errors.Is(err, ErrNotFound) {
			return
		}
		h.log.Error("auto-pause failed; killing the sandbox", "sandbox_id", sb.id, "error", err.Error())
	}
	_ = h.kill(sb.id)
}

// deadline returns the current end time.
func (sb *sandbox) deadline() time.Time {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.endAt
}

// kill ends the sandbox with id: every process SIGKILLed, state and
// directory removed. It returns ErrNotFound when no such sandbox lives.
// It returns once the processes are reaped and the directory is gone (or
// removal failed, which is logged).
func (h *Host) kill(id string) error {
	h.mu.Lock()
	sb, ok := h.sandboxes[id]
	if ok {
		delete(h.sandboxes, id)
		h.wg.Add(1)
	}
	h.mu.Unlock()
	if !ok {
		return ErrNotFound
	}
	defer h.wg.Done()
	h.tombs.add(sb.id, sb.token)
	h.teardown(sb)
	h.log.Info("sandbox killed", "sandbox_id", id)
	h.notify(sb, e2bwebhook.TypeKilled)
	return nil
}

// teardown kills all of sb's processes and removes its directory. A
// paused sandbox's processes are thawed once killed, so that they die
// (a frozen process acts on SIGKILL only when thawed) and none runs again.
// It undoes a partly made sandbox too.
func (h *Host) teardown(sb *sandbox) {
	sb.transition.Lock()
	defer sb.transition.Unlock()
	sb.mu.Lock()
	sb.dead = true
	sb.disarm()
	frozen := sb.state != stateRunning
	procs := make([]*process, 0, len(sb.procs))
	for _, p := range sb.procs {
		procs = append(procs, p)
	}
	sb.mu.Unlock()
	sb.cancel()
	if sb.agent != nil {
		sb.agent.kill(h.Isolated())
	}
	if frozen {
		if err := h.thaw(sb); err != nil {
			h.log.Error("thaw of a killed paused sandbox", "sandbox_id", sb.id, "error", err.Error())
		}
	}
	if sb.agent != nil && !sb.agent.awaitExit() {
		h.log.Error("sandbox launcher did not exit after SIGKILL", "sandbox_id", sb.id, "pid", sb.agent.pid)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			h.log.Error("sandbox process did not end after SIGKILL", "sandbox_id", sb.id, "pid", p.pid)
		}
	}
	if sb.mounted {
		if err := unix.Unmount(sb.dir, unix.MNT_DETACH); err != nil {
			h.log.Error("unmount sandbox tmpfs", "sandbox_id", sb.id, "error", err.Error())
		}
	}
	if err := os.RemoveAll(sb.dir); err != nil {
		h.log.Error("remove sandbox dir", "sandbox_id", sb.id, "error", err.Error())
	}
	h.release(sb)
}

// release frees what create took for sb besides its directory: its cgroup
// (once its last process is reaped; the kernel refuses to remove a cgroup
// that still holds one) and its uid.
func (h *Host) release(sb *sandbox) {
	if sb.cgroup != nil {
		for i := 0; !sb.cgroup.removed(); i++ {
			if i == 50 {
				h.log.Error("sandbox cgroup not removed", "sandbox_id", sb.id)
				return // its uid stays taken too: a process may live on
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if sb.chown {
		h.freeUID(sb.uid)
	}
}

// Close kills every sandbox and refuses new ones. It waits for the
// teardowns to finish. Safe to call more than once.
func (h *Host) Close() error {
	h.mu.Lock()
	h.closed = true
	ids := make([]string, 0, len(h.sandboxes))
	for id := range h.sandboxes {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = h.kill(id)
		}()
	}
	wg.Wait()
	h.wg.Wait()
	if h.cg != nil {
		h.cg.close()
	}
	h.exeMu.Lock()
	h.exeClosed = true
	h.exe.Close() // a create still in flight fails to launch
	h.exeMu.Unlock()
	return nil
}
