package outputsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// restoreS3 injects faults into the reads Restore makes.
type restoreS3 struct {
	*countingS3
	mu      sync.Mutex
	gets    map[string]int // GetObject per key
	listErr error
	// body rewrites a GetObject body (nil: unchanged).
	body func(key string, r io.ReadCloser) io.ReadCloser
	// getErr fails GetObject for a key when it returns non-nil.
	getErr func(key string) error
}

func (r *restoreS3) GetObject(ctx context.Context, in *s3.GetObjectInput, o ...func(*s3.Options)) (*s3.GetObjectOutput, error) {
	key := aws.ToString(in.Key)
	r.mu.Lock()
	if r.gets == nil {
		r.gets = map[string]int{}
	}
	r.gets[key]++
	body, getErr := r.body, r.getErr
	r.mu.Unlock()
	if getErr != nil {
		if err := getErr(key); err != nil {
			return nil, err
		}
	}
	out, err := r.countingS3.GetObject(ctx, in, o...)
	if err == nil && body != nil {
		out.Body = body(key, out.Body)
	}
	return out, err
}

func (r *restoreS3) ListObjectsV2(ctx context.Context, in *s3.ListObjectsV2Input, o ...func(*s3.Options)) (*s3.ListObjectsV2Output, error) {
	r.mu.Lock()
	err := r.listErr
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return r.countingS3.ListObjectsV2(ctx, in, o...)
}

func (r *restoreS3) getCount(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gets[key]
}

// restoreEnv is a thread whose first sandbox (e.sb) synced files, and a
// fresh second sandbox to restore into, on the same bucket and thread.
type restoreEnv struct {
	*syncEnv
	fresh *bashSandbox
	rs3   *restoreS3
}

func newRestoreEnv(t *testing.T, files map[string][]byte) *restoreEnv {
	t.Helper()
	e := newSyncEnv(t)
	for rel, data := range files {
		writeFile(t, e.sb.home, rel, data, t0)
	}
	if len(files) > 0 {
		if res := e.mustSync(e.syncer(Options{PartSize: MinPartSize}), "sb-old"); !res.Complete {
			t.Fatalf("seeding sync = %+v, want complete", res)
		}
	}
	return &restoreEnv{syncEnv: e, fresh: &bashSandbox{home: t.TempDir()}, rs3: &restoreS3{countingS3: e.s3}}
}

// restorer is a Syncer on the fresh sandbox (restoreS3 in front of S3).
func (e *restoreEnv) restorer(opts Options) *Syncer {
	e.t.Helper()
	old := e.sb
	e.sb = e.fresh
	defer func() { e.sb = old }()
	s := e.syncer(opts)
	s.s3, s.up.s3 = e.rs3, e.rs3
	return s
}

func (e *restoreEnv) restore(s *Syncer, sandboxID string) (core.SyncResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return s.Restore(ctx, core.SyncTarget{Ref: core.SandboxRef{ID: sandboxID}, ThreadKey: e.key})
}

// freshFile reads rel from the fresh sandbox (ok=false when absent).
func (e *restoreEnv) freshFile(rel string) ([]byte, bool) {
	b, err := os.ReadFile(e.fresh.home + "/" + rel)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return b, true
}

// putRaw stores an object under the thread prefix directly (as another
// writer of the bucket could).
func (e *restoreEnv) putRaw(rel string, data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(e.bucket), Key: aws.String(e.objectKey(rel)), Body: bytes.NewReader(data),
	})
	return err
}

// Files synced from an earlier sandbox come back byte for byte in a fresh
// one (single-part and multipart objects), and the seeded manifest makes
// the fresh sandbox's first sync upload nothing.
func TestRestore_RoundTripSeedsManifest(t *testing.T) {
	t.Parallel()
	files := map[string][]byte{
		"outputs/report.md":       []byte("# report\n"),
		"outputs/empty.txt":       {},
		"outputs/sp ace/ü.txt":    []byte("unicode name"),
		"workspace/data/big.bin":  randomBytes(t, MinPartSize+123), // multipart, FULL_OBJECT crc32
		"workspace/deep/a/b/c.go": []byte("package c\n"),
	}
	e := newRestoreEnv(t, files)
	s := e.restorer(Options{PartSize: MinPartSize})

	res, err := e.restore(s, "sb-new")
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	var total int64
	for _, b := range files {
		total += int64(len(b))
	}
	want := core.SyncResult{Uploaded: len(files), Bytes: total, Deferred: []core.DeferredFile{}, Excluded: []core.DeferredFile{}, Complete: true}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("result = %+v, want %+v", res, want)
	}
	for rel, data := range files {
		if got, ok := e.freshFile(rel); !ok || !bytes.Equal(got, data) {
			t.Errorf("%s: present=%v, %d bytes, want %d equal bytes", rel, ok, len(got), len(data))
		}
	}
	m := e.manifest()
	if m.SandboxID != "sb-new" || len(m.Files) != len(files) {
		t.Fatalf("manifest = sandbox %q with %d files, want sb-new with %d", m.SandboxID, len(m.Files), len(files))
	}
	if got, want := m.Files["workspace/data/big.bin"].CRC32, crc32b64(files["workspace/data/big.bin"]); got != want {
		t.Errorf("manifest crc32 = %q, want %q", got, want)
	}

	e.s3.writes()
	again, err := e.restorerSync(s, "sb-new")
	if err != nil || again.Uploaded != 0 || again.Skipped != len(files) || !again.Complete {
		t.Errorf("first sync after restore = %+v, %v; want nothing uploaded, %d skipped", again, err, len(files))
	}
	if n := e.s3.writes(); n != 0 {
		t.Errorf("S3 writes by the first sync after restore = %d, want 0", n)
	}
	if opened := e.fresh.openedPaths(); len(opened) != 0 {
		t.Errorf("sync after restore read %v, want no file read", opened)
	}
}

