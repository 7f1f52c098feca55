package provisioner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// fakeProv is a scriptable provisioner: each route answers with its func,
// or 404 when nil. It records create bodies and deletes.
type fakeProv struct {
	t        *testing.T
	srv      *httptest.Server
	mu       sync.Mutex
	caps     http.HandlerFunc
	list     http.HandlerFunc
	create   http.HandlerFunc
	get      http.HandlerFunc
	discover http.HandlerFunc
	del      http.HandlerFunc
	bodies   []map[string]any
	deletes  []string
	headers  []http.Header
	probes   atomic.Int32
}

func newFakeProv(t *testing.T) *fakeProv {
	f := &fakeProv{t: t}
	mux := http.NewServeMux()
	route := func(h func() http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			f.headers = append(f.headers, r.Header.Clone())
			fn := h()
			f.mu.Unlock()
			if fn == nil {
				http.NotFound(w, r)
				return
			}
			fn(w, r)
		}
	}
	mux.HandleFunc("GET /api/capabilities", route(func() http.HandlerFunc { f.probes.Add(1); return f.caps }))
	mux.HandleFunc("GET /api/sandboxes", route(func() http.HandlerFunc { return f.list }))
	mux.HandleFunc("POST /api/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var m map[string]any
		_ = json.NewDecoder(r.Body).Decode(&m)
		f.mu.Lock()
		f.bodies = append(f.bodies, m)
		fn := f.create
		f.mu.Unlock()
		if fn == nil {
			http.NotFound(w, r)
			return
		}
		fn(w, r)
	})
	mux.HandleFunc("GET /api/sandboxes/{id}", route(func() http.HandlerFunc { return f.get }))
	mux.HandleFunc("DELETE /api/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.deletes = append(f.deletes, r.PathValue("id"))
		fn := f.del
		f.mu.Unlock()
		if fn == nil {
			w.WriteHeader(http.StatusOK)
			return
		}
		fn(w, r)
	})
	mux.HandleFunc("GET /api/reconciliation/sandboxes/{id}", route(func() http.HandlerFunc { return f.discover }))
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeProv) set(fn func()) { f.mu.Lock(); fn(); f.mu.Unlock() }

// reply answers status with v as JSON.
func reply200(v any) http.HandlerFunc { return replyJSON(http.StatusOK, v) }

func replyJSON(status int, v any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
}

