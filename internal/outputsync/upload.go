package outputsync

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// errChanged: the stream was longer or shorter than the listed size (the
// file changed while it was read). The upload is abandoned.
var errChanged = errors.New("file changed during sync")

// cleanupTimeout bounds an AbortMultipartUpload issued after a failure (on
// a context detached from the failed one).
const cleanupTimeout = 15 * time.Second

// maxParts is S3's limit on parts per multipart upload.
const maxParts = 10000

// uploader streams one sandbox file to one object.
type uploader struct {
	s3       S3API
	bucket   string
	partSize int64
	bufs     chan []byte // pool of partSize buffers; bounds memory
	callTO   time.Duration
}

// getBuf takes a part buffer, waiting for one to be free.
func (u *uploader) getBuf(ctx context.Context) ([]byte, error) {
	select {
	case b := <-u.bufs:
		if b == nil {
			b = make([]byte, u.partSize)
		}
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (u *uploader) putBuf(b []byte) { u.bufs <- b }

// upload copies exactly size bytes from r to key. Files smaller than the
// part size go in one PutObject, larger ones as a multipart upload. Every
// request carries a CRC32 checksum that S3 verifies: the body's for
// PutObject, each part's for UploadPart, and the whole object's
// (FULL_OBJECT checksum type) for CompleteMultipartUpload, so every object
// ends up with the CRC32 of all its bytes, the same for both kinds. CRC32
// (the SDK's and S3's default) keeps the CPU cost far below SHA-256's.
// Memory: one part buffer, plus a second one for multipart when the pool
// has one free. A stream that ends early or has bytes past size fails with
// errChanged; a multipart upload that fails for any reason is aborted.
func (u *uploader) upload(ctx context.Context, r io.Reader, key string, size int64, meta map[string]string) (ManifestEntry, error) {
	buf, err := u.getBuf(ctx)
	if err != nil {
		return ManifestEntry{}, err
	}
	defer u.putBuf(buf)
	if size < u.partSize {
		return u.single(ctx, r, key, buf[:size], meta)
	}
	return u.multipart(ctx, r, key, size, buf, meta)
}

// readExact fills b from r; a short stream is errChanged.
func readExact(r io.Reader, b []byte) error {
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return errChanged
		}
		return err
	}
	return nil
}

// expectEOF reads one more byte: the stream must be over.
func expectEOF(r io.Reader) error {
	var one [1]byte
	_, err := io.ReadFull(r, one[:])
	switch {
	case err == nil:
		return errChanged
	case errors.Is(err, io.EOF):
		return nil
	default:
		return err
	}
}

func (u *uploader) single(ctx context.Context, r io.Reader, key string, b []byte, meta map[string]string) (ManifestEntry, error) {
	if err := readExact(r, b); err != nil {
		return ManifestEntry{}, err
	}
	if err := expectEOF(r); err != nil {
		return ManifestEntry{}, err
	}
	sum := crcOf(b)
	cctx, cancel := context.WithTimeout(ctx, u.callTO)
	defer cancel()
	out, err := u.s3.PutObject(cctx, &s3.PutObjectInput{
		Bucket:            aws.String(u.bucket),
		Key:               aws.String(key),
		Body:              bytes.NewReader(b),
		ContentLength:     aws.Int64(int64(len(b))),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
		ChecksumCRC32:     aws.String(sum),
		Metadata:          meta,
	})
	if err != nil {
		return ManifestEntry{}, fmt.Errorf("put object: %w", err)
	}
	return ManifestEntry{Size: int64(len(b)), CRC32: sum, ETag: aws.ToString(out.ETag)}, nil
}

// multipart uploads size bytes from r in parts of u.partSize (larger
// when the file needs more than maxParts parts), each part's CRC32 checked
// by S3 and the whole object's CRC32 given at completion. When the pool has
// a spare buffer the next part is read while the previous one is sent;
// otherwise parts go one at a time in buf. Any failure aborts the upload.
func (u *uploader) multipart(ctx context.Context, r io.Reader, key string, size int64, buf []byte, meta map[string]string) (e ManifestEntry, err error) {
	partSize, bufs, release := u.partBuffers(size, buf)
	defer release()
	uploadID, err := u.createMultipart(ctx, key, meta)
	if err != nil {
		return ManifestEntry{}, err
	}
	q := partQueue{u: u, key: key, uploadID: uploadID}
	defer func() {
		// Never leave a part in flight on a buffer going back to the pool.
		if werr := q.wait(); werr != nil && err == nil {
			err = werr
		}
		if err != nil {
			err = u.abortMultipart(ctx, key, uploadID, err)
		}
	}()
	full := crc32.NewIEEE() // the whole object's checksum, part by part
	for off, n := int64(0), int32(1); off < size; n++ {
		if len(bufs) == 1 {
			if err := q.wait(); err != nil { // its buffer is about to be reused
				return ManifestEntry{}, err
			}
		}
		chunk := min(partSize, size-off)
		b := bufs[int(n)%len(bufs)][:chunk]
		if err := readExact(r, b); err != nil {
			return ManifestEntry{}, err
		}
		off += chunk
		if off == size {
			// Refuse a stream longer than listed before the last part goes.
			if err := expectEOF(r); err != nil {
				return ManifestEntry{}, err
			}
		}
		full.Write(b)
		if err := q.send(ctx, n, b); err != nil {
			return ManifestEntry{}, err
		}
	}
	if err := q.wait(); err != nil {
		return ManifestEntry{}, err
	}
	return u.completeMultipart(ctx, key, uploadID, q.done, size, crcString(full))
}

