// Package outputsync copies a thread's output directories (outputs/ and
// workspace/ under the sandbox home) from its sandbox to S3, implementing
// core.OutputSyncer.
//
// One pass: a single listing command in the sandbox (GNU find, no symlink
// following, regular files only, NUL-terminated records of size, mtime and
// path); a per-thread manifest in S3 at
// <prefix>/.broker/manifests/<tenant>/<user>/<thread>.json (a segment no
// tenant id can spell), tied to the sandbox id;
// every new or changed file (size or mtime differ) streamed from the sandbox
// to <prefix>/<tenant>/<user>/<thread>/<outputs|workspace>/<rel> with
// bounded memory and full-object CRC32 checksums that S3 verifies; caps on files,
// bytes, per-file size and wall time, and quotas on what a thread, and
// all of a tenant's threads, store in all. Every file is counted by its
// listed (apparent) size before it is read. Already-synced files are skipped
// before caps are counted, so capped passes converge; a capped or
// incomplete pass prunes nothing from the manifest. Paths that are not
// valid UTF-8, contain control or Unicode format (Cf) characters, "." or
// ".." segments, or lie
// outside the mirrored directories are refused and reported.
//
// Restore is the way back: when a thread gets a freshly
// created sandbox, the thread's objects are streamed from S3 into the same
// paths under its home, under the same caps, and the manifest is seeded for
// the new sandbox so the restored files are not uploaded back. S3 trouble
// never fails a restore; it is reported in the result.
package outputsync
