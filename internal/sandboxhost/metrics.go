package sandboxhost

import (
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
)

// cpuSample is a sandbox's CPU time at a moment, to compute the share of
// CPU it used since.
type cpuSample struct {
	mu    sync.Mutex
	at    time.Time
	usage time.Duration
}

// maxDiskWalk bounds the entries counted for a sandbox's disk use when
// its directory is not a file system of its own.
const maxDiskWalk = 100_000

// handleMetrics serves GET /sandboxes/{id}/metrics: a one-item array with
// the sandbox's current figures (E2B returns the samples of the asked
// interval; the host keeps no history). Memory and CPU are read from the
// sandbox's cgroup where it has one, else reported as 0. 404 when
// unknown.
func (h *Host) handleMetrics(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb, err := h.get(id)
	if err != nil {
		notFound(w, id)
		return
	}
	writeJSON(w, http.StatusOK, []e2bapi.SandboxMetric{h.metric(sb)})
}

// metric samples sb's figures now.
func (h *Host) metric(sb *sandbox) e2bapi.SandboxMetric {
	now := h.now().UTC()
	m := e2bapi.SandboxMetric{
		Timestamp: now, TimestampUnix: now.Unix(), CPUCount: reportedCPUCount,
		MemTotal: int64(reportedMemoryMB) << 20, DiskTotal: int64(reportedDiskMB) << 20,
	}
	if lim := h.opts.Limits.MemoryBytes; sb.cgroup != nil && lim > 0 {
		m.MemTotal = lim
	}
	if sb.cgroup != nil {
		m.MemUsed, m.MemCache = sb.cgroup.memory()
		if usage, ok := sb.cgroup.cpuUsage(); ok {
			m.CPUUsedPct = sb.cpu.share(usage, time.Now(), sb.startedAt, m.CPUCount)
		}
	}
	m.DiskUsed = sb.diskUsed()
	return m
}

// share is the percentage of cpus CPUs that usage (the sandbox's CPU time
// so far) is of the wall time since the previous sample (since start
// for the first), and records this sample.
func (c *cpuSample) share(usage time.Duration, now, start time.Time, cpus int) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	from, before := c.at, c.usage
	if from.IsZero() {
		from, before = start, 0
	}
	c.at, c.usage = now, usage
	wall := now.Sub(from)
	if wall <= 0 || cpus <= 0 {
		return 0
	}
	pct := 100 * float64(usage-before) / float64(wall) / float64(cpus)
	return min(max(pct, 0), 100)
}

// memory reads the cgroup's memory in use and page cache, in bytes
// (cgroup v2 memory.current and memory.stat "file"; v1
// memory.usage_in_bytes and "cache").
func (g *sandboxCgroup) memory() (used, cache int64) {
	for _, d := range g.dirs {
		if v, ok := readInt(filepath.Join(d, "memory.current")); ok {
			return v, statField(filepath.Join(d, "memory.stat"), "file")
		}
		if v, ok := readInt(filepath.Join(d, "memory.usage_in_bytes")); ok {
			return v, statField(filepath.Join(d, "memory.stat"), "cache")
		}
	}
	return 0, 0
}

// cpuUsage reads the cgroup's CPU time so far (v2 cpu.stat usage_usec;
// v1 cpuacct.usage).
func (g *sandboxCgroup) cpuUsage() (time.Duration, bool) {
	for _, d := range g.dirs {
		if _, err := os.Stat(filepath.Join(d, "cpu.stat")); err == nil {
			if v := statField(filepath.Join(d, "cpu.stat"), "usage_usec"); v > 0 {
				return time.Duration(v) * time.Microsecond, true
			}
		}
		if v, ok := readInt(filepath.Join(d, "cpuacct.usage")); ok {
			return time.Duration(v), true
		}
	}
	return 0, false
}

// readInt reads a file holding one integer.
func readInt(p string) (int64, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}

// statField reads the value of key in a "key value" lines file (0 when
// absent).
func statField(p, key string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// diskUsed is the space sb's files take: its own file system's use when
// it has one, else the sizes of at most maxDiskWalk of its files.
func (sb *sandbox) diskUsed() int64 {
	if sb.mounted {
		var st unix.Statfs_t
		if err := unix.Statfs(sb.dir, &st); err == nil {
			return int64(st.Blocks-st.Bfree) * st.Bsize
		}
	}
	var total int64
	seen := 0
	_ = filepath.WalkDir(sb.dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if seen++; seen > maxDiskWalk {
			return filepath.SkipAll
		}
		if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
			total += fi.Size()
		}
		return nil
	})
	return total
}
