package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

const provKey = "test-prov-key"

// createAIOSandbox starts the real sandbox host's provisioner face, creates
// a sandbox through it and returns its id and the connection the broker's
// acquire response carries for the provisioner backend.
func createAIOSandbox(t *testing.T) (string, client.Connection) {
	t.Helper()
	srv := startHost(t)
	base, err := srv.StartProvisioner("127.0.0.1:0", sandboxhost.ProvisionerOptions{APIKey: provKey})
	if err != nil {
		t.Fatalf("StartProvisioner: %v", err)
	}
	var out struct {
		SandboxID   string `json:"sandbox_id"`
		SandboxURL  string `json:"sandbox_url"`
		AccessToken string `json:"access_token"`
	}
	postCreate(t, base+"/api/sandboxes", provKey, `{"sandbox_id":"aio-test-1","user_id":"u1","thread_id":"t1"}`, http.StatusOK, &out)
	if out.SandboxURL == "" {
		t.Fatalf("create sandbox: %+v, want a sandbox_url", out)
	}
	return out.SandboxID, client.Connection{SandboxURL: out.SandboxURL, AccessToken: out.AccessToken}
}

func TestAIOExecFilesRoundTrip(t *testing.T) {
	id, conn := createAIOSandbox(t)
	if got := conn.Kind(); got != client.KindAIO {
		t.Fatalf("Kind() = %q, want %q", got, client.KindAIO)
	}
	a, err := client.NewAIO(id, conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := checkFileRoundTrip(t, a, "uploads/deep/sales.csv", "/home/user/uploads/deep/sales.csv")

	tests := []struct {
		name                   string
		req                    client.ExecRequest
		wantCode               int
		wantStdout, wantStderr string
	}{
		{name: "size seen inside", req: client.ExecRequest{Script: `wc -c < uploads/deep/sales.csv`}, wantStdout: strconv.Itoa(len(data)) + "\n"},
		{name: "stdout, stderr and exit code", req: client.ExecRequest{Script: `echo out; echo err >&2; exit 7`}, wantCode: 7, wantStdout: "out\n", wantStderr: "err\n"},
		{name: "env and cwd", req: client.ExecRequest{Script: `printf '%s %s' "$V" "$PWD"`, Env: map[string]string{"V": "a b;$(x)"}, Cwd: "uploads"}, wantStdout: "a b;$(x) /home/user/uploads"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			tt.req.Stdout, tt.req.Stderr = &stdout, &stderr
			code, err := a.Exec(ctx, tt.req)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if code != tt.wantCode || stdout.String() != tt.wantStdout || stderr.String() != tt.wantStderr {
				t.Errorf("Exec = %d, stdout %q, stderr %q; want %d, %q, %q", code, stdout.String(), stderr.String(), tt.wantCode, tt.wantStdout, tt.wantStderr)
			}
		})
	}

	if _, err := a.Exec(ctx, client.ExecRequest{Script: "sleep 30", Timeout: time.Second}); !errors.Is(err, client.ErrExecTimeout) {
		t.Errorf("Exec past its timeout: error = %v, want ErrExecTimeout", err)
	}
	if _, err := a.GetFile(ctx, "nope/missing.txt", &bytes.Buffer{}); !errors.Is(err, client.ErrFileNotFound) {
		t.Errorf("GetFile(missing) error = %v, want ErrFileNotFound", err)
	}
	if _, err := a.Exec(ctx, client.ExecRequest{Script: "true", Env: map[string]string{"BAD-KEY": "x"}}); err == nil {
		t.Error("Exec with a bad env key: nil error, want one")
	}
}

func TestAIORejectsWrongTokenAndUnknownSandbox(t *testing.T) {
	id, conn := createAIOSandbox(t)
	ctx := context.Background()

	bad, _ := client.NewAIO(id, client.Connection{SandboxURL: conn.SandboxURL, AccessToken: "wrong"}, nil)
	_, err := bad.Exec(ctx, client.ExecRequest{Script: "true"})
	var ae *client.AIOError
	if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Errorf("Exec with a wrong token: error = %v, want an *AIOError with HTTP 401", err)
	}
	if err := bad.PutFile(ctx, "x", strings.NewReader("x")); err == nil {
		t.Error("PutFile with a wrong token: nil error, want one")
	}

	// Another sandbox's token tells nothing of an unknown id: refused as
	// a wrong token is, never told apart from a live one.
	unknown, _ := client.NewAIO("doesnotexist", client.Connection{SandboxURL: strings.Replace(conn.SandboxURL, id, "doesnotexist", 1), AccessToken: conn.AccessToken}, nil)
	if _, err := unknown.Exec(ctx, client.ExecRequest{Script: "true"}); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Errorf("Exec on an unknown sandbox: error = %v, want an *AIOError with HTTP 401", err)
	}
}

func TestConnectionKindAndJSON(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		wantKind string
		want     client.Connection
	}{
		{name: "e2b", body: `{"envd_url":"http://127.0.0.1:1","envd_access_token":"t"}`, wantKind: client.KindEnvd,
			want: client.Connection{EnvdURL: "http://127.0.0.1:1", EnvdAccessToken: "t"}},
		{name: "provisioner", body: `{"sandbox_url":"http://127.0.0.1:2/aio/x","access_token":"j"}`, wantKind: client.KindAIO,
			want: client.Connection{SandboxURL: "http://127.0.0.1:2/aio/x", AccessToken: "j"}},
		{name: "provisioner without token", body: `{"sandbox_url":"http://127.0.0.1:2/aio/x"}`, wantKind: client.KindAIO,
			want: client.Connection{SandboxURL: "http://127.0.0.1:2/aio/x"}},
		{name: "envd with protocol", body: `{"protocol":"envd","envd_url":"http://127.0.0.1:1","envd_access_token":"t"}`, wantKind: client.KindEnvd,
			want: client.Connection{Protocol: "envd", EnvdURL: "http://127.0.0.1:1", EnvdAccessToken: "t"}},
		{name: "aio with protocol", body: `{"protocol":"aio","sandbox_url":"http://127.0.0.1:2/aio/x"}`, wantKind: client.KindAIO,
			want: client.Connection{Protocol: "aio", SandboxURL: "http://127.0.0.1:2/aio/x"}},
		{name: "unknown", body: `{"url":"x"}`, wantKind: ""},
		{name: "unknown protocol", body: `{"protocol":"daytona","sandbox_url":"x"}`, wantKind: "daytona",
			want: client.Connection{Protocol: "daytona", SandboxURL: "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got client.Connection
			if err := json.Unmarshal([]byte(tt.body), &got); err != nil {
				t.Fatal(err)
			}
			if got != tt.want || got.Kind() != tt.wantKind {
				t.Errorf("decoded %+v kind %q, want %+v kind %q", got, got.Kind(), tt.want, tt.wantKind)
			}
		})
	}
}
