package ddbstore

import (
	"context"
	"fmt"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Sealer encrypts sandbox access tokens before they are stored and
// decrypts them when records are read, so that read access to the table, a
// backup or an export does not hand out live access to sandboxes.
// internal/tokenseal implements it with AWS KMS envelope encryption and
// with a local key. aad (the sandbox id) binds a sealed token to its
// record: a token copied onto another record does not open.
type Sealer interface {
	Seal(ctx context.Context, plaintext, aad []byte) ([]byte, error)
	Open(ctx context.Context, sealed, aad []byte) ([]byte, error)
}

// Option configures a Store.
type Option func(*Store)

// WithSealer makes the store keep sandbox access tokens sealed by s (the
// attribute token_sealed) instead of in plaintext. Records stored before,
// with a plaintext token, still read.
func WithSealer(s Sealer) Option { return func(st *Store) { st.sealer = s } }

// seal moves it's plaintext token, if any, into TokenSealed.
func (s *Store) seal(ctx context.Context, it *item) error {
	if s.sealer == nil || it.Token == "" {
		return nil
	}
	sealed, err := s.sealer.Seal(ctx, []byte(it.Token), []byte(it.SandboxID))
	if err != nil {
		return fmt.Errorf("seal access token: %w", err)
	}
	it.Token, it.TokenSealed = "", sealed
	return nil
}

// recordOf is it's record, with its sealed token opened.
func (s *Store) recordOf(ctx context.Context, it item) (rec core.Record, err error) {
	rec = it.record()
	if len(it.TokenSealed) == 0 {
		return rec, nil
	}
	if s.sealer == nil {
		return rec, fmt.Errorf("record %s: access token is sealed and this store has no sealer", it.SandboxID)
	}
	tok, err := s.sealer.Open(ctx, it.TokenSealed, []byte(it.SandboxID))
	if err != nil {
		return rec, fmt.Errorf("record %s: open access token: %w", it.SandboxID, err)
	}
	rec.Endpoint.AccessToken = string(tok)
	return rec, nil
}
