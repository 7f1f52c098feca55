package sandboxhost

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// isolationLimits are small enough that a hog reaches them fast.
var isolationLimits = Limits{Processes: 64, MemoryBytes: 96 << 20, CPUMillis: 500}

// startIsolatedPair starts a bubblewrap host with isolationLimits and two
// sandboxes on it (two tenants' sandboxes, as the broker would create).
func startIsolatedPair(t *testing.T) (srv *Server, a, b envdClient) {
	t.Helper()
	needBwrap(t)
	srv = startHostWith(t, Options{Isolation: IsolationBwrap, Limits: isolationLimits})
	return srv, newEnvd(srv, createSandbox(t, srv, nil)), newEnvd(srv, createSandbox(t, srv, nil))
}

// addKeyPy stores a key in the user keyring (add_key) and prints its
// serial, or the errno name when the call is refused.
const addKeyPy = `import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": 248, "aarch64": 217}[os.uname().machine]
r = libc.syscall(NR, b"user", b"shared-key", b"secret", 6, -4)
print(r if r >= 0 else errno.errorcode[ctypes.get_errno()])`

// searchKeyPy looks the key up in the user keyring (keyctl SEARCH).
const searchKeyPy = `import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": 250, "aarch64": 219}[os.uname().machine]
r = libc.syscall(NR, 10, -4, b"user", b"shared-key", 0)
print(r if r >= 0 else errno.errorcode[ctypes.get_errno()])`

// cloneUserNSPy calls clone(CLONE_NEWUSER|SIGCHLD) and prints the errno
// name, or "cloned" (the child exits at once).
const cloneUserNSPy = `import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
r = libc.syscall(NR, 0x10000000 | 17, 0, 0, 0, 0)
if r == 0:
    os._exit(0)
if r > 0:
    os.waitpid(r, 0)
print("cloned" if r > 0 else errno.errorcode[ctypes.get_errno()])`

// TestSandboxesAreIsolatedFromEachOther: what one sandbox does to keys,
// files, processes and namespaces stays invisible to another.
func TestSandboxesAreIsolatedFromEachOther(t *testing.T) {
	srv, a, b := startIsolatedPair(t)
	steps := []struct {
		name     string
		c        envdClient
		script   string
		wantOut  string
		wantExit int32
	}{
		{"a cannot store a kernel key", a, "python3 -c '" + addKeyPy + "'", "EPERM\n", 0},
		{"b cannot find or store one", b, "python3 -c '" + searchKeyPy + "'", "EPERM\n", 0},
		{"a writes a file in its tmp and home", a, "echo secret > /tmp/a-secret && echo secret > ~/a-secret && echo ok", "ok\n", 0},
		{"b does not see a's tmp", b, "cat /tmp/a-secret 2>/dev/null || echo absent", "absent\n", 0},
		{"b does not see a's home", b, "cat ~/a-secret 2>/dev/null || echo absent", "absent\n", 0},
		{"tmp is sticky and shared by nobody else", b, "stat -c %a /tmp", "1777\n", 0},
		{"no nested user namespace (unshare)", a, "unshare -U true 2>/dev/null || echo refused", "refused\n", 0},
		{"no nested user namespace (clone)", a, "python3 -c '" + cloneUserNSPy + "'", "EPERM\n", 0},
		{"seccomp filter active", a, "grep '^Seccomp:' /proc/self/status | tr -d '\\t'", "Seccomp:2\n", 0},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			res := st.c.run(t, st.script, nil)
			if res.end.ExitCode != st.wantExit || res.stdout != st.wantOut {
				t.Errorf("exit %d stdout %q stderr %q, want exit %d stdout %q", res.end.ExitCode, res.stdout, res.stderr, st.wantExit, st.wantOut)
			}
		})
	}

	if os.Geteuid() == 0 {
		t.Run("each sandbox has its own uid", func(t *testing.T) {
			ua, ub := srv.Host.mustGet(t, a.id).uid, srv.Host.mustGet(t, b.id).uid
			if ua == ub || ua < firstSandboxUID || ub < firstSandboxUID {
				t.Errorf("uids %d and %d, want two distinct sandbox uids", ua, ub)
			}
		})
	}

	t.Run("processes of one are invisible to the other", func(t *testing.T) {
		done := a.runInBackground("echo $$ > /tmp/pid; exec sleep 30")
		aTmp := srv.Host.mustGet(t, a.id).tmp
		waitFor(t, 20*time.Second, "a's sleep to start", func() bool {
			_, err := os.Stat(filepath.Join(aTmp, "pid"))
			return err == nil
		})
		res := b.run(t, "cat /proc/[0-9]*/comm | sort -u | tr '\\n' ' '", nil)
		if strings.Contains(res.stdout, "sleep") {
			t.Errorf("b sees a's processes: %q", res.stdout)
		}
		_ = srv.Host.kill(a.id)
		<-done
	})

}

