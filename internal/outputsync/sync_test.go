package outputsync

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

var t0 = time.Unix(1_720_000_000, 123_456_789)

// crc32b64 is S3's rendering of a full-object CRC32.
func crc32b64(b []byte) string {
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], crc32.ChecksumIEEE(b))
	return base64.StdEncoding.EncodeToString(out[:])
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// deferredReasons maps every file a pass did not copy (deferred or
// excluded) to its reason; a file in the wrong list maps to "misfiled "
// and its reason, so the maps tests compare also check the split.
func deferredReasons(res core.SyncResult) map[string]string {
	m := map[string]string{}
	for _, d := range res.Deferred {
		m[d.Path] = d.Reason
		if excludedReasons[d.Reason] {
			m[d.Path] = "misfiled " + d.Reason
		}
	}
	for _, d := range res.Excluded {
		m[d.Path] = d.Reason
		if !excludedReasons[d.Reason] {
			m[d.Path] = "misfiled " + d.Reason
		}
	}
	return m
}

// New files are uploaded byte for byte with their checksum, and the
// manifest records each file's mtime at the precision find printed it.
func TestSync_WritesNewFilesWithExactBytesAndChecksum(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	files := map[string][]byte{
		"outputs/random.pdf":      []byte("%PDF-1.4hello"),
		"outputs/empty.txt":       {},
		"workspace/sub/dir/x.bin": randomBytes(t, 70_000),
		"outputs/sp ace/ü.txt":    []byte("unicode name"),
	}
	for rel, data := range files {
		writeFile(t, e.sb.home, rel, data, t0)
	}
	s := e.syncer(Options{})

	res := e.mustSync(s, "sb1")

	want := core.SyncResult{Uploaded: 4, Bytes: 13 + 12 + 70_000, Deferred: []core.DeferredFile{}, Excluded: []core.DeferredFile{}, Complete: true}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("result = %+v, want %+v", res, want)
	}
	for rel, data := range files {
		got, ok := e.object(rel)
		if !ok || !bytes.Equal(got, data) {
			t.Errorf("object %s: present=%v, %d bytes, want %d bytes equal", rel, ok, len(got), len(data))
		}
		if got, typ := e.checksum(rel); got != crc32b64(data) || typ != types.ChecksumTypeFullObject {
			t.Errorf("checksum %s = %q (%s), want %q (FULL_OBJECT)", rel, got, typ, crc32b64(data))
		}
		if got := e.manifest().Files[rel].CRC32; got != crc32b64(data) {
			t.Errorf("manifest crc32 %s = %q, want %q", rel, got, crc32b64(data))
		}
	}
	m := e.manifest()
	if m.SandboxID != "sb1" || len(m.Files) != 4 {
		t.Fatalf("manifest = %+v, want sandbox sb1 with 4 files", m)
	}
	if got, want := m.Files["outputs/random.pdf"].MtimeNs, t0.UnixNano(); got != want {
		t.Errorf("manifest mtime_ns = %d, want %d (exact nanoseconds)", got, want)
	}
	if got := m.Files["outputs/random.pdf"].ETag; got == "" {
		t.Errorf("manifest etag empty")
	}
	for _, k := range e.keys() {
		if !strings.HasPrefix(k, testPrefix+"/acme/u1/t1/") && k != manifestKey(testPrefix, e.key) {
			t.Errorf("object %q outside the thread prefix and manifest key", k)
		}
	}
}

// A file changed in place (same size, new mtime) is uploaded again.
func TestSync_UploadsChangedSameSizeFile(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/random.pdf", []byte("%PDF-1.4hello"), t0)
	s := e.syncer(Options{})
	e.mustSync(s, "sb1")

	writeFile(t, e.sb.home, "outputs/random.pdf", []byte("changed-value"), t0.Add(time.Nanosecond))
	e.sb.resetOpens()
	res := e.mustSync(s, "sb1")

	if res.Uploaded != 1 || res.Skipped != 0 || !res.Complete {
		t.Fatalf("result = %+v, want 1 uploaded, complete", res)
	}
	if got, _ := e.object("outputs/random.pdf"); string(got) != "changed-value" {
		t.Fatalf("object = %q, want %q", got, "changed-value")
	}
	if got := e.manifest().Files["outputs/random.pdf"].MtimeNs; got != t0.UnixNano()+1 {
		t.Fatalf("manifest mtime = %d, want %d", got, t0.UnixNano()+1)
	}
}

// A second pass over unchanged files uploads nothing.
func TestSync_SecondPassWithoutChangesUploadsNothing(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/a.txt", []byte("a"), t0)
	writeFile(t, e.sb.home, "workspace/b.txt", []byte("bb"), t0)
	s := e.syncer(Options{})
	e.mustSync(s, "sb1")
	e.sb.resetOpens()
	e.s3.writes()

	res := e.mustSync(s, "sb1")

	want := core.SyncResult{Skipped: 2, Deferred: []core.DeferredFile{}, Excluded: []core.DeferredFile{}, Complete: true}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("result = %+v, want %+v", res, want)
	}
	if got := e.sb.openedPaths(); len(got) != 0 {
		t.Errorf("files read = %v, want none", got)
	}
	if got := e.s3.writes(); got != 0 {
		t.Errorf("S3 writes = %d, want 0 (manifest unchanged too)", got)
	}
}