func newClient(t *testing.T, base string, mod func(*Options)) *Client {
	t.Helper()
	o := Options{BaseURL: base, PollInterval: 10 * time.Millisecond,
		Timeouts: Timeouts{Get: 2 * time.Second, Delete: 2 * time.Second, List: 2 * time.Second, Probe: 2 * time.Second, Create: 2 * time.Second, KillConfirm: time.Second}}
	if mod != nil {
		mod(&o)
	}
	c, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// deadURL is a loopback URL nobody listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

func TestListTolerance(t *testing.T) {
	tests := []struct {
		name    string
		payload any
		want    []string // id=url
	}{
		{"skips entries without id or url", map[string]any{"sandboxes": []any{
			map[string]any{"sandbox_id": "abc123", "sandbox_url": "http://k3s:31001"},
			map[string]any{"sandbox_id": "missing-url"},
			map[string]any{"sandbox_url": "http://k3s:31002"},
		}}, []string{"abc123=http://k3s:31001"}},
		{"skips non-object entries", map[string]any{"sandboxes": []any{
			map[string]any{"sandbox_id": "abc123", "sandbox_url": "http://k3s:31001"}, "bad-entry", 123, nil,
		}}, []string{"abc123=http://k3s:31001"}},
		{"payload not an object", []any{map[string]any{"sandbox_id": "abc", "sandbox_url": "http://k3s:31001"}}, nil},
		{"sandboxes not a list", map[string]any{"sandboxes": map[string]any{"sandbox_id": "abc"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeProv(t)
			f.set(func() { f.list = reply200(tt.payload) })
			got, err := newClient(t, f.srv.URL, nil).ListSandboxes(context.Background())
			if err != nil {
				t.Fatalf("ListSandboxes: %v", err)
			}
			var ids []string
			for _, s := range got {
				ids = append(ids, s.ID+"="+s.URL)
			}
			if strings.Join(ids, ",") != strings.Join(tt.want, ",") {
				t.Errorf("listed %v, want %v", ids, tt.want)
			}
		})
	}
}

func TestAPIKeyHeader(t *testing.T) {
	for _, key := range []string{"", "secret"} {
		f := newFakeProv(t)
		f.set(func() { f.list = reply200(map[string]any{"sandboxes": []any{}}) })
		if _, err := newClient(t, f.srv.URL, func(o *Options) { o.APIKey = key }).ListSandboxes(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := f.headers[0].Get("X-API-Key"); got != key {
			t.Errorf("X-API-Key = %q, want %q", got, key)
		}
		if _, present := f.headers[0]["X-Api-Key"]; present != (key != "") {
			t.Errorf("X-API-Key present = %v with key %q", present, key)
		}
	}
}

// An outage must never look like an empty inventory: reconcile would take
// every tracked sandbox for dead.
func TestListOutageIsAnError(t *testing.T) {
	_, err := newClient(t, deadURL(t), nil).List(context.Background(), core.ListFilter{})
	if err == nil || !core.IsAmbiguous(err) {
		t.Errorf("List over a dead port = %v, want an ambiguous error", err)
	}
	f := newFakeProv(t)
	f.set(func() { f.list = replyJSON(http.StatusServiceUnavailable, map[string]any{"detail": "down"}) })
	if _, err := newClient(t, f.srv.URL, nil).List(context.Background(), core.ListFilter{}); err == nil || !core.IsAmbiguous(err) {
		t.Errorf("List on 503 = %v, want an ambiguous error", err)
	}
}

func TestListFiltersClientSide(t *testing.T) {
	f := newFakeProv(t)
	f.set(func() {
		f.list = reply200(map[string]any{"sandboxes": []any{
			map[string]any{"sandbox_id": "a", "sandbox_url": "http://a", "thread_id": "t1", "user_id": "alice", "status": "Running", "metadata": map[string]any{}},
			map[string]any{"sandbox_id": "b", "sandbox_url": "http://b", "thread_id": "t2", "user_id": "alice", "status": "Pending", "metadata": map[string]any{}},
			map[string]any{"sandbox_id": "c", "sandbox_url": "http://c", "metadata": map[string]any{"sbx_thread": "t1", "k": "v"}},
			map[string]any{"sandbox_id": "d", "sandbox_url": "http://d", "user_id": "acme.bob", "metadata": map[string]any{}},
		}})
	})
	c := newClient(t, f.srv.URL, nil)
	tests := []struct {
		f    core.ListFilter
		want string
	}{
		{core.ListFilter{}, "a,b,c,d"},
		{core.ListFilter{Metadata: map[string]string{core.MetaTenant: "acme", core.MetaUser: "bob"}}, "d"},
		{core.ListFilter{Metadata: map[string]string{core.MetaThread: "t1"}}, "a,c"},
		{core.ListFilter{Metadata: map[string]string{core.MetaUser: "alice"}}, "a,b"},
		{core.ListFilter{Metadata: map[string]string{"k": "v"}}, "c"},
		{core.ListFilter{States: []string{"running"}}, "a,c,d"},
		{core.ListFilter{States: []string{"pending"}}, "b"},
	}
	for _, tt := range tests {
		got, err := c.List(context.Background(), tt.f)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range got {
			ids = append(ids, s.ID)
		}
		if strings.Join(ids, ",") != tt.want {
			t.Errorf("List(%+v) = %v, want %s", tt.f, ids, tt.want)
		}
	}
}

func TestReconciliationDiscovery(t *testing.T) {
	found := map[string]any{"sandbox_id": "old-id", "status": "found", "backend_namespace": "namespace-uid-1",
		"incarnation_id": "pod-uid-1", "sandbox_url": "http://sandbox-old", "thread_id": "thread-1",
		"user_id": "alice", "mount_contract_version": 1}
	tests := []struct {
		name        string
		handler     http.HandlerFunc // nil: dead port
		wantNS      string           // Options.BackendNamespace
		incarnation string
		want        string
	}{
		{"legacy route 404 is unknown", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, "", "", DiscoveryUnknown},
		{"explicit absence", reply200(map[string]any{"sandbox_id": "old-id", "status": "absent", "backend_namespace": "namespace-uid-1"}), "", "", DiscoveryAbsent},
		{"transport error is unknown", nil, "", "", DiscoveryUnknown},
		{"found with old contract", reply200(found), "", "", DiscoveryFound},
		{"found, same incarnation", reply200(found), "namespace-uid-1", "pod-uid-1", DiscoveryFound},
		{"another incarnation is absent", reply200(found), "", "pod-uid-0", DiscoveryAbsent},
		{"namespace mismatch is unknown", reply200(found), "namespace-uid-2", "", DiscoveryUnknown},
		{"absence from another namespace is unknown", reply200(map[string]any{"sandbox_id": "old-id", "status": "absent", "backend_namespace": "x"}), "namespace-uid-1", "", DiscoveryUnknown},
		{"no namespace is unknown", reply200(map[string]any{"sandbox_id": "old-id", "status": "absent"}), "", "", DiscoveryUnknown},
		{"other sandbox is unknown", reply200(map[string]any{"sandbox_id": "x", "status": "absent", "backend_namespace": "n"}), "", "", DiscoveryUnknown},
		{"malformed body is unknown", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "[1,2") }, "", "", DiscoveryUnknown},
		{"5xx is unknown", replyJSON(500, map[string]any{"detail": "x"}), "", "", DiscoveryUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := deadURL(t)
			if tt.handler != nil {
				f := newFakeProv(t)
				f.set(func() { f.discover = tt.handler })
				base = f.srv.URL
			}
			c := newClient(t, base, func(o *Options) { o.BackendNamespace = tt.wantNS })
			got := c.DiscoverForReconciliation(context.Background(), "old-id", tt.incarnation)
			if got.Status != tt.want {
				t.Fatalf("status = %s (%v), want %s", got.Status, got.Err, tt.want)
			}
			if got.Status == DiscoveryFound {
				if got.Info == nil || got.Info.ID != "old-id" || got.Info.Contract != 1 || got.BackendNamespace != "namespace-uid-1" || got.IncarnationID != "pod-uid-1" {
					t.Errorf("found = %+v info %+v", got, got.Info)
				}
			}
			if got.Status == DiscoveryUnknown && got.Info != nil {
				t.Errorf("unknown carries info %+v", got.Info)
			}
		})
	}
}