// TestForkStormDoesNotStopAnotherSandbox: one sandbox at its process limit
// cannot start more, while another's commands run normally.
func TestForkStormDoesNotStopAnotherSandbox(t *testing.T) {
	srv, a, b := startIsolatedPair(t)
	if os.Geteuid() != 0 && srv.Host.cg == nil {
		t.Skip("no per-sandbox process limit here: the host is not root (no per-sandbox uid) and this kernel offers no writable cgroup hierarchy with the pids controller")
	}
	storm := `import os, time
n = 0
for i in range(400):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    except OSError:
        break
print(n, flush=True)
open("/tmp/storm", "w").close()
time.sleep(30)`
	var wg sync.WaitGroup
	var stormRes result
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Killing the sandbox drops this stream: its output is what counts.
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		stormRes, _ = a.runReq(ctx, &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "python3 -c '" + storm + "'"}}})
	}()
	aTmp := srv.Host.mustGet(t, a.id).tmp
	waitFor(t, 60*time.Second, "a's fork storm to hit its limit", func() bool {
		_, err := os.Stat(filepath.Join(aTmp, "storm"))
		return err == nil
	})
	res := b.run(t, `for i in $(seq 1 100); do /bin/true || exit 1; done; (sleep 0.1 & sleep 0.1 & wait); echo ok`, nil)
	if res.end.ExitCode != 0 || res.stdout != "ok\n" {
		t.Errorf("b during a's fork storm: exit %d stdout %q stderr %q, want ok", res.end.ExitCode, res.stdout, res.stderr)
	}
	_ = srv.Host.kill(a.id)
	wg.Wait()
	n, err := strconv.Atoi(strings.TrimSpace(stormRes.stdout))
	if err != nil || n >= 400 || n > isolationLimits.Processes {
		t.Errorf("a forked %q processes, want fewer than its limit %d", stormRes.stdout, isolationLimits.Processes)
	}
}

// TestMemoryHogDoesNotStopAnotherSandbox: a sandbox past its memory limit
// is killed by the kernel inside its cgroup; another's commands run.
func TestMemoryHogDoesNotStopAnotherSandbox(t *testing.T) {
	srv, a, b := startIsolatedPair(t)
	if srv.Host.cg == nil {
		t.Skip("the host cannot make cgroups here (no cgroup v2 hierarchy offering pids, memory and cpu it may delegate, nor writable v1 hierarchies of them): sandbox memory is not limited on this machine")
	}
	hog := a.run(t, `python3 -c 'b = bytearray(512 << 20); print("allocated")'`, nil)
	if hog.end.ExitCode == 0 || strings.Contains(hog.stdout, "allocated") {
		t.Errorf("a allocated 512 MiB under a %d-byte limit: exit %d stdout %q", isolationLimits.MemoryBytes, hog.end.ExitCode, hog.stdout)
	}
	res := b.run(t, `python3 -c 'b = bytearray(32 << 20); print(len(b))'`, nil)
	if res.end.ExitCode != 0 || res.stdout != strconv.Itoa(32<<20)+"\n" {
		t.Errorf("b after a's memory hog: exit %d stdout %q stderr %q", res.end.ExitCode, res.stdout, res.stderr)
	}
}

