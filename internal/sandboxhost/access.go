package sandboxhost

import (
	"crypto/sha256"
	"crypto/subtle"
	"sync"
)

// Who may learn what of a sandbox id: a request is checked against the
// sandbox's access token before anything else, so that a caller without
// it learns nothing of whether an id exists or is paused (every such
// request gets the same answer). A caller holding the token of a sandbox
// that ended learns that it ended: the host keeps the token hashes of the
// last maxTombstones ended sandboxes.

// access is the outcome of checking a request's token for an id.
type access int

const (
	accessDenied  access = iota // no valid token: answer as for any id
	accessGone                  // the token of a sandbox that ended
	accessGranted               // the token of the live sandbox
)

// maxTombstones bounds the ended sandboxes whose tokens the host keeps.
const maxTombstones = 4096

// tombstones are the token hashes of ended sandboxes, oldest first.
type tombstones struct {
	mu    sync.Mutex
	byID  map[string][sha256.Size]byte
	order []string
}

// add remembers that sandbox id, with token, ended.
func (t *tombstones) add(id, token string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID == nil {
		t.byID = map[string][sha256.Size]byte{}
	}
	if _, ok := t.byID[id]; !ok {
		t.order = append(t.order, id)
	}
	t.byID[id] = sha256.Sum256([]byte(token))
	for len(t.order) > maxTombstones {
		delete(t.byID, t.order[0])
		t.order = t.order[1:]
	}
}

// matches reports whether tok was the token of ended sandbox id.
func (t *tombstones) matches(id, tok string) bool {
	t.mu.Lock()
	sum, ok := t.byID[id]
	t.mu.Unlock()
	got := sha256.Sum256([]byte(tok))
	return ok && subtle.ConstantTimeCompare(sum[:], got[:]) == 1
}

// access checks tok for sandbox id and returns the live sandbox when the
// token is its own.
func (h *Host) access(id, tok string) (*sandbox, access) {
	if sb, err := h.get(id); err == nil {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(sb.token)) == 1 {
			return sb, accessGranted
		}
		return nil, accessDenied
	}
	if tok != "" && h.tombs.matches(id, tok) {
		return nil, accessGone
	}
	return nil, accessDenied
}
