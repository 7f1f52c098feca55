package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// Acquire a thread's sandbox, run a command in it through its envd
// connection, and release it (outputs/ and workspace/ go to S3).
func Example() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:8787", "dev-token")
	if err != nil {
		panic(err)
	}
	sb, err := c.Acquire(ctx, "alice", "q3-report")
	var apiErr *client.APIError
	if errors.As(err, &apiErr) && client.IsCapacity(err) {
		fmt.Println("no slot free, retry after", apiErr.RetryAfter)
		return
	} else if err != nil {
		panic(err)
	}
	e, err := client.NewEnvd(sb.SandboxID, sb.Connection, nil)
	if err != nil {
		panic(err)
	}
	code, err := e.Exec(ctx, client.ExecRequest{
		Script:  `python3 -c 'import sys; print(sys.version)' > outputs/python.txt`,
		Timeout: time.Minute, Stdout: os.Stdout, Stderr: os.Stderr,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("exit code", code)
	res, err := c.Release(ctx, sb.SandboxID)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.State, res.Sync.Uploaded)
}
