package sandboxhost

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// File metadata, as E2B's envd keeps it: the X-Metadata-<key> headers of
// an upload become extended attributes user.e2b.<key> (key lowercased) of
// the file written, replacing those of an earlier upload.
const (
	metadataHeaderPrefix = "X-Metadata-"
	metadataXattrPrefix  = "user.e2b."
	// maxMetadataBytes bounds the keys and values of one upload.
	maxMetadataBytes = 16 << 10
)

// errBadMetadata: metadata headers that cannot be stored.
var errBadMetadata = errors.New("bad file metadata")

// sandboxUser is the name of the sandbox's user, as E2B's templates name it.
const sandboxUser = "user"

// uploadMetadata reads the X-Metadata-* headers of an upload (nil when
// none).
func uploadMetadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	size := 0
	for k, vs := range h {
		if len(k) <= len(metadataHeaderPrefix) || !strings.EqualFold(k[:len(metadataHeaderPrefix)], metadataHeaderPrefix) || len(vs) == 0 {
			continue
		}
		key := strings.ToLower(k[len(metadataHeaderPrefix):])
		if md == nil {
			md = map[string]string{}
		}
		md[key] = vs[0]
		if size += len(key) + len(vs[0]); size > maxMetadataBytes {
			return nil, fmt.Errorf("%w: more than %d bytes", errBadMetadata, maxMetadataBytes)
		}
	}
	return md, nil
}

// setMetadata replaces the user.e2b.* attributes of the open file f with md.
func setMetadata(f *os.File, md map[string]string) error {
	fd := int(f.Fd())
	for k := range readMetadata(fd) {
		if err := unix.Fremovexattr(fd, metadataXattrPrefix+k); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("%w: %v", errBadMetadata, err)
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, metadataXattrPrefix+k, []byte(v), 0); err != nil {
			return fmt.Errorf("%w: %s: %v", errBadMetadata, k, err)
		}
	}
	return nil
}

// readMetadata returns the user.e2b.* attributes of fd (nil when none or
// unreadable).
func readMetadata(fd int) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Flistxattr(fd, buf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = unix.Flistxattr(fd, nil); err == nil {
			buf = make([]byte, n)
			n, err = unix.Flistxattr(fd, buf)
		}
	}
	if err != nil || n <= 0 {
		return nil
	}
	var md map[string]string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		val := make([]byte, 4096)
		m, err := unix.Fgetxattr(fd, name, val)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(val[:m])
	}
	return md
}

// fileMetadata returns the metadata of the regular file rel in root (nil
// when none). The file is opened without following a symlink and without
// blocking, so nothing the sandbox planted can hang or mislead the host.
func fileMetadata(root *os.Root, rel string) map[string]string {
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	return readMetadata(int(f.Fd()))
}

// entry describes the file at rel in root (not following a final
// symlink), named with the sandbox path view.
func (sb *sandbox) entry(root *os.Root, rel, view string) (envd.EntryInfo, error) {
	fi, err := root.Lstat(rel)
	if err != nil {
		return envd.EntryInfo{}, err
	}
	e := envd.EntryInfo{
		Name:         path.Base(view),
		Path:         view,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: fi.ModTime().UTC().Format(time.RFC3339Nano),
		Owner:        sandboxUser,
		Group:        sandboxUser,
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = sb.userName(st.Uid)
		e.Group = sb.groupName(st.Gid)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = envd.FileTypeSymlink
		if t, err := root.Readlink(rel); err == nil {
			abs := sb.linkTarget(view, t)
			e.SymlinkTarget = &abs
		}
	case fi.IsDir():
		e.Type = envd.FileTypeDirectory
	default:
		e.Type = envd.FileTypeFile
		e.Metadata = fileMetadata(root, rel)
	}
	return e, nil
}

// linkTarget is the absolute sandbox path the symlink view (target t)
// leads to, as E2B reports it: resolved through further links while they
// stay in the sandbox's own directories, else t made absolute.
func (sb *sandbox) linkTarget(view, t string) string {
	if !path.IsAbs(t) {
		t = path.Join(path.Dir(view), t)
	}
	if vp, err := sb.resolve(t); err == nil {
		return vp.view()
	}
	return path.Clean(t)
}

// ownerUID is the host uid that owns the sandbox's files: its own uid
// (root host), else the host's (bubblewrap maps it to the sandbox user).
func (sb *sandbox) ownerUID() uint32 {
	if sb.chown {
		return uint32(sb.uid)
	}
	return uint32(os.Getuid())
}

// userName names uid as the sandbox sees it: its own uid is "user".
func (sb *sandbox) userName(uid uint32) string {
	if uid == sb.ownerUID() {
		return sandboxUser
	}
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		return u.Username
	}
	return strconv.FormatUint(uint64(uid), 10)
}

// groupName names gid as the sandbox sees it: its own gid is "user".
func (sb *sandbox) groupName(gid uint32) string {
	own := uint32(os.Getgid())
	if sb.chown {
		own = uint32(sb.gid)
	}
	if gid == own {
		return sandboxUser
	}
	if g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10)); err == nil {
		return g.Name
	}
	return strconv.FormatUint(uint64(gid), 10)
}