// capsV returns a capabilities handler advertising version v.
func capsV(v int) http.HandlerFunc {
	return reply200(map[string]any{"mount_contract_version": v, "backend_namespace": "ns"})
}

func sandboxReply(id, user, thread string, version any) map[string]any {
	m := map[string]any{"sandbox_id": id, "sandbox_url": "http://k3s:31001"}
	if user != "" {
		m["user_id"] = user
	}
	if thread != "" {
		m["thread_id"] = thread
	}
	if version != nil {
		m["mount_contract_version"] = version
	}
	return m
}

func TestCreate(t *testing.T) {
	type want struct {
		err      error // errors.Is target; nil: success
		changed  bool  // *MountContractChangedError
		posted   bool
		deleted  bool
		reprobes bool // capability detection restarted
	}
	tests := []struct {
		name    string
		caps    http.HandlerFunc
		req     CreateRequest
		reply   http.HandlerFunc
		want    want
		checkFn func(t *testing.T, body map[string]any, sb Sandbox)
	}{
		{name: "verified identity", caps: capsV(2), req: CreateRequest{SandboxID: "abc123", ThreadID: "thread-1", UserID: "alice"},
			reply: reply200(sandboxReply("abc123", "alice", "thread-1", 2)), want: want{posted: true},
			checkFn: func(t *testing.T, body map[string]any, sb Sandbox) {
				if sb.UserID != "alice" || sb.ThreadID != "thread-1" || sb.Contract != 2 || sb.URL != "http://k3s:31001" {
					t.Errorf("sandbox = %+v", sb)
				}
				if body["required_mount_contract_version"] != float64(2) || body["user_id"] != "alice" || body["thread_id"] != "thread-1" || body["sandbox_id"] != "abc123" {
					t.Errorf("body = %v", body)
				}
			}},
		{name: "mismatched user", caps: capsV(2), req: CreateRequest{SandboxID: "abc123", ThreadID: "thread-1", UserID: "alice"},
			reply: reply200(sandboxReply("abc123", "mallory", "thread-1", 2)), want: want{err: ErrIdentityMismatch, posted: true, deleted: true}},
		{name: "mismatched thread", caps: capsV(2), req: CreateRequest{SandboxID: "abc123", ThreadID: "thread-1", UserID: "alice"},
			reply: reply200(sandboxReply("abc123", "alice", "other-thread", 2)), want: want{err: ErrIdentityMismatch, posted: true, deleted: true}},
		{name: "verified reply without version", caps: capsV(2), req: CreateRequest{SandboxID: "abc123", ThreadID: "thread-1", UserID: "alice"},
			reply: reply200(sandboxReply("abc123", "", "", nil)), want: want{changed: true, posted: true, deleted: true, reprobes: true}},
		{name: "verified reply with older version", caps: capsV(2), req: CreateRequest{SandboxID: "abc123", ThreadID: "thread-1", UserID: "alice"},
			reply: reply200(sandboxReply("abc123", "alice", "thread-1", 1)), want: want{changed: true, posted: true, deleted: true, reprobes: true}},
		{name: "legacy reply advertising a version", caps: capsV(0), req: CreateRequest{SandboxID: "abc123", ThreadID: "thread-1", UserID: "default"},
			reply: reply200(sandboxReply("abc123", "", "", 1)), want: want{changed: true, posted: true, deleted: true, reprobes: true}},
		{name: "409 mount_contract_changed", caps: capsV(2), req: CreateRequest{SandboxID: "sandbox-v2", ThreadID: "thread-1", UserID: "alice"},
			reply: replyJSON(409, map[string]any{"detail": map[string]any{"code": "mount_contract_changed", "expected": 2, "actual": 3}}),
			want:  want{changed: true, posted: true, reprobes: true}},
		{name: "legacy string version", caps: capsV(0), req: CreateRequest{SandboxID: "sandbox-v0", UserID: "default"},
			reply: reply200(sandboxReply("sandbox-v0", "", "", "2")), want: want{err: ErrIdentityMismatch, posted: true, deleted: true}},
		{name: "legacy bool version", caps: capsV(0), req: CreateRequest{SandboxID: "sandbox-v0", UserID: "default"},
			reply: reply200(sandboxReply("sandbox-v0", "", "", true)), want: want{err: ErrIdentityMismatch, posted: true, deleted: true}},
		{name: "future compatible version", caps: capsV(3), req: CreateRequest{SandboxID: "sandbox-v3", ThreadID: "thread-1", UserID: "alice"},
			reply: reply200(sandboxReply("sandbox-v3", "alice", "thread-1", 3)), want: want{posted: true},
			checkFn: func(t *testing.T, body map[string]any, sb Sandbox) {
				if sb.Contract != 3 || body["required_mount_contract_version"] != float64(3) {
					t.Errorf("contract %d, body %v", sb.Contract, body)
				}
			}},
		{name: "legacy refuses non-default user without posting", caps: nil /* 404: legacy */, req: CreateRequest{SandboxID: "sandbox-1", ThreadID: "shared-thread", UserID: "alice"},
			want: want{err: ErrCannotIsolateUser}},
		{name: "unreachable capabilities refuse non-default user", caps: replyJSON(503, nil), req: CreateRequest{SandboxID: "sandbox-1", UserID: "alice"},
			want: want{err: ErrCannotIsolateUser}},
		{name: "required contract above known: restart without posting", caps: capsV(0), req: CreateRequest{SandboxID: "sandbox-v2", UserID: "default", RequiredContract: 2},
			want: want{changed: true, reprobes: true}},
		{name: "anonymous thread on legacy", caps: nil, req: CreateRequest{SandboxID: "anon123"},
			reply: reply200(sandboxReply("anon123", "", "", nil)), want: want{posted: true},
			checkFn: func(t *testing.T, body map[string]any, sb Sandbox) {
				if v, ok := body["thread_id"]; !ok || v != nil {
					t.Errorf("thread_id = %v (present %v), want null", v, ok)
				}
				if body["user_id"] != DefaultUser || body["required_mount_contract_version"] != float64(0) {
					t.Errorf("body = %v", body)
				}
				if _, ok := body["extra_mounts"]; ok {
					t.Errorf("extra_mounts sent without mounts: %v", body)
				}
			}},
		{name: "extra mounts forwarded", caps: capsV(2), req: CreateRequest{SandboxID: "abc123", ThreadID: "thread-1", UserID: "alice",
			ExtraMounts: []Mount{{HostPath: "/state/a", ContainerPath: "/mnt/a", ReadOnly: true}}},
			reply: reply200(sandboxReply("abc123", "alice", "thread-1", 2)), want: want{posted: true},
			checkFn: func(t *testing.T, body map[string]any, sb Sandbox) {
				m, _ := body["extra_mounts"].([]any)
				if len(m) != 1 || m[0].(map[string]any)["container_path"] != "/mnt/a" || m[0].(map[string]any)["read_only"] != true {
					t.Errorf("extra_mounts = %v", body["extra_mounts"])
				}
			}},
		{name: "5xx is ambiguous", caps: capsV(2), req: CreateRequest{SandboxID: "abc123", UserID: "alice"},
			reply: replyJSON(500, map[string]any{"detail": "boom"}), want: want{posted: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeProv(t)
			f.set(func() { f.caps, f.create = tt.caps, tt.reply })
			c := newClient(t, f.srv.URL, nil)
			sb, err := c.CreateSandbox(context.Background(), tt.req)
			var mc *MountContractChangedError
			switch {
			case tt.want.changed:
				if !errors.As(err, &mc) {
					t.Fatalf("err = %v, want *MountContractChangedError", err)
				}
			case tt.want.err != nil:
				if !errors.Is(err, tt.want.err) {
					t.Fatalf("err = %v, want %v", err, tt.want.err)
				}
				if core.IsAmbiguous(err) {
					t.Errorf("err = %v is ambiguous, want a certain refusal", err)
				}
			case tt.name == "5xx is ambiguous":
				if err == nil || !core.IsAmbiguous(err) {
					t.Fatalf("err = %v, want ambiguous", err)
				}
			default:
				if err != nil {
					t.Fatalf("CreateSandbox: %v", err)
				}
			}
			f.mu.Lock()
			posted, deleted := len(f.bodies) > 0, len(f.deletes) > 0
			var body map[string]any
			if posted {
				body = f.bodies[0]
			}
			f.mu.Unlock()
			if posted != tt.want.posted || deleted != tt.want.deleted {
				t.Errorf("posted=%v deleted=%v, want posted=%v deleted=%v", posted, deleted, tt.want.posted, tt.want.deleted)
			}
			if tt.want.reprobes {
				before := f.probes.Load()
				c.ServiceCapabilities(context.Background())
				if f.probes.Load() != before+1 {
					t.Errorf("capability detection did not restart (probes %d -> %d)", before, f.probes.Load())
				}
			}
			if tt.name == "409 mount_contract_changed" && (mc.Expected != 2 || mc.Actual != 3) {
				t.Errorf("changed = %+v, want expected 2 actual 3", mc)
			}
			if tt.checkFn != nil {
				tt.checkFn(t, body, sb)
			}
		})
	}
}

