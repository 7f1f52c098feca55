package e2bwebhook

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// TestSignIsSHA256OfSecretAndBody: the signature is the unpadded URL-safe
// base64 of SHA-256(secret || body), as E2B documents it; Verify accepts
// exactly it.
func TestSignIsSHA256OfSecretAndBody(t *testing.T) {
	body := []byte(`{"id":"e1"}`)
	sum := sha256.Sum256([]byte("s3cret" + string(body)))
	want := strings.TrimRight(strings.NewReplacer("+", "-", "/", "_").Replace(base64.StdEncoding.EncodeToString(sum[:])), "=")
	if got := Sign("s3cret", body); got != want {
		t.Fatalf("Sign = %q, want %q", got, want)
	}
	if !Verify("s3cret", body, want) {
		t.Error("Verify refused its own signature")
	}
	for name, c := range map[string]struct {
		secret, sig string
		body        []byte
	}{
		"other secret": {"other", want, body},
		"other body":   {"s3cret", want, []byte(`{"id":"e2"}`)},
		"no signature": {"s3cret", "", body},
		"no secret":    {"", Sign("", body), body},
	} {
		if Verify(c.secret, c.body, c.sig) {
			t.Errorf("%s: Verify accepted", name)
		}
	}
}

// TestParse reads E2B's payload and refuses one missing what the broker
// needs.
func TestParse(t *testing.T) {
	p, err := Parse([]byte(`{"version":"v2","id":"ev1","type":"sandbox.lifecycle.killed","eventData":{"sandbox_metadata":{"k":"v"},"execution":{"vcpu_count":2}},"sandboxId":"sb1","sandboxTeamId":"team","timestamp":"2025-08-06T20:59:24Z"}`))
	if err != nil || p.ID != "ev1" || p.Type != TypeKilled || p.SandboxID != "sb1" || p.EventData.Metadata["k"] != "v" || p.Timestamp.IsZero() {
		t.Fatalf("Parse = %+v, %v", p, err)
	}
	for _, body := range []string{`nope`, `{}`, `{"id":"e","type":"t","sandboxId":"s"}`, `{"id":"e","sandboxId":"s","timestamp":"2025-08-06T20:59:24Z"}`} {
		if _, err := Parse([]byte(body)); !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse(%s) = %v, want ErrMalformed", body, err)
		}
	}
}
