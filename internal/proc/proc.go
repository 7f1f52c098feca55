// Package proc starts child processes that do not outlive their parent:
// each child runs in its own process group (so the group can be signalled
// as a whole with a negative pid) and gets SIGKILL when the process that
// started it dies (Linux PR_SET_PDEATHSIG, prctl(2)). internal/devstack (make
// run) and internal/testenv (test servers) start their children with it.
package proc

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// launchReq asks the launcher thread to start cmd.
type launchReq struct {
	cmd  *exec.Cmd
	done chan error
}

// Pdeathsig fires when the thread that forked the child exits (prctl(2)),
// not the process, so every child is forked from one goroutine locked to
// its OS thread for the life of the process.
var (
	launcherOnce sync.Once
	launchCh     = make(chan launchReq)
)

// Start sets cmd.SysProcAttr to a new process group with Pdeathsig SIGKILL
// (replacing any set before), starts cmd from the launcher thread and
// reaps it in the background. The returned channel is closed once the
// process has exited (cmd.ProcessState is then set); the caller must not
// call cmd.Wait. Errors are cmd.Start's.
func Start(cmd *exec.Cmd) (<-chan struct{}, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	launcherOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for req := range launchCh {
				req.done <- req.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	launchCh <- launchReq{cmd: cmd, done: done}
	if err := <-done; err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return exited, nil
}
