package outputsync

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Restore-only reasons reported in core.DeferredFile.Reason.
const (
	// ReasonStoreListing: the thread's objects could not be listed in S3
	// (Path ""); nothing or only part of it was restored.
	ReasonStoreListing = "store_listing_failed"
	// ReasonChecksumMismatch: the bytes read did not match the object's
	// stored CRC32; the partial file was removed.
	ReasonChecksumMismatch = "checksum_mismatch"
	// ReasonManifestNotStored: the restored files were written but the
	// seeded manifest could not be stored (Path ""); the next pass uploads
	// them again (same bytes, harmless).
	ReasonManifestNotStored = "manifest_not_stored"
)

// errChecksum: an object's bytes did not match its stored CRC32.
var errChecksum = errors.New("crc32 mismatch")

// maxCleanupEnvBytes bounds the newline-joined paths passed in one cleanup
// command's environment (Linux caps one environment string at 128 KiB).
const maxCleanupEnvBytes = 100 << 10

// envCleanupPaths carries the paths of partially written files, one per
// line, into cleanupScript. Restored paths passed relPath, so they hold no
// control characters and a newline cannot occur inside one.
const envCleanupPaths = "SBX_RESTORE_CLEANUP"

// cleanupScript removes files whose restore failed midway, so a later pass
// cannot upload a truncated copy over the good object.
const cleanupScript = `printf '%s\n' "$` + envCleanupPaths + `" | xargs -r -d '\n' rm -f --`

// restoredFile is one object written into the sandbox.
type restoredFile struct {
	Size  int64
	CRC32 string
	ETag  string
}

// restoreObject is one object under the thread prefix as S3 listed it.
type restoreObject struct {
	Rel  string // "outputs/<rel>" or "workspace/<rel>" (unchecked)
	Size int64
	ETag string
}

// Restore copies a thread's mirrored files from S3 into a freshly created
// sandbox: every object under
// <prefix>/<tenant>/<user>/<thread>/ whose key maps to a safe path under
// outputs/ or workspace/ is written to the same path under the sandbox
// home, in key order, under the same caps as Sync (MaxFiles, MaxTotalBytes,
// MaxFileBytes skipped unread, Deadline from the start of Restore, capped by
// ctx's deadline). S3 is the source of truth: with MirrorDeletes off, files
// deleted in an earlier sandbox are restored too. Each object is streamed
// (memory bounded independently of its size); its length must match the
// listing and the SDK verifies its stored CRC32. A file whose write failed
// midway is removed again. Afterwards the manifest is seeded for t.Ref.ID
// with the restored files' size and sandbox mtime, so the next Sync skips
// them.
//
// In the result, Uploaded counts files written into the sandbox and Bytes
// their bytes; Deferred lists what was not restored and why; Complete is
// true when everything was restored and the manifest stored.
//
// Errors: a *core.ValidationError for a bad target; an error wrapping
// core.ErrSandboxGone when the sandbox died (the sandbox is unusable); a
// context error when ctx ended. S3 trouble is never an error: it is
// reported in Deferred (ReasonStoreListing, ReasonError,
// ReasonManifestNotStored), so a caller can hand the sandbox out anyway.
//
// A restore that a cap (files, bytes, time) or an incomplete listing cut
// short says so (Remaining, and the manifest's RestorePending), and
// ResumeRestore continues it.
func (s *Syncer) Restore(ctx context.Context, t core.SyncTarget) (core.SyncResult, error) {
	res, _, err := s.restore(ctx, t, false)
	return res, err
}

// ResumeRestore continues a restore into t.Ref that stopped short (the
// thread's manifest is this sandbox's and says RestorePending); ran is
// false, at the cost of one manifest read, when none is pending. The
// sandbox has been handed out meanwhile, so only objects whose path is
// neither in the manifest (restored or synced already) nor present in the
// sandbox are restored, and each is written to a staging directory and
// moved into place with a no-clobber rename (mv -n, which fails rather
// than replace a file the agent created in between). Caps, deferrals and
// errors are those of Restore.
func (s *Syncer) ResumeRestore(ctx context.Context, t core.SyncTarget) (core.SyncResult, bool, error) {
	return s.restore(ctx, t, true)
}

