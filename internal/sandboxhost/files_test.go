package sandboxhost

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// multipartBody builds a multipart/form-data body with "file" parts.
func multipartBody(t *testing.T, files map[string]string) (*bytes.Buffer, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for name, content := range files {
		fw, err := mw.CreateFormFile("file", name)
		if err != nil {
			t.Fatal(err)
		}
		fw.Write([]byte(content))
	}
	mw.Close()
	return &buf, mw.FormDataContentType()
}

func TestFilesWriteRead(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, nil)
	c := newEnvd(srv, sb)
	home := srv.Host.mustGet(t, sb.SandboxID).home

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("zipped"))
	zw.Close()

	mp, mpType := multipartBody(t, map[string]string{"ignored-name": "multi"})
	mp2, mp2Type := multipartBody(t, map[string]string{"/home/user/many/one.txt": "1"})
	tests := []struct {
		name     string
		query    string
		body     *bytes.Buffer
		hdr      map[string]string
		wantPath string
		want     string
	}{
		{"multipart with path", "path=" + url.QueryEscape("/home/user/dir/a.txt"), mp, map[string]string{"Content-Type": mpType}, "/home/user/dir/a.txt", "multi"},
		{"multipart, path from filename", "", mp2, map[string]string{"Content-Type": mp2Type}, "/home/user/many/one.txt", "1"},
		{"raw relative path", "path=rel/b.bin", bytes.NewBufferString("raw\x00bytes"), map[string]string{"Content-Type": "application/octet-stream"}, "/home/user/rel/b.bin", "raw\x00bytes"},
		{"raw gzip", "path=/tmp/z.txt", &gz, map[string]string{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}, "/tmp/z.txt", "zipped"},
		{"tilde", "path=~/t.txt", bytes.NewBufferString("tilde"), nil, "/home/user/t.txt", "tilde"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := c.files(t, "POST", tc.query, tc.body, tc.hdr)
			if status != 200 {
				t.Fatalf("write status %d body %s", status, body)
			}
			var infos []envd.WriteInfo
			if err := json.Unmarshal(body, &infos); err != nil || len(infos) != 1 || infos[0].Path != tc.wantPath || infos[0].Type != "file" || infos[0].Name != filepath.Base(tc.wantPath) {
				t.Fatalf("write reply %s (%v), want [{name, type file, path %s}]", body, err, tc.wantPath)
			}
			status, got := c.files(t, "GET", "path="+url.QueryEscape(tc.wantPath), nil, nil)
			if status != 200 || string(got) != tc.want {
				t.Errorf("read back: status %d body %q, want %q", status, got, tc.want)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(home, "dir", "a.txt")); err != nil || string(b) != "multi" {
		t.Errorf("host file = %q, %v", b, err)
	}

	var e e2bapi.Error
	status, body := c.files(t, "GET", "path=/home/user/missing", nil, nil)
	if json.Unmarshal(body, &e); status != 404 || e.Message == "" {
		t.Errorf("missing file: status %d body %s, want 404 JSON", status, body)
	}
	if status, _ := c.files(t, "GET", "path=/home/user/dir", nil, nil); status != 400 {
		t.Errorf("read a directory: status %d, want 400", status)
	}
	if status, _ := c.files(t, "POST", "", bytes.NewBufferString("x"), nil); status != 400 {
		t.Errorf("raw write without path: status %d, want 400", status)
	}
}

func TestFilesystemRPC(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, nil)
	c := newEnvd(srv, sb)
	ctx := context.Background()
	home := srv.Host.mustGet(t, sb.SandboxID).home
	os.MkdirAll(filepath.Join(home, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(home, "a", "f.txt"), []byte("12345"), 0o640)
	os.WriteFile(filepath.Join(home, "a", "b", "g.txt"), []byte("1"), 0o644)
	os.Symlink("f.txt", filepath.Join(home, "a", "link"))

	ls, err := unary[envd.ListDirRequest, envd.ListDirResponse](ctx, c, envd.ProcedureListDir, &envd.ListDirRequest{Path: "/home/user/a", Depth: 1})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]envd.EntryInfo{}
	for _, e := range ls.Entries {
		got[e.Path] = e
	}
	if len(got) != 3 || got["/home/user/a/b"].Type != envd.FileTypeDirectory || got["/home/user/a/f.txt"].Type != envd.FileTypeFile ||
		got["/home/user/a/f.txt"].Size != 5 || got["/home/user/a/f.txt"].Permissions != "-rw-r-----" ||
		got["/home/user/a/link"].Type != envd.FileTypeSymlink || got["/home/user/a/link"].SymlinkTarget == nil {
		t.Errorf("ListDir depth 1 = %+v", ls.Entries)
	}
	ls2, err := unary[envd.ListDirRequest, envd.ListDirResponse](ctx, c, envd.ProcedureListDir, &envd.ListDirRequest{Path: "a", Depth: 2})
	if err != nil || len(ls2.Entries) != 4 {
		t.Errorf("ListDir depth 2: %d entries (%v), want 4", len(ls2.Entries), err)
	}
	if _, err := unary[envd.ListDirRequest, envd.ListDirResponse](ctx, c, envd.ProcedureListDir, &envd.ListDirRequest{Path: "nope"}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("ListDir missing: %v, want not_found", err)
	}
	if _, err := unary[envd.ListDirRequest, envd.ListDirResponse](ctx, c, envd.ProcedureListDir, &envd.ListDirRequest{Path: "a/f.txt"}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("ListDir of a file: %v, want invalid_argument", err)
	}

	st, err := unary[envd.PathRequest, envd.EntryResponse](ctx, c, envd.ProcedureStat, &envd.PathRequest{Path: "/home/user/a/f.txt"})
	if err != nil || st.Entry.Type != envd.FileTypeFile || st.Entry.Size != 5 {
		t.Errorf("Stat of a file = %+v, %v; want the file", st, err)
	}
	if _, err := unary[envd.PathRequest, envd.EntryResponse](ctx, c, envd.ProcedureStat, &envd.PathRequest{Path: "x"}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Stat missing: %v, want not_found", err)
	}
	if _, err := unary[envd.PathRequest, envd.EntryResponse](ctx, c, envd.ProcedureMakeDir, &envd.PathRequest{Path: "new/deep"}); err != nil {
		t.Errorf("MakeDir: %v", err)
	}
	if _, err := unary[envd.PathRequest, envd.EntryResponse](ctx, c, envd.ProcedureMakeDir, &envd.PathRequest{Path: "new/deep"}); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("MakeDir again: %v, want already_exists", err)
	}
	if _, err := unary[envd.MoveRequest, envd.EntryResponse](ctx, c, envd.ProcedureMove, &envd.MoveRequest{Source: "a/f.txt", Destination: "moved/f.txt"}); err != nil {
		t.Errorf("Move: %v", err)
	}
	if _, err := os.Stat(filepath.Join(home, "moved", "f.txt")); err != nil {
		t.Errorf("moved file: %v", err)
	}
	if _, err := unary[envd.PathRequest, envd.Empty](ctx, c, envd.ProcedureRemove, &envd.PathRequest{Path: "a"}); err != nil {
		t.Errorf("Remove: %v", err)
	}
	if _, err := os.Stat(filepath.Join(home, "a")); !os.IsNotExist(err) {
		t.Errorf("removed dir still there: %v", err)
	}
}

