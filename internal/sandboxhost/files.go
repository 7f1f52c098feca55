package sandboxhost

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// fsError maps a filesystem error to a Connect error.
func fsError(err error) error {
	switch {
	case errors.Is(err, ErrOutsideSandbox):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, syscall.ENOSPC):
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	default:
		return connect.NewError(connect.CodeInternal, err)
	}
}

// httpFSError writes a filesystem error as JSON {code, message}.
func httpFSError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrOutsideSandbox), errors.Is(err, fs.ErrPermission):
		status = http.StatusForbidden
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		status = http.StatusNotFound
	case errors.Is(err, errIsDir), errors.Is(err, errBadUpload), errors.Is(err, errBadMetadata):
		status = http.StatusBadRequest
	case errors.Is(err, syscall.ENOSPC):
		status = http.StatusInsufficientStorage
	}
	writeJSON(w, status, e2bapi.Error{Code: status, Message: err.Error()})
}

var (
	errIsDir     = errors.New("path is a directory")
	errBadUpload = errors.New("bad upload")
)

// handleReadFile serves GET /files?path=: the file's raw bytes, streamed.
// 404 JSON when it does not exist.
func (h *Host) handleReadFile(w http.ResponseWriter, r *http.Request) {
	sb := sandboxFrom(r.Context())
	p := r.URL.Query().Get("path")
	if p == "" {
		httpFSError(w, fmt.Errorf("%w: missing path", errBadUpload))
		return
	}
	vp, root, err := sb.openResolved(p)
	if err != nil {
		httpFSError(w, err)
		return
	}
	defer root.Close()
	// O_NONBLOCK: a FIFO planted by the sandbox must not hang the host.
	f, err := root.OpenFile(vp.rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		httpFSError(w, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		httpFSError(w, err)
		return
	}
	if fi.IsDir() {
		httpFSError(w, fmt.Errorf("%w: %s", errIsDir, vp.view()))
		return
	}
	if !fi.Mode().IsRegular() {
		httpFSError(w, fmt.Errorf("%w: %s is not a regular file", errBadUpload, vp.view()))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, f); err != nil {
		h.log.Debug("read file aborted", "sandbox_id", sb.id, "path", vp.view(), "error", err.Error())
	}
}

// handleWriteFile serves POST /files[?path=]: multipart/form-data with
// parts named "file" (destination = path parameter, else each part's
// filename), or a raw body (any other content type; gzip if
// Content-Encoding says so) written to the path parameter. Parent
// directories are created. Reply: 200 with a JSON array of {name, type,
// path}, one per written file.
func (h *Host) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	sb := sandboxFrom(r.Context())
	dest := r.URL.Query().Get("path")
	body := io.Reader(r.Body)
	if strings.EqualFold(strings.TrimSpace(r.Header.Get("Content-Encoding")), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			httpFSError(w, fmt.Errorf("%w: gzip: %v", errBadUpload, err))
			return
		}
		defer zr.Close()
		body = zr
	}
	md, err := uploadMetadata(r.Header)
	if err != nil {
		httpFSError(w, err)
		return
	}
	var written []envd.WriteInfo
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				httpFSError(w, fmt.Errorf("%w: multipart: %v", errBadUpload, err))
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			target := dest
			if target == "" {
				target = rawFileName(part)
			}
			if target == "" {
				httpFSError(w, fmt.Errorf("%w: no path parameter and no part filename", errBadUpload))
				return
			}
			wi, err := sb.writeFile(target, part, md)
			part.Close()
			if err != nil {
				httpFSError(w, err)
				return
			}
			written = append(written, wi)
		}
		if len(written) == 0 {
			httpFSError(w, fmt.Errorf("%w: no part named \"file\"", errBadUpload))
			return
		}
	} else {
		if dest == "" {
			httpFSError(w, fmt.Errorf("%w: missing path", errBadUpload))
			return
		}
		wi, err := sb.writeFile(dest, body, md)
		if err != nil {
			httpFSError(w, err)
			return
		}
		written = append(written, wi)
	}
	writeJSON(w, http.StatusOK, written)
}

