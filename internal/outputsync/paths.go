package outputsync

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// mirroredDirs are the directories under the sandbox home that are copied
// (outputs/ and workspace/). Their names are also the first segment of every manifest
// path and of every object key below the thread prefix.
var mirroredDirs = []string{"outputs", "workspace"}

// maxKeyBytes is S3's limit on an object key's UTF-8 length.
const maxKeyBytes = 1024

// Reasons a listed file is refused by path checks.
var (
	errUnsafePath  = errors.New("unsafe path")
	errPathTooLong = errors.New("object key too long")
)

// relPath maps an absolute sandbox path under home to its mirrored relative
// path "outputs/<rel>" or "workspace/<rel>". It refuses (errUnsafePath) any
// path that is not valid UTF-8, contains a control character (C0, DEL, C1:
// newline, tab and NUL included), lies outside the mirrored directories, or
// has an empty, "." or ".." segment. It also refuses Unicode format
// characters (category Cf: bidirectional overrides such as U+202E,
// zero-width joiners, byte order marks), which make a name display as
// another one.
func relPath(home, abs string) (string, error) {
	if !utf8.ValidString(abs) {
		return "", errUnsafePath
	}
	for _, r := range abs {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return "", errUnsafePath
		}
	}
	rest, ok := strings.CutPrefix(abs, home+"/")
	if !ok {
		return "", errUnsafePath
	}
	dir, sub, ok := strings.Cut(rest, "/")
	if !ok || !isMirrored(dir) {
		return "", errUnsafePath
	}
	for _, seg := range strings.Split(sub, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", errUnsafePath
		}
	}
	return rest, nil
}

func isMirrored(dir string) bool {
	for _, d := range mirroredDirs {
		if d == dir {
			return true
		}
	}
	return false
}

// threadPrefix is "<prefix>/<tenant>/<user>/<thread>/" ("<tenant>/…" when
// prefix is empty). The key's parts are validated ids (no "/" or "."), so
// no object of one thread can fall under another thread's prefix.
func threadPrefix(prefix string, k core.ThreadKey) string {
	return joinKey(prefix, k.Tenant, k.User, k.Thread) + "/"
}

// objectKey is the key of a mirrored file: the thread prefix plus its
// relative path ("outputs/<rel>" or "workspace/<rel>", checked by relPath).
func objectKey(prefix string, k core.ThreadKey, rel string) (string, error) {
	key := threadPrefix(prefix, k) + rel
	if len(key) > maxKeyBytes {
		return "", errPathTooLong
	}
	return key, nil
}

// brokerSegment is the first key segment below the prefix of every object
// the broker itself owns (manifests). It starts with ".", which no tenant id
// (^[A-Za-z0-9_-]{1,64}$) can, so no thread prefix reaches these keys
// whatever the tenant is called.
const brokerSegment = ".broker"

// manifestKey is "<prefix>/.broker/manifests/<tenant>/<user>/<thread>.json",
// outside every tenant's tree.
func manifestKey(prefix string, k core.ThreadKey) string {
	return joinKey(prefix, brokerSegment, "manifests", k.Tenant, k.User, k.Thread+".json")
}

func joinKey(prefix string, parts ...string) string {
	if prefix == "" {
		return strings.Join(parts, "/")
	}
	return prefix + "/" + strings.Join(parts, "/")
}

// cleanPrefix normalises an object key prefix: surrounding slashes are
// dropped; empty, ".", ".." segments and control characters are refused.
func cleanPrefix(p string) (string, error) {
	p = strings.Trim(p, "/")
	if p == "" {
		return "", nil
	}
	if !utf8.ValidString(p) || strings.IndexFunc(p, unicode.IsControl) >= 0 {
		return "", fmt.Errorf("prefix %q: control characters or invalid UTF-8", p)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", fmt.Errorf("prefix %q: empty, \".\" or \"..\" segment", p)
		}
	}
	return p, nil
}

// cleanHome validates the sandbox home: absolute, already clean, no control
// characters, not "/".
func cleanHome(h string) (string, error) {
	if h == "" || h[0] != '/' || h == "/" || path.Clean(h) != h {
		return "", fmt.Errorf("home %q: must be a clean absolute path other than /", h)
	}
	if !utf8.ValidString(h) || strings.IndexFunc(h, unicode.IsControl) >= 0 {
		return "", fmt.Errorf("home %q: control characters or invalid UTF-8", h)
	}
	return h, nil
}

// displayPath renders a possibly hostile sandbox path for reports and logs:
// relative to home when under it, with control characters and invalid UTF-8
// escaped Go-style (so a newline shows as \n), at most 256 bytes.
func displayPath(home, abs string) string {
	p := strings.TrimPrefix(abs, home+"/")
	q := strconv.Quote(p)
	q = q[1 : len(q)-1]
	if len(q) > 256 {
		n := 256
		for n > 0 && !utf8.RuneStart(q[n]) {
			n--
		}
		q = q[:n] + "…"
	}
	return q
}
