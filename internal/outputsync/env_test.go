package outputsync

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

const testPrefix = "out/v1"

// syncEnv is one test's world: a bash sandbox on a temp home, a fresh
// bucket on versitygw (testenv.S3), and an S3 client that counts calls.
type syncEnv struct {
	t      *testing.T
	client *s3.Client
	s3     *countingS3
	bucket string
	sb     *bashSandbox
	key    core.ThreadKey
}

func newSyncEnv(t *testing.T) *syncEnv {
	t.Helper()
	client := testenv.S3Client(t)
	return &syncEnv{
		t:      t,
		client: client,
		s3:     &countingS3{S3API: client},
		bucket: testenv.Bucket(t, client),
		sb:     &bashSandbox{home: t.TempDir()},
		key:    core.ThreadKey{Tenant: "acme", User: "u1", Thread: "t1"},
	}
}

// syncer builds a Syncer on this env; opts' Bucket, Prefix, Home and Logger
// are filled in.
func (e *syncEnv) syncer(opts Options) *Syncer {
	e.t.Helper()
	opts.Bucket = e.bucket
	opts.Prefix = testPrefix
	opts.Home = e.sb.home
	opts.Logger = slog.New(slog.NewJSONHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := New(e.sb, e.s3, opts)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	return s
}

func (e *syncEnv) sync(s *Syncer, sandboxID string) (core.SyncResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return s.Sync(ctx, core.SyncTarget{Ref: core.SandboxRef{ID: sandboxID}, ThreadKey: e.key})
}

// mustSync runs a pass that must not fail.
func (e *syncEnv) mustSync(s *Syncer, sandboxID string) core.SyncResult {
	e.t.Helper()
	res, err := e.sync(s, sandboxID)
	if err != nil {
		e.t.Fatalf("Sync: %v", err)
	}
	return res
}

func (e *syncEnv) objectKey(rel string) string {
	return testPrefix + "/" + e.key.Tenant + "/" + e.key.User + "/" + e.key.Thread + "/" + rel
}

// object returns the stored bytes of the mirrored file rel, or ok=false.
func (e *syncEnv) object(rel string) (data []byte, ok bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(e.bucket), Key: aws.String(e.objectKey(rel))})
	if err != nil {
		if isNotFound(err) {
			return nil, false
		}
		e.t.Fatalf("GetObject %s: %v", rel, err)
	}
	defer out.Body.Close()
	data, err = io.ReadAll(out.Body)
	if err != nil {
		e.t.Fatalf("read %s: %v", rel, err)
	}
	return data, true
}

// checksum returns the object's stored CRC32 checksum and its type
// (HeadObject with ChecksumMode enabled).
func (e *syncEnv) checksum(rel string) (crc string, typ types.ChecksumType) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.client.HeadObject(ctx, &s3.HeadObjectInput{
		Bucket: aws.String(e.bucket), Key: aws.String(e.objectKey(rel)), ChecksumMode: types.ChecksumModeEnabled,
	})
	if err != nil {
		e.t.Fatalf("HeadObject %s: %v", rel, err)
	}
	return aws.ToString(out.ChecksumCRC32), out.ChecksumType
}

// manifest reads the stored manifest of the env's thread.
func (e *syncEnv) manifest() Manifest {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(e.bucket), Key: aws.String(manifestKey(testPrefix, e.key))})
	if err != nil {
		e.t.Fatalf("get manifest: %v", err)
	}
	defer out.Body.Close()
	var m Manifest
	if err := json.NewDecoder(out.Body).Decode(&m); err != nil {
		e.t.Fatalf("decode manifest: %v", err)
	}
	return m
}

// keys lists every object key in the bucket, sorted.
func (e *syncEnv) keys() []string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var keys []string
	p := s3.NewListObjectsV2Paginator(e.client, &s3.ListObjectsV2Input{Bucket: aws.String(e.bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			e.t.Fatalf("list: %v", err)
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	sort.Strings(keys)
	return keys
}

// pendingUploads lists multipart uploads that were neither completed nor aborted.
func (e *syncEnv) pendingUploads() []string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.client.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(e.bucket)})
	if err != nil {
		e.t.Fatalf("ListMultipartUploads: %v", err)
	}
	var keys []string
	for _, u := range out.Uploads {
		keys = append(keys, aws.ToString(u.Key))
	}
	return keys
}

// countingS3 counts the write calls that go through it.
type countingS3 struct {
	S3API
	mu      sync.Mutex
	puts    map[string]int // PutObject per key
	creates int
	parts   int
	aborts  int
	failPut error // when set, every PutObject fails with it
}

func (c *countingS3) PutObject(ctx context.Context, in *s3.PutObjectInput, o ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	c.mu.Lock()
	if c.puts == nil {
		c.puts = map[string]int{}
	}
	c.puts[aws.ToString(in.Key)]++
	fail := c.failPut
	c.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	return c.S3API.PutObject(ctx, in, o...)
}

func (c *countingS3) CreateMultipartUpload(ctx context.Context, in *s3.CreateMultipartUploadInput, o ...func(*s3.Options)) (*s3.CreateMultipartUploadOutput, error) {
	c.mu.Lock()
	c.creates++
	c.mu.Unlock()
	return c.S3API.CreateMultipartUpload(ctx, in, o...)
}

func (c *countingS3) UploadPart(ctx context.Context, in *s3.UploadPartInput, o ...func(*s3.Options)) (*s3.UploadPartOutput, error) {
	c.mu.Lock()
	c.parts++
	c.mu.Unlock()
	return c.S3API.UploadPart(ctx, in, o...)
}

func (c *countingS3) AbortMultipartUpload(ctx context.Context, in *s3.AbortMultipartUploadInput, o ...func(*s3.Options)) (*s3.AbortMultipartUploadOutput, error) {
	c.mu.Lock()
	c.aborts++
	c.mu.Unlock()
	return c.S3API.AbortMultipartUpload(ctx, in, o...)
}

// writes returns the number of S3 write calls so far and resets the counts.
func (c *countingS3) writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.creates + c.parts
	for _, v := range c.puts {
		n += v
	}
	c.puts, c.creates, c.parts, c.aborts = nil, 0, 0, 0
	return n
}

var errInjected = errors.New("injected failure")
