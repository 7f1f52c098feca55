package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/proc"
)

// child is a process started by the stack, in its own process group, that
// gets SIGKILL when the stack's process dies (Pdeathsig).
type child struct {
	name   string
	cmd    *exec.Cmd
	exited <-chan struct{} // closed when the process has exited
	log    io.Closer
}

// startChild runs bin with args and env (exactly env: nothing is inherited)
// in dir, writing its output to logPath (truncated first).
func startChild(name, dir, bin string, args, env []string, logPath string) (*child, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("%s: log dir: %w", name, err)
	}
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout = lf
	cmd.Stderr = lf
	exited, err := proc.Start(cmd) // own process group, Pdeathsig SIGKILL
	if err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &child{name: name, cmd: cmd, exited: exited, log: lf}, nil
}

// stop sends SIGTERM to the child's process group, then SIGKILL after grace.
func (c *child) stop(grace time.Duration) {
	if c == nil || c.cmd.Process == nil {
		return
	}
	pgid := -c.cmd.Process.Pid
	select {
	case <-c.exited:
	default:
		_ = syscall.Kill(pgid, syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(grace):
		}
	}
	// Kill the group even after the leader exited: its children may live on.
	_ = syscall.Kill(pgid, syscall.SIGKILL)
	select {
	case <-c.exited:
	case <-time.After(5 * time.Second):
	}
	c.log.Close()
}

// waitReady polls ready every 100 ms until it succeeds, the child exits,
// ctx ends or timeout passes.
func (c *child) waitReady(ctx context.Context, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("%s exited before it was ready (%v)", c.name, c.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within %s: %w", c.name, timeout, last)
		case <-tick.C:
		}
	}
}

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func freeAddr() (string, error) {
	addrs, err := freeAddrs(1)
	if err != nil {
		return "", err
	}
	return addrs[0], nil
}

// freeAddrs returns n distinct 127.0.0.1 addresses whose ports were free a
// moment ago: every port stays bound until all are picked, so two picks
// cannot return the same port.
func freeAddrs(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// loopbackAddr resolves a configured address: "" or port 0 picks a free
// port; the host must be loopback (empty or localhost means 127.0.0.1).
func loopbackAddr(addr string) (string, bool, error) {
	if addr == "" {
		a, err := freeAddr()
		return a, true, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", false, fmt.Errorf("address %q: %w", addr, err)
	}
	if host == "" || host == "localhost" {
		host = "127.0.0.1"
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", false, fmt.Errorf("address %q is not loopback", addr)
	}
	if port == "0" || port == "" {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return "", false, fmt.Errorf("pick a free port: %w", err)
		}
		defer l.Close()
		return l.Addr().String(), true, nil
	}
	if _, err := strconv.Atoi(port); err != nil {
		return "", false, fmt.Errorf("address %q: bad port", addr)
	}
	return net.JoinHostPort(host, port), false, nil
}

// dialable reports whether addr accepts TCP connections.
func dialable(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

var errStopped = errors.New("devstack stopped")

// ownsListener reports whether process pid holds a socket listening on
// addr's port (on any local address, IPv4 or IPv6: Java binds the wildcard),
// from /proc. A port picked as free may be taken by another process before
// the child binds it; a dial alone would then reach that process (another
// test's emulator or DynamoDB) and the child, failing to bind, would be
// taken for ready. Where /proc cannot tell, it answers true.
func ownsListener(pid int, addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return true
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return true
	}
	suffix := fmt.Sprintf(":%04X", n)
	sockets := map[string]bool{}
	readable := false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		readable = true
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) > 9 && strings.HasSuffix(f[1], suffix) && f[3] == "0A" { // 0A: LISTEN
				sockets["socket:["+f[9]+"]"] = true
			}
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if !readable || err != nil {
		return true
	}
	for _, fd := range fds {
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && sockets[link] {
			return true
		}
	}
	return false
}