var _ core.RestoreResumer = (*Syncer)(nil)

// stagingDir (under the home, outside the mirrored directories) holds the
// files a resumed restore wrote until they are moved into place.
const stagingDir = ".sbx-restore"

// envRestoreMoves carries the relative paths of staged files, one per line
// (paths passed relPath: no newline can occur inside one).
const envRestoreMoves = "SBX_RESTORE_MOVES"

// placeScript moves each staged file into place unless a file is there,
// then prints, one per line, the paths it did not place, and removes the
// staging directory. It runs in the home directory.
const placeScript = `printf '%s\n' "$` + envRestoreMoves + `" | while IFS= read -r rel; do
  [ -n "$rel" ] || continue
  mkdir -p -- "$(dirname -- "$rel")" 2>/dev/null
  mv -n -- "` + stagingDir + `/$rel" "$rel" 2>/dev/null
  if [ -e "` + stagingDir + `/$rel" ]; then printf '%s\n' "$rel"; fi
done
rm -rf -- "` + stagingDir + `"`

// capReasons are the deferrals a later pass can make good (the restore is
// pending while any remains).
var capReasons = map[string]bool{ReasonMaxFiles: true, ReasonMaxTotalBytes: true, ReasonDeadline: true,
	ReasonCanceled: true, ReasonStoreListing: true}

// restoreRun is one restore into a sandbox: its target, its accounting,
// and what it restored.
type restoreRun struct {
	t      core.SyncTarget
	resume bool
	start  time.Time
	log    *slog.Logger
	p      *pass
	// done: paths a resumed restore must leave alone (in the manifest, or
	// present in the sandbox).
	done map[string]bool

	mu       sync.Mutex              // guards restored and failed
	restored map[string]restoredFile // by sandbox-relative path
	failed   []string                // sandbox paths whose write may have left a partial file
}

// restoreJob is one object admitted for restore.
type restoreJob struct {
	obj      restoreObject
	key      string // the object's key
	rel, abs string // its path relative to the home, and where it is written
}

func (s *Syncer) restore(ctx context.Context, t core.SyncTarget, resume bool) (core.SyncResult, bool, error) {
	start := s.now()
	if err := t.ThreadKey.Validate(); err != nil {
		return core.SyncResult{}, false, err
	}
	if err := core.ValidateSandboxID(t.Ref.ID); err != nil {
		return core.SyncResult{}, false, err
	}
	r := &restoreRun{t: t, resume: resume, start: start, p: &pass{},
		log: s.log.With("sandbox_id", t.Ref.ID, "thread", t.ThreadKey.String(), "op", "restore", "resume", resume)}
	if resume {
		pending, err := s.resumeDone(ctx, r)
		if !pending {
			return core.SyncResult{Deferred: []core.DeferredFile{}, Complete: true}, false, nil
		}
		if err != nil {
			return core.SyncResult{}, true, err
		}
	}
	w, closeWindow := s.openWindow(ctx, start)
	defer closeWindow()

	prefix := threadPrefix(s.opts.Prefix, t.ThreadKey)
	// The listing has its own timeouts (like Sync's); the deadline bounds
	// the transfers.
	objs, listComplete, err := s.listObjects(ctx, prefix)
	if err != nil {
		if ctx.Err() != nil {
			return s.finishRestore(ctx, r)
		}
		// Restore what was listed before the failure.
		r.log.WarnContext(ctx, "listing the thread's objects failed", "err", err, "listed", len(objs))
	}
	if err != nil || !listComplete {
		r.p.deferred = append(r.p.deferred, core.DeferredFile{Path: "", Reason: ReasonStoreListing})
	}
	if len(objs) == 0 {
		return s.finishRestore(ctx, r)
	}

	r.restored = map[string]restoredFile{}
	g := new(errgroup.Group)
	g.SetLimit(s.opts.Concurrency)
	for _, o := range objs {
		if j, ok := s.admit(r, w, prefix, o); ok {
			g.Go(func() error {
				s.restoreFile(ctx, r, w, j)
				return nil
			})
		}
	}
	_ = g.Wait()

	if r.p.goneErr == nil && len(r.failed) > 0 {
		s.removeFailed(ctx, r)
	}
	if resume && r.p.goneErr == nil && len(r.restored) > 0 {
		s.place(ctx, t.Ref, r.restored, r.p, r.log)
	}
	return s.finishRestore(ctx, r)
}