// A manifest written for another sandbox of the thread is not trusted.
func TestSync_DiscardsManifestOfAnotherSandbox(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/random.pdf", []byte("%PDF-1.4hello"), t0)
	s := e.syncer(Options{})
	e.mustSync(s, "sb-old")
	e.sb.resetOpens()

	res := e.mustSync(s, "sb-new")

	if res.Uploaded != 1 || res.Skipped != 0 {
		t.Fatalf("result = %+v, want the file uploaded again", res)
	}
	if got := e.sb.openedPaths(); len(got) != 1 {
		t.Errorf("files read = %v, want 1", got)
	}
	if m := e.manifest(); m.SandboxID != "sb-new" {
		t.Errorf("manifest sandbox = %q, want sb-new", m.SandboxID)
	}
}

// An empty listing from a new sandbox resets the manifest to it.
func TestSync_EmptyListingResetsManifestForNewSandbox(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/stale.txt", []byte("x"), t0)
	s := e.syncer(Options{})
	e.mustSync(s, "sb-old")
	if err := os.RemoveAll(e.sb.home + "/outputs"); err != nil {
		t.Fatal(err)
	}

	res := e.mustSync(s, "sb-new")

	if !res.Complete || res.Uploaded != 0 {
		t.Fatalf("result = %+v, want complete, nothing uploaded", res)
	}
	m := e.manifest()
	if want := (Manifest{Version: 1, SandboxID: "sb-new", Files: map[string]ManifestEntry{}}); !reflect.DeepEqual(m, want) {
		t.Fatalf("manifest = %+v, want %+v", m, want)
	}
}

// Files deleted in the sandbox leave the manifest.
func TestSync_DropsManifestEntriesOfDeletedFiles(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/deleted.txt", []byte("bye"), t0)
	writeFile(t, e.sb.home, "outputs/live.txt", []byte("alive"), t0)
	s := e.syncer(Options{})
	e.mustSync(s, "sb1")
	if err := os.Remove(e.sb.home + "/outputs/deleted.txt"); err != nil {
		t.Fatal(err)
	}

	res := e.mustSync(s, "sb1")

	if !res.Complete || res.Skipped != 1 {
		t.Fatalf("result = %+v, want complete with 1 skipped", res)
	}
	var got []string
	for rel := range e.manifest().Files {
		got = append(got, rel)
	}
	if !reflect.DeepEqual(got, []string{"outputs/live.txt"}) {
		t.Errorf("manifest files = %v, want [outputs/live.txt]", got)
	}
	if _, ok := e.object("outputs/deleted.txt"); !ok {
		t.Errorf("object of the deleted file was removed; it must be kept")
	}
}

// With MirrorDeletes, a complete pass also deletes the objects of files
// deleted in the sandbox; a capped pass deletes nothing.
func TestSync_MirrorDeletes(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/deleted.txt", []byte("bye"), t0)
	writeFile(t, e.sb.home, "outputs/live.txt", []byte("alive"), t0)
	e.mustSync(e.syncer(Options{MirrorDeletes: true}), "sb1")
	if err := os.Remove(e.sb.home + "/outputs/deleted.txt"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, e.sb.home, "outputs/n1.txt", []byte("1"), t0)
	writeFile(t, e.sb.home, "outputs/n2.txt", []byte("2"), t0)

	e.mustSync(e.syncer(Options{MirrorDeletes: true, MaxFiles: 1}), "sb1")
	if _, ok := e.object("outputs/deleted.txt"); !ok {
		t.Fatalf("a capped pass deleted an object")
	}
	res := e.mustSync(e.syncer(Options{MirrorDeletes: true}), "sb1")

	if !res.Complete {
		t.Fatalf("result = %+v, want complete", res)
	}
	if _, ok := e.object("outputs/deleted.txt"); ok {
		t.Errorf("object of the deleted file kept; MirrorDeletes wants it gone")
	}
	if _, ok := e.object("outputs/live.txt"); !ok {
		t.Errorf("object of a live file deleted")
	}
	if _, ok := e.manifest().Files["outputs/deleted.txt"]; ok {
		t.Errorf("manifest still lists the deleted file")
	}
}

