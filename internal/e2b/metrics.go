package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
)

// Metrics reads a sandbox's resource use with GET /sandboxes/{id}/metrics
// (Capabilities.Metrics), between start and end when set (E2B's start and
// end query parameters, in Unix seconds). A read: it neither extends nor
// changes the sandbox.
//
// Errors: core.ErrSandboxGone on E2B's not-found; *core.ProviderError
// for any other refusal or an unreadable reply.
func (c *Client) Metrics(ctx context.Context, id string, start, end time.Time) ([]core.SandboxMetric, error) {
	if err := core.ValidateSandboxID(id); err != nil {
		return nil, err
	}
	const op = "sandbox metrics"
	q := url.Values{}
	if !start.IsZero() {
		q.Set("start", strconv.FormatInt(start.Unix(), 10))
	}
	if !end.IsZero() {
		q.Set("end", strconv.FormatInt(end.Unix(), 10))
	}
	status, _, reply, err := c.call(ctx, c.timeouts.ControlPlane, op, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/metrics", q, nil)
	if err != nil {
		return nil, err
	}
	if apiNotFound(status, reply) {
		return nil, fmt.Errorf("e2b %s %s: %w", op, id, core.ErrSandboxGone)
	}
	if status != http.StatusOK {
		return nil, statusError(op, status, reply, providerhttp.AmbiguousStatus(status))
	}
	var ms []e2bapi.SandboxMetric
	if err := json.Unmarshal(reply, &ms); err != nil {
		return nil, &core.ProviderError{Op: op, StatusCode: status, Message: "unreadable reply: " + err.Error()}
	}
	out := make([]core.SandboxMetric, len(ms))
	for i, m := range ms {
		out[i] = core.SandboxMetric{Timestamp: m.Timestamp.UTC(), CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
			MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
	}
	return out, nil
}