// The reply is validated against the contract known when the create
// started, even if detection restarts while the POST is in flight.
func TestCreateKeepsFrozenContract(t *testing.T) {
	f := newFakeProv(t)
	var c *Client
	f.set(func() {
		f.caps = capsV(2)
		f.create = func(w http.ResponseWriter, r *http.Request) {
			c.invalidateCapabilities()
			f.set(func() { f.caps = capsV(0) })
			reply200(map[string]any{"sandbox_id": "abc123", "sandbox_url": "http://legacy.local"})(w, r)
		}
	})
	c = newClient(t, f.srv.URL, nil)
	_, err := c.CreateSandbox(context.Background(), CreateRequest{SandboxID: "abc123", ThreadID: "thread-1", UserID: "alice"})
	var mc *MountContractChangedError
	if !errors.As(err, &mc) {
		t.Fatalf("err = %v, want *MountContractChangedError", err)
	}
}

func TestCreateTransportFailureIsAmbiguous(t *testing.T) {
	f := newFakeProv(t)
	f.set(func() { f.caps = capsV(2) })
	c := newClient(t, f.srv.URL, nil)
	c.ServiceCapabilities(context.Background())
	c.base = deadURL(t) // capabilities are cached; the POST fails in transport
	_, err := c.CreateSandbox(context.Background(), CreateRequest{SandboxID: "abc123", UserID: "alice"})
	if err == nil || !core.IsAmbiguous(err) || !strings.Contains(err.Error(), "provisioner create failed") {
		t.Errorf("err = %v, want an ambiguous 'provisioner create failed'", err)
	}
}

