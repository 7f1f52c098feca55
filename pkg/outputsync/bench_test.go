package outputsync

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// benchBytes is the payload of the throughput benchmarks:
// SYNC_BENCH_BYTES (default 256 MiB; issue 4 asks for 1 GiB).
func benchBytes(b *testing.B) int64 {
	if v := os.Getenv("SYNC_BENCH_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatalf("SYNC_BENCH_BYTES: %v", err)
		}
		return n
	}
	return 256 << 20
}

func benchHome(b *testing.B, files int, total int64) string {
	home := b.TempDir()
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	per := total / int64(files)
	for i := range files {
		p := fmt.Sprintf("%s/outputs/d%03d/f%05d.bin", home, i%100, i)
		if err := os.MkdirAll(p[:len(p)-11], 0o755); err != nil {
			b.Fatal(err)
		}
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		for left := per; left > 0; {
			n := min(left, int64(len(chunk)))
			if _, err := f.Write(chunk[:n]); err != nil {
				b.Fatal(err)
			}
			left -= n
		}
		f.Close()
	}
	return home
}

// benchSync syncs files totalling total bytes with a fresh sandbox id per
// iteration (so every iteration uploads everything) and reports MB/s and
// the heap in use at the end.
func benchSync(b *testing.B, files int, total int64) {
	client := testenv.S3Client(b)
	bucket := testenv.Bucket(b, client)
	home := benchHome(b, files, total)
	s, err := New(&bashSandbox{home: home}, client, Options{
		Bucket: bucket, Prefix: "bench", Home: home,
		MaxFiles: files, MaxTotalBytes: total + 1, MaxFileBytes: total + 1, Deadline: 1 << 40,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(total)
	b.ResetTimer()
	for i := range b.N {
		res, err := s.Sync(context.Background(), core.SyncTarget{
			Ref:       core.SandboxRef{ID: "sb" + strconv.Itoa(i)},
			ThreadKey: core.ThreadKey{Tenant: "bench", User: "u", Thread: "t"},
		})
		if err != nil || res.Uploaded != files {
			b.Fatalf("sync = %+v, %v", res, err)
		}
	}
	b.StopTimer()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapSys)/(1<<20), "heap-sys-MiB")
}

func BenchmarkSyncOneLargeFile(b *testing.B) { benchSync(b, 1, benchBytes(b)) }

func BenchmarkSyncManySmallFiles(b *testing.B) { benchSync(b, 10000, benchBytes(b)) }

// BenchmarkPlainPut is the baseline: one streaming PutObject of the same
// bytes from the same disk (seekable file body), no listing or manifest.
func BenchmarkPlainPut(b *testing.B) {
	client := testenv.S3Client(b)
	bucket := testenv.Bucket(b, client)
	total := benchBytes(b)
	home := benchHome(b, 1, total)
	path := home + "/outputs/d000/f00000.bin"
	b.SetBytes(total)
	b.ResetTimer()
	for range b.N {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		_, err = client.PutObject(context.Background(), &s3.PutObjectInput{
			Bucket: aws.String(bucket), Key: aws.String("plain"), Body: f, ContentLength: aws.Int64(total),
		})
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
}
