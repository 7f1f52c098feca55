package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// route is a canned answer of the fake broker.
type route struct {
	status int
	header map[string]string
	body   string
}

// fakeAPI serves canned answers keyed by "METHOD path" and records the
// Authorization header of the last request.
type fakeAPI struct {
	routes   map[string]route
	lastAuth string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.lastAuth = r.Header.Get("Authorization")
	rt, ok := f.routes[r.Method+" "+r.URL.Path]
	if !ok {
		w.WriteHeader(404)
		io.WriteString(w, `{"error":{"code":"SANDBOX_NOT_FOUND","message":"sandbox not found","retryable":false}}`)
		return
	}
	for k, v := range rt.header {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rt.status)
	io.WriteString(w, rt.body)
}

const acquireBody = `{"sandbox_id":"sb1","state":"active","source":"created","backend":"local",
 "connection":{"envd_url":"http://127.0.0.1:1","envd_access_token":"envd-secret"},"expires_at":"2026-11-29T10:00:00Z"}`

// harness runs sbx in a temp project dir whose stack points at a fake API.
type harness struct {
	t   *testing.T
	dir string
	api *fakeAPI
}

func newHarness(t *testing.T, routes map[string]route) *harness {
	t.Helper()
	api := &fakeAPI{routes: routes}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	writeStack(t, dir, `{"api_url":"`+srv.URL+`","tokens":{"dev":"dev-token","other":"other-token"}}`)
	return &harness{t: t, dir: dir, api: api}
}

func (h *harness) run(env map[string]string, args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	a := &App{Stdout: &out, Stderr: &errb, Getenv: envOf(env), Dir: h.dir}
	code = a.Run(context.Background(), args)
	return code, out.String(), errb.String()
}

func TestAcquirePrintsIDAndStoresConnection(t *testing.T) {
	h := newHarness(t, map[string]route{"POST /v1/sandboxes/acquire": {status: 200, body: acquireBody}})
	code, out, errOut := h.run(nil, "acquire", "--user", "u1", "--thread", "t1")
	if code != ExitOK {
		t.Fatalf("exit = %d, want 0 (stderr %q)", code, errOut)
	}
	if out != "sb1\n" {
		t.Errorf("stdout = %q, want just the id", out)
	}
	if !strings.Contains(errOut, "source created") {
		t.Errorf("stderr = %q, want details with the source", errOut)
	}
	if h.api.lastAuth != "Bearer dev-token" {
		t.Errorf("Authorization = %q, want the stack's first token", h.api.lastAuth)
	}
	p := filepath.Join(h.dir, ".run", "sbx", "sb1.json")
	st, err := os.Stat(p)
	if err != nil {
		t.Fatalf("connection file: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("connection file mode = %v, want 0600", st.Mode().Perm())
	}
	sc, err := connStore{filepath.Dir(p)}.Load("sb1")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Connection.EnvdAccessToken != "envd-secret" || sc.UserID != "u1" || sc.ThreadID != "t1" || sc.Tenant != "dev" {
		t.Errorf("stored = %+v, want token envd-secret for dev/u1/t1", sc)
	}
}

func TestAcquireJSON(t *testing.T) {
	h := newHarness(t, map[string]route{"POST /v1/sandboxes/acquire": {status: 200, body: acquireBody}})
	code, out, _ := h.run(nil, "--json", "acquire", "-u", "u1", "-t", "t1")
	if code != ExitOK {
		t.Fatalf("exit = %d, want 0", code)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	conn, _ := got["connection"].(map[string]any)
	if got["sandbox_id"] != "sb1" || got["source"] != "created" || conn["envd_url"] != "http://127.0.0.1:1" {
		t.Errorf("JSON = %v, want the acquire response", got)
	}
}

func TestExitCodesAndErrorMessages(t *testing.T) {
	capacity := route{status: 429, header: map[string]string{"Retry-After": "5"},
		body: `{"error":{"code":"SANDBOX_CAPACITY_EXCEEDED","message":"all 1 slots are held","reason":"capacity","retryable":true,"retry_after_seconds":5,"details":{"used":1,"limit":1}}}`}
	h := newHarness(t, map[string]route{"POST /v1/sandboxes/acquire": capacity})
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  []string // substrings of stderr
	}{
		{"capacity is 3", []string{"acquire", "-u", "u", "-t", "t"}, ExitCapacity, []string{"SANDBOX_CAPACITY_EXCEEDED", "HTTP 429", "all 1 slots are held", "retry after 5s", "details: limit=1 used=1"}},
		{"not found is 1", []string{"status", "nope"}, ExitError, []string{"SANDBOX_NOT_FOUND", "HTTP 404", "sandbox not found"}},
		{"unknown flag is 2", []string{"capacity", "--bogus"}, ExitUsage, []string{"unknown flag"}},
		{"unknown command is 2", []string{"frobnicate"}, ExitUsage, []string{"unknown command"}},
		{"missing args is 2", []string{"release"}, ExitUsage, []string{"want ID"}},
		{"acquire without thread is 2", []string{"acquire", "-u", "u"}, ExitUsage, []string{"--user and --thread"}},
		{"exec without command is 2", []string{"exec", "sb1"}, ExitUsage, []string{"-c SCRIPT or -- CMD"}},
		{"exec without connection is 1", []string{"exec", "sb9", "--", "true"}, ExitError, []string{"no stored connection", "sbx acquire"}},
		{"bad id is 2", []string{"put", "../x", "a", "b"}, ExitUsage, []string{"must match"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := h.run(nil, tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit = %d, want %d (stderr %q)", code, tt.wantCode, errOut)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr = %q, want it to contain %q", errOut, s)
				}
			}
		})
	}
}