func TestPathEscapeRefused(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, nil)
	c := newEnvd(srv, sb)
	s := srv.Host.mustGet(t, sb.SandboxID)
	ctx := context.Background()
	// Host /tmp paths inside a sandbox mean the sandbox's own /tmp.
	secretDir := t.TempDir()
	secret := filepath.Join(secretDir, "secret")
	os.WriteFile(secret, []byte("secret"), 0o644)
	os.WriteFile(filepath.Join(s.home, "ok.txt"), []byte("ok"), 0o644)
	for name, target := range map[string]string{
		"abs-tmp":     secret,                 // a host path under /tmp: resolves in the sandbox's /tmp
		"abs-etc":     "/etc",                 // sandbox /etc: outside the areas
		"abs-file":    "/etc/hostname",        // a host file outside the areas
		"rel-up":      "../../../../../../..", // climbs out of the home to /
		"abs-ok":      "/home/user/ok.txt",    // fine: inside
		"mnt-to-home": "/home/user",
	} {
		if err := os.Symlink(target, filepath.Join(s.home, name)); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("/home/user", filepath.Join(s.mnt, "user-data"))

	refused := []string{
		"/etc/passwd",
		"../../etc/passwd",
		"/home/user/../../etc/passwd",
		"/home/userx/f",
		"abs-etc/passwd",
		"abs-etc",
		"abs-file",
		"rel-up/etc",
		"rel-up/root",
		"/proc/self/environ",
		"/",
		"/home",
	}
	for _, p := range refused {
		t.Run("refuse "+p, func(t *testing.T) {
			status, body := c.files(t, "GET", "path="+url.QueryEscape(p), nil, nil)
			if status != http.StatusForbidden {
				t.Errorf("read %s: status %d body %q, want 403", p, status, body)
			}
			if status, _ := c.files(t, "POST", "path="+url.QueryEscape(p+"/x"), bytes.NewBufferString("pwned"), nil); status != http.StatusForbidden {
				t.Errorf("write under %s: status %d, want 403", p, status)
			}
			if _, err := unary[envd.ListDirRequest, envd.ListDirResponse](ctx, c, envd.ProcedureListDir, &envd.ListDirRequest{Path: p}); connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Errorf("ListDir %s: %v, want permission_denied", p, err)
			}
			if _, err := unary[envd.PathRequest, envd.Empty](ctx, c, envd.ProcedureRemove, &envd.PathRequest{Path: p + "/x"}); connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Errorf("Remove %s/x: %v, want permission_denied", p, err)
			}
		})
	}
	for _, p := range []string{"abs-tmp", "rel-up" + secret} {
		if status, body := c.files(t, "GET", "path="+url.QueryEscape(p), nil, nil); status != http.StatusNotFound {
			t.Errorf("read %s: status %d body %q, want 404 (the sandbox's own /tmp has no such file)", p, status, body)
		}
	}
	if status, _ := c.files(t, "POST", "path=abs-tmp", bytes.NewBufferString("pwned"), nil); status != 200 {
		t.Errorf("write through abs-tmp: status %d, want 200 (into the sandbox's /tmp)", status)
	}
	if b, _ := os.ReadFile(secret); string(b) != "secret" {
		t.Errorf("host secret changed to %q", b)
	}
	if b, err := os.ReadFile(filepath.Join(s.tmp, strings.TrimPrefix(secret, "/tmp/"))); err != nil || string(b) != "pwned" {
		t.Errorf("sandbox tmp copy = %q, %v", b, err)
	}

	allowed := map[string]string{
		"abs-ok":                "ok",
		"mnt-to-home/ok.txt":    "ok",
		"/mnt/user-data/ok.txt": "ok",
	}
	for p, want := range allowed {
		status, body := c.files(t, "GET", "path="+url.QueryEscape(p), nil, nil)
		if status != 200 || string(body) != want {
			t.Errorf("read %s: status %d body %q, want %q", p, status, body, want)
		}
	}
	// Writes through /mnt/user-data land in the home.
	if status, _ := c.files(t, "POST", "path=/mnt/user-data/outputs/r.txt", bytes.NewBufferString("r"), nil); status != 200 {
		t.Errorf("write via /mnt/user-data: status %d", status)
	}
	if b, err := os.ReadFile(filepath.Join(s.home, "outputs", "r.txt")); err != nil || string(b) != "r" {
		t.Errorf("home/outputs/r.txt = %q, %v", b, err)
	}
}

