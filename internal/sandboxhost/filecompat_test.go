package sandboxhost

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// TestFileEntriesAsE2B checks entry info as E2B's envd gives it: owner and
// group named "user", Stat of a symlink describes the link with an
// absolute target, and removing a missing path succeeds.
func TestFileEntriesAsE2B(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, nil)
	c := newEnvd(srv, sb)
	ctx := context.Background()
	home := srv.Host.mustGet(t, sb.SandboxID).home
	if err := os.MkdirAll(filepath.Join(home, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(home, "a", "f.txt"), []byte("12345"), 0o644)
	os.Symlink("f.txt", filepath.Join(home, "a", "link"))

	st, err := unary[envd.PathRequest, envd.EntryResponse](ctx, c, envd.ProcedureStat, &envd.PathRequest{Path: "a/link"})
	if err != nil {
		t.Fatal(err)
	}
	e := st.Entry
	if e.Type != envd.FileTypeSymlink || e.SymlinkTarget == nil || *e.SymlinkTarget != "/home/user/a/f.txt" || e.Path != "/home/user/a/link" {
		t.Errorf("Stat of a symlink = %+v (target %v), want the link with target /home/user/a/f.txt", e, deref(e.SymlinkTarget))
	}
	ls, err := unary[envd.ListDirRequest, envd.ListDirResponse](ctx, c, envd.ProcedureListDir, &envd.ListDirRequest{Path: "a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ls.Entries {
		if e.Owner != "user" || e.Group != "user" {
			t.Errorf("%s: owner %q group %q, want user user", e.Path, e.Owner, e.Group)
		}
		if e.Type == envd.FileTypeSymlink && deref(e.SymlinkTarget) != "/home/user/a/f.txt" {
			t.Errorf("listed symlink target %q, want /home/user/a/f.txt", deref(e.SymlinkTarget))
		}
	}
	if _, err := unary[envd.PathRequest, envd.Empty](ctx, c, envd.ProcedureRemove, &envd.PathRequest{Path: "no/such/path"}); err != nil {
		t.Errorf("Remove of a missing path: %v, want success", err)
	}
}

// TestFileMetadata checks that X-Metadata-* headers of an upload are the
// file's metadata in the write reply and in entry info, replaced by the
// next upload.
func TestFileMetadata(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, nil)
	c := newEnvd(srv, sb)
	ctx := context.Background()
	status, body := c.files(t, "POST", "path=m.txt", strings.NewReader("x"), map[string]string{
		"Content-Type": "application/octet-stream", "X-Metadata-Author": "mish", "x-metadata-purpose": "upload"})
	var written []envd.WriteInfo
	if status != 200 || json.Unmarshal(body, &written) != nil || len(written) != 1 || written[0].Metadata["author"] != "mish" {
		t.Fatalf("upload with metadata: %d %s", status, body)
	}
	st, err := unary[envd.PathRequest, envd.EntryResponse](ctx, c, envd.ProcedureStat, &envd.PathRequest{Path: "m.txt"})
	if err != nil || st.Entry.Metadata["author"] != "mish" || st.Entry.Metadata["purpose"] != "upload" || len(st.Entry.Metadata) != 2 {
		t.Fatalf("Stat metadata = %v, %v; want author and purpose", st.Entry.Metadata, err)
	}
	if status, body := c.files(t, "POST", "path=m.txt", strings.NewReader("y"), map[string]string{
		"Content-Type": "application/octet-stream", "X-Metadata-Author": "other"}); status != 200 {
		t.Fatalf("second upload: %d %s", status, body)
	}
	ls, err := unary[envd.ListDirRequest, envd.ListDirResponse](ctx, c, envd.ProcedureListDir, &envd.ListDirRequest{Path: "/home/user"})
	if err != nil || len(ls.Entries) != 1 {
		t.Fatalf("ListDir = %+v, %v", ls, err)
	}
	if md := ls.Entries[0].Metadata; len(md) != 1 || md["author"] != "other" {
		t.Errorf("metadata after a second upload = %v, want only author=other", md)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
