package core

import (
	"context"
	"io"
)

// CappedReader streams body and fails with *FileTooLargeError as soon as
// more than max bytes arrive, handing out at most max bytes (max <= 0: no
// cap). Close closes body and then calls cancel(nil) (cancel may be nil),
// ending the request that produced body. Providers use it for
// Provider.OpenFile.
func CappedReader(body io.ReadCloser, cancel context.CancelCauseFunc, path string, max int64) io.ReadCloser {
	return &cappedBody{body: body, cancel: cancel, path: path, max: max}
}

type cappedBody struct {
	body   io.ReadCloser
	cancel context.CancelCauseFunc
	path   string
	max    int64
	n      int64
	err    error
}

func (r *cappedBody) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.max <= 0 {
		return r.body.Read(p)
	}
	if room := r.max - r.n + 1; int64(len(p)) > room {
		p = p[:room] // read at most one byte past the cap
	}
	k, err := r.body.Read(p)
	if r.n+int64(k) > r.max {
		k = int(r.max - r.n)
		r.n = r.max
		r.err = &FileTooLargeError{Path: r.path, MaxBytes: r.max}
		r.Close()
		return k, r.err
	}
	r.n += int64(k)
	return k, err
}

func (r *cappedBody) Close() error {
	err := r.body.Close()
	if r.cancel != nil {
		r.cancel(nil)
	}
	return err
}
