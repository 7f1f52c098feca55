package outputsync

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
)

var _ Sandbox = (*e2b.Client)(nil)

// The whole chain on real components: the repository's sandbox host (a
// sandbox with /home/user inside, bubblewrap when available), the E2B
// client over envd, and versitygw. Files written by a command in the
// sandbox land in S3 with the same bytes, hostile names are refused, a
// second pass uploads nothing, and a killed sandbox is ErrSandboxGone.
func TestSync_EndToEndWithSandboxHostAndE2BClient(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, ref := startSandbox(t, ctx)
	res, err := client.Run(ctx, ref, core.Command{
		Script: `set -e
mkdir -p outputs/sub workspace uploads
printf '%s' "$A" > outputs/a.txt
printf 'report\n' > outputs/sub/report.md
head -c 6000000 /dev/zero | tr '\0' 'z' > workspace/big.bin
printf x > $'outputs/new\nline'
printf x > $'outputs/bad\xff'
printf secret > uploads/not-mirrored.txt
ln -s /etc/passwd outputs/passwd
mkfifo outputs/fifo`,
		Env: map[string]string{"A": "hello from the sandbox"},
		Cwd: "/home/user",
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("setup command: %v, exit %d, stderr %s", err, res.ExitCode, res.Stderr)
	}

	e := newSyncEnv(t)
	s, err := New(client, e.s3, Options{
		Bucket: e.bucket, Prefix: testPrefix, PartSize: MinPartSize,
		Logger: slog.New(slog.NewJSONHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	target := core.SyncTarget{Ref: ref, ThreadKey: e.key}

	got, err := s.Sync(ctx, target)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantDefer := map[string]string{`outputs/new\nline`: ReasonUnsafePath, `outputs/bad\xff`: ReasonUnsafePath}
	if got.Uploaded != 3 || !reflect.DeepEqual(deferredReasons(got), wantDefer) {
		t.Errorf("result = %+v, want 3 uploaded and deferred %v", got, wantDefer)
	}
	for rel, want := range map[string]string{
		"outputs/a.txt":         "hello from the sandbox",
		"outputs/sub/report.md": "report\n",
	} {
		if b, _ := e.object(rel); string(b) != want {
			t.Errorf("%s = %q, want %q", rel, b, want)
		}
	}
	if b, _ := e.object("workspace/big.bin"); len(b) != 6000000 || b[0] != 'z' || b[len(b)-1] != 'z' {
		t.Errorf("workspace/big.bin: %d bytes, want 6000000 of 'z'", len(b))
	}
	keys := e.keys()
	wantKeys := []string{manifestKey(testPrefix, e.key), e.objectKey("outputs/a.txt"), e.objectKey("outputs/sub/report.md"), e.objectKey("workspace/big.bin")}
	sort.Strings(wantKeys)
	if !reflect.DeepEqual(keys, wantKeys) {
		t.Errorf("keys = %q, want %q", keys, wantKeys)
	}

	e.s3.writes()
	again, err := s.Sync(ctx, target)
	if err != nil || again.Uploaded != 0 || again.Skipped != 3 {
		t.Errorf("second pass = %+v, %v; want nothing uploaded, 3 skipped", again, err)
	}
	if n := e.s3.writes(); n != 0 {
		t.Errorf("second pass S3 writes = %d, want 0", n)
	}

	if err := client.Kill(ctx, ref.ID); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := s.Sync(ctx, target); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("sync of a killed sandbox: err = %v, want ErrSandboxGone", err)
	}
}
