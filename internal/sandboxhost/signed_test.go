package sandboxhost

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFileSignatureMatchesSDK pins the signature to values the official
// SDK's getSignature computed (e2b 2.51.0, token "tok123").
func TestFileSignatureMatchesSDK(t *testing.T) {
	if got, want := fileSignature("/home/user/a.txt", "read", "", "tok123", ""), "v1_byj2OB/vujgbES/1KAKCaR27E+9eOrB6PzeTnIL8L6M"; got != want {
		t.Errorf("read signature = %s, want %s", got, want)
	}
	if got, want := fileSignature("up.txt", "write", "", "tok123", ""), "v1_lQpBa5hMY3oF5D+/iDqoKBRs+J5le+Ez/R9aEpmeKGs"; got != want {
		t.Errorf("write signature = %s, want %s", got, want)
	}
}

// TestSignedFileURLs checks that a signature stands in for the access
// token on /files, with the sandbox named by the host name or by nothing
// at all (as a plain HTTP client of the SDK's URL sends it), and that a
// wrong, expired or mismatched signature is refused alike.
func TestSignedFileURLs(t *testing.T) {
	srv := startHost(t, IsolationNone)
	sb := createSandbox(t, srv, nil)
	other := createSandbox(t, srv, nil)
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	past := strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)
	do := func(method, host string, q url.Values, body string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, srv.EnvdURL+"/files?"+q.Encode(), rd)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	up := url.Values{"path": {"signed.txt"}, "signature": {fileSignature("signed.txt", "write", "", sb.EnvdAccessToken, exp)}, "signature_expiration": {exp}}
	if status, body := do("POST", "", up, "hi"); status != 200 {
		t.Fatalf("signed upload without a sandbox id: %d %s", status, body)
	}
	down := url.Values{"path": {"signed.txt"}, "signature": {fileSignature("signed.txt", "read", "", sb.EnvdAccessToken, "")}}
	if status, body := do("GET", "49983-"+sb.SandboxID+".e2b.local", down, ""); status != 200 || body != "hi" {
		t.Errorf("signed download by host name: %d %q, want 200 hi", status, body)
	}
	refused := map[string]url.Values{
		"wrong operation": {"path": {"signed.txt"}, "signature": {fileSignature("signed.txt", "write", "", sb.EnvdAccessToken, "")}},
		"other path":      {"path": {"other.txt"}, "signature": down["signature"]},
		"expired":         {"path": {"signed.txt"}, "signature": {fileSignature("signed.txt", "read", "", sb.EnvdAccessToken, past)}, "signature_expiration": {past}},
		"unsigned":        {"path": {"signed.txt"}},
	}
	for name, q := range refused {
		if status, _ := do("GET", "", q, ""); status != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, status)
		}
	}
	if status, _ := do("GET", "49983-"+other.SandboxID+".e2b.local", down, ""); status != http.StatusUnauthorized {
		t.Errorf("signature of one sandbox on another's host name: %d, want 401", status)
	}
}