func TestSync_Caps(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		opts       Options
		files      map[string]int // rel -> size
		wantOpened []string
		wantDefer  map[string]string
	}{
		{
			name:       "max files",
			opts:       Options{MaxFiles: 2},
			files:      map[string]int{"outputs/a.txt": 5, "outputs/b.txt": 5, "outputs/c.txt": 5, "outputs/d.txt": 5},
			wantOpened: []string{"outputs/a.txt", "outputs/b.txt"},
			wantDefer:  map[string]string{"outputs/c.txt": ReasonMaxFiles, "outputs/d.txt": ReasonMaxFiles},
		},
		{
			name:       "max total bytes",
			opts:       Options{MaxTotalBytes: 25},
			files:      map[string]int{"outputs/a.txt": 10, "outputs/b.txt": 10, "outputs/c.txt": 10},
			wantOpened: []string{"outputs/a.txt", "outputs/b.txt"},
			wantDefer:  map[string]string{"outputs/c.txt": ReasonMaxTotalBytes},
		},
		{
			name:      "deadline",
			opts:      Options{Deadline: time.Nanosecond},
			files:     map[string]int{"outputs/a.txt": 5},
			wantDefer: map[string]string{"outputs/a.txt": ReasonDeadline},
		},
		{
			name:       "oversize file skipped without reading",
			opts:       Options{MaxFileBytes: 100},
			files:      map[string]int{"outputs/huge.bin": 101, "outputs/ok.bin": 100},
			wantOpened: []string{"outputs/ok.bin"},
			wantDefer:  map[string]string{"outputs/huge.bin": ReasonFileTooLarge},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newSyncEnv(t)
			for rel, n := range tc.files {
				writeFile(t, e.sb.home, rel, bytes.Repeat([]byte("x"), n), t0)
			}
			s := e.syncer(tc.opts)

			res := e.mustSync(s, "sb1")

			var opened []string
			for _, p := range e.sb.openedPaths() {
				opened = append(opened, strings.TrimPrefix(p, e.sb.home+"/"))
			}
			sort.Strings(opened)
			if !reflect.DeepEqual(opened, tc.wantOpened) {
				t.Errorf("files read = %v, want %v", opened, tc.wantOpened)
			}
			if got := deferredReasons(res); !reflect.DeepEqual(got, tc.wantDefer) {
				t.Errorf("deferred = %v, want %v", got, tc.wantDefer)
			}
			// A pass is complete when only policy exclusions are left.
			if wantComplete := len(res.Deferred) == 0; res.Complete != wantComplete {
				t.Errorf("complete = %v, want %v (deferred %v, excluded %v)", res.Complete, wantComplete, res.Deferred, res.Excluded)
			}
			for _, rel := range tc.wantOpened {
				if _, ok := e.object(rel); !ok {
					t.Errorf("object %s missing", rel)
				}
			}
			for rel := range tc.wantDefer {
				if _, ok := e.object(rel); ok {
					t.Errorf("deferred %s is in S3", rel)
				}
			}
		})
	}
}

// A capped pass keeps the manifest entries it did not reach.
func TestSync_CappedPassPrunesNothing(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/kept.txt", []byte("old"), t0)
	e.mustSync(e.syncer(Options{}), "sb1")
	if err := os.Remove(e.sb.home + "/outputs/kept.txt"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		writeFile(t, e.sb.home, "outputs/"+n+".txt", []byte("hello"), t0)
	}

	res := e.mustSync(e.syncer(Options{MaxFiles: 1}), "sb1")

	if res.Uploaded != 1 || res.Complete {
		t.Fatalf("result = %+v, want 1 uploaded, incomplete", res)
	}
	m := e.manifest()
	for _, rel := range []string{"outputs/kept.txt", "outputs/a.txt"} {
		if _, ok := m.Files[rel]; !ok {
			t.Errorf("manifest lacks %s; files = %v", rel, m.Files)
		}
	}
}

// Capped passes converge: synced files are skipped before the cap is
// counted, so the cap drains the tail.
func TestSync_CappedPassesConverge(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	names := []string{"a", "b", "c", "d", "e"}
	for _, n := range names {
		writeFile(t, e.sb.home, "outputs/"+n+".txt", []byte("hello"), t0)
	}
	s := e.syncer(Options{MaxFiles: 2})

	var results []core.SyncResult
	for range 3 {
		results = append(results, e.mustSync(s, "sb1"))
	}

	for i, want := range []struct {
		up, skip int
		complete bool
	}{{2, 0, false}, {2, 2, false}, {1, 4, true}} {
		if r := results[i]; r.Uploaded != want.up || r.Skipped != want.skip || r.Complete != want.complete {
			t.Errorf("pass %d = %+v, want uploaded %d skipped %d complete %v", i+1, r, want.up, want.skip, want.complete)
		}
	}
	var opened []string
	for _, p := range e.sb.openedPaths() {
		opened = append(opened, strings.TrimPrefix(p, e.sb.home+"/outputs/"))
	}
	if want := []string{"a.txt", "b.txt", "c.txt", "d.txt", "e.txt"}; !reflect.DeepEqual(sorted(opened), want) || len(opened) != 5 {
		t.Errorf("files read across passes = %v, want each once: %v", opened, want)
	}
	if got := e.mustSync(s, "sb1"); got.Uploaded != 0 || !got.Complete {
		t.Errorf("fourth pass = %+v, want nothing uploaded, complete", got)
	}
}

func sorted(s []string) []string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	return s
}

