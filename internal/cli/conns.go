package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// sandboxIDPattern bounds ids used as file names (the API's own bound,
// internal/core ValidateSandboxID).
var sandboxIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ErrNoConnection means no connection is stored for a sandbox.
var ErrNoConnection = errors.New("no stored connection")

// StoredConnection is what `sbx acquire` keeps per sandbox in
// <state dir>/<id>.json (mode 0600: the envd access token is a secret), so
// exec/put/get can reach the sandbox without acquiring again.
type StoredConnection struct {
	SandboxID string `json:"sandbox_id"`
	Tenant    string `json:"tenant,omitempty"`
	UserID    string `json:"user_id"`
	ThreadID  string `json:"thread_id"`
	// Backend is the acquire response's backend (e2b, provisioner).
	Backend    string            `json:"backend,omitempty"`
	APIURL     string            `json:"api_url"`
	Connection client.Connection `json:"connection"`
	ExpiresAt  time.Time         `json:"expires_at"`
	SavedAt    time.Time         `json:"saved_at"`
}

// connStore reads and writes StoredConnection files in dir.
type connStore struct{ dir string }

func (s connStore) path(id string) (string, error) {
	if !sandboxIDPattern.MatchString(id) {
		return "", fmt.Errorf("sandbox id %q: must match %s", id, sandboxIDPattern)
	}
	return filepath.Join(s.dir, id+".json"), nil
}

// Save writes c atomically with mode 0600 (directory 0700).
func (s connStore) Save(c StoredConnection) error {
	p, err := s.path(c.SandboxID)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("save connection: %w", err)
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("save connection: %w", err)
	}
	f, err := os.CreateTemp(s.dir, "."+c.SandboxID+".*.tmp")
	if err != nil {
		return fmt.Errorf("save connection: %w", err)
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("save connection: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("save connection: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("save connection: %w", err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("save connection: %w", err)
	}
	return nil
}

// Load reads the connection of id; ErrNoConnection (wrapped) when there is none.
func (s connStore) Load(id string) (StoredConnection, error) {
	var c StoredConnection
	p, err := s.path(id)
	if err != nil {
		return c, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return c, fmt.Errorf("%w for sandbox %s in %s", ErrNoConnection, id, s.dir)
	}
	if err != nil {
		return c, fmt.Errorf("load connection: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("load connection %s: %w", p, err)
	}
	return c, nil
}

// Delete removes the connection of id; a missing file is fine.
func (s connStore) Delete(id string) error {
	p, err := s.path(id)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete connection: %w", err)
	}
	return nil
}
