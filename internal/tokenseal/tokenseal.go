// Package tokenseal seals sandbox access tokens for storage
// (ddbstore.Sealer): AES-256-GCM under a data key that is either generated
// by AWS KMS and stored, encrypted by KMS, next to every token it sealed
// (envelope encryption; KMS), or a local key given in configuration
// (Local, for `make run` and tests).
//
// A sealed token is: version byte 1, the big-endian uint16 length of the
// encrypted data key, the encrypted data key (empty for Local), a 12-byte
// random nonce, and the GCM ciphertext with its tag. The caller's aad (the
// sandbox id) is authenticated, so a sealed token opens only for the record
// it was sealed for.
package tokenseal

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/kms/types"

	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

const version = 1

// KeyBytes is the length of a Local key (AES-256).
const KeyBytes = 32

// ErrMalformed: the sealed bytes do not have the format above.
var ErrMalformed = errors.New("tokenseal: malformed sealed token")

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func seal(aead cipher.AEAD, encKey, plaintext, aad []byte) ([]byte, error) {
	if len(encKey) > 0xffff {
		return nil, errors.New("tokenseal: encrypted data key too long")
	}
	out := make([]byte, 0, 3+len(encKey)+aead.NonceSize()+len(plaintext)+aead.Overhead())
	out = append(out, version)
	out = binary.BigEndian.AppendUint16(out, uint16(len(encKey)))
	out = append(out, encKey...)
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out = append(out, nonce...)
	return aead.Seal(out, nonce, plaintext, aad), nil
}

// split returns the encrypted data key and the nonce-prefixed ciphertext.
func split(sealed []byte) (encKey, rest []byte, err error) {
	if len(sealed) < 3 || sealed[0] != version {
		return nil, nil, ErrMalformed
	}
	n := int(binary.BigEndian.Uint16(sealed[1:3]))
	if len(sealed) < 3+n {
		return nil, nil, ErrMalformed
	}
	return sealed[3 : 3+n], sealed[3+n:], nil
}

func open(aead cipher.AEAD, rest, aad []byte) ([]byte, error) {
	if len(rest) < aead.NonceSize()+aead.Overhead() {
		return nil, ErrMalformed
	}
	ns := aead.NonceSize()
	pt, err := aead.Open(nil, rest[:ns], rest[ns:], aad)
	if err != nil {
		return nil, fmt.Errorf("tokenseal: open: %w", err)
	}
	return pt, nil
}

// Local seals with one key held in memory.
type Local struct{ aead cipher.AEAD }

var _ ddbstore.Sealer = (*Local)(nil)