// writeFile writes r to sandbox path p (creating parents), truncating,
// and gives it metadata md (replacing any it had).
func (sb *sandbox) writeFile(p string, r io.Reader, md map[string]string) (envd.WriteInfo, error) {
	vp, err := sb.resolve(p)
	if err != nil {
		return envd.WriteInfo{}, err
	}
	if vp.rel == "." {
		return envd.WriteInfo{}, fmt.Errorf("%w: %s", errIsDir, vp.view())
	}
	root, err := vp.open()
	if err != nil {
		return envd.WriteInfo{}, err
	}
	defer root.Close()
	if err := sb.mkdirAll(root, path.Dir(vp.rel)); err != nil {
		return envd.WriteInfo{}, fmt.Errorf("create parent: %w", err)
	}
	// O_NONBLOCK: a FIFO planted by the sandbox must not hang the host.
	f, err := root.OpenFile(vp.rel, os.O_WRONLY|os.O_CREATE|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		if errors.Is(err, syscall.EISDIR) {
			return envd.WriteInfo{}, fmt.Errorf("%w: %s", errIsDir, vp.view())
		}
		if errors.Is(err, syscall.ENXIO) {
			return envd.WriteInfo{}, fmt.Errorf("%w: %s is not a regular file", errBadUpload, vp.view())
		}
		return envd.WriteInfo{}, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return envd.WriteInfo{}, fmt.Errorf("%w: %s is not a regular file", errBadUpload, vp.view())
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return envd.WriteInfo{}, err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		if errors.Is(err, syscall.ENOSPC) {
			return envd.WriteInfo{}, err
		}
		return envd.WriteInfo{}, fmt.Errorf("%w: write %s: %v", errBadUpload, vp.view(), err)
	}
	if err := setMetadata(f, md); err != nil {
		f.Close()
		return envd.WriteInfo{}, err
	}
	if err := f.Close(); err != nil {
		return envd.WriteInfo{}, err
	}
	if err := sb.own(root, vp.rel); err != nil {
		return envd.WriteInfo{}, err
	}
	return envd.WriteInfo{Name: path.Base(vp.rel), Type: "file", Path: vp.view(), Metadata: md}, nil
}

// openResolved resolves sandbox path p (following symlinks, as resolve
// does) and opens its area root; the caller closes root. Errors are
// resolve's (ErrOutsideSandbox, I/O) or os.OpenRoot's.
func (sb *sandbox) openResolved(p string) (vpath, *os.Root, error) {
	vp, err := sb.resolve(p)
	if err != nil {
		return vpath{}, nil, err
	}
	root, err := vp.open()
	if err != nil {
		return vpath{}, nil, err
	}
	return vp, root, nil
}

// entryReply answers an RPC with the entry at rel inside root, named view;
// filesystem errors become Connect errors (fsError).
func (sb *sandbox) entryReply(root *os.Root, rel, view string) (*connect.Response[envd.EntryResponse], error) {
	e, err := sb.entry(root, rel, view)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&envd.EntryResponse{Entry: e}), nil
}

// rpcStat describes one path, following symlinks in the path but not a
// final one: a symlink is described as a link, as envd does.
func (h *Host) rpcStat(ctx context.Context, req *connect.Request[envd.PathRequest]) (*connect.Response[envd.EntryResponse], error) {
	sb := sandboxFrom(ctx)
	vp, err := sb.resolveNoFollow(req.Msg.Path)
	if err != nil {
		return nil, fsError(err)
	}
	root, err := vp.open()
	if err != nil {
		return nil, fsError(err)
	}
	defer root.Close()
	return sb.entryReply(root, vp.rel, vp.view())
}

