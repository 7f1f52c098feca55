package sandboxhost

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// watchMask is what a directory watch reports: the changes E2B's envd
// reports (through fsnotify) on Linux. Watches are added through
// /proc/self/fd of a directory opened with os.Root, so the magic link is
// followed to that directory and nowhere else.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_DELETE_SELF |
	unix.IN_MOVED_FROM | unix.IN_MOVE_SELF | unix.IN_ATTRIB | unix.IN_ONLYDIR

// dirWatch is an inotify instance on one sandbox directory (and its
// subdirectories when recursive). Watches are added through descriptors
// opened with os.Root, so no path the sandbox swaps in can lead outside.
type dirWatch struct {
	f         *os.File // the inotify descriptor, non-blocking (Go's poller)
	root      *os.Root
	base      string           // the watched directory, relative to root
	view      string           // the watched directory as the sandbox sees it
	stop      chan struct{}    // closed by close
	dirs      map[int32]string // watch descriptor -> directory relative to base
	recursive bool
}

// rpcWatchDir streams changes in a sandbox directory as E2B's envd does:
// start{} first, then filesystem{name (relative to the directory), type,
// entry?} per change and keepalives. A missing directory is not_found, a
// file invalid_argument.
func (h *Host) rpcWatchDir(ctx context.Context, req *connect.Request[envd.WatchDirRequest], stream *connect.ServerStream[envd.WatchDirResponse]) error {
	sb := sandboxFrom(ctx)
	w, err := sb.watchDir(req.Msg.Path, req.Msg.Recursive)
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&envd.WatchDirResponse{Start: &struct{}{}}); err != nil {
		return err
	}
	events := make(chan envd.FilesystemEvent, outputQueue)
	go w.read(events)
	tick := time.NewTicker(keepalive(req.Header()))
	defer tick.Stop()
	for {
		var msg envd.WatchDirResponse
		select {
		case ev, ok := <-events:
			if !ok {
				return connect.NewError(connect.CodeInternal, errors.New("watch ended"))
			}
			if req.Msg.IncludeEntry {
				if e, err := sb.entry(w.root, path.Join(w.base, ev.Name), path.Join(w.view, ev.Name)); err == nil {
					ev.Entry = &e
				}
			}
			msg.Filesystem = &ev
		case <-tick.C:
			msg.Keepalive = &struct{}{}
		case <-sb.ctx.Done():
			panic(http.ErrAbortHandler) // the sandbox died: the stream drops, as on E2B
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := stream.Send(&msg); err != nil {
			return err
		}
	}
}

// watchDir starts watching sandbox directory p.
func (sb *sandbox) watchDir(p string, recursive bool) (*dirWatch, error) {
	vp, root, err := sb.openResolved(p)
	if err != nil {
		return nil, fsError(err)
	}
	fi, err := root.Stat(vp.rel)
	if err != nil {
		root.Close()
		return nil, fsError(err)
	}
	if !fi.IsDir() {
		root.Close()
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", vp.view()))
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		root.Close()
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("watch: %w", err))
	}
	w := &dirWatch{f: os.NewFile(uintptr(fd), "inotify"), root: root, base: vp.rel, view: vp.view(), stop: make(chan struct{}), dirs: map[int32]string{}, recursive: recursive}
	if err := w.add(""); err != nil {
		w.close()
		return nil, fsError(err)
	}
	return w, nil
}

// add watches directory dir (relative to the watched one) and, when
// recursive, every directory below it.
func (w *dirWatch) add(dir string) error {
	d, err := w.root.Open(path.Join(w.base, dir))
	if err != nil {
		return err
	}
	wd, err := unix.InotifyAddWatch(int(w.f.Fd()), "/proc/self/fd/"+strconv.Itoa(int(d.Fd())), watchMask)
	if err != nil {
		d.Close()
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	w.dirs[int32(wd)] = dir
	var subs []os.DirEntry
	if w.recursive {
		subs, _ = d.ReadDir(-1)
	}
	d.Close()
	for _, e := range subs {
		if e.IsDir() {
			_ = w.add(path.Join(dir, e.Name())) // it may be gone already
		}
	}
	return nil
}

// read sends the watch's events until its descriptor is closed, then
// closes events.
func (w *dirWatch) read(events chan<- envd.FilesystemEvent) {
	defer close(events)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := string(trimNUL(buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+nameLen]))
			off += unix.SizeofInotifyEvent + nameLen
			dir, ok := w.dirs[wd]
			if !ok {
				continue
			}
			rel := path.Join(dir, name)
			if w.recursive && mask&unix.IN_ISDIR != 0 && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
				_ = w.add(rel)
			}
			for _, t := range eventTypes(mask) {
				select {
				case events <- envd.FilesystemEvent{Name: rel, Type: t}:
				case <-w.stop:
					return
				}
			}
		}
	}
}

// eventTypes maps an inotify mask to envd's event types, as fsnotify
// groups them.
func eventTypes(mask uint32) []string {
	var out []string
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		out = append(out, envd.EventTypeCreate)
	}
	if mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0 {
		out = append(out, envd.EventTypeRename)
	}
	if mask&unix.IN_ATTRIB != 0 {
		out = append(out, envd.EventTypeChmod)
	}
	if mask&unix.IN_MODIFY != 0 {
		out = append(out, envd.EventTypeWrite)
	}
	if mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0 {
		out = append(out, envd.EventTypeRemove)
	}
	return out
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// close stops the watch.
func (w *dirWatch) close() {
	close(w.stop)
	_ = w.f.Close()
	_ = w.root.Close()
}
