package outputsync

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
)

// Environment variables that carry the (trusted) directory names into the
// listing script. Values are never interpolated into the script text.
const (
	envOutputsDir   = "SBX_SYNC_OUTPUTS_DIR"
	envWorkspaceDir = "SBX_SYNC_WORKSPACE_DIR"
	envListMax      = "SBX_SYNC_LIST_MAX_BYTES"
)

// listScript lists every regular file under the two mirrored directories
// with GNU find: -P never follows symbolic links (neither starting points nor
// entries) and -type f matches regular files only, so symlinks, FIFOs,
// sockets and devices are never listed. One record per file:
// "<size bytes>\t<mtime seconds.fraction>\t<path>\0". Paths end at the NUL,
// so tabs and newlines inside names cannot shift fields. A missing (or
// symlinked) directory contributes nothing. The output is cut at
// $SBX_SYNC_LIST_MAX_BYTES; a cut or any find error makes the exit status
// non-zero (pipefail), which the caller treats as an incomplete listing.
const listScript = `set -u -o pipefail
list_dirs() {
  rc=0
  for d in "$` + envOutputsDir + `" "$` + envWorkspaceDir + `"; do
    if [ -d "$d" ] && [ ! -L "$d" ]; then
      find -P "$d" -type f -printf '%s\t%T@\t%p\0' || rc=1
    fi
  done
  return "$rc"
}
list_dirs | head -c "$` + envListMax + `"
`

// listedFile is one parsed listing record.
type listedFile struct {
	Size    int64  // bytes, as stat reported it when listed
	MtimeNs int64  // modification time, nanoseconds since the Unix epoch
	Path    string // absolute path in the sandbox, raw bytes (may be unsafe)
}

// errBadRecord is returned by parseRecord for a record that does not have
// the listing's shape.
var errBadRecord = errors.New("malformed listing record")

// parseListing splits find's NUL-terminated output into records. Records
// that do not parse are returned raw in bad. A final record without its NUL
// terminator (the output was cut) is reported in truncated and not parsed.
func parseListing(out []byte) (files []listedFile, bad [][]byte, truncated bool) {
	for len(out) > 0 {
		i := bytes.IndexByte(out, 0)
		if i < 0 {
			return files, bad, true
		}
		rec := out[:i]
		out = out[i+1:]
		f, err := parseRecord(rec)
		if err != nil {
			bad = append(bad, rec)
			continue
		}
		files = append(files, f)
	}
	return files, bad, false
}

// parseRecord parses "<size>\t<mtime>\t<path>". The path is everything after
// the second tab (it may itself contain tabs or newlines; path safety is
// judged separately).
func parseRecord(rec []byte) (listedFile, error) {
	sizeField, rest, ok := bytes.Cut(rec, []byte{'\t'})
	if !ok {
		return listedFile{}, errBadRecord
	}
	mtimeField, pathField, ok := bytes.Cut(rest, []byte{'\t'})
	if !ok || len(pathField) == 0 {
		return listedFile{}, errBadRecord
	}
	size, err := parseDecimal(string(sizeField))
	if err != nil {
		return listedFile{}, errBadRecord
	}
	mtime, err := parseMtimeNs(string(mtimeField))
	if err != nil {
		return listedFile{}, errBadRecord
	}
	return listedFile{Size: size, MtimeNs: mtime, Path: string(pathField)}, nil
}

// parseDecimal parses a non-empty run of ASCII digits into a non-negative
// int64 (no sign, no spaces, no overflow).
func parseDecimal(s string) (int64, error) {
	if s == "" || len(s) > 19 {
		return 0, errBadRecord
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errBadRecord
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errBadRecord
	}
	return v, nil
}

// parseMtimeNs converts find's %T@ ("seconds[.fraction]", optionally
// negative) to integer nanoseconds exactly, without floating point. GNU find
// 4.9 prints tv_sec, a dot, then tv_nsec as 9 digits followed by a zero (10
// fractional digits; observed: 1720000000.123456789 s prints
// "1720000000.1234567890", -1.5 s prints "-2.5000000000"), so the first 9
// fractional digits are the nanoseconds; shorter fractions are padded.
func parseMtimeNs(s string) (int64, error) {
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	secStr, frac, hasFrac := strings.Cut(s, ".")
	if hasFrac && frac == "" {
		return 0, errBadRecord
	}
	sec, err := parseDecimal(secStr)
	if err != nil {
		return 0, err
	}
	var ns int64
	if hasFrac {
		for i := 0; i < len(frac); i++ {
			if frac[i] < '0' || frac[i] > '9' {
				return 0, errBadRecord
			}
		}
		if len(frac) > 9 {
			frac = frac[:9]
		}
		frac += strings.Repeat("0", 9-len(frac))
		ns, _ = strconv.ParseInt(frac, 10, 64)
	}
	if sec > (math.MaxInt64-ns)/1e9 {
		return 0, errBadRecord
	}
	if neg {
		// find prints the whole seconds (floored) and then the positive
		// nanosecond field: -1.5 s is printed as "-2.5000000000".
		return -sec*1e9 + ns, nil
	}
	return sec*1e9 + ns, nil
}
