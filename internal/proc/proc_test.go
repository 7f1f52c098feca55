package proc_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/proc"
)

// helperEnv makes the test binary act as a parent that starts `sleep 60`
// with proc.Start, prints the child's pid and exits without killing it.
const helperEnv = "PROC_TEST_PARENT"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		cmd := exec.Command("sleep", "60")
		if _, err := proc.Start(cmd); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println(cmd.Process.Pid)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestStartNewGroupAndExitedChannel(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	exited, err := proc.Start(cmd)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	pid := cmd.Process.Pid
	pgid, err := syscall.Getpgid(pid)
	if err != nil {
		t.Fatalf("Getpgid(%d): %v", pid, err)
	}
	if pgid != pid {
		t.Errorf("process group = %d, want its own (%d)", pgid, pid)
	}
	select {
	case <-exited:
		t.Fatal("exited closed while the process runs")
	default:
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill group: %v", err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("exited not closed within 10s of SIGKILL")
	}
	if cmd.ProcessState == nil || cmd.ProcessState.Exited() {
		t.Errorf("ProcessState = %v, want killed by a signal", cmd.ProcessState)
	}
}

func TestStartReturnsStartError(t *testing.T) {
	_, err := proc.Start(exec.Command("/nonexistent/binary"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Start(missing binary) error = %v, want one wrapping fs.ErrNotExist", err)
	}
}

func TestChildDiesWithItsParent(t *testing.T) {
	parent := exec.Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), helperEnv+"=1")
	out, err := parent.Output()
	if err != nil {
		t.Fatalf("parent: %v", err)
	}
	line, _ := bufio.NewReader(strings.NewReader(string(out))).ReadString('\n')
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("parent printed %q, want a pid", out)
	}
	// The orphan is reparented and reaped by init (or a subreaper); once
	// killed, signal 0 finds no such process. A zombie would still answer,
	// so look at its state too.
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("child %d still running 10s after its parent exited", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// Field 3 (after "(comm)") is the state; Z is a zombie, X dead.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}
