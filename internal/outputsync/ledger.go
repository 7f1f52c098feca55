package outputsync

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// ledgerTries bounds how often a pass plans again after another pass of
// the tenant moved its total between the read and the write;
// ledgerCallTimeout bounds each call to the ledger.
const (
	ledgerTries       = 3
	ledgerCallTimeout = 10 * time.Second
)

// upload plan of one pass, before the ledger accepted it.
type uploadPlan struct {
	jobs []fileJob
	// stops are the files deferred or excluded, with their reasons.
	stops   []core.DeferredFile
	skipped int
	// growth is the bytes the jobs may add to the thread's stored bytes
	// (the sum of their positive grows).
	growth int64
}

// planUploads decides file by file (in path order) whether to skip, defer
// or upload, counting each file by its listed size (its apparent size,
// what S3 will store, however few blocks a sparse file takes) before
// anything of it is read. Files whose size and mtime match the manifest
// are skipped before any cap is counted, so successive capped passes
// drain the deferred tail.
//
// Two quotas bound what the thread stores. The thread's (MaxThreadBytes)
// counts its objects as listed at the start of the pass (objects of files
// deleted since included, unless MirrorDeletes removed them), counting
// what replacing an object adds: a file past it is excluded with
// ReasonThreadQuota. The tenant's (MaxTenantBytes, with a Ledger) counts
// what every thread of the tenant stores, as the ledger records it: the
// thread's new total is recorded before any upload, conditional on the
// tenant's total staying within the quota, so that no two passes of the
// tenant spend the same room. A file past it is excluded with
// ReasonTenantQuota; when the ledger cannot be read or written, a file
// that adds bytes is deferred with ReasonError. A pass that adds no bytes
// does not read the ledger.
func (s *Syncer) planUploads(ctx context.Context, w *window, t core.SyncTarget, files []listedFile, p *pass, stored storedObjects) []fileJob {
	pl := s.plan(ctx, w, t, files, p, stored, math.MaxInt64, "")
	if s.opts.Ledger == nil || pl.growth == 0 {
		return p.take(pl) // nothing to count against the tenant
	}
	p.ledgerUsed = true
	for try := 1; ; try++ {
		lctx, cancel := context.WithTimeout(w.pass, ledgerCallTimeout)
		rec, err := s.opts.Ledger.StoredBytes(lctx, t.ThreadKey)
		cancel()
		if err != nil {
			p.log.WarnContext(ctx, "reading the tenant's stored bytes failed; no file that adds bytes is uploaded", "err", err)
			return p.take(s.plan(ctx, w, t, files, p, stored, 0, ReasonError))
		}
		p.recorded, p.recordedKnown = rec.Thread, true
		room := s.opts.MaxTenantBytes - (rec.Tenant - rec.Thread) - stored.bytes
		pl := s.plan(ctx, w, t, files, p, stored, room, ReasonTenantQuota)
		want := stored.bytes + pl.growth
		if want <= rec.Thread {
			return p.take(pl) // the bytes recorded already cover it
		}
		lctx, cancel = context.WithTimeout(w.pass, ledgerCallTimeout)
		err = s.opts.Ledger.RecordStored(lctx, core.StoredChange{ThreadKey: t.ThreadKey, Prev: rec.Thread, Bytes: want,
			TenantLimit: s.opts.MaxTenantBytes})
		cancel()
		switch {
		case err == nil:
			p.recorded = want
			return p.take(pl)
		case (errors.Is(err, core.ErrStorageFull) || errors.Is(err, core.ErrConflict)) && try < ledgerTries:
			// Another pass of the tenant moved it: plan again from a
			// fresh read.
			continue
		}
		// Refused again, or its outcome unknown: nothing that adds bytes
		// is uploaded; the pass's end records the truth.
		p.recordedKnown = false
		p.log.WarnContext(ctx, "recording the thread's stored bytes failed; no file that adds bytes is uploaded", "err", err)
		return p.take(s.plan(ctx, w, t, files, p, stored, 0, ReasonError))
	}
}

// take accepts pl: its stops are reported and its skips counted.
func (p *pass) take(pl uploadPlan) []fileJob {
	for _, d := range pl.stops {
		p.stop(d.Path, d.Reason)
	}
	p.mu.Lock()
	p.res.Skipped += pl.skipped
	p.mu.Unlock()
	return pl.jobs
}

