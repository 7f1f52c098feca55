package cli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Values of `sbx sync --progress`.
const (
	progressAuto   = "auto"   // when stderr is a terminal and --json is not set
	progressAlways = "always" // even when stderr is not a terminal
	progressNever  = "never"
)

// spinnerTick is how often the spinner line is redrawn.
const spinnerTick = 100 * time.Millisecond

// isTerminal reports whether w is a character device (a terminal), the
// test `[ -t 2 ]` makes; anything that is not an *os.File is not one.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// spinner redraws "<frame> <label> <elapsed>" on one line of w until
// stopped, for calls whose duration is unknown (a sync pass reports nothing
// until it ends, so there is no fraction to show; a determinate bar such
// as github.com/schollz/progressbar would have nothing to fill).
type spinner struct {
	w     io.Writer
	label string
	start time.Time
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// startSpinner draws the first frame at once, then one every tick.
func startSpinner(w io.Writer, label string, tick time.Duration) *spinner {
	s := &spinner{w: w, label: label, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go s.loop(tick)
	return s
}

func (s *spinner) loop(tick time.Duration) {
	defer close(s.done)
	frames := `|/-\`
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; ; i++ {
		fmt.Fprintf(s.w, "\r\x1b[K%c %s %s", frames[i%len(frames)], s.label, elapsed(time.Since(s.start)))
		select {
		case <-s.stop:
			fmt.Fprint(s.w, "\r\x1b[K")
			return
		case <-t.C:
		}
	}
}

// Stop clears the spinner line and returns the time since the start. Safe
// on a nil spinner (progress off) and when called twice.
func (s *spinner) Stop() time.Duration {
	if s == nil {
		return 0
	}
	s.once.Do(func() { close(s.stop) })
	<-s.done
	return time.Since(s.start)
}

// elapsed renders d as "4.2s" below a minute and "2m05s" above.
func elapsed(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}
