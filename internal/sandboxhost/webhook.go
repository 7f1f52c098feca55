package sandboxhost

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bwebhook"
)

// Webhook is where the host sends E2B's signed sandbox lifecycle webhooks
// (killed, paused, resumed), as E2B sends them to a registered URL.
type Webhook struct {
	// URL receives each event as a POST; "" sends none.
	URL string
	// Secret signs each delivery (e2b-signature).
	Secret string
}

// Webhook delivery bounds: each attempt's deadline, and the attempts of
// one event (a retry follows a transport error or a 5xx, after
// webhookRetryWait; a redelivery keeps the event id).
const (
	webhookTimeout   = 5 * time.Second
	webhookAttempts  = 3
	webhookRetryWait = time.Second
)

// notify sends event type typ about sb to the webhook URL, in the
// background: a slow or absent receiver never holds the sandbox's
// transition (each delivery ends within its attempts' bounds). A host
// being closed sends none: its sandboxes end with it.
func (h *Host) notify(sb *sandbox, typ string) {
	w := h.opts.Webhook
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if w.URL == "" || closed {
		return
	}
	sb.mu.Lock()
	md := maps.Clone(sb.metadata)
	sb.mu.Unlock()
	body, err := json.Marshal(e2bwebhook.Payload{Version: "v2", ID: uuid.NewString(), Type: typ,
		EventData: e2bwebhook.EventData{Metadata: md}, SandboxID: sb.id, TeamID: "local", Template: sb.templateID,
		Timestamp: h.now().UTC()})
	if err != nil {
		h.log.Error("webhook: encode", "sandbox_id", sb.id, "error", err.Error())
		return
	}
	go func() {
		for attempt := 1; ; attempt++ {
			status, err := h.deliver(w, body)
			if err == nil && status < 500 {
				if status >= 300 {
					h.log.Warn("webhook: refused", "sandbox_id", sb.id, "type", typ, "status", status)
				}
				return
			}
			if attempt == webhookAttempts {
				h.log.Warn("webhook: not delivered", "sandbox_id", sb.id, "type", typ, "status", status, "error", fmt.Sprint(err))
				return
			}
			time.Sleep(webhookRetryWait)
		}
	}()
}

// deliver makes one delivery attempt of body, answering the status.
func (h *Host) deliver(w Webhook, body []byte) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), webhookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(e2bwebhook.HeaderSignature, e2bwebhook.Sign(w.Secret, body))
	req.Header.Set(e2bwebhook.HeaderSignatureVersion, e2bwebhook.SignatureVersion)
	req.Header.Set(e2bwebhook.HeaderWebhookID, "local")
	req.Header.Set(e2bwebhook.HeaderDeliveryID, uuid.NewString())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
