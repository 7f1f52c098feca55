package sandboxhost

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// Limits bound what one sandbox may use. Zero fields take the defaults
// below; a negative field means no limit.
type Limits struct {
	// Processes (threads included) the sandbox may run at once: the pids
	// controller's pids.max and, when the host runs as root (each sandbox
	// then has its own uid), the uid's RLIMIT_NPROC.
	Processes int
	// MemoryBytes is the memory (page cache included) its processes may
	// use together; past it the kernel reclaims, then kills one of them.
	MemoryBytes int64
	// CPUMillis is its CPU time per second of wall time, in thousandths
	// of a core (1000 = one core).
	CPUMillis int
}

// Default limits.
const (
	DefaultProcesses   = 512
	DefaultMemoryBytes = 1 << 30 // 1 GiB
	DefaultCPUMillis   = 1000
)

// LimitsFromEnv reads Limits from <prefix>PROCESSES, <prefix>MEMORY_BYTES
// and <prefix>CPU_MILLIS (unset: the default; -1: no limit). Errors name
// the variable.
func LimitsFromEnv(getenv func(string) string, prefix string) (Limits, error) {
	read := func(name string) (int64, error) {
		s := getenv(prefix + name)
		if s == "" {
			return 0, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < -1 || n == 0 || n > math.MaxInt32 && name != "MEMORY_BYTES" {
			return 0, fmt.Errorf("%s%s: must be a positive integer or -1 (no limit), got %q", prefix, name, s)
		}
		return n, nil
	}
	procs, err := read("PROCESSES")
	if err != nil {
		return Limits{}, err
	}
	mem, err := read("MEMORY_BYTES")
	if err != nil {
		return Limits{}, err
	}
	cpu, err := read("CPU_MILLIS")
	if err != nil {
		return Limits{}, err
	}
	return Limits{Processes: int(procs), MemoryBytes: mem, CPUMillis: int(cpu)}, nil
}

func (l Limits) withDefaults() Limits {
	if l.Processes == 0 {
		l.Processes = DefaultProcesses
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = DefaultMemoryBytes
	}
	if l.CPUMillis == 0 {
		l.CPUMillis = DefaultCPUMillis
	}
	return l
}

// cgroupControllers are the controllers the host limits sandboxes with.
var cgroupControllers = []string{"pids", "memory", "cpu"}

// cgroups is where the host makes one cgroup per sandbox: a directory per
// hierarchy (cgroup v2: one; v1: one per controller) that the host may
// write, below its own cgroup.
type cgroups struct {
	v2 bool
	// parents maps a controller to the directory sandbox cgroups are made
	// in (v2: the same directory for every controller).
	parents map[string]string
	// freezer is, with v1 controllers, the directory in the cgroup v2
	// hierarchy (mounted alongside, without controllers) where each
	// sandbox also gets a cgroup, for its cgroup.freeze; "" when there is
	// none the host may write. With v2 the sandbox's one cgroup has it.
	freezer string
}

// errNoCgroups: no writable hierarchy holds the pids, memory and cpu
// controllers for this process.
// hostCgroups numbers the hosts of this process (probeCgroups).
var hostCgroups atomic.Int64

var errNoCgroups = errors.New("no writable cgroup hierarchy with the pids, memory and cpu controllers")

// probeCgroups finds, for the calling process, a cgroup v2 hierarchy with
// the pids, memory and cpu controllers available and delegable, else
// cgroup v1 hierarchies of those controllers, and makes the directory
// "sandboxhost-<pid>-<n>" below its own cgroup in each, n counting the
// hosts of the process: one host's close removes its directories, never
// those of another host still running in the same process. The caller
// removes them with close.
func probeCgroups() (*cgroups, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	name := "sandboxhost-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(hostCgroups.Add(1), 10)
	if m, ok := mounts[""]; ok {
		if c, err := probeV2(filepath.Join(m, own[""]), name); err == nil {
			return c, nil
		}
	}
	c := &cgroups{parents: map[string]string{}}
	for _, ctrl := range cgroupControllers {
		m, ok := mounts[ctrl]
		if !ok {
			return nil, errNoCgroups
		}
		dir := filepath.Join(m, own[ctrl], name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			c.close()
			return nil, fmt.Errorf("%w: %v", errNoCgroups, err)
		}
		c.parents[ctrl] = dir
	}
	if m, ok := mounts[""]; ok {
		c.freezer = probeFreezer(filepath.Join(m, own[""], name))
	}
	return c, nil
}

// probeFreezer makes dir in a cgroup v2 hierarchy and returns it when its
// cgroups can be frozen (cgroup.freeze, Linux 5.2 on); "" otherwise.
func probeFreezer(dir string) string {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return ""
	}
	if _, err := os.Stat(filepath.Join(dir, freezeFile)); err != nil {
		_ = os.Remove(dir)
		return ""
	}
	return dir
}

// probeV2 makes dir/name with the three controllers enabled for its
// children. It fails when dir does not offer them or cannot delegate them
// (a non-root cgroup that holds processes cannot enable controllers for
// its children).
func probeV2(dir, name string) (*cgroups, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil, err
	}
	have := strings.Fields(string(b))
	for _, ctrl := range cgroupControllers {
		if !slices.Contains(have, ctrl) {
			return nil, errNoCgroups
		}
	}
	enable := "+pids +memory +cpu"
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(enable), 0); err != nil {
		return nil, err
	}
	sub := filepath.Join(dir, name)
	if err := os.Mkdir(sub, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(sub, "cgroup.subtree_control"), []byte(enable), 0); err != nil {
		_ = os.Remove(sub)
		return nil, err
	}
	c := &cgroups{v2: true, parents: map[string]string{}}
	for _, ctrl := range cgroupControllers {
		c.parents[ctrl] = sub
	}
	return c, nil
}