func TestLimitsFromEnv(t *testing.T) {
	tests := []struct {
		env     map[string]string
		want    Limits
		wantErr string
	}{
		{map[string]string{}, Limits{}, ""},
		{map[string]string{"P_PROCESSES": "100", "P_MEMORY_BYTES": "1073741824", "P_CPU_MILLIS": "-1"}, Limits{Processes: 100, MemoryBytes: 1 << 30, CPUMillis: -1}, ""},
		{map[string]string{"P_PROCESSES": "0"}, Limits{}, "P_PROCESSES"},
		{map[string]string{"P_MEMORY_BYTES": "1GiB"}, Limits{}, "P_MEMORY_BYTES"},
		{map[string]string{"P_CPU_MILLIS": "-2"}, Limits{}, "P_CPU_MILLIS"},
	}
	for _, tt := range tests {
		got, err := LimitsFromEnv(func(k string) string { return tt.env[k] }, "P_")
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("LimitsFromEnv(%v) error = %v, want one naming %s", tt.env, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("LimitsFromEnv(%v) = %+v, %v; want %+v", tt.env, got, err, tt.want)
		}
	}
}

// syscallPy calls the system call numbered argv[1] with the long
// arguments that follow and prints its result, or the errno name when it
// fails.
const syscallPy = `import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
r = libc.syscall(*[ctypes.c_long(int(a)) for a in sys.argv[1:]])
print(r if r >= 0 else errno.errorcode[ctypes.get_errno()])`

// TestSeccompFilterRefusesSystemCalls calls, inside a sandbox, each system
// call the filter refuses and checks the filter's answer. The arguments
// are chosen so that, without the filter, the kernel would answer
// something else (success, EBADF, EFAULT or EINVAL from checks it makes
// before any privilege check): each row fails if its call leaves the
// filter. Calls whose kernel code checks privileges first (pivot_root,
// move_mount, fsopen, fsmount, fspick, the module and kexec calls, and bpf
// where unprivileged bpf is disabled) answer EPERM either way and have no
// row here.
func TestSeccompFilterRefusesSystemCalls(t *testing.T) {
	needBwrap(t)
	srv := startHostWith(t, Options{Isolation: IsolationBwrap})
	c := newEnvd(srv, createSandbox(t, srv, nil))
	const userModeOnly = 1 // UFFD_USER_MODE_ONLY
	tests := []struct {
		name string
		nr   uintptr
		args []int64
		want string
	}{
		{"unshare(0)", unix.SYS_UNSHARE, []int64{0}, "EPERM"},
		{"setns on a bad fd", unix.SYS_SETNS, []int64{-1, 0}, "EPERM"},
		{"mount without a target", unix.SYS_MOUNT, []int64{0, 0, 0, 0, 0}, "EPERM"},
		{"umount2 with bad flags", unix.SYS_UMOUNT2, []int64{0, -1}, "EPERM"},
		{"open_tree with bad flags", unix.SYS_OPEN_TREE, []int64{-1, 0, -1}, "EPERM"},
		{"fsconfig on a bad fd", unix.SYS_FSCONFIG, []int64{-1, 0, 0, 0, 0}, "EPERM"},
		{"perf_event_open with bad flags", unix.SYS_PERF_EVENT_OPEN, []int64{0, 0, -1, -1, -1}, "EPERM"},
		{"userfaultfd in user mode", unix.SYS_USERFAULTFD, []int64{userModeOnly}, "EPERM"},
		{"io_uring_setup without params", unix.SYS_IO_URING_SETUP, []int64{1, 0}, "EPERM"},
		{"io_uring_enter on a bad fd", unix.SYS_IO_URING_ENTER, []int64{-1, 0, 0, 0, 0, 0}, "EPERM"},
		{"io_uring_register on a bad fd", unix.SYS_IO_URING_REGISTER, []int64{-1, 0, 0, 0}, "EPERM"},
		{"open_by_handle_at without a handle", unix.SYS_OPEN_BY_HANDLE_AT, []int64{-1, 0, 0}, "EPERM"},
		{"name_to_handle_at with bad flags", unix.SYS_NAME_TO_HANDLE_AT, []int64{-1, 0, 0, 0, -1}, "EPERM"},
		{"clone3 without arguments", unix.SYS_CLONE3, []int64{0, 0}, "ENOSYS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv := []string{strconv.FormatUint(uint64(tt.nr), 10)}
			for _, a := range tt.args {
				argv = append(argv, strconv.FormatInt(a, 10))
			}
			res := c.run(t, "python3 -c '"+syscallPy+"' "+strings.Join(argv, " "), nil)
			if got := strings.TrimSpace(res.stdout); res.end.ExitCode != 0 || got != tt.want {
				t.Errorf("got exit %d answer %q stderr %q, want %s", res.end.ExitCode, got, res.stderr, tt.want)
			}
		})
	}
}

