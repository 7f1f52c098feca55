package sandboxhost

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// Signed file URLs, as E2B's SDKs make them (downloadUrl, uploadUrl): a
// GET or POST /files carrying no access token but a signature query
// parameter, "v1_" and the unpadded standard base64 of the SHA-256 of
// "<path>:<read|write>:<username>:<access token>[:<expiration>]", with
// the optional signature_expiration (Unix seconds) after which it is
// refused. Such a URL is meant for a plain HTTP client, which sends no
// E2b-Sandbox-Id: the sandbox is then the one named by the host name
// (<port>-<id>.<domain>, as the SDK builds it without a sandbox URL) or,
// failing that, the one whose token the signature was made with.

// sandboxIDOf is the sandbox a request is for: its E2b-Sandbox-Id header,
// else the id in a host name <port>-<id>.<domain> ("" when neither).
func sandboxIDOf(r *http.Request) string {
	if id := r.Header.Get(envd.HeaderSandboxID); id != "" {
		return id
	}
	label, _, _ := strings.Cut(r.Host, ".")
	port, id, ok := strings.Cut(label, "-")
	if _, err := strconv.Atoi(port); !ok || err != nil || id == "" || !strings.Contains(r.Host, ".") {
		return ""
	}
	return id
}

// signedAccess checks a /files request's signature: it returns the live
// sandbox it was signed for (the one named id, or any when id is "")
// and accessGranted, else accessDenied.
func (h *Host) signedAccess(id string, r *http.Request) (*sandbox, access) {
	q := r.URL.Query()
	sig := q.Get("signature")
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	exp := q.Get("signature_expiration")
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || n < h.now().Unix() {
			return nil, accessDenied
		}
	}
	var candidates []*sandbox
	if id != "" {
		if sb, err := h.get(id); err == nil {
			candidates = append(candidates, sb)
		}
	} else {
		candidates = h.list()
	}
	for _, sb := range candidates {
		want := fileSignature(q.Get("path"), op, q.Get("username"), sb.token, exp)
		if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) == 1 {
			return sb, accessGranted
		}
	}
	return nil, accessDenied
}

// fileSignature is the signature of a file URL for path, operation op
// ("read" or "write"), user and token, with expiration exp ("": none).
func fileSignature(path, op, user, token, exp string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
