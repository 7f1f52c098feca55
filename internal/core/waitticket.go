package core

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"
)

// Waiting is an acquire's place in the wait queue, handed to its caller
// instead of a sandbox (HTTP 202) so that waiting holds no invocation:
// the caller asks again with Ticket (AcquireRequest.Ticket) after
// RetryAfter, until it is served or refused.
type Waiting struct {
	// Ticket is the opaque form of the queue's ticket (see encodeTicket).
	Ticket string
	// RetryAfter is when to ask again.
	RetryAfter time.Duration
	// Until is when the wait ends: an acquire still waiting then is
	// refused for capacity.
	Until time.Time
}

// AcquireRequest is one acquire of a thread's sandbox: the thread, and
// the ticket of the wait it continues ("" for a new acquire).
type AcquireRequest struct {
	Key    ThreadKey
	Ticket string
}

// waitRetry is how long a waiting acquire's caller waits before it asks
// again: each ask reads its ticket once and takes a turn (waitTurn).
const waitRetry = time.Second

// ticketGrace is how long a ticket (and its waiter place) outlives its
// wait's end, so that the last ask still finds it; a caller that stopped
// asking holds it no longer.
const ticketGrace = 2 * waitRetry

// maxTicketLen bounds the opaque ticket a caller may send back.
const maxTicketLen = 1024

// ticketWire is the opaque ticket's content: the queue's Ticket (its
// tenant is the caller's, never the wire's) and the stable seed of the
// thread it was issued to.
type ticketWire struct {
	ID      string    `json:"id"`
	Place   int       `json:"place"`
	Round   int       `json:"round"`
	Key     string    `json:"key"`
	Arrived time.Time `json:"arrived"`
	Until   time.Time `json:"until"`
	Seed    string    `json:"seed"`
}

// encodeTicket is the opaque ticket of t for key's thread. It carries no
// secret and needs no signature: the store finds a ticket only by its
// Key, which embeds the ticket's random ID, and only in the caller's own
// tenant, so a forged or altered ticket finds nothing (it is gone) and a
// caller can only ever give up its own place.
func encodeTicket(t Ticket, key ThreadKey) string {
	b, _ := json.Marshal(ticketWire{ID: t.ID, Place: t.Place, Round: t.Round, Key: t.Key,
		Arrived: t.Arrived, Until: t.Until, Seed: key.Seed()})
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeTicket parses an opaque ticket sent back for key's thread: a
// *ValidationError (field "ticket") when it is malformed or was issued
// to another thread.
func decodeTicket(s string, key ThreadKey) (Ticket, error) {
	bad := &ValidationError{Field: "ticket", Message: "must be the ticket of an earlier waiting answer for this thread"}
	if len(s) == 0 || len(s) > maxTicketLen {
		return Ticket{}, bad
	}
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Ticket{}, bad
	}
	var w ticketWire
	if err := json.Unmarshal(raw, &w); err != nil || w.Seed != key.Seed() || w.ID == "" ||
		!strings.HasSuffix(w.Key, w.ID) || w.Place < 0 || w.Until.IsZero() {
		return Ticket{}, bad
	}
	return Ticket{ID: w.ID, Tenant: key.Tenant, Place: w.Place, Round: w.Round, Key: w.Key,
		Arrived: w.Arrived, Until: w.Until}, nil
}
