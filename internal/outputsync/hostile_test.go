package outputsync

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
)

// startSandbox starts the repository's sandbox host on loopback and one
// sandbox in it, returning the E2B client and the sandbox's ref.
func startSandbox(t testing.TB, ctx context.Context) (*e2b.Client, core.SandboxRef) {
	t.Helper()
	const key = "hostile-key"
	srv, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: key, RootDir: t.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	client, err := e2b.New(e2b.Options{APIURL: srv.APIURL, SandboxURL: srv.EnvdURL, APIKey: key})
	if err != nil {
		t.Fatalf("e2b.New: %v", err)
	}
	ref, err := client.Create(ctx, core.CreateSpec{Timeout: 30 * time.Minute})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = client.Kill(context.Background(), ref.ID) })
	return client, ref
}

// hostileSetup plants, inside the sandbox, names the listing and the key
// mapping must survive: a newline followed by a forged listing record,
// tabs, invalid UTF-8, "..", symlinks to /etc/passwd and /etc, a
// directory symlink up the tree, a FIFO, a file over the per-file cap,
// and 10,000 tiny files (one shell loop with the printf builtin).
const hostileSetup = `set -e
cd /home/user
mkdir -p outputs/sub workspace/many
printf safe > outputs/safe.txt
printf 'x' > $'outputs/nl\n0\t1\t..'
printf 'x' > $'outputs/tab\tname'
printf 'x' > $'outputs/bad\xff\xfeutf8'
printf 'x' > 'outputs/..dots..'
printf 'x' > 'outputs/sub/..\..\win'
ln -s /etc/passwd outputs/passwd
ln -s /etc workspace/etc
ln -s .. outputs/sub/up
ln -s ../../.. outputs/root
mkfifo outputs/fifo
head -c 2000000 /dev/zero > outputs/big.bin
for i in $(seq 1 10000); do printf "$i" > workspace/many/f$i; done
`