// partBuffers returns the part size of an upload of size bytes and the
// buffers its parts are read into: buf, plus a spare from the pool when
// one is free (release returns it). A file over partSize*maxParts bytes
// gets one larger buffer of its own instead.
func (u *uploader) partBuffers(size int64, buf []byte) (partSize int64, bufs [][]byte, release func()) {
	partSize, bufs, release = u.partSize, [][]byte{buf}, func() {}
	if min := (size + maxParts - 1) / maxParts; min > partSize {
		return min, [][]byte{make([]byte, min)}, release
	}
	select {
	case spare := <-u.bufs:
		if spare == nil {
			spare = make([]byte, u.partSize)
		}
		return partSize, append(bufs, spare), func() { u.putBuf(spare) }
	default:
		return partSize, bufs, release
	}
}

// createMultipart starts a multipart upload with full-object CRC32.
func (u *uploader) createMultipart(ctx context.Context, key string, meta map[string]string) (*string, error) {
	cctx, cancel := context.WithTimeout(ctx, u.callTO)
	defer cancel()
	created, err := u.s3.CreateMultipartUpload(cctx, &s3.CreateMultipartUploadInput{
		Bucket:            aws.String(u.bucket),
		Key:               aws.String(key),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
		ChecksumType:      types.ChecksumTypeFullObject,
		Metadata:          meta,
	})
	if err != nil {
		return nil, fmt.Errorf("create multipart upload: %w", err)
	}
	return created.UploadId, nil
}

// completeMultipart completes an upload of size bytes whose whole-object
// CRC32 is sum (S3 checks it against the parts).
func (u *uploader) completeMultipart(ctx context.Context, key string, uploadID *string, parts []types.CompletedPart, size int64, sum string) (ManifestEntry, error) {
	cctx, cancel := context.WithTimeout(ctx, u.callTO)
	defer cancel()
	done, err := u.s3.CompleteMultipartUpload(cctx, &s3.CompleteMultipartUploadInput{
		Bucket:          aws.String(u.bucket),
		Key:             aws.String(key),
		UploadId:        uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
		ChecksumCRC32:   aws.String(sum),
		ChecksumType:    types.ChecksumTypeFullObject,
	})
	if err != nil {
		return ManifestEntry{}, fmt.Errorf("complete multipart upload: %w", err)
	}
	return ManifestEntry{Size: size, CRC32: sum, ETag: aws.ToString(done.ETag)}, nil
}

// abortMultipart aborts a failed upload (past ctx's end, briefly) and
// returns err, joined with the abort's own failure if any.
func (u *uploader) abortMultipart(ctx context.Context, key string, uploadID *string, err error) error {
	actx, cancel := core.CleanupContext(ctx, cleanupTimeout)
	defer cancel()
	if _, aerr := u.s3.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{
		Bucket: aws.String(u.bucket), Key: aws.String(key), UploadId: uploadID,
	}); aerr != nil {
		return errors.Join(err, fmt.Errorf("abort multipart upload: %w", aerr))
	}
	return err
}

// partQueue sends the parts of one upload, at most one in flight, and
// collects the completed ones in order.
type partQueue struct {
	u        *uploader
	key      string
	uploadID *string
	pending  chan sentPart // the part in flight, if any
	done     []types.CompletedPart
}

type sentPart struct {
	part types.CompletedPart
	err  error
}

// wait waits for the part in flight, if any, and records it.
func (q *partQueue) wait() error {
	if q.pending == nil {
		return nil
	}
	r := <-q.pending
	q.pending = nil
	if r.err != nil {
		return r.err
	}
	q.done = append(q.done, r.part)
	return nil
}

// send waits for the part in flight, then starts sending part n from b.
func (q *partQueue) send(ctx context.Context, n int32, b []byte) error {
	if err := q.wait(); err != nil {
		return err
	}
	q.pending = make(chan sentPart, 1)
	go func(done chan<- sentPart) {
		p, err := q.u.sendPart(ctx, q.key, q.uploadID, n, b)
		done <- sentPart{p, err}
	}(q.pending)
	return nil
}

// sendPart uploads part n with its CRC32, which S3 verifies.
func (u *uploader) sendPart(ctx context.Context, key string, uploadID *string, n int32, b []byte) (types.CompletedPart, error) {
	pb64 := crcOf(b)
	cctx, cancel := context.WithTimeout(ctx, u.callTO)
	defer cancel()
	out, err := u.s3.UploadPart(cctx, &s3.UploadPartInput{
		Bucket:            aws.String(u.bucket),
		Key:               aws.String(key),
		UploadId:          uploadID,
		PartNumber:        aws.Int32(n),
		Body:              bytes.NewReader(b),
		ContentLength:     aws.Int64(int64(len(b))),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
		ChecksumCRC32:     aws.String(pb64),
	})
	if err != nil {
		return types.CompletedPart{}, fmt.Errorf("upload part %d: %w", n, err)
	}
	return types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(n), ChecksumCRC32: aws.String(pb64)}, nil
}

// crcString renders a CRC32 (IEEE) as S3 does: base64 of the big-endian
// 4 bytes.
func crcString(h hash.Hash32) string {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], h.Sum32())
	return base64.StdEncoding.EncodeToString(b[:])
}

func crcOf(b []byte) string {
	h := crc32.NewIEEE()
	h.Write(b)
	return crcString(h)
}
