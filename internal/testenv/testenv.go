// Package testenv starts the local stand-ins that tests run against: DynamoDB Local and the
// versitygw S3 gateway (scripts/install-deps.sh installs them and says how they start). It is imported only
// from _test.go files.
//
// Each stand-in is started at most once per test process, on a free 127.0.0.1 port, on first use,
// and is killed when the test process exits (Pdeathsig SIGKILL) or when Stop is called. Setting
// TEST_DYNAMODB_ENDPOINT or TEST_S3_ENDPOINT uses an already running server instead. When a tool is
// missing the test fails with a hint to run `make deps`; it never skips, except under -short
// (NeedsStandIns: `make test-short` runs no stand-in).
package testenv

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/proc"
	"github.com/sandbox-broker/sandbox-broker/internal/standin"
)

// Region is the AWS region the stand-ins are addressed with.
const Region = standin.Region

// startTimeout bounds how long a stand-in may take to answer after it was started. It is generous
// because `go test ./...` starts one JVM per test binary, several at a time, on small machines.
const startTimeout = 120 * time.Second

var (
	rootOnce sync.Once
	rootDir  string
	rootErr  error
)

// RepoRoot returns the directory holding the module's go.mod, found by walking up from the working
// directory (a package directory under `go test`). It fails the test when there is none.
func RepoRoot(t testing.TB) string {
	t.Helper()
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			rootErr = fmt.Errorf("getwd: %w", err)
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				rootDir = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = errors.New("no go.mod found above the working directory")
				return
			}
			dir = parent
		}
	})
	if rootErr != nil {
		t.Fatalf("testenv: %v", rootErr)
	}
	return rootDir
}

// ToolPath returns the absolute path of rel under the repository's .tools directory, failing the test
// with a `make deps` hint when it does not exist.
func ToolPath(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(RepoRoot(t), ".tools", rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("testenv: %s missing: run make deps", filepath.Join(".tools", rel))
	}
	return p
}

// UniqueName returns a name that is unique per call and valid both as a DynamoDB table name and as
// an S3 bucket name (3 to 63 characters of [a-z0-9-], starting and ending with a letter or digit).
// It is built from prefix, the test's name and a random suffix, so leftovers can be traced back.
func UniqueName(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: random name: %v", err)
	}
	suffix := hex.EncodeToString(b[:])
	clean := func(s string, max int) string {
		var sb strings.Builder
		dash := false
		for _, r := range strings.ToLower(s) {
			if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
				sb.WriteRune(r)
				dash = false
			} else if !dash && sb.Len() > 0 {
				sb.WriteByte('-')
				dash = true
			}
			if sb.Len() >= max {
				break
			}
		}
		return strings.Trim(sb.String(), "-")
	}
	parts := []string{}
	if p := clean(prefix, 20); p != "" {
		parts = append(parts, p)
	}
	if n := clean(t.Name(), 63-len(suffix)-2-len(strings.Join(parts, "-"))); n != "" {
		parts = append(parts, n)
	}
	parts = append(parts, suffix)
	return strings.Join(parts, "-")
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("listen: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// server is a stand-in process started by this package.
type server struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited <-chan struct{} // closed when the process has exited
	dirs   []string        // removed by Stop
}

var (
	serversMu sync.Mutex
	servers   []*server
)

func (s *server) kill() {
	if s.cmd.Process != nil {
		// Negative pid: the whole process group (Setpgid below).
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
		}
	}
	for _, d := range s.dirs {
		_ = os.RemoveAll(d)
	}
}

// start runs name with args on a new process group that gets SIGKILL when the test process dies,
// then calls ready until it returns nil, the process exits or startTimeout passes.
func start(dir, name string, args []string, ready func() error) (*server, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out := &syncBuffer{}
	cmd.Stdout = out
	cmd.Stderr = out
	exited, err := proc.Start(cmd) // own process group, Pdeathsig SIGKILL
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(name), err)
	}
	s := &server{cmd: cmd, out: out, exited: exited}
	serversMu.Lock()
	servers = append(servers, s)
	serversMu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		err := ready()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s exited before answering (%v); output:\n%s", filepath.Base(name), cmd.ProcessState, out.tail(4000))
		default:
		}
		if time.Now().After(deadline) {
			s.kill()
			return nil, fmt.Errorf("%s did not answer within %s: %v; output:\n%s", filepath.Base(name), startTimeout, err, out.tail(4000))
		}
		select {
		case <-s.exited:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// syncBuffer collects a child's output for error messages.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 { // keep memory bounded for long-running servers
		b.buf.Reset()
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// waitTCP reports whether addr accepts TCP connections.
func waitTCP(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// NeedsStandIns skips t under -short (`make test-short`: unit and in-memory tests only, no
// stand-in started). DynamoDB and S3 call it, so every test that needs a stand-in is skipped
// there; call it first in a test that needs one later, or a whole test binary's setup.
func NeedsStandIns(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a local stand-in (DynamoDB Local or versitygw): skipped under -short")
	}
}
