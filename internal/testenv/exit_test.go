package testenv_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// TestStandInsDieWithProcess runs this test binary again as a child that starts both stand-ins and
// exits without calling Stop, then checks that both servers are gone (Pdeathsig).
func TestStandInsDieWithProcess(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		fmt.Printf("ENDPOINT %s\n", testenv.DynamoDB(t).Endpoint)
		fmt.Printf("ENDPOINT %s\n", testenv.S3(t).Endpoint)
		os.Exit(0)
	}
	if os.Getenv("TEST_DYNAMODB_ENDPOINT") != "" || os.Getenv("TEST_S3_ENDPOINT") != "" {
		t.Log("external endpoints set: this process starts no stand-ins; checking nothing")
		return
	}
	t.Parallel()
	testenv.RepoRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestStandInsDieWithProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TESTENV_CHILD=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	var hosts []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if ep, ok := strings.CutPrefix(sc.Text(), "ENDPOINT "); ok {
			u, err := url.Parse(ep)
			if err != nil {
				t.Fatalf("child printed a bad endpoint %q: %v", ep, err)
			}
			hosts = append(hosts, u.Host)
		}
	}
	if len(hosts) != 2 {
		t.Fatalf("child printed %d endpoints, want 2; stdout:\n%s", len(hosts), out)
	}
	for _, h := range hosts {
		deadline := time.Now().Add(10 * time.Second)
		for {
			c, err := net.DialTimeout("tcp", h, time.Second)
			if err != nil {
				break // refused: the server is gone
			}
			c.Close()
			if time.Now().After(deadline) {
				t.Fatalf("%s still accepts connections 10s after the test process exited", h)
			}
			time.Sleep(100 * time.Millisecond) // polling a kernel-side effect; no event to wait on
		}
	}
}
