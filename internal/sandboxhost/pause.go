package sandboxhost

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bwebhook"
)

// Pause and resume, as E2B does them (POST /sandboxes/{id}/pause, then
// connect): every process of a paused sandbox is frozen, in memory, and its
// files stay; its timeout clock stops (the time it had left is kept); it
// lists and reads as "paused"; envd refuses it; connect thaws it. E2B keeps
// a paused sandbox until it is resumed or killed, and so does the host (no
// paused timeout).
//
// Freezing uses the sandbox's cgroup v2 freezer (cgroup.freeze) where the
// host makes cgroups and a v2 hierarchy is writable (cgroup.go); otherwise
// every process of the sandbox is sent SIGSTOP (and SIGCONT on resume),
// found from its launcher through /proc's children lists.
//
// One difference from E2B: a command's Start stream stays open across a
// pause (E2B's connections drop), so that a background command whose
// client still listens goes on after the resume, as it does on E2B.

// runState is whether a sandbox's processes run.
type runState int

const (
	stateRunning runState = iota
	// statePausing: the host is freezing the sandbox; it is refused like
	// a paused one and still lists as running.
	statePausing
	statePaused
)

var (
	// errAlreadyPaused: pause of a paused sandbox (E2B answers 409).
	errAlreadyPaused = errors.New("sandbox is already paused")
	// errPaused: a process start raced with a pause.
	errPaused = errors.New("sandbox is paused")
)

const (
	// freezeFile and eventsFile are the cgroup v2 freezer's control and
	// state files.
	freezeFile = "cgroup.freeze"
	eventsFile = "cgroup.events"
	// freezeTimeout bounds the wait for every process to be frozen or
	// thawed.
	freezeTimeout = 10 * time.Second
	freezePoll    = 5 * time.Millisecond
)

// paused reports whether sb's processes are frozen or being frozen.
func (sb *sandbox) paused() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.state != stateRunning
}

// listedPaused reports whether sb lists as paused: frozen (one being
// frozen still lists as running).
func (sb *sandbox) listedPaused() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.state == statePaused
}

// disarm stops sb's timeout timer; a callback already running finds itself
// stale. sb.mu must be held.
func (sb *sandbox) disarm() {
	sb.gen++
	if sb.timer != nil {
		sb.timer.Stop()
	}
}

// pause freezes every process of sb and stops its timeout clock, keeping
// the time it had left. Errors: ErrNotFound (dead), errAlreadyPaused, or a
// freeze failure (sb then runs on with its old deadline).
func (h *Host) pause(sb *sandbox) error {
	sb.transition.Lock()
	defer sb.transition.Unlock()
	now := h.now().UTC()
	sb.mu.Lock()
	switch {
	case sb.dead:
		sb.mu.Unlock()
		return ErrNotFound
	case sb.state == statePaused:
		sb.mu.Unlock()
		return errAlreadyPaused
	}
	sb.state = statePausing
	remaining := sb.endAt.Sub(now)
	sb.disarm()
	sb.mu.Unlock()

	if err := h.freeze(sb); err != nil {
		if terr := h.thaw(sb); terr != nil {
			h.log.Error("thaw after a failed freeze", "sandbox_id", sb.id, "error", terr.Error())
		}
		sb.mu.Lock()
		sb.state = stateRunning
		sb.mu.Unlock()
		h.setDeadlineFrom(sb, now, remaining, false)
		return fmt.Errorf("freeze sandbox: %w", err)
	}
	sb.mu.Lock()
	sb.state = statePaused
	sb.remaining = max(remaining, 0)
	// E2B reports a paused sandbox's end as the time it was paused.
	sb.endAt = now
	sb.mu.Unlock()
	h.log.Info("sandbox paused", "sandbox_id", sb.id, "remaining_s", remaining.Seconds())
	h.notify(sb, e2bwebhook.TypePaused)
	return nil
}