// A stream that does not match its listed size is abandoned: nothing is
// stored, a multipart upload is aborted, the manifest keeps no entry, and
// the next pass retries.
func TestSync_StreamNotMatchingListedSizeIsAborted(t *testing.T) {
	t.Parallel()
	const part = MinPartSize
	tests := []struct {
		name       string
		size       int
		maxFile    int64
		extra      int   // bytes appended to the stream
		cut        int64 // stream cut at this many bytes (-1: no cut)
		wantReason string
		multipart  bool
	}{
		{name: "small file grew", size: 10, extra: 1, cut: -1, wantReason: ReasonChanged},
		{name: "small file shrank", size: 10, cut: 9, wantReason: ReasonChanged},
		{name: "multipart file grew", size: part + 100, extra: 5, cut: -1, wantReason: ReasonChanged, multipart: true},
		{name: "multipart file shrank", size: 2*part + 100, cut: part + 1, wantReason: ReasonChanged, multipart: true},
		{name: "stream passes the per-file cap", size: 64, maxFile: 64, extra: 1 << 20, cut: -1, wantReason: ReasonFileTooLarge},
		{name: "multipart stream passes the per-file cap", size: part + 10, maxFile: part + 10, extra: 1 << 20, cut: -1, wantReason: ReasonFileTooLarge, multipart: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newSyncEnv(t)
			data := randomBytes(t, tc.size)
			writeFile(t, e.sb.home, "outputs/f.bin", data, t0)
			path := e.sb.home + "/outputs/f.bin"
			e.sb.extra = map[string][]byte{path: bytes.Repeat([]byte("+"), tc.extra)}
			if tc.cut >= 0 {
				e.sb.cut = map[string]int64{path: tc.cut}
			}
			s := e.syncer(Options{PartSize: part, MaxFileBytes: tc.maxFile})

			res := e.mustSync(s, "sb1")

			if got := deferredReasons(res); !reflect.DeepEqual(got, map[string]string{"outputs/f.bin": tc.wantReason}) {
				t.Fatalf("deferred = %v, want outputs/f.bin: %s", got, tc.wantReason)
			}
			// Over the cap is a policy exclusion; a changed file is retried.
			if wantComplete := excludedReasons[tc.wantReason]; res.Uploaded != 0 || res.Complete != wantComplete {
				t.Errorf("result = %+v, want nothing uploaded, complete %v", res, wantComplete)
			}
			if _, ok := e.object("outputs/f.bin"); ok {
				t.Errorf("object stored for an aborted stream")
			}
			if got := e.pendingUploads(); len(got) != 0 {
				t.Errorf("multipart uploads left behind: %v", got)
			}
			if tc.multipart && e.s3.aborts != 1 {
				t.Errorf("AbortMultipartUpload calls = %d, want 1", e.s3.aborts)
			}
			if _, ok := e.manifest().Files["outputs/f.bin"]; ok {
				t.Errorf("manifest records an aborted upload")
			}

			e.sb.extra, e.sb.cut = nil, nil
			if res := e.mustSync(s, "sb1"); res.Uploaded != 1 {
				t.Fatalf("retry pass = %+v, want the file uploaded", res)
			}
			if got, _ := e.object("outputs/f.bin"); !bytes.Equal(got, data) {
				t.Errorf("retried object differs from the file (%d vs %d bytes)", len(got), len(data))
			}
		})
	}
}

// Large files go up in parts with bounded buffers; the bytes and a
// composite checksum land in S3.
func TestSync_MultipartUploadExactBytes(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	data := randomBytes(t, 2*MinPartSize+12345)
	writeFile(t, e.sb.home, "workspace/big.bin", data, t0)
	writeFile(t, e.sb.home, "workspace/exact.bin", data[:MinPartSize], t0)
	s := e.syncer(Options{PartSize: MinPartSize})

	res := e.mustSync(s, "sb1")

	if res.Uploaded != 2 || !res.Complete || res.Bytes != int64(len(data)+MinPartSize) {
		t.Fatalf("result = %+v, want 2 uploaded, complete", res)
	}
	for rel, want := range map[string][]byte{"workspace/big.bin": data, "workspace/exact.bin": data[:MinPartSize]} {
		if got, _ := e.object(rel); !bytes.Equal(got, want) {
			t.Errorf("%s: stored %d bytes, want %d identical bytes", rel, len(got), len(want))
		}
		if got, typ := e.checksum(rel); got != crc32b64(want) || typ != types.ChecksumTypeFullObject {
			t.Errorf("%s: stored checksum %q (%s), want full-object CRC32 %q", rel, got, typ, crc32b64(want))
		}
		if got := e.manifest().Files[rel].CRC32; got != crc32b64(want) {
			t.Errorf("%s: manifest crc32 = %s, want %s", rel, got, crc32b64(want))
		}
	}
	if e.s3.creates != 2 || e.s3.parts != 4 {
		t.Errorf("multipart calls: creates %d parts %d, want 2 and 4", e.s3.creates, e.s3.parts)
	}
}

// Hostile names on a real file system: those that cannot be keys are
// refused and reported; symlinks and FIFOs are never listed or read.
func TestSync_HostileTreeOnDisk(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	home := e.sb.home
	writeFile(t, home, "outputs/ok.txt", []byte("ok"), t0)
	writeFile(t, home, "outputs/new\nline.txt", []byte("n"), t0)
	writeFile(t, home, "outputs/tab\there.txt", []byte("t"), t0)
	writeFile(t, home, "outputs/bad\xffutf8.txt", []byte("u"), t0)
	writeFile(t, home, "workspace/..dots../x.txt", []byte("dots are fine"), t0)
	if err := os.Symlink("/etc/passwd", home+"/outputs/passwd"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", home+"/outputs/etc"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(home+"/outputs/fifo", 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", home+"/workspace/link-dir"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, home, "uploads/not-mirrored.txt", []byte("no"), t0)
	s := e.syncer(Options{})

	res := e.mustSync(s, "sb1")

	wantDefer := map[string]string{
		`outputs/new\nline.txt`:   ReasonUnsafePath,
		`outputs/tab\there.txt`:   ReasonUnsafePath,
		`outputs/bad\xffutf8.txt`: ReasonUnsafePath,
	}
	if got := deferredReasons(res); !reflect.DeepEqual(got, wantDefer) {
		t.Errorf("deferred = %v, want %v", got, wantDefer)
	}
	if res.Uploaded != 2 || !res.Complete {
		t.Errorf("result = %+v, want 2 uploaded, complete (unsafe names are excluded)", res)
	}
	want := []string{
		manifestKey(testPrefix, e.key),
		e.objectKey("outputs/ok.txt"),
		e.objectKey("workspace/..dots../x.txt"),
	}
	sort.Strings(want)
	if got := e.keys(); !reflect.DeepEqual(got, want) {
		t.Errorf("keys = %q, want %q", got, want)
	}
	for _, p := range e.sb.openedPaths() {
		if strings.Contains(p, "passwd") || strings.Contains(p, "fifo") || strings.Contains(p, "etc") {
			t.Errorf("read %q: symlinks and FIFOs must not be read", p)
		}
	}
}