// A hostile sandbox against the whole chain (sandbox host, E2B client over
// envd, versitygw): nothing escapes the thread's prefix, nothing hangs,
// and the result names every file it did not copy and why.
func TestSync_HostileSandboxEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client, ref := startSandbox(t, ctx)
	if res, err := client.Run(ctx, ref, core.Command{Script: hostileSetup, Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
		t.Fatalf("setup: %v, exit %d, stderr %s", err, res.ExitCode, res.Stderr)
	}

	// A file that grows while it is read: a writer appends to it for the
	// whole pass.
	growCtx, stopGrowing := context.WithCancel(ctx)
	growDone := make(chan error, 1)
	go func() {
		_, err := client.Run(growCtx, ref, core.Command{
			Script:  `end=$((SECONDS+60)); while [ $SECONDS -lt $end ]; do printf '%0100d' 0 >> /home/user/outputs/growing.log; sleep 0.001; done`,
			Timeout: 90 * time.Second,
		})
		growDone <- err
	}()
	var once sync.Once
	stop := func() { once.Do(func() { stopGrowing(); <-growDone }) }
	defer stop()
	waitFor(t, ctx, func() bool {
		res, err := client.Run(ctx, ref, core.Command{Script: `[ -s /home/user/outputs/growing.log ]`})
		return err == nil && res.ExitCode == 0
	})

	e := newSyncEnv(t)
	const maxFiles = 500
	s, err := New(client, e.s3, Options{
		Bucket: e.bucket, Prefix: testPrefix, PartSize: MinPartSize,
		MaxFiles: maxFiles, MaxFileBytes: 1 << 20, MaxReported: 20000,
		Logger: slog.New(slog.NewJSONHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	target := core.SyncTarget{Ref: ref, ThreadKey: e.key}

	start := time.Now()
	res, err := s.Sync(ctx, target)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Sync: %v (after %s)", err, took)
	}
	t.Logf("hostile pass: uploaded %d, deferred %d, bytes %d in %s", res.Uploaded, len(res.Deferred), res.Bytes, took)
	if took > time.Minute {
		t.Errorf("pass took %s, want well under a minute", took)
	}

	got := deferredReasons(res)
	want := map[string]string{
		`outputs/nl\n0\t1\t..`:    ReasonUnsafePath,
		`outputs/tab\tname`:       ReasonUnsafePath,
		`outputs/bad\xff\xfeutf8`: ReasonUnsafePath,
		`outputs/big.bin`:         ReasonFileTooLarge,
	}
	for p, r := range want {
		if got[p] != r {
			t.Errorf("deferred[%q] = %q, want %q", p, got[p], r)
		}
	}
	// growing.log: the stream outran the listed size (or the cap), or it
	// was read between two appends; never a silently wrong object.
	grow := got["outputs/growing.log"]
	switch grow {
	case ReasonChanged, ReasonFileTooLarge:
	case "":
		if b, ok := e.object("outputs/growing.log"); !ok || len(b)%100 != 0 {
			t.Errorf("growing.log uploaded as %d bytes, want a whole number of appends", len(b))
		}
	default:
		t.Errorf("growing.log deferred with %q, want %s or uploaded", grow, ReasonChanged)
	}
	t.Logf("growing.log: %q", grow)

	// Files under outputs/ sort before workspace/many, so they are within
	// the cap; the rest of the 10,000 are deferred by it, each reported.
	capped, uploadedMany := 0, 0
	for p, r := range got {
		if strings.HasPrefix(p, "workspace/many/") {
			if r != ReasonMaxFiles {
				t.Errorf("deferred[%q] = %q, want %s", p, r, ReasonMaxFiles)
			}
			capped++
		}
	}
	for _, k := range e.keys() {
		if strings.HasPrefix(k, e.objectKey("workspace/many/")) {
			uploadedMany++
		}
	}
	if capped+uploadedMany != 10000 || uploadedMany < maxFiles-4 || res.Uploaded < maxFiles-1 || res.Uploaded > maxFiles || res.Complete {
		t.Errorf("uploaded %d (%d of the tiny files), capped %d, complete %v; want the %d-file cap spent, every other tiny file reported, incomplete",
			res.Uploaded, uploadedMany, capped, res.Complete, maxFiles)
	}
	for _, name := range []string{"outputs/safe.txt", "outputs/..dots..", `outputs/sub/..\..\win`} {
		if _, ok := e.object(name); !ok {
			t.Errorf("%s not uploaded", name)
		}
	}

	// Nothing outside the thread's prefix; no symlink target, FIFO or
	// /etc content in S3.
	threadPre := testPrefix + "/acme/u1/t1/"
	for _, k := range e.keys() {
		if k == manifestKey(testPrefix, e.key) {
			continue
		}
		if !strings.HasPrefix(k, threadPre) {
			t.Errorf("object %q outside %s", k, threadPre)
		}
		for _, bad := range []string{"passwd", "/etc", "fifo", "/up", "root", ".."} {
			if strings.Contains(strings.TrimPrefix(k, threadPre), bad) && !strings.HasSuffix(k, "..dots..") && !strings.HasSuffix(k, `..\..\win`) {
				t.Errorf("object %q should not exist (%q)", k, bad)
			}
		}
	}
	if b, ok := e.object("outputs/passwd"); ok || bytes.Contains(b, []byte("root:")) {
		t.Errorf("symlink to /etc/passwd was followed")
	}

	// The next pass spends its cap on the deferred tail (converges).
	stop()
	again, err := s.Sync(ctx, target)
	if err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	if again.Uploaded < maxFiles-1 || again.Skipped < maxFiles-1 {
		t.Errorf("second pass = uploaded %d skipped %d, want about %d each (converging)", again.Uploaded, again.Skipped, maxFiles)
	}
}

// waitFor polls cond every 50 ms until it holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("condition not met: %v", context.Cause(ctx))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Restore against the whole chain: the outputs of one sandbox come back in
// a fresh sandbox of the same thread with the same bytes, and the fresh
// sandbox's first sync uploads nothing.
func TestRestore_EndToEndWithSandboxHost(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, first := startSandbox(t, ctx)
	setup := `set -e
cd /home/user
mkdir -p outputs/sub workspace
printf 'hello' > outputs/a.txt
printf 'report\n' > outputs/sub/r.md
head -c 6000000 /dev/urandom > workspace/big.bin
sha256sum outputs/a.txt outputs/sub/r.md workspace/big.bin`
	res, err := client.Run(ctx, first, core.Command{Script: setup})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("setup: %v, exit %d, %s", err, res.ExitCode, res.Stderr)
	}
	sums := string(res.Stdout)

	e := newSyncEnv(t)
	s, err := New(client, e.s3, Options{Bucket: e.bucket, Prefix: testPrefix, PartSize: MinPartSize,
		Logger: slog.New(slog.NewJSONHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.Sync(ctx, core.SyncTarget{Ref: first, ThreadKey: e.key}); err != nil || r.Uploaded != 3 {
		t.Fatalf("first sync = %+v, %v", r, err)
	}
	if err := client.Kill(ctx, first.ID); err != nil {
		t.Fatal(err)
	}

	second, err := client.Create(ctx, core.CreateSpec{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Kill(context.Background(), second.ID) })
	target := core.SyncTarget{Ref: second, ThreadKey: e.key}
	r, err := s.Restore(ctx, target)
	if err != nil || r.Uploaded != 3 || !r.Complete {
		t.Fatalf("Restore = %+v, %v; want 3 restored, complete", r, err)
	}
	res, err = client.Run(ctx, second, core.Command{Script: `cd /home/user && sha256sum outputs/a.txt outputs/sub/r.md workspace/big.bin`})
	if err != nil || string(res.Stdout) != sums {
		t.Errorf("restored checksums = %q (%v), want %q", res.Stdout, err, sums)
	}
	e.s3.writes()
	again, err := s.Sync(ctx, target)
	if err != nil || again.Uploaded != 0 || again.Skipped != 3 {
		t.Errorf("sync after restore = %+v, %v; want 3 skipped", again, err)
	}
	if n := e.s3.writes(); n != 0 {
		t.Errorf("S3 writes after restore = %d, want 0", n)
	}

	// A third sandbox, with a stream cut short in transit: envd writes in
	// place, so the partial file must be removed again by the cleanup
	// command (bash and xargs inside the sandbox).
	third, err := client.Create(ctx, core.CreateSpec{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Kill(context.Background(), third.ID) })
	rs3 := &restoreS3{countingS3: e.s3, body: func(key string, r io.ReadCloser) io.ReadCloser {
		if strings.HasSuffix(key, "/workspace/big.bin") {
			return struct {
				io.Reader
				io.Closer
			}{io.LimitReader(r, 3_000_000), r}
		}
		return r
	}}
	cut, err := New(client, rs3, Options{Bucket: e.bucket, Prefix: testPrefix, PartSize: MinPartSize,
		Logger: slog.New(slog.NewJSONHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	r, err = cut.Restore(ctx, core.SyncTarget{Ref: third, ThreadKey: e.key})
	if err != nil || r.Uploaded != 2 || deferredReasons(r)["workspace/big.bin"] != ReasonChanged {
		t.Fatalf("Restore with a cut stream = %+v, %v; want 2 restored, big.bin %s", r, err, ReasonChanged)
	}
	res, err = client.Run(ctx, third, core.Command{Script: `cd /home/user && ls outputs outputs/sub workspace`})
	if err != nil || strings.Contains(string(res.Stdout), "big.bin") || !strings.Contains(string(res.Stdout), "a.txt") {
		t.Errorf("third sandbox lists %q (%v); want a.txt and no partial big.bin", res.Stdout, err)
	}

	if err := client.Kill(ctx, second.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Restore(ctx, target); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("restore into a killed sandbox: err = %v, want ErrSandboxGone", err)
	}
}