// TestResolveRaceSafe checks the os.Root backstop: a resolved path whose
// directory is swapped for an escaping symlink afterwards is refused.
func TestResolveRaceSafe(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := srv.Host.mustGet(t, createSandbox(t, srv, nil).SandboxID)
	os.MkdirAll(filepath.Join(sb.home, "d"), 0o755)
	vp, err := sb.resolve("d/f")
	if err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	os.Remove(filepath.Join(sb.home, "d"))
	os.Symlink(outside, filepath.Join(sb.home, "d"))
	root, err := vp.open()
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if f, err := root.Create(vp.rel); err == nil {
		f.Close()
		t.Error("os.Root followed an escaping symlink")
	}
	if _, err := os.Stat(filepath.Join(outside, "f")); err == nil {
		t.Error("file created outside the sandbox")
	}
}

func TestFilesSpecialFilesDoNotHang(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, nil)
	c := newEnvd(srv, sb)
	home := srv.Host.mustGet(t, sb.SandboxID).home
	if err := syscall.Mkfifo(filepath.Join(home, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if status, body := c.files(t, "GET", "path=fifo", nil, nil); status != http.StatusBadRequest {
		t.Errorf("read a FIFO: status %d body %s, want 400", status, body)
	}
	if status, body := c.files(t, "POST", "path=fifo", strings.NewReader("x"), nil); status != http.StatusBadRequest {
		t.Errorf("write a FIFO: status %d body %s, want 400", status, body)
	}
}