// The mirrored directories themselves may be symlinks planted by the
// sandbox; they are not followed.
func TestSync_SymlinkedMirroredDirIsNotFollowed(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	outside := t.TempDir()
	writeFile(t, outside, "secret.txt", []byte("secret"), t0)
	if err := os.Symlink(outside, e.sb.home+"/outputs"); err != nil {
		t.Fatal(err)
	}
	res := e.mustSync(e.syncer(Options{}), "sb1")
	if res.Uploaded != 0 || !res.Complete {
		t.Fatalf("result = %+v, want nothing uploaded", res)
	}
	if got := e.sb.openedPaths(); len(got) != 0 {
		t.Errorf("read %v through a symlinked directory", got)
	}
}

// Crafted listings (a hostile or broken sandbox answering the listing
// command) are parsed, refused or counted; nothing outside the mirrored
// directories is read and nothing escapes the thread prefix.
func TestSync_HostileListing(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	home := e.sb.home
	writeFile(t, home, "outputs/ok.txt", []byte("ok"), t0)
	rec := func(size int, p string) string { return fmt.Sprintf("%d\t1720000000.1234567890\t%s\x00", size, p) }
	e.sb.stdout = []byte(rec(2, home+"/outputs/ok.txt") +
		rec(4, home+"/outputs/../../etc/passwd") +
		rec(4, home+"/outputs/a/../../x") +
		rec(4, home+"/outputs/./x") +
		rec(4, home+"/outputs//x") +
		rec(4, home+"/outputs/") +
		rec(4, home+"/uploads/x") +
		rec(4, home+"/outputsx/y") +
		rec(4, "/etc/passwd") +
		rec(4, home+"/outputs/esc\x1b[31m") +
		rec(4, home+"/outputs/c1\u0085") +
		rec(4, home+"/outputs/"+strings.Repeat("k", 1100)) +
		"garbage-without-tabs\x00" +
		"12\tnot-a-time\t" + home + "/outputs/x\x00" +
		"-5\t1.0\t" + home + "/outputs/neg\x00")

	res := e.mustSync(e.syncer(Options{}), "sb1")

	counts := map[string]int{}
	for _, d := range append(res.Deferred, res.Excluded...) {
		counts[d.Reason]++
	}
	want := map[string]int{ReasonUnsafePath: 10, ReasonPathTooLong: 1, ReasonUnparsable: 3}
	if !reflect.DeepEqual(counts, want) {
		t.Errorf("deferral counts = %v, want %v (deferred: %v)", counts, want, res.Deferred)
	}
	if got := e.sb.openedPaths(); !reflect.DeepEqual(got, []string{home + "/outputs/ok.txt"}) {
		t.Errorf("files read = %q, want only ok.txt", got)
	}
	if res.Uploaded != 1 || res.Complete {
		t.Errorf("result = %+v, want 1 uploaded, incomplete", res)
	}
	for _, d := range res.Deferred {
		if strings.ContainsAny(d.Path, "\x00\n\t\x1b") {
			t.Errorf("report path %q carries raw control characters", d.Path)
		}
	}
}

// A listing cut short (find failed, output capped, record without NUL)
// marks the pass incomplete and prunes nothing.
func TestSync_IncompleteListingPrunesNothing(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/a.txt", []byte("a"), t0)
	writeFile(t, e.sb.home, "outputs/b.txt", []byte("b"), t0)
	e.mustSync(e.syncer(Options{}), "sb1")

	// A listing cap that holds only the first record.
	res := e.mustSync(e.syncer(Options{MaxListBytes: int64(len(fmt.Sprintf("1\t%d.1234567890\t%s/outputs/a.txt\x00", t0.Unix(), e.sb.home)) + 3)}), "sb1")

	if res.Complete || deferredReasons(res)[""] != ReasonListingIncomplete {
		t.Fatalf("result = %+v, want incomplete with listing_incomplete", res)
	}
	if m := e.manifest(); len(m.Files) != 2 {
		t.Errorf("manifest files = %v, want both kept", m.Files)
	}
}