// rpcMakeDir creates a directory and its parents; already_exists if it
// exists.
func (h *Host) rpcMakeDir(ctx context.Context, req *connect.Request[envd.PathRequest]) (*connect.Response[envd.EntryResponse], error) {
	sb := sandboxFrom(ctx)
	vp, root, err := sb.openResolved(req.Msg.Path)
	if err != nil {
		return nil, fsError(err)
	}
	defer root.Close()
	if _, err := root.Lstat(vp.rel); err == nil {
		return nil, fsError(fmt.Errorf("%w: %s", fs.ErrExist, vp.view()))
	}
	if err := sb.mkdirAll(root, vp.rel); err != nil {
		return nil, fsError(err)
	}
	return sb.entryReply(root, vp.rel, vp.view())
}

// rpcListDir lists a directory down to depth levels (0 means 1); symlinks
// are reported, not followed.
func (h *Host) rpcListDir(ctx context.Context, req *connect.Request[envd.ListDirRequest]) (*connect.Response[envd.ListDirResponse], error) {
	sb := sandboxFrom(ctx)
	vp, root, err := sb.openResolved(req.Msg.Path)
	if err != nil {
		return nil, fsError(err)
	}
	defer root.Close()
	// resolve already accepted the path, so virtualPath cannot fail here.
	view, err := sb.virtualPath(req.Msg.Path)
	if err != nil {
		return nil, fsError(err)
	}
	depth := int(req.Msg.Depth)
	if depth <= 0 {
		depth = 1
	}
	fi, err := root.Stat(vp.rel)
	if err != nil {
		return nil, fsError(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", view))
	}
	out := &envd.ListDirResponse{Entries: []envd.EntryInfo{}}
	var walk func(rel, view string, level int) error
	walk = func(rel, view string, level int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := root.Open(rel)
		if err != nil {
			return err
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return err
		}
		slices.Sort(names)
		for _, name := range names {
			crel, cview := path.Join(rel, name), path.Join(view, name)
			e, err := sb.entry(root, crel, cview)
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed meanwhile
			}
			if err != nil {
				return err
			}
			out.Entries = append(out.Entries, e)
			if e.Type == envd.FileTypeDirectory && level < depth {
				if err := walk(crel, cview, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(vp.rel, view, 1); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(out), nil
}

// rpcMove renames source to destination (creating destination's parents).
func (h *Host) rpcMove(ctx context.Context, req *connect.Request[envd.MoveRequest]) (*connect.Response[envd.EntryResponse], error) {
	sb := sandboxFrom(ctx)
	src, err := sb.resolveNoFollow(req.Msg.Source)
	if err != nil {
		return nil, fsError(err)
	}
	dst, err := sb.resolveNoFollow(req.Msg.Destination)
	if err != nil {
		return nil, fsError(err)
	}
	if src.areaRoot != dst.areaRoot {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("move across /home/user, /tmp and /mnt is not supported"))
	}
	root, err := src.open()
	if err != nil {
		return nil, fsError(err)
	}
	defer root.Close()
	if err := sb.mkdirAll(root, path.Dir(dst.rel)); err != nil {
		return nil, fsError(err)
	}
	if err := root.Rename(src.rel, dst.rel); err != nil {
		return nil, fsError(err)
	}
	return sb.entryReply(root, dst.rel, dst.view())
}

// rpcRemove removes a file or a directory tree; a missing path is not an
// error (as on E2B).
func (h *Host) rpcRemove(ctx context.Context, req *connect.Request[envd.PathRequest]) (*connect.Response[envd.Empty], error) {
	sb := sandboxFrom(ctx)
	vp, err := sb.resolveNoFollow(req.Msg.Path)
	if err != nil {
		return nil, fsError(err)
	}
	if vp.rel == "." {
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("cannot remove %s", vp.view()))
	}
	root, err := vp.open()
	if err != nil {
		return nil, fsError(err)
	}
	defer root.Close()
	if err := root.RemoveAll(vp.rel); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&envd.Empty{}), nil
}

// rawFileName is a part's Content-Disposition filename as sent: the SDK
// puts the full destination path there, which multipart.Part.FileName
// would reduce to its base name.
func rawFileName(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}
