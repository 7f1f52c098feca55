package outputsync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// manifestVersion is the manifest schema version written by this package.
const manifestVersion = 1

// maxManifestBytes bounds how much of a stored manifest is read (a manifest
// lists at most what one listing of MaxListBytes can hold).
const maxManifestBytes = 256 << 20

// Manifest is what a thread's last sync passes copied, stored as JSON at
// manifestKey. It is tied to one sandbox: mtimes are only comparable within
// the sandbox that produced them, so a manifest of another sandbox id is
// discarded.
type Manifest struct {
	Version   int    `json:"version"`
	SandboxID string `json:"sandbox_id"`
	// Files maps the mirrored relative path ("outputs/a.txt") to what was
	// uploaded for it.
	Files map[string]ManifestEntry `json:"files"`
	// RestorePending: a restore into this sandbox stopped at a cap (files,
	// bytes, time) or an incomplete listing; ResumeRestore (next acquire)
	// and Sync continue it.
	RestorePending bool `json:"restore_pending,omitempty"`
}

// ManifestEntry records one uploaded file as it was listed in the sandbox
// and as S3 stored it.
type ManifestEntry struct {
	Size    int64 `json:"size"`     // bytes, as listed (and as uploaded)
	MtimeNs int64 `json:"mtime_ns"` // listed modification time, ns since the epoch
	// CRC32 is the full-object CRC32 (IEEE) of the uploaded bytes, base64
	// of the big-endian value, as S3 stores and reports it
	// (x-amz-checksum-crc32); computed while streaming, verified by S3.
	CRC32 string `json:"crc32"`
	// ETag is the object's ETag as S3 returned it (quotes kept).
	ETag string `json:"etag,omitempty"`
}

func newManifest(sandboxID string) *Manifest {
	return &Manifest{Version: manifestVersion, SandboxID: sandboxID, Files: map[string]ManifestEntry{}}
}

// loadManifest reads the manifest at key. A missing object gives found ==
// false; a corrupt one gives corrupt == true (the caller starts afresh).
// Other errors are S3 failures. S3 answers a GetObject of a missing key
// with 403 instead of 404 to a caller that may not list the bucket: a 403
// is taken for "missing" only when a listing of the key confirms it.
func loadManifest(ctx context.Context, c S3API, bucket, key string) (m *Manifest, found, corrupt bool, err error) {
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		if isNotFound(err) {
			return nil, false, false, nil
		}
		if isForbidden(err) {
			exists, lerr := objectListed(ctx, c, bucket, key)
			if lerr == nil && !exists {
				return nil, false, false, nil
			}
			if lerr != nil {
				err = errors.Join(err, fmt.Errorf("confirm absence: %w", lerr))
			}
		}
		return nil, false, false, fmt.Errorf("get manifest: %w", err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(io.LimitReader(out.Body, maxManifestBytes+1))
	if err != nil {
		return nil, false, false, fmt.Errorf("read manifest: %w", err)
	}
	if len(data) > maxManifestBytes {
		return nil, true, true, nil
	}
	m = &Manifest{}
	if err := json.Unmarshal(data, m); err != nil || m.Version != manifestVersion {
		return nil, true, true, nil
	}
	if m.Files == nil {
		m.Files = map[string]ManifestEntry{}
	}
	return m, true, false, nil
}

// loadThreadManifest reads the manifest of a thread, at manifestKey.
func loadThreadManifest(ctx context.Context, c S3API, bucket, prefix string, k core.ThreadKey) (m *Manifest, found, corrupt bool, err error) {
	return loadManifest(ctx, c, bucket, manifestKey(prefix, k))
}

// storeManifest writes m at key (seekable body: plain-HTTP endpoints need
// one: they cannot sign a streamed body).
func storeManifest(ctx context.Context, c S3API, bucket, key string, m *Manifest) error {
	data, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	_, err = c.PutObject(ctx, &s3.PutObjectInput{
		Bucket:            aws.String(bucket),
		Key:               aws.String(key),
		Body:              bytes.NewReader(data),
		ContentLength:     aws.Int64(int64(len(data))),
		ContentType:       aws.String("application/json"),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
	})
	if err != nil {
		return fmt.Errorf("put manifest: %w", err)
	}
	return nil
}

// isNotFound reports a missing object: NoSuchKey, NotFound or a bare 404.
func isNotFound(err error) bool {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nsk) || errors.As(err, &nf) {
		return true
	}
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound
}

// isForbidden reports an access-denied answer (HTTP 403).
func isForbidden(err error) bool {
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusForbidden
}

// objectListed reports whether a listing shows an object with exactly
// key (ListObjectsV2 from key's prefix, one key).
func objectListed(ctx context.Context, c S3API, bucket, key string) (bool, error) {
	out, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(key), MaxKeys: aws.Int32(1)})
	if err != nil {
		return false, err
	}
	for _, o := range out.Contents {
		if aws.ToString(o.Key) == key {
			return true, nil
		}
	}
	return false, nil
}

// maxVerifyPages bounds the ListObjectsV2 pages read to verify a manifest
// (1000 keys a page).
const maxVerifyPages = 200

// storedObject is one object under the thread prefix as S3 lists it.
type storedObject struct {
	Size int64
	ETag string
}

// storedObjects is what a bounded listing of a thread's prefix found.
type storedObjects struct {
	byKey map[string]storedObject
	// last is the greatest key listed; complete is false when the listing
	// stopped at maxVerifyPages (keys past last were not seen).
	last     string
	complete bool
	// bytes is the sum of the listed objects' sizes: what the thread
	// stores (SYNC_MAX_THREAD_BYTES counts it).
	bytes int64
}

// listStored lists the objects under prefix (at most maxVerifyPages pages).
func listStored(ctx context.Context, c S3API, bucket, prefix string) (storedObjects, error) {
	st := storedObjects{byKey: map[string]storedObject{}, complete: true}
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for page := 0; p.HasMorePages(); page++ {
		if page == maxVerifyPages {
			st.complete = false
			break
		}
		out, err := p.NextPage(ctx)
		if err != nil {
			return st, fmt.Errorf("list objects: %w", err)
		}
		for _, o := range out.Contents {
			k := aws.ToString(o.Key)
			st.byKey[k] = storedObject{Size: aws.ToInt64(o.Size), ETag: aws.ToString(o.ETag)}
			st.bytes += aws.ToInt64(o.Size)
			st.last = k
		}
	}
	return st, nil
}

// dropMissing removes manifest entries whose object is not in stored as
// recorded (deleted, or replaced: size or ETag differ), so the pass uploads
// those files again; entries past a bounded listing's last key are
// trusted. It returns the number of entries dropped.
func dropMissing(stored storedObjects, m *Manifest, keyOf func(rel string) string) int {
	dropped := 0
	for rel, e := range m.Files {
		k := keyOf(rel)
		o, ok := stored.byKey[k]
		if !ok && !stored.complete && k > stored.last {
			continue // not reached by the bounded listing
		}
		if !ok || o.Size != e.Size || (e.ETag != "" && o.ETag != "" && o.ETag != e.ETag) {
			delete(m.Files, rel)
			dropped++
		}
	}
	return dropped
}