func (e *restoreEnv) restorerSync(s *Syncer, sandboxID string) (core.SyncResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return s.Sync(ctx, core.SyncTarget{Ref: core.SandboxRef{ID: sandboxID}, ThreadKey: e.key})
}

// A thread with nothing in S3 costs one listing: no reads, no writes, no
// manifest, complete.
func TestRestore_NothingStored(t *testing.T) {
	t.Parallel()
	e := newRestoreEnv(t, nil)
	res, err := e.restore(e.restorer(Options{}), "sb-new")
	want := core.SyncResult{Deferred: []core.DeferredFile{}, Excluded: []core.DeferredFile{}, Complete: true}
	if err != nil || !reflect.DeepEqual(res, want) {
		t.Fatalf("Restore = %+v, %v; want %+v, nil", res, err, want)
	}
	if n := e.s3.writes(); n != 0 {
		t.Errorf("S3 writes = %d, want 0", n)
	}
	if w := e.fresh.writtenPaths(); len(w) != 0 {
		t.Errorf("sandbox writes = %v, want none", w)
	}
}

// The caps of Sync bound a restore: oversize objects are skipped without
// being read, file and byte caps defer the tail (in key order).
func TestRestore_Caps(t *testing.T) {
	t.Parallel()
	files := map[string][]byte{
		"outputs/a.txt":   bytes.Repeat([]byte("a"), 10),
		"outputs/b.txt":   bytes.Repeat([]byte("b"), 10),
		"outputs/c.txt":   bytes.Repeat([]byte("c"), 10),
		"outputs/huge.md": bytes.Repeat([]byte("h"), 100),
	}
	tests := []struct {
		name         string
		opts         Options
		wantRestored []string
		wantDeferred map[string]string
	}{
		{"max files", Options{MaxFiles: 2, MaxFileBytes: 50},
			[]string{"outputs/a.txt", "outputs/b.txt"},
			map[string]string{"outputs/c.txt": ReasonMaxFiles, "outputs/huge.md": ReasonFileTooLarge}},
		{"max total bytes", Options{MaxTotalBytes: 25, MaxFileBytes: 50},
			[]string{"outputs/a.txt", "outputs/b.txt"},
			map[string]string{"outputs/c.txt": ReasonMaxTotalBytes, "outputs/huge.md": ReasonFileTooLarge}},
		{"deadline", Options{Deadline: time.Nanosecond, MaxFileBytes: 50},
			nil,
			map[string]string{"outputs/a.txt": ReasonDeadline, "outputs/b.txt": ReasonDeadline, "outputs/c.txt": ReasonDeadline, "outputs/huge.md": ReasonFileTooLarge}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newRestoreEnv(t, files)
			res, err := e.restore(e.restorer(tt.opts), "sb-new")
			if err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if got := deferredReasons(res); !reflect.DeepEqual(got, tt.wantDeferred) || res.Complete || res.Uploaded != len(tt.wantRestored) {
				t.Errorf("result = %+v, want %d restored, deferred %v, incomplete", res, len(tt.wantRestored), tt.wantDeferred)
			}
			for rel := range files {
				_, ok := e.freshFile(rel)
				if want := contains(tt.wantRestored, rel); ok != want {
					t.Errorf("%s present = %v, want %v", rel, ok, want)
				}
			}
			if n := e.rs3.getCount(e.objectKey("outputs/huge.md")); n != 0 {
				t.Errorf("oversize object read %d times, want 0", n)
			}
		})
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// S3 trouble never fails a restore: a failed listing, a failed read and a
// corrupted or truncated body are reported per file, and no partial file is
// left in the sandbox (a later sync would upload it over the good object).
func TestRestore_S3TroubleIsReportedNotFatal(t *testing.T) {
	t.Parallel()
	files := map[string][]byte{
		"outputs/good.txt":      []byte("good"),
		"outputs/fails.txt":     []byte("fails"),
		"outputs/corrupt.bin":   randomBytes(t, 100_000),
		"outputs/truncated.bin": randomBytes(t, 100_000),
	}
	t.Run("listing fails", func(t *testing.T) {
		t.Parallel()
		e := newRestoreEnv(t, files)
		e.rs3.listErr = fmt.Errorf("list: %w", errInjected)
		res, err := e.restore(e.restorer(Options{}), "sb-new")
		if err != nil {
			t.Fatalf("Restore err = %v, want nil (S3 trouble is reported)", err)
		}
		if got := deferredReasons(res); res.Complete || got[""] != ReasonStoreListing || res.Uploaded != 0 {
			t.Errorf("result = %+v, want nothing restored, %s, incomplete", res, ReasonStoreListing)
		}
	})
	t.Run("per-file failures", func(t *testing.T) {
		t.Parallel()
		e := newRestoreEnv(t, files)
		e.rs3.getErr = func(key string) error {
			if strings.HasSuffix(key, "/fails.txt") {
				return errInjected
			}
			return nil
		}
		e.rs3.body = func(key string, r io.ReadCloser) io.ReadCloser {
			switch {
			case strings.HasSuffix(key, "/corrupt.bin"):
				return &flipByte{r, 50_000}
			case strings.HasSuffix(key, "/truncated.bin"):
				return struct {
					io.Reader
					io.Closer
				}{io.LimitReader(r, 60_000), r}
			}
			return r
		}
		res, err := e.restore(e.restorer(Options{}), "sb-new")
		if err != nil {
			t.Fatalf("Restore err = %v, want nil", err)
		}
		want := map[string]string{"outputs/fails.txt": ReasonError, "outputs/corrupt.bin": ReasonChecksumMismatch, "outputs/truncated.bin": ReasonChanged}
		if got := deferredReasons(res); !reflect.DeepEqual(got, want) || res.Uploaded != 1 || res.Complete {
			t.Errorf("result = %+v, want good.txt restored, deferred %v", res, want)
		}
		for rel := range want {
			if _, ok := e.freshFile(rel); ok {
				t.Errorf("%s left in the sandbox after a failed restore", rel)
			}
		}
		if got, _ := e.freshFile("outputs/good.txt"); string(got) != "good" {
			t.Errorf("good.txt = %q", got)
		}
		if m := e.manifest(); len(m.Files) != 1 || m.Files["outputs/good.txt"].Size != 4 {
			t.Errorf("manifest files = %v, want only good.txt", m.Files)
		}
	})
}

// flipByte flips the byte at offset off of the stream (same length).
type flipByte struct {
	io.ReadCloser
	off int64
}

func (f *flipByte) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if f.off >= 0 && f.off < int64(n) {
		p[f.off] ^= 0xff
	}
	f.off -= int64(n)
	return n, err
}

