package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// initMessages are the lines a function logs at cold start, outside any
// invocation: they have no request id to carry.
var initMessages = map[string]bool{"configured": true, "configuration": true, "invalid configuration": true, "init failed": true}

// checkRequestIDs reads the functions' logs of a stack and checks that
// every JSON line logged during an invocation carries the Lambda request
// id ("requestId"), the HTTP adapter's, the engine's and the syncer's
// among them (the scenario makes each log at least once).
func checkRequestIDs(t *testing.T, logDir string) {
	t.Helper()
	seen := map[string]int{} // message -> lines with a request id
	files := eachLogLine(t, filepath.Join(logDir, "fn-*.log"), func(name, raw string, line map[string]any) bool {
		msg, _ := line["msg"].(string)
		if msg == "" || initMessages[msg] {
			return true
		}
		if id, _ := line["requestId"].(string); id == "" {
			t.Errorf("%s: line without requestId: %s", filepath.Base(name), raw)
			return true
		}
		seen[msg]++
		return true
	})
	if files == 0 {
		t.Fatalf("no function logs in %s", logDir)
	}
	// "request": the HTTP adapter; "sync pass": the syncer; "reconcile
	// pass": the engine.
	for _, msg := range []string{"request", "sync pass", "reconcile pass"} {
		if seen[msg] == 0 {
			t.Errorf("no %q line with a requestId in the function logs (seen %v)", msg, seen)
		}
	}
}

// eachLogLine calls fn with every JSON line of the log files matching
// pattern (the emulator's own text lines are skipped) until fn returns
// false, and returns how many files it read.
func eachLogLine(t *testing.T, pattern string, fn func(name, raw string, line map[string]any) bool) int {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		more := true
		for more && sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			more = fn(name, sc.Text(), line)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		if !more {
			break
		}
	}
	return len(files)
}