func TestCapacityErrorAsJSON(t *testing.T) {
	h := newHarness(t, map[string]route{"POST /v1/sandboxes/acquire": {status: 429,
		body: `{"error":{"code":"SANDBOX_CAPACITY_EXCEEDED","message":"full","reason":"capacity","retryable":true,"retry_after_seconds":3}}`}})
	code, out, _ := h.run(nil, "--json", "acquire", "-u", "u", "-t", "t")
	if code != ExitCapacity {
		t.Fatalf("exit = %d, want %d", code, ExitCapacity)
	}
	var got struct {
		Error struct {
			Status     int     `json:"status"`
			Code       string  `json:"code"`
			RetryAfter float64 `json:"retry_after_seconds"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	if got.Error.Status != 429 || got.Error.Code != "SANDBOX_CAPACITY_EXCEEDED" || got.Error.RetryAfter != 3 {
		t.Errorf("JSON error = %+v, want 429 SANDBOX_CAPACITY_EXCEEDED retry 3", got.Error)
	}
}

func TestHumanOutput(t *testing.T) {
	h := newHarness(t, map[string]route{
		"GET /v1/capacity": {status: 200, body: `{"limit":3,"used":2,"active":1,"warm":1,"reserved":0,"transitioning":0,"policy":"wait"}`},
		"POST /v1/sandboxes/sb1/release": {status: 200, body: `{"sandbox_id":"sb1","state":"warm",
			"sync":{"uploaded":1,"skipped":2,"deferred":[{"path":"outputs/huge.bin","reason":"file_too_large"}],"bytes":42,"complete":false}}`},
		"POST /v1/sandboxes/sb1/sync": {status: 200, body: `{"uploaded":0,"skipped":3,"deferred":[],"bytes":0,"complete":true}`},
		"GET /v1/sandboxes/sb1":       {status: 200, body: `{"sandbox_id":"sb1","state":"warm","connection":{"envd_url":"http://x","envd_access_token":"tok"}}`},
	})
	tests := []struct {
		args []string
		want []string
		not  []string
	}{
		{[]string{"capacity"}, []string{"2 of 3 slots used (active 1, warm 1, reserved 0, transitioning 0), overflow policy wait"}, nil},
		{[]string{"release", "sb1"}, []string{"released sb1: warm", "1 uploaded (42 bytes), 2 unchanged, 1 deferred, INCOMPLETE", "deferred outputs/huge.bin: file_too_large"}, nil},
		{[]string{"sync", "sb1"}, []string{"synced sb1: 0 uploaded (0 bytes), 3 unchanged, 0 deferred, complete"}, nil},
		{[]string{"status", "sb1"}, []string{"state", "warm", "connection.envd_url", "(hidden)"}, []string{"tok\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.args[0], func(t *testing.T) {
			code, out, errOut := h.run(nil, tt.args...)
			if code != ExitOK {
				t.Fatalf("exit = %d, want 0 (stderr %q)", code, errOut)
			}
			for _, s := range tt.want {
				if !strings.Contains(out, s) {
					t.Errorf("stdout = %q, want it to contain %q", out, s)
				}
			}
			for _, s := range tt.not {
				if strings.Contains(out, s) {
					t.Errorf("stdout = %q, must not contain %q", out, s)
				}
			}
		})
	}
}

func TestReleaseForgetsTheConnection(t *testing.T) {
	h := newHarness(t, map[string]route{
		"POST /v1/sandboxes/acquire":     {status: 200, body: acquireBody},
		"POST /v1/sandboxes/sb1/release": {status: 200, body: `{"sandbox_id":"sb1","state":"warm"}`},
	})
	if code, _, e := h.run(nil, "acquire", "-u", "u", "-t", "t"); code != 0 {
		t.Fatalf("acquire exit %d: %s", code, e)
	}
	if code, _, e := h.run(nil, "release", "sb1"); code != 0 {
		t.Fatalf("release exit %d: %s", code, e)
	}
	if _, err := os.Stat(filepath.Join(h.dir, ".run", "sbx", "sb1.json")); !os.IsNotExist(err) {
		t.Errorf("connection file after release: err = %v, want it removed", err)
	}
}

func TestTenantFlagSelectsToken(t *testing.T) {
	h := newHarness(t, map[string]route{"GET /v1/capacity": {status: 200, body: `{}`}})
	if code, _, e := h.run(nil, "--tenant", "other", "capacity"); code != 0 {
		t.Fatalf("exit %d: %s", code, e)
	}
	if h.api.lastAuth != "Bearer other-token" {
		t.Errorf("Authorization = %q, want Bearer other-token", h.api.lastAuth)
	}
	if code, _, e := h.run(map[string]string{EnvToken: "env-token"}, "--tenant", "other", "capacity"); code != 0 {
		t.Fatalf("exit %d: %s", code, e)
	}
	if h.api.lastAuth != "Bearer env-token" {
		t.Errorf("Authorization = %q, want SBX_TOKEN over the stack", h.api.lastAuth)
	}
	if code, _, e := h.run(map[string]string{EnvToken: "env-token"}, "--token", "flag-token", "capacity"); code != 0 {
		t.Fatalf("exit %d: %s", code, e)
	}
	if h.api.lastAuth != "Bearer flag-token" {
		t.Errorf("Authorization = %q, want --token over SBX_TOKEN", h.api.lastAuth)
	}
}

// fakeS3 serves an in-memory S3 holding objects (key -> body) in bucket;
// it returns the endpoint (path-style, credentials ak/sk).
func fakeS3(t *testing.T, bucket string, objects map[string]string) string {
	t.Helper()
	s3srv := httptest.NewServer(gofakes3.New(s3mem.New()).Server())
	t.Cleanup(s3srv.Close)
	cl := s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(s3srv.URL), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("ak", "sk", "")})
	ctx := context.Background()
	if _, err := cl.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatal(err)
	}
	for key, body := range objects {
		if _, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: strings.NewReader(body)}); err != nil {
			t.Fatal(err)
		}
	}
	return s3srv.URL
}

func TestLsOutputsListsTheThreadPrefix(t *testing.T) {
	endpoint := fakeS3(t, "out", map[string]string{
		"pre/dev/u1/t1/outputs/report.md":   "# report\n",
		"pre/dev/u1/t1/workspace/notes.txt": "n",
		"pre/dev/u1/t2/outputs/other.md":    "other thread",
		"pre/other/u1/t1/outputs/x.md":      "other tenant",
	})
	dir := t.TempDir()
	writeStack(t, dir, `{"api_url":"http://127.0.0.1:1","tokens":{"dev":"dev-token","other":"o"},
	 "s3":{"endpoint":"`+endpoint+`","region":"us-east-1","access_key":"ak","secret_key":"sk","bucket":"out","prefix":"pre"}}`)
	h := &harness{t: t, dir: dir}

	code, out, errOut := h.run(nil, "ls-outputs", "-u", "u1", "-t", "t1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"outputs/report.md", "workspace/notes.txt", "9 "} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout = %q, want %q", out, want)
		}
	}
	for _, not := range []string{"other"} {
		if strings.Contains(out, not) {
			t.Errorf("stdout = %q lists another thread's or tenant's object", out)
		}
	}
	if !strings.Contains(errOut, "s3://out/pre/dev/u1/t1/") {
		t.Errorf("stderr = %q, want the listed prefix", errOut)
	}

	code, out, _ = h.run(nil, "--json", "--tenant", "other", "ls-outputs", "-u", "u1", "-t", "t1")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var objs []OutputObject
	if err := json.Unmarshal([]byte(out), &objs); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(objs) != 1 || objs[0].Key != "pre/other/u1/t1/outputs/x.md" || objs[0].Path != "outputs/x.md" || objs[0].Size != int64(len("other tenant")) {
		t.Errorf("objects = %+v, want only pre/other/u1/t1/outputs/x.md", objs)
	}
}

// TestLsOutputsDeployedBucket: with --bucket (a deployed stack, no stack
// file) the AWS SDK's configuration locates S3, and --prefix is the
// stack's OutputPrefix.
func TestLsOutputsDeployedBucket(t *testing.T) {
	endpoint := fakeS3(t, "deployed", map[string]string{"outputs/acme/u1/t1/outputs/smoke.txt": "ok", "outputs/acme/u1/t2/outputs/no.txt": "ok"})
	for k, v := range map[string]string{"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "sk",
		"AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"} {
		t.Setenv(k, v)
	}
	h := &harness{t: t, dir: t.TempDir()}
	code, out, errOut := h.run(nil, "--json", "--tenant", "acme", "ls-outputs", "-u", "u1", "-t", "t1", "--bucket", "deployed")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var objs []OutputObject
	if err := json.Unmarshal([]byte(out), &objs); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(objs) != 1 || objs[0].Path != "outputs/smoke.txt" {
		t.Errorf("objects = %+v, want only outputs/smoke.txt", objs)
	}
}

func TestS3EnvPrintsQuotedExports(t *testing.T) {
	dir := t.TempDir()
	writeStack(t, dir, `{"s3":{"endpoint":"http://127.0.0.1:9000","region":"us-east-1","access_key":"ak","secret_key":"s k'x","bucket":"b","prefix":"/outputs/"}}`)
	h := &harness{t: t, dir: dir}
	code, out, errOut := h.run(nil, "s3-env")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "export AWS_ACCESS_KEY_ID=ak\n" +
		"export AWS_SECRET_ACCESS_KEY='s k'\\''x'\n" +
		"export AWS_DEFAULT_REGION=us-east-1\n" +
		"export S3_ENDPOINT=http://127.0.0.1:9000\n" +
		"export S3_BUCKET=b\n" +
		"export S3_PREFIX=outputs\n"
	if out != want {
		t.Errorf("stdout =\n%s\nwant\n%s", out, want)
	}
	code, _, errOut = (&harness{t: t, dir: t.TempDir()}).run(nil, "s3-env")
	if code != ExitError || !strings.Contains(errOut, "make run") {
		t.Errorf("without a stack: exit %d, stderr %q; want 1 and a hint", code, errOut)
	}
}

func TestStackFromEnvInAScratchDirectory(t *testing.T) {
	h := newHarness(t, map[string]route{"POST /v1/sandboxes/acquire": {status: 200, body: acquireBody}})
	scratch := t.TempDir()
	var out, errb bytes.Buffer
	a := &App{Stdout: &out, Stderr: &errb, Dir: scratch,
		Getenv: envOf(map[string]string{EnvStack: filepath.Join(h.dir, ".run", "stack.json")})}
	if code := a.Run(context.Background(), []string{"acquire", "-u", "u", "-t", "t"}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(h.dir, ".run", "sbx", "sb1.json")); err != nil {
		t.Errorf("connection not stored next to the stack file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(scratch, ".run")); !os.IsNotExist(err) {
		t.Errorf("scratch dir got a .run directory (err %v), want none", err)
	}
}

func TestCapacityShowsDrainingAndTombstones(t *testing.T) {
	h := newHarness(t, map[string]route{
		"GET /v1/capacity": {status: 200, body: `{"limit":3,"used":2,"active":1,"warm":0,"reserved":0,"transitioning":0,"tombstones":1,"granted":1,"policy":"wait","draining":true,"counted_at":"2026-12-07T10:11:12Z"}`},
	})
	code, out, errOut := h.run(nil, "capacity")
	if code != ExitOK {
		t.Fatalf("exit = %d, want 0 (stderr %q)", code, errOut)
	}
	if want := "2 of 3 slots used (active 1, warm 0, reserved 0, transitioning 0), overflow policy wait, 1 tombstones, 1 held for waiting acquires; draining: acquires refused; states counted at 10:11:12"; !strings.Contains(out, want) {
		t.Errorf("stdout = %q, want it to contain %q", out, want)
	}
	code, out, errOut = h.run(nil, "--json", "capacity")
	if code != ExitOK {
		t.Fatalf("--json exit = %d, want 0 (stderr %q)", code, errOut)
	}
	for _, want := range []string{`"draining": true`, `"tombstones": 1`} {
		if !strings.Contains(out, want) {
			t.Errorf("--json stdout = %q, want it to contain %s", out, want)
		}
	}
}