// removeFailed removes the partial files of r's failed writes. Cleanup
// runs past the pass deadline, and briefly past the end of ctx: it keeps a
// later pass from uploading a partial file over the good object.
func (s *Syncer) removeFailed(ctx context.Context, r *restoreRun) {
	cctx, cancel := core.CleanupContext(ctx, cleanupTimeout)
	err := s.removePartial(cctx, r.t.Ref, r.failed, r.log)
	cancel()
	if err != nil {
		s.markGone(r.p, err)
	}
}

// resumeDone fills r.done for a resumed restore. pending is false when the
// thread's manifest is not this sandbox's or says no restore is pending
// (nothing to resume); err is set when the sandbox could not be listed.
func (s *Syncer) resumeDone(ctx context.Context, r *restoreRun) (pending bool, err error) {
	mctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
	m, found, corrupt, err := loadThreadManifest(mctx, s.s3, s.opts.Bucket, s.opts.Prefix, r.t.ThreadKey)
	cancel()
	if err != nil || !found || corrupt || m.SandboxID != r.t.Ref.ID || !m.RestorePending {
		return false, nil
	}
	files, _, _, err := s.list(ctx, r.t.Ref, r.log)
	if err != nil {
		return true, fmt.Errorf("list sandbox: %w", err)
	}
	r.done = make(map[string]bool, len(m.Files)+len(files))
	for rel := range m.Files {
		r.done[rel] = true
	}
	for _, f := range files {
		if rel, err := relPath(s.opts.Home, f.Path); err == nil {
			r.done[rel] = true
		}
	}
	return true, nil
}

// admit decides whether o (listed under prefix) is restored: it defers an
// unsafe path, a file over MaxFileBytes and one past a cap, skips what a
// resumed restore must leave alone, and plans the rest (written to the
// staging directory when resuming).
func (s *Syncer) admit(r *restoreRun, w *window, prefix string, o restoreObject) (restoreJob, bool) {
	p := r.p
	abs := s.opts.Home + "/" + o.Rel
	rel, err := relPath(s.opts.Home, abs)
	if err != nil {
		p.deferFile(displayPath(s.opts.Home, abs), ReasonUnsafePath)
		return restoreJob{}, false
	}
	if r.done[rel] {
		p.res.Skipped++
		return restoreJob{}, false
	}
	if o.Size > s.opts.MaxFileBytes {
		p.deferFile(rel, ReasonFileTooLarge)
		return restoreJob{}, false
	}
	if reason := s.capReason(w, p, o.Size); reason != "" {
		p.deferFile(rel, reason)
		return restoreJob{}, false
	}
	p.plan(o.Size)
	if r.resume {
		abs = s.opts.Home + "/" + stagingDir + "/" + rel
	}
	return restoreJob{obj: o, key: prefix + o.Rel, rel: rel, abs: abs}, true
}

// restoreFile restores one admitted object and records the outcome: the
// file restored, or deferred (and its path kept for cleanup when the write
// may have left part of it).
func (s *Syncer) restoreFile(ctx context.Context, r *restoreRun, w *window, j restoreJob) {
	p := r.p
	f, attempted, err := s.restoreOne(w.jobs, r.t.Ref, j.key, j.abs, j.obj)
	if err == nil {
		r.mu.Lock()
		r.restored[j.rel] = f
		r.mu.Unlock()
		p.mu.Lock()
		p.res.Uploaded++
		p.res.Bytes += f.Size
		p.mu.Unlock()
		return
	}
	if attempted {
		r.mu.Lock()
		r.failed = append(r.failed, j.abs)
		r.mu.Unlock()
	}
	reason := s.restoreReason(ctx, w.pass, err, p)
	if reason == ReasonSandboxGone {
		w.cancelJobs()
	}
	r.log.WarnContext(ctx, "file not restored", "path", j.rel, "reason", reason, "err", err)
	p.deferFile(j.rel, reason)
}