// Keys in S3 that do not map to a safe path under outputs/ or workspace/
// are refused; nothing is written outside the mirrored directories.
func TestRestore_RefusesUnsafeKeys(t *testing.T) {
	t.Parallel()
	e := newRestoreEnv(t, map[string][]byte{"outputs/ok.txt": []byte("ok")})
	unsafe := []string{"other/x.txt", "outputs/a\tb.txt", "outputs/a\x7fb", "top.txt"}
	var stored []string
	for _, rel := range unsafe {
		if err := e.putRaw(rel, []byte("evil")); err != nil {
			t.Logf("S3 refused key %q: %v", rel, err)
			continue
		}
		stored = append(stored, rel)
	}
	if len(stored) < 3 {
		t.Fatalf("only %d unsafe keys could be stored (%q); the test needs more", len(stored), stored)
	}
	res, err := e.restore(e.restorer(Options{}), "sb-new")
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	got := deferredReasons(res)
	for _, rel := range stored {
		if got[displayPath(e.fresh.home, e.fresh.home+"/"+rel)] != ReasonUnsafePath {
			t.Errorf("key %q: deferred = %v, want unsafe_path", rel, got)
		}
	}
	if res.Uploaded != 1 {
		t.Errorf("restored = %d, want 1 (ok.txt)", res.Uploaded)
	}
	for _, w := range e.fresh.writtenPaths() {
		if w != e.fresh.home+"/outputs/ok.txt" {
			t.Errorf("wrote %q, want only outputs/ok.txt", w)
		}
	}
}

