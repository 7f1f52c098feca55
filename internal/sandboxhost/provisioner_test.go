package sandboxhost_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// aioCall sends method path with body (JSON unless ct says otherwise) and
// returns the status and decoded JSON reply (nil when not JSON).
func aioCall(t *testing.T, method, url, auth, ct string, body []byte) (int, map[string]any, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct == "" {
		ct = "application/json"
	}
	req.Header.Set("Content-Type", ct)
	if strings.HasPrefix(auth, "key:") {
		req.Header.Set("X-API-Key", strings.TrimPrefix(auth, "key:"))
	} else if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m, raw
}

func TestProvisionerFaceHTTP(t *testing.T) {
	_, prov := startBothFaces(t)
	key := "key:" + conformanceProvKey

	// API key required on /api.
	if st, _, _ := aioCall(t, "GET", prov+"/api/sandboxes", "key:wrong", "", nil); st != http.StatusUnauthorized {
		t.Errorf("list with a wrong key: HTTP %d, want 401", st)
	}
	// Create validation.
	for _, body := range []string{
		`{"sandbox_id":"../x","user_id":"alice"}`,
		`{"sandbox_id":"ok1","user_id":"alice","extra_mounts":[{"host_path":"/","container_path":"/mnt/root","read_only":false}]}`,
		`not json`,
	} {
		if st, _, raw := aioCall(t, "POST", prov+"/api/sandboxes", key, "", []byte(body)); st != http.StatusUnprocessableEntity {
			t.Errorf("create %s: HTTP %d %s, want 422", body, st, raw)
		}
	}
	st, m, raw := aioCall(t, "POST", prov+"/api/sandboxes", key, "", []byte(`{"sandbox_id":"face-1","user_id":"alice","thread_id":"t1","required_mount_contract_version":3}`))
	if st != http.StatusConflict || m["detail"].(map[string]any)["code"] != "mount_contract_changed" {
		t.Fatalf("create requiring contract 3: HTTP %d %s, want 409 mount_contract_changed", st, raw)
	}
	st, m, raw = aioCall(t, "POST", prov+"/api/sandboxes", key, "", []byte(`{"sandbox_id":"face-1","user_id":"alice","thread_id":"t1","required_mount_contract_version":2}`))
	if st != 200 || m["sandbox_id"] != "face-1" || m["user_id"] != "alice" || m["thread_id"] != "t1" || m["mount_contract_version"] != float64(2) {
		t.Fatalf("create: HTTP %d %s", st, raw)
	}
	aio, tok := m["sandbox_url"].(string), m["access_token"].(string)
	if st, _, _ := aioCall(t, "POST", prov+"/api/sandboxes", key, "", []byte(`{"sandbox_id":"face-1","user_id":"alice"}`)); st != http.StatusConflict {
		t.Errorf("duplicate create: HTTP %d, want 409", st)
	}
	if st, m, _ := aioCall(t, "GET", prov+"/api/sandboxes/face-1", key, "", nil); st != 200 || m["access_token"] != nil || m["status"] != "Running" {
		t.Errorf("get: HTTP %d %v, want Running without the token", st, m)
	}

	// AIO auth and routing.
	if st, _, _ := aioCall(t, "GET", aio+"/v1/sandbox", "wrong", "", nil); st != http.StatusUnauthorized {
		t.Errorf("AIO with a wrong token: HTTP %d, want 401", st)
	}
	// Without its own token an unknown id answers as a live one does.
	if st, _, _ := aioCall(t, "GET", prov+"/aio/nope/v1/sandbox", tok, "", nil); st != http.StatusUnauthorized {
		t.Errorf("AIO of an unknown sandbox: HTTP %d, want 401", st)
	}
	if st, m, _ := aioCall(t, "GET", aio+"/v1/sandbox", tok, "", nil); st != 200 || m["home_dir"] != "/home/user" {
		t.Errorf("GET /v1/sandbox: HTTP %d %v", st, m)
	}
	if st, _, _ := aioCall(t, "POST", aio+"/v1/bash/exec", tok, "", []byte(`{"command":"true","async_mode":true}`)); st != http.StatusUnprocessableEntity {
		t.Errorf("async exec: HTTP %d, want 422 (unsupported)", st)
	}
	// max_output_length truncates the middle, as the AIO API does.
	_, m, _ = aioCall(t, "POST", aio+"/v1/bash/exec", tok, "", []byte(`{"command":"head -c 1000 /dev/zero | tr '\\0' a","max_output_length":100}`))
	if out := m["data"].(map[string]any)["stdout"].(string); len(out) > 200 || !strings.HasPrefix(out, "aaaa") || !strings.Contains(out, "truncated") {
		t.Errorf("truncated stdout = %q", out)
	}

	// /v1/file/write: base64, then download; escapes are refused in-band.
	st, m, raw = aioCall(t, "POST", aio+"/v1/file/write", tok, "", []byte(`{"file":"/home/user/w/x.bin","content":"AAEC/w==","encoding":"base64"}`))
	if st != 200 || m["success"] != true {
		t.Fatalf("write: HTTP %d %s", st, raw)
	}
	if st, _, raw := aioCall(t, "GET", aio+"/v1/file/download?path=/home/user/w/x.bin", tok, "", nil); st != 200 || !bytes.Equal(raw, []byte{0, 1, 2, 255}) {
		t.Errorf("download: HTTP %d %q", st, raw)
	}
	for _, p := range []string{"/home/user/../../../etc/passwd-x", "/etc/evil"} {
		st, m, raw := aioCall(t, "POST", aio+"/v1/file/write", tok, "", []byte(`{"file":"`+p+`","content":"x"}`))
		if st != 200 || m["success"] != false || m["data"].(map[string]any)["error_type"] == "" {
			t.Errorf("write %s: HTTP %d %s, want success=false with an error_type", p, st, raw)
		}
	}
	if st, _, _ := aioCall(t, "GET", aio+"/v1/file/download?path=/home/user/none", tok, "", nil); st != http.StatusNotFound {
		t.Errorf("download of a missing file: HTTP %d, want 404", st)
	}

	// Delete, then everything about it is gone.
	if st, _, _ := aioCall(t, "DELETE", prov+"/api/sandboxes/face-1", key, "", nil); st != 200 {
		t.Errorf("delete: HTTP %d", st)
	}
	if st, _, _ := aioCall(t, "DELETE", prov+"/api/sandboxes/face-1", key, "", nil); st != http.StatusNotFound {
		t.Errorf("second delete: HTTP %d, want 404", st)
	}
	if st, _, _ := aioCall(t, "GET", aio+"/v1/sandbox", tok, "", nil); st != http.StatusNotFound {
		t.Errorf("AIO after delete: HTTP %d, want 404", st)
	}
	if _, m, _ := aioCall(t, "GET", prov+"/api/reconciliation/sandboxes/face-1", key, "", nil); m["status"] != "absent" || m["backend_namespace"] == "" {
		t.Errorf("discovery after delete: %v, want absent with a namespace", m)
	}
}