func TestProbeBackoff(t *testing.T) {
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
	for i, w := range want {
		if got := probeBackoff(i + 1); got != w*time.Second {
			t.Errorf("probeBackoff(%d) = %s, want %s", i+1, got, w*time.Second)
		}
	}
	if got := probeBackoff(1 << 40); got != 30*time.Second {
		t.Errorf("probeBackoff(huge) = %s", got)
	}

	now := time.Unix(100, 0)
	c := newClient(t, deadURL(t), func(o *Options) { o.Now = func() time.Time { return now } })
	c.failures = 1024
	c.ServiceCapabilities(context.Background())
	if c.failures != 1025 || !c.nextProbe.Equal(now.Add(30*time.Second)) {
		t.Errorf("after failure: failures %d next %v, want 1025 and %v", c.failures, c.nextProbe, now.Add(30*time.Second))
	}
}

func TestCapabilitiesCacheAndSingleFlight(t *testing.T) {
	f := newFakeProv(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 16)
	f.set(func() {
		f.caps = func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-release
			capsV(2)(w, r)
		}
	})
	c := newClient(t, f.srv.URL, nil)
	var wg sync.WaitGroup
	results := make(chan Capabilities, 8)
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); results <- c.ServiceCapabilities(context.Background()) }()
	}
	<-entered
	close(release)
	wg.Wait()
	close(results)
	for r := range results {
		if !r.Known || r.Contract != 2 {
			t.Errorf("caller saw %+v, want known contract 2", r)
		}
	}
	c.ServiceCapabilities(context.Background()) // fresh: cached
	if n := f.probes.Load(); n != 1 {
		t.Errorf("probes = %d, want 1 (concurrent callers wait for the one in flight; fresh answers are cached)", n)
	}
}