// A sandbox that dies during the restore is an error wrapping
// core.ErrSandboxGone; no further writes are attempted.
func TestRestore_SandboxGone(t *testing.T) {
	t.Parallel()
	e := newRestoreEnv(t, map[string][]byte{"outputs/a": []byte("a"), "outputs/b": []byte("b"), "outputs/c": []byte("c")})
	e.fresh.writeErr = func(n int, _ string) error {
		if n >= 1 {
			return fmt.Errorf("envd: %w", core.ErrSandboxGone)
		}
		return nil
	}
	s := e.restorer(Options{Concurrency: 1})
	res, err := e.restore(s, "sb-new")
	if !errors.Is(err, core.ErrSandboxGone) {
		t.Fatalf("err = %v, want ErrSandboxGone", err)
	}
	if res.Uploaded != 1 || res.Complete {
		t.Errorf("result = %+v, want 1 restored, incomplete", res)
	}
	if n := len(e.fresh.writtenPaths()); n != 2 {
		t.Errorf("writes = %d, want 2 (none after the sandbox died)", n)
	}
}

func TestRestore_RejectsBadTarget(t *testing.T) {
	t.Parallel()
	e := newRestoreEnv(t, nil)
	s := e.restorer(Options{})
	for _, tgt := range []core.SyncTarget{
		{Ref: core.SandboxRef{ID: "sb"}, ThreadKey: core.ThreadKey{Tenant: "a", User: "../u", Thread: "t"}},
		{Ref: core.SandboxRef{ID: "../sb"}, ThreadKey: e.key},
	} {
		var ve *core.ValidationError
		if _, err := s.Restore(context.Background(), tgt); !errors.As(err, &ve) {
			t.Errorf("Restore(%+v) err = %v, want *core.ValidationError", tgt, err)
		}
	}
}

// A restore cut short by a cap converges: it reports what remains, each
// ResumeRestore (and each Sync) continues it into the same sandbox, files
// the agent changed or created meanwhile are never overwritten, and once
// everything is back nothing is pending.
func TestRestore_ResumesWithoutOverwriting(t *testing.T) {
	t.Parallel()
	files := map[string][]byte{}
	for i := range 45 {
		files[fmt.Sprintf("outputs/f%02d.txt", i)] = []byte(fmt.Sprintf("stored %02d", i))
	}
	for _, viaSync := range []bool{false, true} {
		t.Run(fmt.Sprintf("via sync %v", viaSync), func(t *testing.T) {
			t.Parallel()
			e := newRestoreEnv(t, files)
			s := e.restorer(Options{MaxFiles: 20})
			res, err := e.restore(s, "sb-new")
			if err != nil || res.Uploaded != 20 || res.Remaining != 25 || res.Complete {
				t.Fatalf("first restore = %+v, %v; want 20 restored, 25 remaining, incomplete", res, err)
			}
			// The agent edits a restored file and creates one the restore
			// has not reached yet.
			writeFile(t, e.fresh.home, "outputs/f00.txt", []byte("agent edit"), t0.Add(time.Hour))
			writeFile(t, e.fresh.home, "outputs/f30.txt", []byte("agent's own"), t0.Add(time.Hour))

			ctx := context.Background()
			target := core.SyncTarget{Ref: core.SandboxRef{ID: "sb-new"}, ThreadKey: e.key}
			for round := 0; ; round++ {
				if round == 5 {
					t.Fatalf("restore did not converge in 5 rounds")
				}
				if viaSync {
					if _, err := s.Sync(ctx, target); err != nil {
						t.Fatalf("Sync: %v", err)
					}
					if m := e.manifest(); !m.RestorePending {
						break
					}
					continue
				}
				res, ran, err := s.ResumeRestore(ctx, target)
				if err != nil {
					t.Fatalf("ResumeRestore: %v", err)
				}
				if !ran {
					break
				}
				if res.Remaining == 0 && !res.Complete {
					t.Fatalf("resume = %+v: nothing remaining but incomplete", res)
				}
			}
			for rel, data := range files {
				want := data
				switch rel {
				case "outputs/f00.txt":
					want = []byte("agent edit")
				case "outputs/f30.txt":
					want = []byte("agent's own")
				}
				if got, ok := e.freshFile(rel); !ok || !bytes.Equal(got, want) {
					t.Errorf("%s = %q (present %v), want %q", rel, got, ok, want)
				}
			}
			if _, err := os.Stat(e.fresh.home + "/" + stagingDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("staging directory left behind: %v", err)
			}
			if _, ran, err := s.ResumeRestore(ctx, target); ran || err != nil {
				t.Errorf("ResumeRestore after convergence: ran %v, %v; want nothing pending", ran, err)
			}
		})
	}
}