// restoreOne streams the object key into the sandbox at abs. attempted
// reports that WriteFile ran (the file may exist partially on failure).
func (s *Syncer) restoreOne(ctx context.Context, ref core.SandboxRef, key, abs string, o restoreObject) (restoredFile, bool, error) {
	out, err := s.s3.GetObject(ctx, &s3.GetObjectInput{
		Bucket:       aws.String(s.opts.Bucket),
		Key:          aws.String(key),
		IfMatch:      nonEmpty(o.ETag),
		ChecksumMode: types.ChecksumModeEnabled, // the SDK verifies the stored CRC32 while reading
	})
	if err != nil {
		return restoredFile{}, false, fmt.Errorf("get object: %w", err)
	}
	defer out.Body.Close()
	want := aws.ToString(out.ChecksumCRC32)
	if strings.Contains(want, "-") {
		want = "" // a composite (per-part) checksum, not the CRC32 of the bytes
	}
	body := &sizedReader{r: out.Body, left: o.Size, sum: crc32.NewIEEE(), want: want}
	werr := s.sb.WriteFile(ctx, ref, abs, body)
	// An HTTP client may go on reading the body after WriteFile returned
	// (net/http closes it from its own goroutine): end reads first.
	read := body.finish()
	if werr != nil {
		return restoredFile{}, true, fmt.Errorf("write file: %w", errors.Join(read.err, werr))
	}
	if read.err != nil || read.left != 0 {
		// WriteFile did not read the body to its end.
		return restoredFile{}, true, errors.Join(errChanged, read.err)
	}
	sum := read.sum
	if want != "" && want != sum {
		return restoredFile{}, true, fmt.Errorf("crc32 %s, object says %s: %w", sum, want, errChecksum)
	}
	etag := aws.ToString(out.ETag)
	if etag == "" {
		etag = o.ETag
	}
	return restoredFile{Size: o.Size, CRC32: sum, ETag: etag}, true, nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// sizedReader passes exactly left bytes through and hashes them: more
// bytes, or an early end, fail with errChanged (the object changed after
// it was listed); at the end, a CRC32 other than want (when set) fails
// with errChecksum instead of io.EOF, so the writer never completes a
// corrupt file. The first error is kept. Read may run on an HTTP
// client's goroutine while the caller reads the outcome, so the state is
// guarded, and finish ends the reads.
type sizedReader struct {
	r    io.Reader
	want string // base64 CRC32 the bytes must have ("" = unchecked)

	mu       sync.Mutex
	left     int64
	sum      hash.Hash32
	err      error
	finished bool
}

// readOutcome is what a sizedReader read: the first error, the bytes
// short of the size, and the CRC32 of the bytes read.
type readOutcome struct {
	err  error
	left int64
	sum  string
}

// errReadAfterWrite fails a read that comes after the write gave up.
var errReadAfterWrite = errors.New("read after the write ended")

func (r *sizedReader) Read(b []byte) (int, error) {
	r.mu.Lock()
	left, err := r.left, r.err
	if err == nil && r.finished {
		err = errReadAfterWrite
	}
	r.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if int64(len(b)) > left+1 {
		b = b[:left+1]
	}
	n, err := r.r.Read(b)
	r.mu.Lock()
	defer r.mu.Unlock()
	if int64(n) > r.left {
		r.err = errChanged
		return 0, r.err
	}
	r.left -= int64(n)
	r.sum.Write(b[:n])
	switch {
	case errors.Is(err, io.EOF) && r.left != 0:
		r.err = errChanged
		return n, r.err
	case errors.Is(err, io.EOF) && r.want != "" && crcString(r.sum) != r.want:
		r.err = errChecksum
		return n, r.err
	case err != nil && !errors.Is(err, io.EOF):
		r.err = err
	}
	return n, err
}

// finish ends the reads (a later one fails) and reports what was read.
func (r *sizedReader) finish() readOutcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finished = true
	return readOutcome{err: r.err, left: r.left, sum: crcString(r.sum)}
}

