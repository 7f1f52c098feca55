package sandboxhost

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// ErrOutsideSandbox is returned for a path that resolves outside the
// sandbox's own directories (/home/user, /tmp, /mnt), directly or through
// symlinks.
var ErrOutsideSandbox = errors.New("path outside the sandbox's home, /tmp and /mnt")

// maxSymlinkHops bounds symlink resolution (as Linux's ELOOP limit does).
const maxSymlinkHops = 40

// vpath is a resolved sandbox path: an area root on the host and a
// slash-separated path relative to it. Every file operation goes through
// os.Root on areaRoot, so a symlink swapped in after resolution still
// cannot lead outside the area.
type vpath struct {
	area     string // sandbox view prefix: /home/user, /tmp or /mnt
	areaRoot string // host directory backing area
	rel      string // "." for the area root
}

// view is the path as the sandbox sees it.
func (p vpath) view() string { return path.Join(p.area, p.rel) }

// hostPath is the host path (for use when no isolation is active).
func (p vpath) hostPath() string { return filepath.Join(p.areaRoot, filepath.FromSlash(p.rel)) }

// open opens the area root; close it after use.
func (p vpath) open() (*os.Root, error) { return os.OpenRoot(p.areaRoot) }

// virtualPath makes p an absolute, clean sandbox path; relative paths are
// relative to /home/user (as in envd).
func (sb *sandbox) virtualPath(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: NUL in path", ErrOutsideSandbox)
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = sandboxHome + p[1:]
	}
	if !path.IsAbs(p) {
		p = path.Join(sandboxHome, p)
	}
	return path.Clean(p), nil
}

// split maps an absolute clean sandbox path to its area.
func (sb *sandbox) split(v string) (vpath, bool) {
	for _, a := range [...]struct{ prefix, root string }{
		{sandboxHome, sb.home}, {sandboxTmp, sb.tmp}, {sandboxMnt, sb.mnt},
	} {
		if v == a.prefix {
			return vpath{area: a.prefix, areaRoot: a.root, rel: "."}, true
		}
		if strings.HasPrefix(v, a.prefix+"/") {
			return vpath{area: a.prefix, areaRoot: a.root, rel: v[len(a.prefix)+1:]}, true
		}
	}
	return vpath{}, false
}

// resolve maps sandbox path p to a vpath, following symlinks as the
// sandbox would see them (absolute targets are sandbox paths) in every
// component, and in the last one too.
func (sb *sandbox) resolve(p string) (vpath, error) { return sb.resolvePath(p, true) }

// resolveNoFollow is resolve without following a symlink in the last
// component (for Lstat, remove, rename).
func (sb *sandbox) resolveNoFollow(p string) (vpath, error) { return sb.resolvePath(p, false) }

func (sb *sandbox) resolvePath(p string, followLast bool) (vpath, error) {
	v, err := sb.virtualPath(p)
	if err != nil {
		return vpath{}, err
	}
	for hops := 0; ; hops++ {
		if hops > maxSymlinkHops {
			return vpath{}, fmt.Errorf("resolve %s: too many symlinks", p)
		}
		vp, next, err := sb.resolveStep(v, followLast)
		if err != nil {
			return vpath{}, err
		}
		if next == "" {
			return vp, nil
		}
		v = next
	}
}

// resolveStep walks v up to its first symlink. It returns the resolved
// vpath when there is none, or the sandbox path to continue with.
func (sb *sandbox) resolveStep(v string, followLast bool) (vpath, string, error) {
	vp, ok := sb.split(v)
	if !ok {
		return vpath{}, "", fmt.Errorf("%w: %s", ErrOutsideSandbox, v)
	}
	if vp.rel == "." {
		return vp, "", nil
	}
	root, err := vp.open()
	if err != nil {
		return vpath{}, "", fmt.Errorf("open sandbox dir: %w", err)
	}
	defer root.Close()
	parts := strings.Split(vp.rel, "/")
	cur := ""
	for i, part := range parts {
		next := path.Join(cur, part)
		if i == len(parts)-1 && !followLast {
			cur = next
			break
		}
		fi, err := root.Lstat(next)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				// Missing from here on: nothing more to resolve.
				cur = path.Join(append([]string{next}, parts[i+1:]...)...)
				break
			}
			return vpath{}, "", fmt.Errorf("resolve %s: %w", v, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		target, err := root.Readlink(next)
		if err != nil {
			return vpath{}, "", fmt.Errorf("resolve %s: %w", v, err)
		}
		if !path.IsAbs(target) {
			target = path.Join(vp.area, cur, target)
		}
		return vpath{}, path.Clean(path.Join(append([]string{target}, parts[i+1:]...)...)), nil
	}
	vp.rel = cur
	return vp, "", nil
}

// own gives rel (not following a final symlink) to the sandbox's owner
// when the host runs sandboxes under another uid.
func (sb *sandbox) own(root *os.Root, rel string) error {
	if !sb.chown {
		return nil
	}
	if err := root.Lchown(rel, sb.uid, sb.gid); err != nil {
		return fmt.Errorf("chown %s: %w", rel, err)
	}
	return nil
}

// mkdirAll creates rel and its missing parents inside root, owned by the
// sandbox's owner.
func (sb *sandbox) mkdirAll(root *os.Root, rel string) error {
	if rel == "." || rel == "" {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		err := root.Mkdir(p, 0o755)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := sb.own(root, p); err != nil {
			return err
		}
	}
	return nil
}

// isDir returns nil when p is an existing directory (following symlinks
// inside its area), fs.ErrNotExist or errNotDir otherwise.
func (p vpath) isDir() error {
	root, err := p.open()
	if err != nil {
		return err
	}
	defer root.Close()
	fi, err := root.Stat(p.rel)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errNotDir
	}
	return nil
}

// errNotDir is returned for a directory path naming something else.
var errNotDir = errors.New("not a directory")