func TestAliveAndGet(t *testing.T) {
	tests := []struct {
		name      string
		handler   http.HandlerFunc
		alive     bool
		wantErr   string
		wantGone  bool
		ambiguous bool
	}{
		{"running", reply200(map[string]any{"status": "Running"}), true, "", false, false},
		{"pending", reply200(map[string]any{"status": "Pending"}), false, "", false, false},
		{"404", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, false, "", true, false},
		{"503", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503); io.WriteString(w, "unavailable") }, false, "HTTP 503 unavailable", false, true},
		{"dead port", nil, false, "Provisioner health check failed for abc123", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := deadURL(t)
			if tt.handler != nil {
				f := newFakeProv(t)
				f.set(func() { f.get = tt.handler })
				base = f.srv.URL
			}
			c := newClient(t, base, nil)
			alive, err := c.Alive(context.Background(), "abc123")
			if alive != tt.alive || (err != nil) != (tt.wantErr != "") || (err != nil && !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tt.wantErr))) {
				t.Errorf("Alive = %v, %v; want %v, error containing %q", alive, err, tt.alive, tt.wantErr)
			}
			_, err = c.Info(context.Background(), "abc123")
			if errors.Is(err, core.ErrSandboxGone) != tt.wantGone {
				t.Errorf("Info = %v, want gone=%v", err, tt.wantGone)
			}
			if tt.ambiguous && !core.IsAmbiguous(err) {
				t.Errorf("Info = %v, want ambiguous", err)
			}
		})
	}
}

