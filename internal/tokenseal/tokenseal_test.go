package tokenseal

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/kms"
)

// fakeKMS stands in for AWS KMS (no local KMS runs here): data keys are
// "encrypted" by XOR with a master key, and each call is counted and its
// encryption context checked.
type fakeKMS struct {
	mu        sync.Mutex
	master    [KeyBytes]byte
	generated int
	decrypted int
	badCtx    bool
}

func (f *fakeKMS) wrap(b []byte) []byte {
	out := make([]byte, len(b))
	for i := range b {
		out[i] = b[i] ^ f.master[i%len(f.master)]
	}
	return out
}

func (f *fakeKMS) GenerateDataKey(_ context.Context, in *kms.GenerateDataKeyInput, _ ...func(*kms.Options)) (*kms.GenerateDataKeyOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.generated++
	f.badCtx = f.badCtx || !maps.Equal(in.EncryptionContext, EncryptionContext)
	key := make([]byte, KeyBytes)
	_, _ = rand.Read(key)
	return &kms.GenerateDataKeyOutput{Plaintext: bytes.Clone(key), CiphertextBlob: append([]byte("kms:"), f.wrap(key)...)}, nil
}

func (f *fakeKMS) Decrypt(_ context.Context, in *kms.DecryptInput, _ ...func(*kms.Options)) (*kms.DecryptOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decrypted++
	if !maps.Equal(in.EncryptionContext, EncryptionContext) {
		return nil, errors.New("InvalidCiphertextException: encryption context mismatch")
	}
	return &kms.DecryptOutput{Plaintext: f.wrap(bytes.TrimPrefix(in.CiphertextBlob, []byte("kms:")))}, nil
}

func TestLocalRoundTripAndTampering(t *testing.T) {
	ctx := context.Background()
	l, err := NewLocal(bytes.Repeat([]byte{1}, KeyBytes))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := l.Seal(ctx, []byte("tok-123"), []byte("sbx1"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("tok-123")) {
		t.Fatalf("sealed token contains the plaintext")
	}
	if got, err := l.Open(ctx, sealed, []byte("sbx1")); err != nil || string(got) != "tok-123" {
		t.Fatalf("Open = %q, %v; want tok-123", got, err)
	}
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)-1] ^= 1
	other, _ := NewLocal(bytes.Repeat([]byte{2}, KeyBytes))
	for _, tc := range []struct {
		name   string
		s      *Local
		sealed []byte
		aad    string
	}{
		{"another record's id", l, sealed, "sbx2"},
		{"tampered", l, flipped, "sbx1"},
		{"another key", other, sealed, "sbx1"},
		{"truncated", l, sealed[:5], "sbx1"},
	} {
		if got, err := tc.s.Open(ctx, tc.sealed, []byte(tc.aad)); err == nil {
			t.Errorf("%s: Open = %q, want an error", tc.name, got)
		}
	}
	if _, err := NewLocal(make([]byte, 16)); err == nil {
		t.Errorf("NewLocal accepted a 16-byte key")
	}
}

// TestKMSEnvelope: an instance seals with one data key per hour (one KMS
// call), another instance opens with one Decrypt per distinct data key,
// both with the encryption context the IAM policy requires.
func TestKMSEnvelope(t *testing.T) {
	ctx := context.Background()
	f := &fakeKMS{}
	_, _ = rand.Read(f.master[:])
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	a := NewKMS(f, "arn:aws:kms:eu-west-1:123456789012:key/k")
	a.now = func() time.Time { return now }
	var sealed [][]byte
	for i := range 5 {
		s, err := a.Seal(ctx, []byte{byte('a' + i)}, []byte("sbx"))
		if err != nil {
			t.Fatal(err)
		}
		sealed = append(sealed, s)
	}
	now = now.Add(2 * time.Hour) // the next seal takes a new data key
	s, err := a.Seal(ctx, []byte("f"), []byte("sbx"))
	if err != nil {
		t.Fatal(err)
	}
	sealed = append(sealed, s)
	if f.generated != 2 {
		t.Errorf("GenerateDataKey calls = %d, want 2 (one per data key life)", f.generated)
	}
	b := NewKMS(f, "arn:aws:kms:eu-west-1:123456789012:key/k")
	for i, s := range sealed {
		got, err := b.Open(ctx, s, []byte("sbx"))
		if err != nil || string(got) != string(rune('a'+i)) {
			t.Errorf("Open #%d = %q, %v", i, got, err)
		}
	}
	if f.decrypted != 2 {
		t.Errorf("Decrypt calls = %d, want 2 (one per distinct data key)", f.decrypted)
	}
	if f.badCtx {
		t.Errorf("GenerateDataKey called without the encryption context %v", EncryptionContext)
	}
	local, _ := NewLocal(make([]byte, KeyBytes))
	if _, err := local.Open(ctx, sealed[0], []byte("sbx")); err == nil {
		t.Errorf("a local key opened a KMS-sealed token")
	}
}