// cgroupMounts maps each controller of a mounted cgroup v1 hierarchy to
// its mount point, and "" to the cgroup v2 mount point.
func cgroupMounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, after := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(after) < 3 {
			continue
		}
		switch after[0] {
		case "cgroup2":
			if _, seen := out[""]; !seen {
				out[""] = fields[4]
			}
		case "cgroup":
			for _, opt := range strings.Split(after[2], ",") {
				if slices.Contains(cgroupControllers, opt) {
					if _, seen := out[opt]; !seen {
						out[opt] = fields[4]
					}
				}
			}
		}
	}
	return out, sc.Err()
}

// ownCgroups maps each v1 controller to the calling process's cgroup path
// in its hierarchy, and "" to its v2 path (/proc/self/cgroup).
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			out[ctrl] = parts[2]
		}
	}
	return out, nil
}

// sandboxCgroup is one sandbox's cgroup (one directory per hierarchy).
type sandboxCgroup struct {
	dirs []string
	// freezeDir is the directory among dirs with cgroup.freeze (cgroup
	// v2); "" when the sandbox cannot be frozen through its cgroup.
	freezeDir string
}

// create makes the cgroup of sandbox id with limits lim.
func (c *cgroups) create(id string, lim Limits) (*sandboxCgroup, error) {
	g := &sandboxCgroup{}
	type setting struct{ name, value string }
	// In this order: v1 needs memory.limit_in_bytes set before memsw.
	var files []setting
	if c.v2 {
		files = []setting{
			{"pids.max", limitValue(int64(lim.Processes), "max")},
			{"memory.max", limitValue(lim.MemoryBytes, "max")},
			{"memory.swap.max", "0"},
			{"cpu.max", limitValue(int64(lim.CPUMillis)*100, "max") + " 100000"},
		}
	} else {
		files = []setting{
			{"pids.max", limitValue(int64(lim.Processes), "max")},
			{"memory.limit_in_bytes", limitValue(lim.MemoryBytes, "-1")},
			{"memory.memsw.limit_in_bytes", limitValue(lim.MemoryBytes, "-1")},
			{"cpu.cfs_period_us", "100000"},
			{"cpu.cfs_quota_us", limitValue(int64(lim.CPUMillis)*100, "-1")},
		}
	}
	seen := map[string]bool{}
	for _, ctrl := range cgroupControllers {
		parent := c.parents[ctrl]
		if seen[parent] {
			continue
		}
		seen[parent] = true
		dir := filepath.Join(parent, id)
		if err := os.Mkdir(dir, 0o755); err != nil {
			g.remove()
			return nil, fmt.Errorf("cgroup %s: %w", dir, err)
		}
		g.dirs = append(g.dirs, dir)
	}
	if c.freezer != "" {
		// Best effort: without it the sandbox is paused with signals.
		if dir := filepath.Join(c.freezer, id); os.Mkdir(dir, 0o755) == nil {
			g.dirs = append(g.dirs, dir)
		}
	}
	for _, dir := range g.dirs {
		if _, err := os.Stat(filepath.Join(dir, freezeFile)); err == nil {
			g.freezeDir = dir
			break
		}
	}
	// Write each file where it exists (v1: in its controller's hierarchy;
	// memsw and swap files exist only with swap accounting).
	for _, f := range files {
		name, v := f.name, f.value
		optional := name == "memory.memsw.limit_in_bytes" || name == "memory.swap.max"
		written := false
		for _, dir := range g.dirs {
			p := filepath.Join(dir, name)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			if err := os.WriteFile(p, []byte(v), 0); err != nil && !optional {
				g.remove()
				return nil, fmt.Errorf("cgroup %s = %s: %w", p, v, err)
			}
			written = true
		}
		if !written && !optional {
			g.remove()
			return nil, fmt.Errorf("cgroup limit %s: no such file in %v", name, g.dirs)
		}
	}
	return g, nil
}

func limitValue(v int64, unlimited string) string {
	if v < 0 {
		return unlimited
	}
	return strconv.FormatInt(v, 10)
}

// procsFiles are the files a process writes its pid to in order to join
// the cgroup.
func (g *sandboxCgroup) procsFiles() []string {
	out := make([]string, len(g.dirs))
	for i, d := range g.dirs {
		out[i] = filepath.Join(d, "cgroup.procs")
	}
	return out
}

// remove deletes the cgroup's directories (they must hold no process).
func (g *sandboxCgroup) remove() { g.removed() }

// removed deletes the cgroup's directories and reports whether none is
// left.
func (g *sandboxCgroup) removed() bool {
	ok := true
	for _, d := range g.dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			ok = false
		}
	}
	return ok
}

// close removes the host's own directories.
func (c *cgroups) close() {
	seen := map[string]bool{}
	for _, d := range c.parents {
		if !seen[d] {
			seen[d] = true
			_ = os.Remove(d)
		}
	}
	if c.freezer != "" {
		_ = os.Remove(c.freezer)
	}
}
