package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/sandbox-broker/sandbox-broker/internal/standin"
)

var execLookPath = exec.LookPath

// S3Endpoint addresses an S3-compatible server and the credentials it accepts (SigV4 is checked).
type S3Endpoint struct {
	Endpoint  string // base URL, e.g. http://127.0.0.1:41235; use path-style addressing
	Region    string
	AccessKey string
	SecretKey string
}

var (
	s3Once sync.Once
	s3EP   S3Endpoint
	s3Err  error
)

// s3DirPrefix names the per-process data directories under os.TempDir(); the pid follows it.
const s3DirPrefix = "testenv-s3-"

// S3 returns the endpoint of a running S3 server: TEST_S3_ENDPOINT with TEST_S3_ACCESS_KEY,
// TEST_S3_SECRET_KEY and optionally TEST_S3_REGION when set, else one versitygw per test process
// (from .tools/bin) serving a temporary posix directory. Use Bucket for a fresh bucket. Fails the
// test when versitygw is missing (run make deps) or does not start.
func S3(t testing.TB) S3Endpoint {
	t.Helper()
	NeedsStandIns(t)
	if ep := os.Getenv("TEST_S3_ENDPOINT"); ep != "" {
		e := S3Endpoint{
			Endpoint:  ep,
			Region:    os.Getenv("TEST_S3_REGION"),
			AccessKey: os.Getenv("TEST_S3_ACCESS_KEY"),
			SecretKey: os.Getenv("TEST_S3_SECRET_KEY"),
		}
		if e.Region == "" {
			e.Region = Region
		}
		if e.AccessKey == "" || e.SecretKey == "" {
			t.Fatal("testenv: TEST_S3_ENDPOINT is set but TEST_S3_ACCESS_KEY or TEST_S3_SECRET_KEY is not")
		}
		return e
	}
	bin := ToolPath(t, filepath.Join("bin", "versitygw"))
	s3Once.Do(func() {
		s3EP, s3Err = startS3(bin)
	})
	if s3Err != nil {
		t.Fatalf("testenv: versitygw: %v", s3Err)
	}
	return s3EP
}

func startS3(bin string) (S3Endpoint, error) {
	removeStaleS3Dirs()
	base, err := os.MkdirTemp("", s3DirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return S3Endpoint{}, fmt.Errorf("temp dir: %w", err)
	}
	posixArgs, err := standin.VersityGWData(base)
	if err != nil {
		_ = os.RemoveAll(base)
		return S3Endpoint{}, err
	}

	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return S3Endpoint{}, err
		}
		ep := S3Endpoint{
			Endpoint:  "http://127.0.0.1:" + strconv.Itoa(port),
			Region:    Region,
			AccessKey: "testenvaccess",
			SecretKey: "testenvsecret",
		}
		client := newS3Client(ep)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		srv, err := start(base, bin, standin.VersityGWArgs(addr, standin.S3Keys{AccessKey: ep.AccessKey, SecretKey: ep.SecretKey}, posixArgs), func() error {
			if err := waitTCP(addr); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return standin.S3Ready(ctx, client)
		})
		if err == nil {
			srv.dirs = append(srv.dirs, base)
			return ep, nil
		}
		lastErr = err
	}
	_ = os.RemoveAll(base)
	return S3Endpoint{}, lastErr
}

// removeStaleS3Dirs removes data directories left by test processes that no longer run.
func removeStaleS3Dirs() {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), s3DirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
		}
	}
}

// S3Client returns an S3 client for S3(t) using path-style addressing.
func S3Client(t testing.TB) *s3.Client {
	t.Helper()
	return newS3Client(S3(t))
}

func newS3Client(ep S3Endpoint) *s3.Client {
	return standin.S3Client(ep.Endpoint, ep.Region, standin.S3Keys{AccessKey: ep.AccessKey, SecretKey: ep.SecretKey}, 60*time.Second)
}

// Bucket creates a fresh, empty bucket named by UniqueName and returns its name. At the end of the
// test it deletes the bucket's objects and the bucket (best effort; failures are logged).
func Bucket(t testing.TB, client *s3.Client) string {
	t.Helper()
	name := UniqueName(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("testenv: create bucket %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := emptyBucket(ctx, client, name); err != nil {
			t.Logf("testenv: empty bucket %s: %v", name, err)
			return
		}
		if _, err := client.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(name)}); err != nil {
			t.Logf("testenv: delete bucket %s: %v", name, err)
		}
	})
	return name
}

func emptyBucket(ctx context.Context, client *s3.Client, bucket string) error {
	p := s3.NewListObjectsV2Paginator(client, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		if len(page.Contents) == 0 {
			continue
		}
		ids := make([]types.ObjectIdentifier, 0, len(page.Contents))
		for _, o := range page.Contents {
			ids = append(ids, types.ObjectIdentifier{Key: o.Key})
		}
		if _, err := client.DeleteObjects(ctx, &s3.DeleteObjectsInput{
			Bucket: aws.String(bucket),
			Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)},
		}); err != nil {
			return fmt.Errorf("delete objects: %w", err)
		}
	}
	return nil
}