// A dead sandbox is an error wrapping core.ErrSandboxGone, whether found by
// the listing or in the middle of the uploads (release then destroys instead
// of parking).
func TestSync_SandboxGone(t *testing.T) {
	t.Parallel()
	t.Run("listing", func(t *testing.T) {
		t.Parallel()
		e := newSyncEnv(t)
		e.sb.runErr = fmt.Errorf("envd: %w", core.ErrSandboxGone)
		_, err := e.sync(e.syncer(Options{}), "sb1")
		if !errors.Is(err, core.ErrSandboxGone) {
			t.Fatalf("err = %v, want ErrSandboxGone", err)
		}
	})
	t.Run("mid-sync", func(t *testing.T) {
		t.Parallel()
		e := newSyncEnv(t)
		for _, n := range []string{"a", "b", "c", "d"} {
			writeFile(t, e.sb.home, "outputs/"+n+".txt", []byte(n), t0)
		}
		e.sb.openErr = func(n int, _ string) error {
			if n >= 1 {
				return fmt.Errorf("files: %w", core.ErrSandboxGone)
			}
			return nil
		}
		res, err := e.sync(e.syncer(Options{Concurrency: 1}), "sb1")
		if !errors.Is(err, core.ErrSandboxGone) {
			t.Fatalf("err = %v, want ErrSandboxGone", err)
		}
		if res.Uploaded != 1 || res.Complete {
			t.Errorf("result = %+v, want the one file read before death, incomplete", res)
		}
		for _, d := range res.Deferred {
			if d.Reason != ReasonSandboxGone {
				t.Errorf("deferred %v, want reason sandbox_gone", d)
			}
		}
		if got := len(e.sb.openedPaths()); got != 2 {
			t.Errorf("opens = %d, want 2 (no reads after the sandbox died)", got)
		}
	})
	t.Run("mid-stream of a multipart upload", func(t *testing.T) {
		t.Parallel()
		e := newSyncEnv(t)
		writeFile(t, e.sb.home, "outputs/big.bin", randomBytes(t, MinPartSize+10), t0)
		// The file's bytes arrive, then the connection reports the sandbox gone.
		e.sb.cut = map[string]int64{e.sb.home + "/outputs/big.bin": MinPartSize + 5}
		e.sb.readErr = map[string]error{e.sb.home + "/outputs/big.bin": fmt.Errorf("read: %w", core.ErrSandboxGone)}
		e.sb.extra = nil
		res, err := e.sync(e.syncer(Options{PartSize: MinPartSize}), "sb1")
		if !errors.Is(err, core.ErrSandboxGone) {
			t.Fatalf("err = %v, want ErrSandboxGone", err)
		}
		if got := deferredReasons(res); got["outputs/big.bin"] != ReasonSandboxGone {
			t.Errorf("deferred = %v, want big.bin: sandbox_gone", got)
		}
		if got := e.pendingUploads(); len(got) != 0 {
			t.Errorf("multipart uploads left behind: %v", got)
		}
	})
}

// A file deleted between listing and reading, and an S3 failure, are
// per-file deferrals, not pass errors.
func TestSync_PerFileFailuresAreDeferred(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/a.txt", []byte("a"), t0)
	writeFile(t, e.sb.home, "outputs/gone.txt", []byte("g"), t0)
	e.sb.openErr = func(_ int, p string) error {
		if strings.HasSuffix(p, "gone.txt") {
			return fmt.Errorf("files: %w", core.ErrFileNotFound)
		}
		return nil
	}
	res := e.mustSync(e.syncer(Options{}), "sb1")
	if got, want := deferredReasons(res), map[string]string{"outputs/gone.txt": ReasonVanished}; !reflect.DeepEqual(got, want) {
		t.Errorf("deferred = %v, want %v", got, want)
	}

	e.sb.openErr = nil
	writeFile(t, e.sb.home, "outputs/a.txt", []byte("A"), t0.Add(time.Second))
	e.s3.mu.Lock()
	e.s3.failPut = errInjected
	e.s3.mu.Unlock()
	res, err := e.sync(e.syncer(Options{}), "sb1")
	if err != nil {
		t.Errorf("err = %v, want nil (per-file failures; the manifest did not change)", err)
	}
	if got := deferredReasons(res); got["outputs/a.txt"] != ReasonError || got["outputs/gone.txt"] != ReasonError {
		t.Errorf("deferred = %v, want both files with reason error", got)
	}
}

func TestSync_RejectsBadTarget(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	s := e.syncer(Options{})
	for _, tgt := range []core.SyncTarget{
		{Ref: core.SandboxRef{ID: "sb1"}, ThreadKey: core.ThreadKey{Tenant: "acme", User: "../x", Thread: "t"}},
		{Ref: core.SandboxRef{ID: "sb1"}, ThreadKey: core.ThreadKey{Tenant: "", User: "u", Thread: "t"}},
		{Ref: core.SandboxRef{ID: "a/b"}, ThreadKey: e.key},
	} {
		_, err := s.Sync(t.Context(), tgt)
		var ve *core.ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("Sync(%+v) err = %v, want *core.ValidationError", tgt, err)
		}
	}
	if e.sb.runs != 0 {
		t.Errorf("sandbox commands run = %d, want 0", e.sb.runs)
	}
}

