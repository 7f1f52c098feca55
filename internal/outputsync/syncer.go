package outputsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sync/errgroup"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Sandbox is what the syncer needs from a sandbox provider (the methods of
// core.Provider it calls; internal/e2b's client implements it). Errors:
// core.ErrSandboxGone when the sandbox no longer exists; OpenFile fails
// with core.ErrFileNotFound for a missing path and its reader with
// *core.FileTooLargeError past maxBytes. WriteFile (Restore only) writes r
// to path, creating parent directories.
type Sandbox interface {
	Run(ctx context.Context, ref core.SandboxRef, cmd core.Command) (core.CommandResult, error)
	OpenFile(ctx context.Context, ref core.SandboxRef, path string, maxBytes int64) (io.ReadCloser, error)
	WriteFile(ctx context.Context, ref core.SandboxRef, path string, r io.Reader) error
}

// S3API lists the S3 operations the syncer calls, with the signatures of
// aws-sdk-go-v2's *s3.Client.
type S3API interface {
	GetObject(ctx context.Context, in *s3.GetObjectInput, optFns ...func(*s3.Options)) (*s3.GetObjectOutput, error)
	PutObject(ctx context.Context, in *s3.PutObjectInput, optFns ...func(*s3.Options)) (*s3.PutObjectOutput, error)
	CreateMultipartUpload(ctx context.Context, in *s3.CreateMultipartUploadInput, optFns ...func(*s3.Options)) (*s3.CreateMultipartUploadOutput, error)
	UploadPart(ctx context.Context, in *s3.UploadPartInput, optFns ...func(*s3.Options)) (*s3.UploadPartOutput, error)
	CompleteMultipartUpload(ctx context.Context, in *s3.CompleteMultipartUploadInput, optFns ...func(*s3.Options)) (*s3.CompleteMultipartUploadOutput, error)
	AbortMultipartUpload(ctx context.Context, in *s3.AbortMultipartUploadInput, optFns ...func(*s3.Options)) (*s3.AbortMultipartUploadOutput, error)
	ListObjectsV2(ctx context.Context, in *s3.ListObjectsV2Input, optFns ...func(*s3.Options)) (*s3.ListObjectsV2Output, error)
	DeleteObject(ctx context.Context, in *s3.DeleteObjectInput, optFns ...func(*s3.Options)) (*s3.DeleteObjectOutput, error)
}

var (
	_ S3API             = (*s3.Client)(nil)
	_ core.OutputSyncer = (*Syncer)(nil)
)

// Defaults applied by New to zero Options fields.
const (
	DefaultHome          = "/home/user"
	DefaultMaxFiles      = 1000
	DefaultMaxTotalBytes = 1 << 30   // 1 GiB per pass
	DefaultMaxFileBytes  = 256 << 20 // 256 MiB per file
	// DefaultMaxThreadBytes bounds what one thread stores in S3 in all.
	DefaultMaxThreadBytes = 10 << 30 // 10 GiB
	// DefaultMaxTenantBytes bounds what one tenant's threads store in S3
	// together (with a Ledger).
	DefaultMaxTenantBytes = 100 << 30 // 100 GiB
	DefaultDeadline       = 60 * time.Second
	DefaultPartSize       = 8 << 20 // multipart part size and buffer size
	DefaultConcurrency    = 4
	DefaultListTimeout    = 30 * time.Second
	DefaultMaxListBytes   = 8 << 20 // listing output cap (~80k records)
	DefaultMaxReported    = 1000
	// MinPartSize is S3's minimum size of a multipart part (all but the last).
	MinPartSize = 5 << 20
	// s3CallTimeout bounds each S3 request.
	s3CallTimeout = 2 * time.Minute
	// manifestReserve is kept free before the caller's context deadline for
	// the final manifest write (a quarter of the time when less is left):
	// uploads stop that much earlier.
	manifestReserve = 3 * time.Second
	// checkpointEvery: during a long pass the manifest is stored at least
	// this often, so an invocation that dies mid-pass loses little.
	checkpointEvery = 15 * time.Second
	// maxUnsafeLogged bounds per-path log lines for refused paths per pass.
	maxUnsafeLogged = 20
)

