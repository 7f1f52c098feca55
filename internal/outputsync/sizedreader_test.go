package outputsync

import (
	"errors"
	"hash/crc32"
	"io"
	"strings"
	"sync"
	"testing"
)

// TestSizedReader: the reader passes exactly the listed size, hashes what
// it passed, fails a longer or shorter body with errChanged and a body
// whose CRC32 differs with errChecksum, and fails every read after finish.
func TestSizedReader(t *testing.T) {
	const body = "hello, sandbox"
	sum := crc32.NewIEEE()
	sum.Write([]byte(body))
	good := crcString(sum)
	for _, tc := range []struct {
		name    string
		size    int64
		want    string
		wantErr error
		left    int64
	}{
		{"exact", int64(len(body)), good, nil, 0},
		{"unchecked", int64(len(body)), "", nil, 0},
		{"longer than listed", int64(len(body)) - 1, "", errChanged, int64(len(body)) - 1},
		{"shorter than listed", int64(len(body)) + 1, "", errChanged, 1},
		{"wrong checksum", int64(len(body)), "AAAAAA==", errChecksum, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &sizedReader{r: strings.NewReader(body), left: tc.size, sum: crc32.NewIEEE(), want: tc.want}
			_, err := io.Copy(io.Discard, r)
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("copy error = %v, want %v", err, tc.wantErr)
			}
			got := r.finish()
			if !errors.Is(got.err, tc.wantErr) || got.left != tc.left {
				t.Errorf("finish = err %v left %d, want err %v left %d", got.err, got.left, tc.wantErr, tc.left)
			}
			if tc.wantErr == nil && got.sum != good {
				t.Errorf("finish sum = %s, want %s", got.sum, good)
			}
			if n, err := r.Read(make([]byte, 4)); n != 0 || err == nil {
				t.Errorf("Read after finish = %d, %v; want 0 and an error", n, err)
			}
		})
	}
}

// TestSizedReaderFinishWhileReading: an HTTP client's goroutine may go on
// reading the body after the write returned; finish and those reads do not
// race (run with -race), and the reads stop.
func TestSizedReaderFinishWhileReading(t *testing.T) {
	for range 50 {
		r := &sizedReader{r: strings.NewReader(strings.Repeat("x", 1<<16)), left: 1 << 16, sum: crc32.NewIEEE()}
		var wg sync.WaitGroup
		var readErr error
		wg.Go(func() {
			buf := make([]byte, 64)
			for {
				if _, err := r.Read(buf); err != nil {
					readErr = err
					return
				}
			}
		})
		_ = r.finish()
		wg.Wait()
		if !errors.Is(readErr, errReadAfterWrite) && !errors.Is(readErr, io.EOF) {
			t.Fatalf("reads ended with %v, want errReadAfterWrite (or the end of the body)", readErr)
		}
	}
}