// NewLocal returns a Local sealer for a KeyBytes-long key.
func NewLocal(key []byte) (*Local, error) {
	if len(key) != KeyBytes {
		return nil, fmt.Errorf("tokenseal: local key must be %d bytes, got %d", KeyBytes, len(key))
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	return &Local{aead: aead}, nil
}

// Seal implements ddbstore.Sealer.
func (l *Local) Seal(_ context.Context, plaintext, aad []byte) ([]byte, error) {
	return seal(l.aead, nil, plaintext, aad)
}

// Open implements ddbstore.Sealer.
func (l *Local) Open(_ context.Context, sealed, aad []byte) ([]byte, error) {
	encKey, rest, err := split(sealed)
	if err != nil {
		return nil, err
	}
	if len(encKey) != 0 {
		return nil, errors.New("tokenseal: token was sealed under a KMS data key, not the local key")
	}
	return open(l.aead, rest, aad)
}

// KMSAPI lists the AWS KMS operations KMS calls, with the signatures of
// aws-sdk-go-v2's *kms.Client.
type KMSAPI interface {
	GenerateDataKey(ctx context.Context, in *kms.GenerateDataKeyInput, optFns ...func(*kms.Options)) (*kms.GenerateDataKeyOutput, error)
	Decrypt(ctx context.Context, in *kms.DecryptInput, optFns ...func(*kms.Options)) (*kms.DecryptOutput, error)
}

var _ KMSAPI = (*kms.Client)(nil)

// EncryptionContext is the KMS encryption context of every data key; the
// functions' IAM policy allows GenerateDataKey and Decrypt only with it.
var EncryptionContext = map[string]string{"purpose": "sandbox-access-token"}

// Data key reuse: a function instance seals with one data key for at most
// dataKeyLife (far below GCM's random-nonce bound), and keeps at most
// maxOpenKeys decrypted data keys of other instances.
const (
	dataKeyLife = time.Hour
	maxOpenKeys = 256
	// kmsCallTimeout bounds each KMS call.
	kmsCallTimeout = 5 * time.Second
)

// KMS seals with data keys from AWS KMS (envelope encryption). One KMS
// call per function instance and hour seals (GenerateDataKey), and one per
// distinct data key opens (Decrypt); both are cached in memory.
type KMS struct {
	api   KMSAPI
	keyID string
	now   func() time.Time

	mu      sync.Mutex
	current struct {
		aead    cipher.AEAD
		encKey  []byte
		created time.Time
	}
	opened map[string]cipher.AEAD // by encrypted data key
}

var _ ddbstore.Sealer = (*KMS)(nil)

// NewKMS returns a KMS sealer for the key keyID (ARN, id or alias).
func NewKMS(api KMSAPI, keyID string) *KMS {
	return &KMS{api: api, keyID: keyID, now: time.Now, opened: map[string]cipher.AEAD{}}
}

// Seal implements ddbstore.Sealer.
func (k *KMS) Seal(ctx context.Context, plaintext, aad []byte) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.current.aead == nil || k.now().Sub(k.current.created) > dataKeyLife {
		cctx, cancel := context.WithTimeout(ctx, kmsCallTimeout)
		out, err := k.api.GenerateDataKey(cctx, &kms.GenerateDataKeyInput{
			KeyId: &k.keyID, KeySpec: types.DataKeySpecAes256, EncryptionContext: EncryptionContext,
		})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("tokenseal: kms generate data key: %w", err)
		}
		aead, err := newAEAD(out.Plaintext)
		clear(out.Plaintext)
		if err != nil {
			return nil, fmt.Errorf("tokenseal: kms data key: %w", err)
		}
		k.current.aead, k.current.encKey, k.current.created = aead, out.CiphertextBlob, k.now()
		k.remember(string(out.CiphertextBlob), aead)
	}
	return seal(k.current.aead, k.current.encKey, plaintext, aad)
}

// Open implements ddbstore.Sealer.
func (k *KMS) Open(ctx context.Context, sealed, aad []byte) ([]byte, error) {
	encKey, rest, err := split(sealed)
	if err != nil {
		return nil, err
	}
	if len(encKey) == 0 {
		return nil, errors.New("tokenseal: token was sealed under a local key, not a KMS data key")
	}
	k.mu.Lock()
	aead := k.opened[string(encKey)]
	k.mu.Unlock()
	if aead == nil {
		cctx, cancel := context.WithTimeout(ctx, kmsCallTimeout)
		out, err := k.api.Decrypt(cctx, &kms.DecryptInput{
			CiphertextBlob: encKey, KeyId: &k.keyID, EncryptionContext: EncryptionContext,
		})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("tokenseal: kms decrypt data key: %w", err)
		}
		aead, err = newAEAD(out.Plaintext)
		clear(out.Plaintext)
		if err != nil {
			return nil, fmt.Errorf("tokenseal: kms data key: %w", err)
		}
		k.mu.Lock()
		k.remember(string(encKey), aead)
		k.mu.Unlock()
	}
	return open(aead, rest, aad)
}

// remember caches an opened data key (k.mu held), forgetting all others
// when the cache is full.
func (k *KMS) remember(encKey string, aead cipher.AEAD) {
	if len(k.opened) >= maxOpenKeys {
		clear(k.opened)
	}
	k.opened[encKey] = aead
}