func TestNew_ValidatesOptions(t *testing.T) {
	sb := &bashSandbox{home: "/home/user"}
	s3c := &countingS3{}
	tests := []struct {
		name string
		opts Options
		ok   bool
	}{
		{"defaults", Options{Bucket: "b"}, true},
		{"no bucket", Options{}, false},
		{"relative home", Options{Bucket: "b", Home: "home/user"}, false},
		{"unclean home", Options{Bucket: "b", Home: "/home/user/"}, false},
		{"root home", Options{Bucket: "b", Home: "/"}, false},
		{"dotdot prefix", Options{Bucket: "b", Prefix: "a/../b"}, false},
		{"control prefix", Options{Bucket: "b", Prefix: "a\nb"}, false},
		{"small parts", Options{Bucket: "b", PartSize: 1 << 20}, false},
		{"negative cap", Options{Bucket: "b", MaxFiles: -1}, false},
	}
	for _, tc := range tests {
		s, err := New(sb, s3c, tc.opts)
		if (err == nil) != tc.ok {
			t.Errorf("%s: New err = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if tc.name == "defaults" && s != nil {
			o := s.opts
			if o.Home != DefaultHome || o.MaxFiles != 1000 || o.MaxTotalBytes != 1<<30 || o.MaxFileBytes != 256<<20 || o.Deadline != time.Minute {
				t.Errorf("defaults = %+v", o)
			}
		}
	}
}

// corruptingS3 flips the first byte of every object and part body it
// forwards, keeping the checksum the syncer computed: S3 must refuse it.
type corruptingS3 struct{ S3API }

func corrupt(r io.Reader) io.ReadSeeker {
	b, _ := io.ReadAll(r)
	b = append([]byte(nil), b...)
	if len(b) > 0 {
		b[0] ^= 0xff
	}
	return bytes.NewReader(b)
}

func (c corruptingS3) PutObject(ctx context.Context, in *s3.PutObjectInput, o ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	if !strings.HasSuffix(aws.ToString(in.Key), ".json") {
		cp := *in
		cp.Body = corrupt(in.Body)
		in = &cp
	}
	return c.S3API.PutObject(ctx, in, o...)
}

func (c corruptingS3) UploadPart(ctx context.Context, in *s3.UploadPartInput, o ...func(*s3.Options)) (*s3.UploadPartOutput, error) {
	cp := *in
	cp.Body = corrupt(in.Body)
	return c.S3API.UploadPart(ctx, &cp, o...)
}

// The checksum travels with the bytes and S3 verifies it: bytes corrupted
// between the syncer and S3 are refused, for single and multipart uploads.
func TestSync_S3VerifiesChecksum(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/small.txt", []byte("hello"), t0)
	writeFile(t, e.sb.home, "outputs/big.bin", randomBytes(t, MinPartSize+1), t0)
	var logs syncBuffer
	opts := Options{Bucket: e.bucket, Prefix: testPrefix, Home: e.sb.home, PartSize: MinPartSize,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	s, err := New(e.sb, corruptingS3{e.client}, opts)
	if err != nil {
		t.Fatal(err)
	}

	res := e.mustSync(s, "sb1")

	want := map[string]string{"outputs/small.txt": ReasonError, "outputs/big.bin": ReasonError}
	if got := deferredReasons(res); !reflect.DeepEqual(got, want) {
		t.Fatalf("deferred = %v, want %v", got, want)
	}
	if got := strings.Count(logs.String(), "BadDigest"); got != 2 {
		t.Errorf("BadDigest refusals logged = %d, want 2; logs:\n%s", got, logs.String())
	}
	if got := e.keys(); !reflect.DeepEqual(got, []string{manifestKey(testPrefix, e.key)}) {
		t.Errorf("keys = %v, want only the manifest", got)
	}
	if got := e.pendingUploads(); len(got) != 0 {
		t.Errorf("multipart uploads left behind: %v", got)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// An object deleted or replaced in S3 behind the manifest's back is
// uploaded again even though the sandbox file did not change.
func TestSync_ReuploadsObjectMissingOrReplacedInS3(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/a.txt", []byte("aaa"), t0)
	writeFile(t, e.sb.home, "outputs/b.txt", []byte("bbb"), t0)
	writeFile(t, e.sb.home, "outputs/c.txt", []byte("ccc"), t0)
	s := e.syncer(Options{})
	e.mustSync(s, "sb1")
	ctx := t.Context()
	if _, err := e.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(e.bucket), Key: aws.String(e.objectKey("outputs/a.txt"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(e.bucket), Key: aws.String(e.objectKey("outputs/b.txt")), Body: strings.NewReader("xyz")}); err != nil {
		t.Fatal(err)
	}
	e.sb.resetOpens()

	res := e.mustSync(s, "sb1")

	if res.Uploaded != 2 || res.Skipped != 1 || !res.Complete {
		t.Fatalf("result = %+v, want a and b uploaded again, c skipped", res)
	}
	for rel, want := range map[string]string{"outputs/a.txt": "aaa", "outputs/b.txt": "bbb"} {
		if got, _ := e.object(rel); string(got) != want {
			t.Errorf("%s = %q, want %q", rel, got, want)
		}
	}
}

// A long pass stores the manifest as it goes, so an invocation that dies
// mid-pass does not upload everything again next time.
func TestSync_ManifestCheckpointsDuringPass(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	for _, n := range []string{"a", "b", "c"} {
		writeFile(t, e.sb.home, "outputs/"+n+".txt", []byte(n), t0)
	}
	s := e.syncer(Options{Concurrency: 1})
	s.checkpointEvery = 0
	var seen []string
	e.sb.openErr = func(n int, _ string) error {
		if n == 2 {
			for rel := range e.manifest().Files {
				seen = append(seen, rel)
			}
		}
		return nil
	}

	e.mustSync(s, "sb1")

	if got, want := sorted(seen), []string{"outputs/a.txt", "outputs/b.txt"}; !reflect.DeepEqual(got, want) {
		t.Errorf("stored manifest before the third file = %v, want %v", got, want)
	}
}

// Many tiny files (a hostile or just busy sandbox) drain over capped passes
// with concurrent uploads; each file is read once.
func TestSync_ManyTinyFilesConverge(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	const n = 1500
	for i := range n {
		writeFile(t, e.sb.home, fmt.Sprintf("outputs/d%02d/f%04d", i%37, i), []byte(fmt.Sprint(i)), time.Time{})
	}
	s := e.syncer(Options{MaxFiles: 1000})

	r1 := e.mustSync(s, "sb1")
	r2 := e.mustSync(s, "sb1")

	if r1.Uploaded != 1000 || len(r1.Deferred) != n-1000 || r1.Complete {
		t.Errorf("pass 1 = uploaded %d, deferred %d, complete %v; want 1000, %d, false", r1.Uploaded, len(r1.Deferred), r1.Complete, n-1000)
	}
	if r2.Uploaded != n-1000 || r2.Skipped != 1000 || !r2.Complete {
		t.Errorf("pass 2 = %+v, want %d uploaded, 1000 skipped, complete", r2, n-1000)
	}
	if got := len(e.sb.openedPaths()); got != n {
		t.Errorf("reads = %d, want %d", got, n)
	}
	if got := len(e.manifest().Files); got != n {
		t.Errorf("manifest entries = %d, want %d", got, n)
	}
}

// A file over the per-file cap is excluded by policy: it is reported in
// Excluded, never in Deferred, and every pass, the first included, is
// complete, so "more to do" and "excluded" stay distinguishable.
func TestSync_ExcludedFilesDoNotKeepPassesIncomplete(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	writeFile(t, e.sb.home, "outputs/huge.bin", bytes.Repeat([]byte("x"), 101), t0)
	writeFile(t, e.sb.home, "outputs/ok.txt", []byte("ok"), t0)
	s := e.syncer(Options{MaxFileBytes: 100})
	wantExcluded := []core.DeferredFile{{Path: "outputs/huge.bin", Reason: ReasonFileTooLarge}}
	for pass, wantUploaded := range []int{1, 0} {
		res := e.mustSync(s, "sb1")
		if !res.Complete || res.Uploaded != wantUploaded || len(res.Deferred) != 0 || !reflect.DeepEqual(res.Excluded, wantExcluded) {
			t.Errorf("pass %d: got %+v, want complete, %d uploaded, nothing deferred, excluded %v", pass+1, res, wantUploaded, wantExcluded)
		}
	}
}

// TestSync_ThreadQuota: what a thread stores in S3, all passes together,
// stays within MaxThreadBytes: files past it are deferred (thread_quota)
// and stay deferred on later passes; objects of files deleted in the
// sandbox still count (they are still stored); replacing a file counts only
// what it adds.
func TestSync_ThreadQuota(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	for _, rel := range []string{"outputs/a.bin", "outputs/b.bin", "outputs/c.bin"} {
		writeFile(t, e.sb.home, rel, bytes.Repeat([]byte("x"), 10), t0)
	}
	s := e.syncer(Options{MaxThreadBytes: 25})

	res := e.mustSync(s, "sb1")
	// The quota is a policy: the file is excluded, and the pass is complete
	// (another pass would upload nothing more).
	if got, want := deferredReasons(res), map[string]string{"outputs/c.bin": ReasonThreadQuota}; !reflect.DeepEqual(got, want) || res.Uploaded != 2 || !res.Complete || len(res.Excluded) != 1 {
		t.Fatalf("first pass: uploaded %d deferred %v excluded %v complete %v; want 2 uploaded, %v excluded, complete", res.Uploaded, got, res.Excluded, res.Complete, want)
	}
	// A separate pass does not get a fresh allowance.
	res = e.mustSync(s, "sb1")
	if got := deferredReasons(res); got["outputs/c.bin"] != ReasonThreadQuota || res.Uploaded != 0 || !res.Complete {
		t.Fatalf("second pass: uploaded %d deferred %v complete %v; want c.bin still excluded, complete", res.Uploaded, got, res.Complete)
	}
	// Deleting a file in the sandbox does not free what S3 still stores.
	if err := os.Remove(e.sb.home + "/outputs/a.bin"); err != nil {
		t.Fatal(err)
	}
	res = e.mustSync(s, "sb1")
	if got := deferredReasons(res); got["outputs/c.bin"] != ReasonThreadQuota || res.Uploaded != 0 {
		t.Fatalf("after a delete: uploaded %d deferred %v; want c.bin still deferred", res.Uploaded, got)
	}
	// Growing b.bin by 5 bytes fits (20 + 5 = 25); by 6 more it does not.
	writeFile(t, e.sb.home, "outputs/b.bin", bytes.Repeat([]byte("y"), 15), t0.Add(time.Second))
	res = e.mustSync(s, "sb1")
	if got, _ := e.object("outputs/b.bin"); len(got) != 15 {
		t.Fatalf("b.bin grown within the quota: stored %d bytes, want 15 (deferred %v)", len(got), deferredReasons(res))
	}
	writeFile(t, e.sb.home, "outputs/b.bin", bytes.Repeat([]byte("z"), 16), t0.Add(2*time.Second))
	res = e.mustSync(s, "sb1")
	if got := deferredReasons(res); got["outputs/b.bin"] != ReasonThreadQuota {
		t.Fatalf("b.bin grown past the quota: deferred %v, want thread_quota", got)
	}
	total := int64(0)
	for _, k := range e.keys() {
		if strings.HasPrefix(k, threadPrefix(testPrefix, e.key)) {
			data, _ := e.object(strings.TrimPrefix(k, threadPrefix(testPrefix, e.key)))
			total += int64(len(data))
		}
	}
	if total > 25 {
		t.Errorf("thread stores %d bytes, quota 25", total)
	}
}
