package e2b

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sandbox-broker/sandbox-broker/internal/providererr"
	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

var (
	_ core.PagedLister = (*Client)(nil)
	_ core.EnvdLocator = (*Client)(nil)
)

// ListPage reads one page of GET /v2/sandboxes (E2B API spec: limit,
// nextToken query parameters; the next token in the X-Next-Token response
// header, empty on the last page). cursor is a previous page's next token
// ("" = first page); limit is clamped to 1..ListPageSize. Errors are
// classified as List's.
func (c *Client) ListPage(ctx context.Context, f core.ListFilter, cursor string, limit int) ([]core.SandboxInfo, string, error) {
	const op = "list sandboxes"
	q := url.Values{}
	if len(f.Metadata) > 0 {
		inner := url.Values{}
		for k, v := range f.Metadata {
			inner.Set(k, v)
		}
		q.Set("metadata", inner.Encode())
	}
	states := f.States
	if len(states) == 0 {
		states = []string{"running", "paused"}
	}
	q.Set("state", strings.Join(states, ","))
	if limit <= 0 || limit > c.pageSize {
		limit = c.pageSize
	}
	q.Set("limit", strconv.Itoa(limit))
	if cursor != "" {
		q.Set("nextToken", cursor)
	}
	status, header, reply, err := c.call(ctx, c.timeouts.ControlPlane, op, http.MethodGet, "/v2/sandboxes", q, nil)
	if err != nil {
		return nil, "", err
	}
	if status != http.StatusOK {
		return nil, "", statusError(op, status, reply, providererr.AmbiguousStatus(status))
	}
	var items []sandboxDetail
	if err := json.Unmarshal(reply, &items); err != nil {
		return nil, "", &core.ProviderError{Op: op, StatusCode: status, Message: "unreadable reply: " + err.Error(), Ambiguous: true}
	}
	out := make([]core.SandboxInfo, len(items))
	for i, it := range items {
		out[i] = it.info()
	}
	next := header.Get("X-Next-Token")
	if next != "" && next == cursor {
		// A token that does not move would loop forever; never read it as
		// the end (an incomplete inventory must not look complete).
		return nil, "", &core.ProviderError{Op: op, StatusCode: status, Message: "next token did not advance"}
	}
	return out, next, nil
}

// EnvdRef addresses a sandbox's envd from its id alone (no call, so
// nothing extends its life). The access token is unknown (empty): it is
// only returned by create and connect.
func (c *Client) EnvdRef(id string) core.SandboxRef {
	return core.SandboxRef{ID: id, EnvdURL: c.envdURL(id, DefaultDomain)}
}