// restoreReason classifies a failed restore of one file.
func (s *Syncer) restoreReason(ctx, passCtx context.Context, err error, p *pass) string {
	switch {
	case errors.Is(err, core.ErrSandboxGone):
		s.markGone(p, err)
		return ReasonSandboxGone
	case p.isGone():
		return ReasonSandboxGone
	case errors.Is(err, errChanged):
		return ReasonChanged
	case errors.Is(err, errChecksum):
		return ReasonChecksumMismatch
	case isNotFound(err) || isPreconditionFailed(err):
		return ReasonVanished
	case ctx.Err() != nil:
		return ReasonCanceled
	case passCtx.Err() != nil:
		return ReasonDeadline
	}
	return ReasonError
}

func (s *Syncer) markGone(p *pass, err error) {
	p.mu.Lock()
	if p.goneErr == nil {
		p.goneErr = fmt.Errorf("restore: %w", err)
	}
	p.mu.Unlock()
}

func isPreconditionFailed(err error) bool {
	var ae interface{ ErrorCode() string }
	return errors.As(err, &ae) && ae.ErrorCode() == "PreconditionFailed"
}

// removePartial deletes the files whose restore failed after WriteFile
// started. It returns an error only when the sandbox is gone; other
// failures are logged (the files keep no manifest entry either way).
func (s *Syncer) removePartial(ctx context.Context, ref core.SandboxRef, paths []string, log *slog.Logger) error {
	sort.Strings(paths)
	for len(paths) > 0 {
		n, size := 0, 0
		for n < len(paths) && size+len(paths[n])+1 <= maxCleanupEnvBytes {
			size += len(paths[n]) + 1
			n++
		}
		if n == 0 {
			n = 1 // a single path over the bound cannot exist (PATH_MAX)
		}
		batch := paths[:n]
		paths = paths[n:]
		cctx, cancel := context.WithTimeout(ctx, s.opts.ListTimeout+5*time.Second)
		res, err := s.sb.Run(cctx, ref, core.Command{
			Script:  cleanupScript,
			Env:     map[string]string{envCleanupPaths: strings.Join(batch, "\n")},
			Timeout: s.opts.ListTimeout,
		})
		cancel()
		if errors.Is(err, core.ErrSandboxGone) {
			return err
		}
		if err != nil || res.ExitCode != 0 {
			log.WarnContext(ctx, "removing partially restored files failed", "count", len(batch), "err", err, "exit_code", res.ExitCode)
		}
	}
	return nil
}

// seedManifest lists the sandbox and stores a manifest for t.Ref.ID whose
// entries are the restored files as listed now (size must match what was
// written), merged into the stored manifest when it is already this
// sandbox's.
//
// pending is stored as the manifest's RestorePending.
func (s *Syncer) seedManifest(ctx context.Context, t core.SyncTarget, restored map[string]restoredFile, pending bool, p *pass, log *slog.Logger) {
	files, _, _, err := s.list(ctx, t.Ref, log)
	if err != nil {
		if errors.Is(err, core.ErrSandboxGone) {
			s.markGone(p, err)
			return
		}
		log.WarnContext(ctx, "listing after restore failed; restored files will be uploaded again", "err", err)
		p.deferred = append(p.deferred, core.DeferredFile{Path: "", Reason: ReasonManifestNotStored})
		return
	}
	mkey := manifestKey(s.opts.Prefix, t.ThreadKey)
	mctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
	m, found, corrupt, err := loadThreadManifest(mctx, s.s3, s.opts.Bucket, s.opts.Prefix, t.ThreadKey)
	cancel()
	if err != nil || !found || corrupt || m.SandboxID != t.Ref.ID {
		m = newManifest(t.Ref.ID)
	}
	m.RestorePending = pending
	for _, f := range files {
		rel, err := relPath(s.opts.Home, f.Path)
		if err != nil {
			continue
		}
		r, ok := restored[rel]
		if !ok || r.Size != f.Size {
			continue
		}
		m.Files[rel] = ManifestEntry{Size: r.Size, MtimeNs: f.MtimeNs, CRC32: r.CRC32, ETag: r.ETag}
	}
	sctx, cancel := core.CleanupContext(ctx, s3CallTimeout)
	err = storeManifest(sctx, s.s3, s.opts.Bucket, mkey, m)
	cancel()
	if err != nil {
		log.WarnContext(ctx, "storing the seeded manifest failed; restored files will be uploaded again", "err", err)
		p.deferred = append(p.deferred, core.DeferredFile{Path: "", Reason: ReasonManifestNotStored})
	}
}

