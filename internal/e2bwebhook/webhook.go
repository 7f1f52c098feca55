// Package e2bwebhook is the wire format of E2B's sandbox lifecycle
// webhooks: the JSON payload E2B posts, its headers, and its signature.
// The broker verifies what E2B (or the local sandbox host, which sends
// the same webhooks) posts to POST /webhooks/e2b; the host signs what it
// sends. Facts from E2B's documentation ("Sandbox lifecycle webhooks").
package e2bwebhook

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Request headers of a delivery.
const (
	// HeaderSignature carries the payload's signature (Sign).
	HeaderSignature = "E2b-Signature"
	// HeaderSignatureVersion is "v1", the only scheme.
	HeaderSignatureVersion = "E2b-Signature-Version"
	// HeaderWebhookID names the webhook registration that sent it.
	HeaderWebhookID = "E2b-Webhook-Id"
	// HeaderDeliveryID is unique per delivery attempt: a retry of the same
	// event gets a new one (the event's Payload.ID stays).
	HeaderDeliveryID = "E2b-Delivery-Id"
)

// SignatureVersion is the signature scheme Sign implements.
const SignatureVersion = "v1"

// Event types (Payload.Type).
const (
	TypeCreated = "sandbox.lifecycle.created"
	TypeKilled  = "sandbox.lifecycle.killed"
	TypeUpdated = "sandbox.lifecycle.updated"
	TypePaused  = "sandbox.lifecycle.paused"
	TypeResumed = "sandbox.lifecycle.resumed"
)

// Payload is one delivered event.
type Payload struct {
	Version string `json:"version"`
	// ID is the event's id: the same in every retry of its delivery.
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	EventData EventData `json:"eventData"`
	SandboxID string    `json:"sandboxId"`
	TeamID    string    `json:"sandboxTeamId,omitempty"`
	Template  string    `json:"sandboxTemplateId,omitempty"`
	BuildID   string    `json:"sandboxBuildId,omitempty"`
	Execution string    `json:"sandboxExecutionId,omitempty"`
	// Timestamp is when the event happened (RFC 3339).
	Timestamp time.Time `json:"timestamp"`
}

// EventData is the event's details: the sandbox's metadata.
type EventData struct {
	Metadata map[string]string `json:"sandbox_metadata,omitempty"`
}

// Sign is the signature of body under secret: SHA-256 of the secret
// followed by the body, in unpadded URL-safe base64.
func Sign(secret string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(secret))
	h.Write(body)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// Verify reports whether sig is body's signature under secret (a
// constant-time comparison). An empty secret verifies nothing.
func Verify(secret string, body []byte, sig string) bool {
	if secret == "" || sig == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(Sign(secret, body)), []byte(sig)) == 1
}

// ErrMalformed: the body is not an event this package can read.
var ErrMalformed = errors.New("malformed webhook payload")

// Parse reads a delivered body: it must be a JSON object with an id, a
// type, a sandbox id and a timestamp.
func Parse(body []byte) (Payload, error) {
	var p Payload
	if err := json.Unmarshal(body, &p); err != nil {
		return Payload{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	switch {
	case p.ID == "" || len(p.ID) > 256:
		return Payload{}, fmt.Errorf("%w: id", ErrMalformed)
	case p.Type == "":
		return Payload{}, fmt.Errorf("%w: type", ErrMalformed)
	case p.SandboxID == "" || len(p.SandboxID) > 128:
		return Payload{}, fmt.Errorf("%w: sandboxId", ErrMalformed)
	case p.Timestamp.IsZero():
		return Payload{}, fmt.Errorf("%w: timestamp", ErrMalformed)
	}
	return p, nil
}