func TestDelete(t *testing.T) {
	for _, status := range []int{200, 202, 204, 404} {
		f := newFakeProv(t)
		f.set(func() { f.del = func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) } })
		if err := newClient(t, f.srv.URL, nil).DeleteSandbox(context.Background(), "abc123"); err != nil {
			t.Errorf("DeleteSandbox on %d = %v, want nil", status, err)
		}
		if len(f.deletes) != 1 || f.deletes[0] != "abc123" {
			t.Errorf("deletes = %v", f.deletes)
		}
	}
	if err := newClient(t, deadURL(t), nil).DeleteSandbox(context.Background(), "abc123"); err == nil || !core.IsAmbiguous(err) {
		t.Errorf("DeleteSandbox over a dead port = %v, want ambiguous", err)
	}
	f := newFakeProv(t)
	f.set(func() { f.del = replyJSON(403, map[string]any{"detail": "no"}) })
	if err := newClient(t, f.srv.URL, nil).DeleteSandbox(context.Background(), "abc123"); err == nil || core.IsAmbiguous(err) {
		t.Errorf("DeleteSandbox on 403 = %v, want a certain refusal", err)
	}
}

// Kill is confirmed only once the provisioner reports the sandbox absent.
func TestKillWaitsForAbsence(t *testing.T) {
	f := newFakeProv(t)
	var gets atomic.Int32
	f.set(func() {
		f.get = func(w http.ResponseWriter, r *http.Request) {
			if gets.Add(1) < 3 {
				reply200(map[string]any{"sandbox_id": "abc123", "sandbox_url": "http://x", "status": "Terminating"})(w, r)
				return
			}
			http.NotFound(w, r)
		}
	})
	if err := newClient(t, f.srv.URL, nil).Kill(context.Background(), "abc123"); err != nil {
		t.Errorf("Kill = %v, want nil after the pod went away", err)
	}
	f.set(func() { f.get = reply200(map[string]any{"status": "Terminating"}) })
	if err := newClient(t, f.srv.URL, func(o *Options) { o.Timeouts.KillConfirm = 50 * time.Millisecond }).Kill(context.Background(), "abc123"); err == nil || !core.IsAmbiguous(err) {
		t.Errorf("Kill of a pod that never goes = %v, want ambiguous", err)
	}
}

// A provisioner without the metadata extension cannot prove absence for a
// filter on other keys: List fails (ambiguously) rather than return nothing.
func TestListWithoutMetadataSupport(t *testing.T) {
	f := newFakeProv(t)
	f.set(func() {
		f.list = reply200(map[string]any{"sandboxes": []any{
			map[string]any{"sandbox_id": "a", "sandbox_url": "http://a", "thread_id": "t1"},
		}})
	})
	c := newClient(t, f.srv.URL, nil)
	_, err := c.List(context.Background(), core.ListFilter{Metadata: map[string]string{core.MetaDeployment: "dev"}})
	if !errors.Is(err, ErrNoMetadata) || !core.IsAmbiguous(err) {
		t.Errorf("List(deployment) = %v, want ambiguous ErrNoMetadata", err)
	}
	got, err := c.List(context.Background(), core.ListFilter{Metadata: map[string]string{core.MetaThread: "t1"}})
	if err != nil || len(got) != 1 {
		t.Errorf("List(thread) = %v, %v; want the one sandbox", got, err)
	}
}