// finishRestore seeds the manifest with what was restored and whether a
// restore remains pending, then builds the result and the error.
func (s *Syncer) finishRestore(ctx context.Context, r *restoreRun) (core.SyncResult, bool, error) {
	p := r.p
	for _, d := range p.deferred {
		if capReasons[d.Reason] {
			p.res.Remaining++
		}
	}
	if p.goneErr == nil && ctx.Err() == nil && (len(r.restored) > 0 || r.resume || p.res.Remaining > 0) {
		s.seedManifest(ctx, r.t, r.restored, p.res.Remaining > 0, p, r.log)
	}
	res := p.res
	res.Deferred, res.Excluded = s.report(p.deferred), s.report(p.excluded)
	res.Complete = len(p.deferred) == 0 && p.goneErr == nil && ctx.Err() == nil
	r.log.InfoContext(ctx, "restore", "restored", res.Uploaded, "skipped", res.Skipped, "remaining", res.Remaining,
		"deferred", len(p.deferred), "excluded", len(p.excluded), "bytes", res.Bytes, "complete", res.Complete,
		"duration_ms", s.now().Sub(r.start).Milliseconds())
	switch {
	case p.goneErr != nil:
		return res, true, p.goneErr
	case ctx.Err() != nil:
		return res, true, fmt.Errorf("restore canceled: %w", context.Cause(ctx))
	}
	return res, true, nil
}

// place moves the files a resumed restore staged into place (placeScript);
// a file the agent created at the same path meanwhile is kept, and the
// staged copy dropped (counted as skipped, not restored).
func (s *Syncer) place(ctx context.Context, ref core.SandboxRef, restored map[string]restoredFile, p *pass, log *slog.Logger) {
	rels := make([]string, 0, len(restored))
	for rel := range restored {
		rels = append(rels, rel)
	}
	sort.Strings(rels)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	out, err := s.sb.Run(cctx, ref, core.Command{
		Script:  "cd \"$SBX_HOME\" && { " + placeScript + "; }",
		Env:     map[string]string{envRestoreMoves: strings.Join(rels, "\n"), "SBX_HOME": s.opts.Home},
		Timeout: s.opts.ListTimeout,
	})
	if errors.Is(err, core.ErrSandboxGone) {
		s.markGone(p, err)
		return
	}
	kept := map[string]bool{}
	if err != nil || out.ExitCode != 0 {
		log.WarnContext(ctx, "placing restored files failed", "err", err, "exit_code", out.ExitCode)
		for _, rel := range rels {
			kept[rel] = true
		}
	}
	for _, rel := range strings.Split(string(out.Stdout), "\n") {
		if rel != "" {
			kept[rel] = true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for rel := range kept {
		if f, ok := restored[rel]; ok {
			delete(restored, rel)
			p.res.Uploaded--
			p.res.Bytes -= f.Size
			p.res.Skipped++
		}
	}
}

// listObjects lists the objects under prefix in key order (at most
// maxVerifyPages pages; complete is false when more remain).
func (s *Syncer) listObjects(ctx context.Context, prefix string) (objs []restoreObject, complete bool, err error) {
	pg := s3.NewListObjectsV2Paginator(s.s3, &s3.ListObjectsV2Input{Bucket: aws.String(s.opts.Bucket), Prefix: aws.String(prefix)})
	for page := 0; pg.HasMorePages(); page++ {
		if page == maxVerifyPages {
			return objs, false, nil
		}
		lctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
		out, err := pg.NextPage(lctx)
		cancel()
		if err != nil {
			return objs, false, fmt.Errorf("list objects: %w", err)
		}
		for _, o := range out.Contents {
			rel := strings.TrimPrefix(aws.ToString(o.Key), prefix)
			size := aws.ToInt64(o.Size)
			if strings.HasSuffix(rel, "/") && size == 0 {
				continue // a "directory" marker, as consoles create
			}
			objs = append(objs, restoreObject{Rel: rel, Size: size, ETag: aws.ToString(o.ETag)})
		}
	}
	return objs, true, nil
}