// connect is E2B's connect: a paused sb is thawed and ends timeout from
// now (timeout 0: the time it had left when paused), and resumed is true;
// a running one ends timeout from now unless that is earlier than its
// current end. Errors: ErrNotFound (dead) or a thaw failure (sb stays
// paused).
func (h *Host) connect(sb *sandbox, timeout time.Duration) (resumed bool, err error) {
	sb.transition.Lock()
	defer sb.transition.Unlock()
	sb.mu.Lock()
	dead, state, remaining := sb.dead, sb.state, sb.remaining
	sb.mu.Unlock()
	if dead {
		return false, ErrNotFound
	}
	if state == stateRunning {
		if timeout > 0 {
			h.setDeadline(sb, timeout, true)
		}
		return false, nil
	}
	if err := h.thaw(sb); err != nil {
		return false, fmt.Errorf("thaw sandbox: %w", err)
	}
	sb.mu.Lock()
	sb.state = stateRunning
	sb.mu.Unlock()
	if timeout <= 0 {
		timeout = remaining
	}
	if timeout <= 0 {
		// Paused by its timeout (autoPause): it had no time left.
		timeout = h.opts.DefaultTimeout
	}
	h.setDeadline(sb, timeout, false)
	h.log.Info("sandbox resumed", "sandbox_id", sb.id, "timeout_s", timeout.Seconds())
	h.notify(sb, e2bwebhook.TypeResumed)
	return true, nil
}

// freeze stops every process of sb: through its cgroup's freezer, else
// with SIGSTOP. It returns once all of them are stopped.
func (h *Host) freeze(sb *sandbox) error {
	if h.cgroupFreezes(sb) {
		return sb.cgroup.setFrozen(true)
	}
	return sb.signalAll(syscall.SIGSTOP)
}

// thaw lets sb's processes run again (undoes freeze).
func (h *Host) thaw(sb *sandbox) error {
	if h.cgroupFreezes(sb) {
		return sb.cgroup.setFrozen(false)
	}
	return sb.signalAll(syscall.SIGCONT)
}

// cgroupFreezes reports whether sb is frozen through its cgroup.
func (h *Host) cgroupFreezes(sb *sandbox) bool {
	h.mu.Lock()
	signals := h.signalPause
	h.mu.Unlock()
	return !signals && sb.cgroup != nil && sb.cgroup.freezeDir != ""
}

// setFrozen freezes or thaws the cgroup and waits until the kernel reports
// it done (cgroup.events "frozen 1" or "frozen 0").
func (g *sandboxCgroup) setFrozen(frozen bool) error {
	value, want := "0", "frozen 0"
	if frozen {
		value, want = "1", "frozen 1"
	}
	if err := os.WriteFile(filepath.Join(g.freezeDir, freezeFile), []byte(value), 0); err != nil {
		return err
	}
	deadline := time.Now().Add(freezeTimeout)
	for {
		b, err := os.ReadFile(filepath.Join(g.freezeDir, eventsFile))
		if err != nil {
			return err
		}
		if slices.Contains(strings.Split(string(b), "\n"), want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: not %q after %s", g.freezeDir, want, freezeTimeout)
		}
		time.Sleep(freezePoll)
	}
}

// signalAll sends sig to every process of sb: its launcher and all of its
// descendants (the agent, every command and whatever they left running).
// For SIGSTOP it waits until each is stopped and looks again, until a
// look finds no process it has not stopped: a process forked before its
// parent stopped is stopped too, and a stopped process forks no more.
func (sb *sandbox) signalAll(sig syscall.Signal) error {
	roots := []int{sb.agent.pid}
	seen := map[int]bool{}
	deadline := time.Now().Add(freezeTimeout)
	for {
		fresh := false
		queue := slices.Clone(roots)
		for len(queue) > 0 {
			pid := queue[0]
			queue = queue[1:]
			if !seen[pid] {
				seen[pid] = true
				fresh = true
				_ = syscall.Kill(pid, sig)
			}
			queue = append(queue, childPIDs(pid)...)
		}
		if !fresh || sig != syscall.SIGSTOP {
			return nil
		}
		for pid := range seen {
			for !stoppedOrGone(pid) {
				if time.Now().After(deadline) {
					return fmt.Errorf("process %d not stopped after %s", pid, freezeTimeout)
				}
				time.Sleep(freezePoll)
			}
		}
	}
}

// stoppedOrGone reports whether pid is stopped (by a signal or a tracer),
// a zombie, or gone, from /proc/<pid>/stat.
func stoppedOrGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	switch b[i+2] {
	case 'T', 't', 'Z', 'X':
		return true
	}
	return false
}