// Per-call timeouts default to create 30 s, delete 15 s,
// get/list 10 s, capability probe 5 s.
func TestDefaultTimeouts(t *testing.T) {
	c, err := New(Options{BaseURL: "http://provisioner:8002"})
	if err != nil {
		t.Fatal(err)
	}
	got := c.timeouts
	if got.Create != 30*time.Second || got.Delete != 15*time.Second || got.Get != 10*time.Second || got.List != 10*time.Second || got.Probe != 5*time.Second {
		t.Errorf("timeouts = %+v", got)
	}
	for _, bad := range []string{"", "provisioner:8002", "ftp://x", "http://"} {
		if _, err := New(Options{BaseURL: bad}); err == nil {
			t.Errorf("New(%q) succeeded, want an error", bad)
		}
	}
}

// A provisioner that never answers is cut off by the call's timeout and
// reported as ambiguous.
func TestHungProvisionerTimesOut(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	t.Cleanup(func() { close(block); srv.Close() })
	c := newClient(t, srv.URL, func(o *Options) { o.Timeouts.Get = 100 * time.Millisecond })
	start := time.Now()
	_, err := c.Info(context.Background(), "abc123")
	if err == nil || !core.IsAmbiguous(err) || errors.Is(err, core.ErrSandboxGone) || time.Since(start) > 5*time.Second {
		t.Errorf("Info against a hung provisioner = %v after %s, want an ambiguous timeout", err, time.Since(start))
	}
}

func TestProvisionerUser(t *testing.T) {
	tests := []struct {
		md   map[string]string
		want string
	}{
		{map[string]string{core.MetaTenant: "acme", core.MetaUser: "u-1"}, "acme.u-1"},
		{map[string]string{core.MetaUser: "u-1"}, "u-1"},
		{map[string]string{core.MetaTenant: "acme"}, ""},
		{nil, ""},
	}
	for _, tt := range tests {
		if got := ProvisionerUser(tt.md); got != tt.want {
			t.Errorf("ProvisionerUser(%v) = %q, want %q", tt.md, got, tt.want)
		}
	}
}

// With Options.Deployment, the sandbox ids the client creates carry the
// deployment's tag, so a listing without metadata can still be filtered by
// deployment (reconcile's inventory): tagged ids match, others do not.
func TestListDerivesDeploymentFromSandboxID(t *testing.T) {
	mine, err := newSandboxID("dev")
	if err != nil {
		t.Fatal(err)
	}
	theirs, _ := newSandboxID("other")
	f := newFakeProv(t)
	f.set(func() {
		f.list = reply200(map[string]any{"sandboxes": []any{
			map[string]any{"sandbox_id": mine, "sandbox_url": "http://a", "thread_id": "t1", "user_id": "acme.alice", "status": "Running"},
			map[string]any{"sandbox_id": theirs, "sandbox_url": "http://b", "thread_id": "t2", "user_id": "acme.bob", "status": "Running"},
		}})
	})
	c := newClient(t, f.srv.URL, func(o *Options) { o.Deployment = "dev" })
	got, err := c.List(context.Background(), core.ListFilter{Metadata: map[string]string{core.MetaDeployment: "dev"}})
	if err != nil || len(got) != 1 || got[0].ID != mine {
		t.Fatalf("List(deployment dev) = %v, %v; want only %s", got, err, mine)
	}
	if md := got[0].Metadata; md[core.MetaTenant] != "acme" || md[core.MetaUser] != "alice" || md[core.MetaThread] != "t1" {
		t.Errorf("derived metadata = %v, want tenant acme, user alice, thread t1", md)
	}
}