// sandboxCPUMillis reads, from the host side, the CPU limit of the
// sandbox cgroup directory among dirs that holds the cpu controller's
// files (v2: cpu.max; v1: cpu.cfs_quota_us and cpu.cfs_period_us), in
// thousandths of a core (-1: no limit), and that directory.
func sandboxCPUMillis(t *testing.T, dirs []string) (millis int64, dir string) {
	t.Helper()
	read := func(p string) []string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		return strings.Fields(string(b))
	}
	num := func(s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("cgroup value %q: %v", s, err)
		}
		return n
	}
	for _, d := range dirs {
		var quota, period string
		if _, err := os.Stat(filepath.Join(d, "cpu.max")); err == nil {
			f := read(filepath.Join(d, "cpu.max"))
			if len(f) != 2 {
				t.Fatalf("%s/cpu.max = %q, want quota and period", d, f)
			}
			quota, period = f[0], f[1]
		} else if _, err := os.Stat(filepath.Join(d, "cpu.cfs_quota_us")); err == nil {
			quota, period = read(filepath.Join(d, "cpu.cfs_quota_us"))[0], read(filepath.Join(d, "cpu.cfs_period_us"))[0]
		} else {
			continue
		}
		if quota == "max" || quota == "-1" {
			return -1, d
		}
		return num(quota) * 1000 / num(period), d
	}
	t.Fatalf("no cpu controller file in the sandbox's cgroup directories %v", dirs)
	return 0, ""
}

// TestSandboxCPULimit: the CPU limit the host is configured with is the
// quota of the cgroup the sandbox's commands run in.
func TestSandboxCPULimit(t *testing.T) {
	needBwrap(t)
	tests := []struct {
		configured int
		want       int64
	}{
		{0, DefaultCPUMillis},
		{250, 250},
		{1500, 1500},
		{-1, -1},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.configured), func(t *testing.T) {
			srv := startHostWith(t, Options{Isolation: IsolationBwrap, Limits: Limits{CPUMillis: tt.configured}})
			if srv.Host.cg == nil {
				t.Skip("the host cannot make cgroups here (no cgroup v2 hierarchy offering pids, memory and cpu it may delegate, nor writable v1 hierarchies of them): sandbox CPU is not limited on this machine")
			}
			c := newEnvd(srv, createSandbox(t, srv, nil))
			sb := srv.Host.mustGet(t, c.id)
			got, dir := sandboxCPUMillis(t, sb.cgroup.dirs)
			if got != tt.want {
				t.Errorf("configured CPUMillis %d: cgroup %s allows %d thousandths of a core, want %d", tt.configured, dir, got, tt.want)
			}

			done := c.runInBackground("touch /tmp/started; exec sleep 30")
			waitFor(t, 20*time.Second, "the sandbox's command to start", func() bool {
				_, err := os.Stat(filepath.Join(sb.tmp, "started"))
				return err == nil
			})
			procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			if err != nil || len(strings.Fields(string(procs))) == 0 {
				t.Errorf("%s/cgroup.procs = %q, %v; want the running command's processes", dir, procs, err)
			}
			_ = srv.Host.kill(c.id)
			<-done
		})
	}
}