// plan is one planning of the pass's uploads (see planUploads): room is
// what the thread may still add under the tenant's quota, and overRoom the
// reason a file past it gets. It counts the planned transfers in p
// (pass.plan) from zero, and reports nothing yet (see pass.take).
func (s *Syncer) plan(ctx context.Context, w *window, t core.SyncTarget, files []listedFile, p *pass, stored storedObjects, room int64, overRoom string) uploadPlan {
	var pl uploadPlan
	p.planned, p.plannedBytes = 0, 0
	unsafe := 0
	threadBytes := stored.bytes
	for _, f := range files {
		rel, err := relPath(s.opts.Home, f.Path)
		if err != nil {
			if unsafe++; unsafe <= maxUnsafeLogged {
				p.log.WarnContext(ctx, "refusing unsafe path", "path", displayPath(s.opts.Home, f.Path))
			}
			pl.stops = append(pl.stops, core.DeferredFile{Path: displayPath(s.opts.Home, f.Path), Reason: ReasonUnsafePath})
			continue
		}
		key, err := objectKey(s.opts.Prefix, t.ThreadKey, rel)
		if err != nil {
			pl.stops = append(pl.stops, core.DeferredFile{Path: rel, Reason: ReasonPathTooLong})
			continue
		}
		p.mu.Lock()
		e, ok := p.m.Files[rel]
		p.mu.Unlock()
		if ok && e.Size == f.Size && e.MtimeNs == f.MtimeNs {
			pl.skipped++
			continue
		}
		grow := f.Size - stored.byKey[key].Size
		reason := s.fileReason(w, p, f.Size)
		switch {
		case reason != "":
		case threadBytes+grow > s.opts.MaxThreadBytes:
			reason = ReasonThreadQuota
		case grow > 0 && pl.growth+grow > room:
			reason = overRoom
		}
		if reason != "" {
			pl.stops = append(pl.stops, core.DeferredFile{Path: rel, Reason: reason})
			continue
		}
		threadBytes += grow
		pl.growth += max(grow, 0)
		p.plan(f.Size)
		pl.jobs = append(pl.jobs, fileJob{f: f, rel: rel, key: key, grow: grow})
	}
	if unsafe > maxUnsafeLogged {
		p.log.WarnContext(ctx, "refused unsafe paths", "count", unsafe)
	}
	return pl
}

// fileReason says why a file of size bytes is not uploaded before its
// quotas are counted: over the per-file cap, or a cap of the pass (see
// capReason); "" when it may be.
func (s *Syncer) fileReason(w *window, p *pass, size int64) string {
	if size > s.opts.MaxFileBytes {
		return ReasonFileTooLarge
	}
	return s.capReason(w, p, size)
}

// settleStored records, at the pass's end, what the thread stores now: the
// bytes listed at its start, moved by the uploads and deletes made. An
// upload that failed counts as made (its reply may have been lost), a
// delete that failed as not made: whatever goes wrong, the ledger counts
// no fewer bytes than S3 holds. It is recorded without the tenant's
// quota: it adds nothing planUploads did not record first, except objects
// the ledger did not know of. A pass that dies before it leaves the
// planned bytes, more than the truth, until the thread's next pass. A conflict (the recorded
// bytes were not known) reads them again once. A pass that changed
// nothing leaves the ledger alone.
func (s *Syncer) settleStored(ctx context.Context, t core.SyncTarget, p *pass, stored storedObjects) {
	final := stored.bytes + p.grown + p.maybe - p.deleted
	if s.opts.Ledger == nil || !stored.complete || (!p.ledgerUsed && final == stored.bytes) {
		return // nothing changed that the ledger counts
	}
	for try := 0; try < 2; try++ {
		lctx, cancel := core.CleanupContext(ctx, ledgerCallTimeout)
		if !p.recordedKnown {
			rec, err := s.opts.Ledger.StoredBytes(lctx, t.ThreadKey)
			if err != nil {
				cancel()
				p.log.WarnContext(ctx, "reading the thread's stored bytes failed; the next pass records them", "err", err)
				return
			}
			p.recorded, p.recordedKnown = rec.Thread, true
		}
		if final == p.recorded {
			cancel()
			return
		}
		err := s.opts.Ledger.RecordStored(lctx, core.StoredChange{ThreadKey: t.ThreadKey, Prev: p.recorded, Bytes: final})
		cancel()
		if err == nil {
			p.recorded = final
			return
		}
		p.recordedKnown = false
		if !errors.Is(err, core.ErrConflict) {
			p.log.WarnContext(ctx, "recording the thread's stored bytes failed; the next pass records them", "err", err)
			return
		}
	}
}
