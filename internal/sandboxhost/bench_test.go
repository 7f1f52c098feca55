package sandboxhost

import (
	"context"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// BenchmarkRunTrue measures one `bash -l -c true` round trip over envd.
func BenchmarkRunTrue(b *testing.B) {
	for _, mode := range []string{IsolationNone, IsolationBwrap} {
		b.Run(mode, func(b *testing.B) {
			srv, err := Start(context.Background(), Options{APIKey: testAPIKey, RootDir: b.TempDir(), Isolation: mode}, ":0", ":0")
			if err != nil {
				b.Skip(err)
			}
			defer srv.Close()
			sb, err := srv.Host.create(createSpec{templateID: "base", timeout: 600e9})
			if err != nil {
				b.Fatal(err)
			}
			c := envdClient{srv: srv, id: sb.id, token: sb.token}
			req := &envd.StartRequest{Process: envd.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "true"}}}
			b.ResetTimer()
			for range b.N {
				if res, err := c.runReq(context.Background(), req); err != nil || res.end.ExitCode != 0 {
					b.Fatalf("run: %v %+v", err, res.end)
				}
			}
		})
	}
}