// Reasons reported in core.DeferredFile.Reason. Those of excludedReasons
// go to SyncResult.Excluded (policy: no later pass copies the file as it
// is), the others to SyncResult.Deferred.
const (
	ReasonMaxFiles          = "max_files"           // the pass's file cap was spent
	ReasonMaxTotalBytes     = "max_total_bytes"     // the pass's byte cap would be passed
	ReasonFileTooLarge      = "file_too_large"      // listed size or stream over MaxFileBytes
	ReasonDeadline          = "deadline"            // the pass's wall-time budget ran out
	ReasonUnsafePath        = "unsafe_path"         // refused by path checks (see relPath)
	ReasonPathTooLong       = "path_too_long"       // object key over 1024 bytes
	ReasonChanged           = "changed_during_sync" // stream length differed from the listed size
	ReasonVanished          = "vanished"            // deleted between listing and reading
	ReasonUnparsable        = "unparsable_record"   // listing record without the expected shape
	ReasonListingIncomplete = "listing_incomplete"  // find failed or the listing was cut
	ReasonSandboxGone       = "sandbox_gone"        // the sandbox died during the pass
	ReasonCanceled          = "canceled"            // the caller's context ended
	ReasonError             = "error"               // sandbox read or S3 failure (logged)
	ReasonReportTruncated   = "report_truncated"    // more deferrals than MaxReported
	ReasonThreadQuota       = "thread_quota"        // the thread would store more than MaxThreadBytes
	ReasonTenantQuota       = "tenant_quota"        // the tenant's threads would store more than MaxTenantBytes
)

// excludedReasons are the policy reasons: the file stays out of the sink
// until it or the bytes stored change (it shrinks, is renamed, or the
// thread's or the tenant's stored objects are removed), so another pass
// would upload nothing more and it never makes a pass incomplete. A
// listing record that cannot be parsed is the same: the next listing is
// alike.
var excludedReasons = map[string]bool{ReasonFileTooLarge: true, ReasonUnsafePath: true, ReasonPathTooLong: true,
	ReasonThreadQuota: true, ReasonTenantQuota: true, ReasonUnparsable: true}

// Options configure a Syncer. Zero values take the defaults above.
type Options struct {
	Bucket string // required
	// Prefix is prepended to every key ("" allowed); surrounding slashes
	// are ignored.
	Prefix string
	// Home is the sandbox user's home; outputs/ and workspace/ under it
	// are mirrored. Default /home/user.
	Home string
	// MaxFiles caps uploads per pass.
	MaxFiles int
	// MaxTotalBytes caps bytes uploaded per pass (by listed size).
	MaxTotalBytes int64
	// MaxFileBytes: larger files are deferred without being read.
	MaxFileBytes int64
	// MaxThreadBytes caps the bytes a thread stores under its prefix, all
	// passes together (SYNC_MAX_THREAD_BYTES); see planUploads.
	MaxThreadBytes int64
	// MaxTenantBytes caps the bytes a tenant's threads store together
	// (SYNC_MAX_TENANT_BYTES), counted in Ledger; see planUploads.
	MaxTenantBytes int64
	// Ledger records what each thread and tenant stores (the broker's
	// store). nil keeps no tenant total: MaxTenantBytes is then not
	// enforced.
	Ledger core.StorageStore
	// Deadline is the wall-time budget of a pass, from the start of Sync;
	// no upload starts after it and running ones are cut off by it. The
	// listing has its own ListTimeout; the manifest write after the
	// deadline has its own short timeout.
	Deadline time.Duration
	Logger   *slog.Logger // default slog.Default()

	// PartSize is the multipart part size and per-upload buffer (>= 5 MiB).
	// Files smaller than it go in one PutObject. Peak buffer memory is
	// (Concurrency+1) * PartSize.
	PartSize int64
	// Concurrency is the number of files uploaded at once.
	Concurrency int
	// ListTimeout bounds the listing command.
	ListTimeout time.Duration
	// MaxListBytes caps the listing output; a longer listing is cut and
	// the pass is incomplete (nothing pruned). Keep it at or below the
	// provider's cap on a command's stdout (internal/e2b MaxOutputBytes, 8 MiB by
	// default, keeps the tail), or the head of the listing is lost (its
	// first record then fails to parse, so the pass is still marked
	// incomplete, but the files before it go unlisted).
	MaxListBytes int64
	// MirrorDeletes: on a complete pass, the objects of manifest entries
	// whose files are gone from the sandbox are deleted too
	// (SYNC_MIRROR_DELETES). Default false: objects are kept.
	MirrorDeletes bool
	// MaxReported caps SyncResult.Deferred; past it one entry with reason
	// "report_truncated" and Path "+<n> more" ends the list.
	MaxReported int
}

