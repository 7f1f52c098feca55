package outputsync

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// The sync benchmark: throughput of syncing 1 GiB in one file and in
// 10,000 files from a sandbox of the local sandbox host (bytes read over
// envd by the E2B client, as in production) to versitygw, as a ratio to one
// plain streaming PutObject of the same number of bytes in the same run,
// and the peak RSS of the process while syncing.
//
//	go test -run '^$' -bench BenchmarkSync -benchtime 1x -timeout 30m ./internal/outputsync
//
// SYNC_BENCH_BYTES sets the payload (default 1 GiB). Metrics: MB/s (sync),
// plain-MB/s (the PutObject), ratio (sync/plain), peak-RSS-MiB (VmHWM of
// this process during the sync passes, after a reset; the sandbox host runs
// in this process too and is included) and rss-before-MiB.
func BenchmarkSync(b *testing.B) {
	for _, c := range []struct {
		name  string
		files int
	}{{"one-file", 1}, {"10000-files", 10000}} {
		b.Run(c.name, func(b *testing.B) { benchSync(b, c.files, benchBytes(b)) })
	}
}

// benchBytes is SYNC_BENCH_BYTES or 1 GiB.
func benchBytes(b *testing.B) int64 {
	if v := os.Getenv("SYNC_BENCH_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			b.Fatalf("SYNC_BENCH_BYTES=%q: want a positive number of bytes", v)
		}
		return n
	}
	return 1 << 30
}

func benchSync(b *testing.B, files int, total int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	client, ref := startSandbox(b, ctx)
	// One process writes all files: split cuts one random stream into
	// files of per bytes (the last one shorter).
	per := (total + int64(files) - 1) / int64(files)
	res, err := client.Run(ctx, ref, core.Command{
		Script: `set -e -o pipefail
mkdir -p /home/user/outputs/bench && cd /home/user/outputs/bench
head -c "$TOTAL" /dev/urandom | split -b "$PER" -a 5 -d - f
ls | wc -l`,
		Env:     map[string]string{"TOTAL": strconv.FormatInt(total, 10), "PER": strconv.FormatInt(per, 10)},
		Timeout: 10 * time.Minute,
	})
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("creating files: %v, exit %d, %s", err, res.ExitCode, res.Stderr)
	}
	if got := strings.TrimSpace(string(res.Stdout)); got != strconv.Itoa(files) {
		b.Fatalf("created %s files, want %d", got, files)
	}

	s3c := testenv.S3Client(b)
	bucket := testenv.Bucket(b, s3c)
	s, err := New(client, s3c, Options{
		Bucket: bucket, Prefix: "bench",
		MaxFiles: files, MaxTotalBytes: total, MaxFileBytes: total, Deadline: time.Hour,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}

	runtime.GC()
	debug.FreeOSMemory()
	rssBefore := procStatusKiB(b, "VmRSS")
	resetPeakRSS(b)
	b.SetBytes(total)
	b.ResetTimer()
	for i := range b.N {
		// A new thread per iteration: no manifest, everything uploads.
		r, err := s.Sync(ctx, core.SyncTarget{Ref: ref, ThreadKey: core.ThreadKey{Tenant: "bench", User: "u", Thread: "t" + strconv.Itoa(i)}})
		if err != nil || r.Uploaded != files || r.Bytes != total {
			b.Fatalf("sync = %d uploaded, %d bytes, %v; want %d, %d", r.Uploaded, r.Bytes, err, files, total)
		}
	}
	syncDur := b.Elapsed()
	b.StopTimer()
	peak := procStatusKiB(b, "VmHWM")

	plainDur := plainPut(b, ctx, s3c, bucket, total, b.N)
	syncRate := float64(total) * float64(b.N) / syncDur.Seconds() / 1e6
	plainRate := float64(total) * float64(b.N) / plainDur.Seconds() / 1e6
	b.ReportMetric(plainRate, "plain-MB/s")
	b.ReportMetric(syncRate/plainRate, "ratio")
	b.ReportMetric(float64(peak)/1024, "peak-RSS-MiB")
	b.ReportMetric(float64(rssBefore)/1024, "rss-before-MiB")
}

// plainPut times n single PutObject calls of total bytes from a local file
// (a seekable body, which plain-HTTP S3 needs; SDK defaults, so the SDK
// reads it once for the CRC32 and once to send).
func plainPut(b *testing.B, ctx context.Context, c *s3.Client, bucket string, total int64, n int) time.Duration {
	f, err := os.CreateTemp(b.TempDir(), "plain")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	if _, err := io.CopyN(w, rand.Reader, total); err != nil {
		b.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	var d time.Duration
	for i := range n {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		_, err := c.PutObject(ctx, &s3.PutObjectInput{
			Bucket: aws.String(bucket), Key: aws.String(fmt.Sprintf("plain/%d", i)), Body: f, ContentLength: aws.Int64(total),
		})
		d += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
	}
	return d
}

// resetPeakRSS resets VmHWM to the current RSS (Linux: "5" to clear_refs).
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset peak RSS (%v); peak-RSS-MiB covers the whole process life", err)
	}
}

// procStatusKiB reads a "Name:   123 kB" line of /proc/self/status.
func procStatusKiB(b *testing.B, name string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("%s not in /proc/self/status", name)
	return 0
}
