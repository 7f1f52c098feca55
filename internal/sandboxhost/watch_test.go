package sandboxhost

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// TestWatchDir checks WatchDir as E2B's envd serves it: start first, then
// changes named relative to the directory (below it when recursive, with
// entry info when asked), and not_found for a missing directory.
func TestWatchDir(t *testing.T) {
	srv := startHost(t, IsolationNone)
	c := newEnvd(srv, createSandbox(t, srv, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	missing, err := serverStream[envd.WatchDirRequest, envd.WatchDirResponse](ctx, c, envd.ProcedureWatchDir, &envd.WatchDirRequest{Path: "nope"})
	if err == nil && (missing.Receive() || connect.CodeOf(missing.Err()) != connect.CodeNotFound) {
		t.Errorf("watch of a missing directory: %v, want not_found", missing.Err())
	}
	if _, err := unary[envd.PathRequest, envd.EntryResponse](ctx, c, envd.ProcedureMakeDir, &envd.PathRequest{Path: "w/sub"}); err != nil {
		t.Fatal(err)
	}
	s, err := serverStream[envd.WatchDirRequest, envd.WatchDirResponse](ctx, c, envd.ProcedureWatchDir, &envd.WatchDirRequest{Path: "/home/user/w", Recursive: true, IncludeEntry: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() || s.Msg().Start == nil {
		t.Fatalf("first message is not start: %+v %v", s.Msg(), s.Err())
	}
	for _, p := range []string{"w/top.txt", "w/sub/deep.txt"} {
		if status, body := c.files(t, "POST", "path="+p, strings.NewReader("x"), nil); status != 200 {
			t.Fatalf("upload %s: %d %s", p, status, body)
		}
	}
	want := map[string]bool{"top.txt": false, "sub/deep.txt": false}
	for s.Receive() {
		ev := s.Msg().Filesystem
		if ev == nil || ev.Type != envd.EventTypeCreate {
			continue
		}
		if _, ok := want[ev.Name]; ok {
			want[ev.Name] = true
			if ev.Entry == nil || ev.Entry.Path != "/home/user/w/"+ev.Name {
				t.Errorf("create %s: entry %+v, want its entry info", ev.Name, ev.Entry)
			}
		}
		if want["top.txt"] && want["sub/deep.txt"] {
			return
		}
	}
	t.Errorf("stream ended (%v) before create events for %v", s.Err(), want)
}