// Syncer copies a thread's outputs/ and workspace/ from its sandbox to S3.
// Safe for concurrent use on different threads; passes on the same thread
// must be serialised by the caller (the engine's lease does that).
type Syncer struct {
	sb   Sandbox
	s3   S3API
	opts Options
	log  *slog.Logger
	up   *uploader
	now  func() time.Time
	// checkpointEvery is the manifest checkpoint interval (tests shorten it).
	checkpointEvery time.Duration
}

// New validates opts, applies defaults and returns a Syncer.
func New(sb Sandbox, s3c S3API, opts Options) (*Syncer, error) {
	if sb == nil || s3c == nil {
		return nil, errors.New("outputsync: sandbox and s3 clients are required")
	}
	if opts.Bucket == "" {
		return nil, errors.New("outputsync: Bucket is required")
	}
	var err error
	if opts.Prefix, err = cleanPrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("outputsync: %w", err)
	}
	if opts.Home == "" {
		opts.Home = DefaultHome
	}
	if opts.Home, err = cleanHome(opts.Home); err != nil {
		return nil, fmt.Errorf("outputsync: %w", err)
	}
	if opts.MaxFiles < 0 || opts.MaxTotalBytes < 0 || opts.MaxFileBytes < 0 || opts.MaxThreadBytes < 0 || opts.MaxTenantBytes < 0 || opts.Deadline < 0 ||
		opts.PartSize < 0 || opts.Concurrency < 0 || opts.ListTimeout < 0 || opts.MaxListBytes < 0 || opts.MaxReported < 0 {
		return nil, errors.New("outputsync: caps, sizes and durations must not be negative")
	}
	setDefault(&opts.MaxFiles, DefaultMaxFiles)
	setDefault(&opts.MaxTotalBytes, DefaultMaxTotalBytes)
	setDefault(&opts.MaxFileBytes, DefaultMaxFileBytes)
	setDefault(&opts.MaxThreadBytes, DefaultMaxThreadBytes)
	setDefault(&opts.MaxTenantBytes, DefaultMaxTenantBytes)
	setDefault(&opts.Deadline, DefaultDeadline)
	setDefault(&opts.PartSize, DefaultPartSize)
	setDefault(&opts.Concurrency, DefaultConcurrency)
	setDefault(&opts.ListTimeout, DefaultListTimeout)
	setDefault(&opts.MaxListBytes, DefaultMaxListBytes)
	setDefault(&opts.MaxReported, DefaultMaxReported)
	if opts.PartSize < MinPartSize {
		return nil, fmt.Errorf("outputsync: PartSize %d is below S3's minimum part size %d", opts.PartSize, MinPartSize)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	// One buffer per concurrent upload plus one spare that lets a multipart
	// upload read its next part while sending the previous one.
	bufs := make(chan []byte, opts.Concurrency+1)
	for range opts.Concurrency + 1 {
		bufs <- nil // allocated on first use
	}
	return &Syncer{
		sb: sb, s3: s3c, opts: opts, log: opts.Logger, now: time.Now, checkpointEvery: checkpointEvery,
		up: &uploader{s3: s3c, bucket: opts.Bucket, partSize: opts.PartSize, bufs: bufs, callTO: s3CallTimeout},
	}, nil
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// pass is the state of one Sync call.
type pass struct {
	mu       sync.Mutex
	res      core.SyncResult
	deferred []core.DeferredFile
	excluded []core.DeferredFile
	m        *Manifest
	dirty    bool
	capped   bool
	goneErr  error
	// checkpointing: one store at a time, at most every checkpointEvery.
	storing   bool
	lastStore time.Time
	// planned and plannedBytes count the transfers started, against the
	// caps; only the loop that starts them touches them.
	planned      int
	plannedBytes int64
	// The thread's stored bytes (see ledger.go): as recorded in the
	// ledger (known false when unread or when a write's outcome is
	// unknown), and what the uploads and deletes of the pass changed
	// (maybe: what failed uploads may have added all the same).
	recorded              int64
	recordedKnown         bool
	grown, maybe, deleted int64
	// ledgerUsed: the pass planned uploads that add bytes, against the
	// ledger.
	ledgerUsed bool
	// Sync's: the manifest's key and the pass's logger.
	mkey string
	log  *slog.Logger
}

// plan counts a transfer of size bytes as started.
func (p *pass) plan(size int64) {
	p.planned++
	p.plannedBytes += size
}

// window holds the contexts of one pass's transfers: ctx is the caller's;
// pass ends at the pass deadline, after which no transfer starts; jobs is
// canceled as soon as the sandbox is found gone.
type window struct {
	ctx, pass, jobs context.Context
	cancelJobs      context.CancelFunc
	deadline        time.Time
}

// openWindow opens the window of a pass that started at start (see
// passDeadline); close releases its contexts.
func (s *Syncer) openWindow(ctx context.Context, start time.Time) (w *window, close func()) {
	deadline := s.passDeadline(ctx, start)
	passCtx, cancelPass := context.WithDeadline(ctx, deadline)
	jobs, cancelJobs := context.WithCancel(passCtx)
	return &window{ctx: ctx, pass: passCtx, jobs: jobs, cancelJobs: cancelJobs, deadline: deadline}, func() {
		cancelJobs()
		cancelPass()
	}
}

// deferFile reports a file not copied: excluded for a policy reason,
// deferred otherwise.
func (p *pass) deferFile(path, reason string) {
	p.mu.Lock()
	if excludedReasons[reason] {
		p.excluded = append(p.excluded, core.DeferredFile{Path: path, Reason: reason})
	} else {
		p.deferred = append(p.deferred, core.DeferredFile{Path: path, Reason: reason})
	}
	p.mu.Unlock()
}

// Sync runs one pass for t: list the mirrored directories, upload new and
// changed files (by size and mtime against the thread's manifest) under the
// caps, and store the manifest. The result says what was uploaded, skipped
// and deferred (with reasons). Errors: a *core.ValidationError for a bad
// target; an error wrapping core.ErrSandboxGone when the sandbox died
// (the partial result is returned too); listing, manifest and context
// failures. Per-file failures are deferrals, not errors.
func (s *Syncer) Sync(ctx context.Context, t core.SyncTarget) (core.SyncResult, error) {
	start := s.now()
	if err := t.ThreadKey.Validate(); err != nil {
		return core.SyncResult{}, err
	}
	if err := core.ValidateSandboxID(t.Ref.ID); err != nil {
		return core.SyncResult{}, err
	}
	log := s.log.With("sandbox_id", t.Ref.ID, "thread", t.ThreadKey.String())

	mkey := manifestKey(s.opts.Prefix, t.ThreadKey)
	in, err := s.begin(ctx, t, start, log)
	if err != nil {
		return core.SyncResult{}, err
	}
	files, bad, listIncomplete, m, found, corrupt := in.files, in.bad, in.listIncomplete, in.m, in.found, in.corrupt
	p := &pass{m: m, mkey: mkey, log: log}
	switch {
	case corrupt:
		log.WarnContext(ctx, "discarding unreadable manifest", "key", mkey)
		p.m, p.dirty = newManifest(t.Ref.ID), true
	case !found || m.SandboxID != t.Ref.ID:
		if found {
			log.InfoContext(ctx, "discarding manifest of another sandbox", "manifest_sandbox_id", m.SandboxID)
		}
		p.m, p.dirty = newManifest(t.Ref.ID), true
	}
	stored, err := s.verifyStored(ctx, t, p)
	if err != nil {
		return core.SyncResult{}, err
	}

	for _, rec := range bad {
		p.deferred = append(p.deferred, core.DeferredFile{Path: displayPath(s.opts.Home, string(rec)), Reason: ReasonUnparsable})
	}
	if listIncomplete {
		p.deferred = append(p.deferred, core.DeferredFile{Path: "", Reason: ReasonListingIncomplete})
	}

	s.transfer(ctx, t, start, files, p, stored)

	// Prune entries of files that are gone, only when this pass saw the
	// whole tree and spent no cap (a capped pass prunes nothing).
	if !listIncomplete && len(bad) == 0 && !p.capped && p.goneErr == nil && ctx.Err() == nil {
		s.prune(ctx, t, files, p, stored)
	}
	s.settleStored(ctx, t, p, stored)

	storeErr := s.storeFinal(ctx, p)
	res := p.res
	res.Deferred, res.Excluded = s.report(p.deferred), s.report(p.excluded)
	res.Complete = len(p.deferred) == 0 && storeErr == nil && p.goneErr == nil && ctx.Err() == nil
	log.InfoContext(ctx, "sync pass", "uploaded", res.Uploaded, "skipped", res.Skipped, "deferred", len(p.deferred), "excluded", len(p.excluded),
		"bytes", res.Bytes, "complete", res.Complete, "duration_ms", s.now().Sub(start).Milliseconds())
	switch {
	case p.goneErr != nil:
		return res, errors.Join(p.goneErr, storeErr)
	case ctx.Err() != nil:
		return res, errors.Join(fmt.Errorf("sync canceled: %w", context.Cause(ctx)), storeErr)
	}
	return res, storeErr
}

// passInput is what a Sync pass starts from: the sandbox's listing and the
// thread's manifest as loaded.
type passInput struct {
	files          []listedFile
	bad            [][]byte
	listIncomplete bool
	m              *Manifest
	found, corrupt bool
}

// begin lists the sandbox and loads the thread's manifest. When the
// manifest says a restore into this sandbox stopped short, the restore is
// continued first (with at most half of the pass's time), then both are
// read again.
func (s *Syncer) begin(ctx context.Context, t core.SyncTarget, start time.Time, log *slog.Logger) (passInput, error) {
	for again := false; ; again = true {
		var in passInput
		var err error
		if in.files, in.bad, in.listIncomplete, err = s.list(ctx, t.Ref, log); err != nil {
			return passInput{}, err
		}
		mctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
		in.m, in.found, in.corrupt, err = loadThreadManifest(mctx, s.s3, s.opts.Bucket, s.opts.Prefix, t.ThreadKey)
		cancel()
		if err != nil {
			return passInput{}, fmt.Errorf("load manifest %s: %w", manifestKey(s.opts.Prefix, t.ThreadKey), err)
		}
		if again || !in.found || in.corrupt || in.m.SandboxID != t.Ref.ID || !in.m.RestorePending {
			return in, nil
		}
		rctx, cancel := context.WithDeadline(ctx, start.Add(s.opts.Deadline/2))
		_, _, rerr := s.restore(rctx, t, true)
		cancel()
		if errors.Is(rerr, core.ErrSandboxGone) {
			return passInput{}, rerr
		}
	}
}

// storeFinal stores the pass's manifest if it changed. The uploads
// happened: they are recorded even if ctx ended.
func (s *Syncer) storeFinal(ctx context.Context, p *pass) error {
	if !p.dirty {
		return nil
	}
	sctx, cancel := core.CleanupContext(ctx, s3CallTimeout)
	defer cancel()
	if err := storeManifest(sctx, s.s3, s.opts.Bucket, p.mkey, p.m); err != nil {
		return fmt.Errorf("store manifest %s: %w", p.mkey, err)
	}
	return nil
}

// verifyStored lists what S3 holds under the thread's prefix and drops the
// manifest entries whose object is missing or replaced (they are uploaded
// again).
func (s *Syncer) verifyStored(ctx context.Context, t core.SyncTarget, p *pass) (storedObjects, error) {
	prefix := threadPrefix(s.opts.Prefix, t.ThreadKey)
	vctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
	stored, err := listStored(vctx, s.s3, s.opts.Bucket, prefix)
	cancel()
	if err != nil {
		return storedObjects{}, fmt.Errorf("verify manifest against s3: %w", err)
	}
	if dropped := dropMissing(stored, p.m, func(rel string) string { return prefix + rel }); dropped > 0 {
		p.log.WarnContext(ctx, "objects missing or replaced in s3; uploading again", "count", dropped)
		p.dirty = true
	}
	p.lastStore = s.now()
	return stored, nil
}

// prune drops the manifest entries of files no longer listed (and, with
// MirrorDeletes, their objects; an entry whose delete fails is kept for the
// next pass).
func (s *Syncer) prune(ctx context.Context, t core.SyncTarget, files []listedFile, p *pass, stored storedObjects) {
	seen := make(map[string]struct{}, len(files))
	for _, f := range files {
		if rel, err := relPath(s.opts.Home, f.Path); err == nil {
			seen[rel] = struct{}{}
		}
	}
	for rel := range p.m.Files {
		if _, ok := seen[rel]; ok {
			continue
		}
		if s.opts.MirrorDeletes {
			key := threadPrefix(s.opts.Prefix, t.ThreadKey) + rel
			if err := s.deleteObject(ctx, key); err != nil {
				p.log.WarnContext(ctx, "mirror delete failed; entry kept for the next pass", "path", rel, "err", err)
				continue
			}
			p.deleted += stored.byKey[key].Size
		}
		delete(p.m.Files, rel)
		p.dirty = true
	}
}

func (s *Syncer) deleteObject(ctx context.Context, key string) error {
	dctx, cancel := context.WithTimeout(ctx, s3CallTimeout)
	defer cancel()
	_, err := s.s3.DeleteObject(dctx, &s3.DeleteObjectInput{Bucket: &s.opts.Bucket, Key: &key})
	return err
}

// list runs the listing script and parses its output. incomplete is set
// when find failed, the output was cut, or it ended mid-record.
func (s *Syncer) list(ctx context.Context, ref core.SandboxRef, log *slog.Logger) (files []listedFile, bad [][]byte, incomplete bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, s.opts.ListTimeout+5*time.Second)
	defer cancel()
	out, err := s.sb.Run(lctx, ref, core.Command{
		Script: listScript,
		Env: map[string]string{
			envOutputsDir:   s.opts.Home + "/outputs",
			envWorkspaceDir: s.opts.Home + "/workspace",
			envListMax:      strconv.FormatInt(s.opts.MaxListBytes, 10),
		},
		Timeout: s.opts.ListTimeout,
	})
	if err != nil {
		return nil, nil, false, fmt.Errorf("list outputs: %w", err)
	}
	files, bad, truncated := parseListing(out.Stdout)
	incomplete = truncated || out.ExitCode != 0 || int64(len(out.Stdout)) >= s.opts.MaxListBytes
	if incomplete {
		log.WarnContext(ctx, "listing incomplete", "exit_code", out.ExitCode, "stdout_bytes", len(out.Stdout),
			"stderr", string(bytes.ToValidUTF8(head(out.Stderr, 512), []byte("?"))))
	}
	if len(bad) > 0 {
		log.WarnContext(ctx, "unparsable listing records", "count", len(bad))
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, bad, incomplete, nil
}

func head(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// transfer plans the pass's uploads (see planUploads: every file is
// counted by its listed size, before any byte of it is read) and runs
// them with bounded concurrency. A transfer due to start after the pass
// stopped (the deadline passed, the sandbox is gone, the caller left) is
// deferred unread.
func (s *Syncer) transfer(ctx context.Context, t core.SyncTarget, start time.Time, files []listedFile, p *pass, stored storedObjects) {
	w, closeWindow := s.openWindow(ctx, start)
	defer closeWindow()
	jobs := s.planUploads(ctx, w, t, files, p, stored)
	g := new(errgroup.Group)
	g.SetLimit(s.opts.Concurrency)
	for _, job := range jobs {
		g.Go(func() error {
			if reason := s.stopReason(w, p); reason != "" {
				p.stop(job.rel, reason)
				return nil
			}
			s.uploadOne(w, t.Ref, job, p)
			s.checkpoint(ctx, p)
			return nil
		})
	}
	_ = g.Wait()
}

// checkpoint stores the manifest mid-pass when the last store is older
// than checkpointEvery. Only one store runs at a time; the final store
// after all uploads always runs, so a checkpoint never has the last word.
func (s *Syncer) checkpoint(ctx context.Context, p *pass) {
	p.mu.Lock()
	if p.storing || !p.dirty || s.now().Sub(p.lastStore) < s.checkpointEvery {
		p.mu.Unlock()
		return
	}
	p.storing = true
	snap := &Manifest{Version: p.m.Version, SandboxID: p.m.SandboxID, RestorePending: p.m.RestorePending,
		Files: make(map[string]ManifestEntry, len(p.m.Files))}
	for k, v := range p.m.Files {
		snap.Files[k] = v
	}
	p.mu.Unlock()
	sctx, cancel := core.CleanupContext(ctx, s3CallTimeout)
	err := storeManifest(sctx, s.s3, s.opts.Bucket, p.mkey, snap)
	cancel()
	if err != nil {
		p.log.WarnContext(ctx, "manifest checkpoint failed", "err", err)
	}
	p.mu.Lock()
	p.storing = false
	p.lastStore = s.now()
	p.mu.Unlock()
}

// passDeadline is when a pass started at start stops starting transfers:
// Options.Deadline after start, or manifestReserve before ctx's deadline
// when that comes sooner (so the manifest can still be stored).
func (s *Syncer) passDeadline(ctx context.Context, start time.Time) time.Time {
	deadline := start.Add(s.opts.Deadline)
	if d, ok := ctx.Deadline(); ok {
		// A short pass keeps a quarter of its time for the manifest.
		reserve := min(manifestReserve, time.Until(d)/4)
		if d.Add(-reserve).Before(deadline) {
			deadline = d.Add(-reserve)
		}
	}
	return deadline
}

// capReason says why a file of size bytes must not start in pass p, given
// the transfers p already started: the sandbox is gone, the caller's
// context ended, the pass deadline passed (or its context ended), or a
// MaxFiles/MaxTotalBytes cap would be exceeded. It returns "" when the file
// may start. Sync and Restore share these caps.
func (s *Syncer) capReason(w *window, p *pass, size int64) string {
	if reason := s.stopReason(w, p); reason != "" {
		return reason
	}
	switch {
	case p.planned >= s.opts.MaxFiles:
		return ReasonMaxFiles
	case p.plannedBytes+size > s.opts.MaxTotalBytes:
		return ReasonMaxTotalBytes
	}
	return ""
}

// stopReason says why no transfer may start any more in pass p: the
// sandbox is gone, the caller's context ended, or the pass deadline passed
// (or its context ended); "" when one may.
func (s *Syncer) stopReason(w *window, p *pass) string {
	switch {
	case p.isGone():
		return ReasonSandboxGone
	case w.ctx.Err() != nil:
		return ReasonCanceled
	case !s.now().Before(w.deadline) || w.pass.Err() != nil:
		return ReasonDeadline
	}
	return ""
}

// stop defers the file at rel for reason, a cap's or stopReason's: a cap
// spent marks the pass capped (it prunes nothing).
func (p *pass) stop(rel, reason string) {
	if reason == ReasonDeadline || reason == ReasonMaxFiles || reason == ReasonMaxTotalBytes {
		p.mu.Lock()
		p.capped = true
		p.mu.Unlock()
	}
	p.deferFile(rel, reason)
}

func (p *pass) isGone() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.goneErr != nil
}

// fileJob is one file to upload: as listed, its path relative to the home
// and its object key.
type fileJob struct {
	f        listedFile
	rel, key string
	// grow is what the upload adds to the thread's stored bytes: the
	// file's size less that of the object it replaces.
	grow int64
}

// uploadOne streams one file and records the outcome in p.
func (s *Syncer) uploadOne(w *window, ref core.SandboxRef, job fileJob, p *pass) {
	ctx, jobCtx, f, rel, key, log := w.ctx, w.jobs, job.f, job.rel, job.key, p.log
	err := jobCtx.Err()
	var entry ManifestEntry
	if err == nil {
		var rc io.ReadCloser
		rc, err = s.sb.OpenFile(jobCtx, ref, f.Path, s.opts.MaxFileBytes)
		if err == nil {
			meta := map[string]string{"sandbox-id": ref.ID, "mtime-ns": strconv.FormatInt(f.MtimeNs, 10)}
			entry, err = s.up.upload(jobCtx, rc, key, f.Size, meta)
			rc.Close()
		}
	}
	if err == nil {
		entry.MtimeNs = f.MtimeNs
		p.mu.Lock()
		p.m.Files[rel] = entry
		p.dirty = true
		p.res.Uploaded++
		p.res.Bytes += f.Size
		p.grown += job.grow
		p.mu.Unlock()
		log.DebugContext(ctx, "uploaded", "path", rel, "bytes", f.Size)
		return
	}

	var tooLarge *core.FileTooLargeError
	var reason string
	switch {
	case errors.Is(err, core.ErrSandboxGone):
		p.mu.Lock()
		if p.goneErr == nil {
			p.goneErr = fmt.Errorf("sync %s: %w", rel, err)
		}
		p.mu.Unlock()
		w.cancelJobs()
		reason = ReasonSandboxGone
	case p.isGone():
		reason = ReasonSandboxGone
	case errors.As(err, &tooLarge):
		reason = ReasonFileTooLarge
	case errors.Is(err, errChanged):
		reason = ReasonChanged
	case errors.Is(err, core.ErrFileNotFound):
		reason = ReasonVanished
	case ctx.Err() != nil:
		reason = ReasonCanceled
	case w.pass.Err() != nil:
		reason = ReasonDeadline
		p.mu.Lock()
		p.capped = true
		p.mu.Unlock()
	default:
		reason = ReasonError
	}
	log.WarnContext(ctx, "file deferred", "path", rel, "reason", reason, "err", err)
	p.deferFile(rel, reason)
	// The object may be stored all the same (a reply lost): counted as
	// stored until a pass lists it.
	p.mu.Lock()
	p.maybe += max(job.grow, 0)
	p.mu.Unlock()
}

// report sorts deferrals by path and caps their number.
func (s *Syncer) report(d []core.DeferredFile) []core.DeferredFile {
	sort.SliceStable(d, func(i, j int) bool { return d[i].Path < d[j].Path })
	if len(d) > s.opts.MaxReported {
		more := len(d) - s.opts.MaxReported
		d = append(d[:s.opts.MaxReported:s.opts.MaxReported], core.DeferredFile{Path: "+" + strconv.Itoa(more) + " more", Reason: ReasonReportTruncated})
	}
	if d == nil {
		d = []core.DeferredFile{}
	}
	return d
}
