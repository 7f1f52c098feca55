package e2b

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
)

var _ core.PagedLister = (*Client)(nil)

// ListPage reads one page of GET /v2/sandboxes (E2B API spec: limit,
// nextToken query parameters; the next token in the X-Next-Token response
// header, empty on the last page). cursor is a previous page's next token
// ("" = first page); limit is clamped to 1..ListPageSize. Errors are
// classified as List's.
func (c *Client) ListPage(ctx context.Context, f core.ListFilter, cursor string, limit int) ([]core.SandboxInfo, string, error) {
	const op = "list sandboxes"
	if limit <= 0 || limit > c.pageSize {
		limit = c.pageSize
	}
	q := listQuery(f, limit)
	if cursor != "" {
		q.Set("nextToken", cursor)
	}
	out, next, err := c.fetchPage(ctx, op, q)
	if err != nil {
		return nil, "", err
	}
	if next != "" && next == cursor {
		// A token that does not move would loop forever; never read it as
		// the end (an incomplete inventory must not look complete).
		return nil, "", &core.ProviderError{Op: op, StatusCode: http.StatusOK, Message: "next token did not advance"}
	}
	return out, next, nil
}

// listQuery is GET /v2/sandboxes's query for f: the metadata filter
// double-encoded as the SDK does it (a query string as the value of the
// metadata parameter), state (default running,paused) and limit.
func listQuery(f core.ListFilter, limit int) url.Values {
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
	q.Set("limit", strconv.Itoa(limit))
	return q
}

// fetchPage reads one page of GET /v2/sandboxes with query q and returns
// its sandboxes and the X-Next-Token header ("" on the last page). Errors
// are *core.ProviderError: transport (ambiguous), a non-200 status
// (statusError) or an unreadable reply (ambiguous).
func (c *Client) fetchPage(ctx context.Context, op string, q url.Values) ([]core.SandboxInfo, string, error) {
	status, header, reply, err := c.call(ctx, c.timeouts.ControlPlane, op, http.MethodGet, "/v2/sandboxes", q, nil)
	if err != nil {
		return nil, "", err
	}
	if status != http.StatusOK {
		return nil, "", statusError(op, status, reply, providerhttp.AmbiguousStatus(status))
	}
	var items []e2bapi.ListedSandbox
	if err := json.Unmarshal(reply, &items); err != nil {
		return nil, "", &core.ProviderError{Op: op, StatusCode: status, Message: "unreadable reply: " + err.Error(), Ambiguous: true}
	}
	out := make([]core.SandboxInfo, len(items))
	for i, it := range items {
		out[i] = sandboxInfo(it)
	}
	return out, header.Get("X-Next-Token"), nil
}

// Locate addresses a sandbox's envd, its access token included, with
// GET /sandboxes/{id}: a read, so nothing extends the sandbox's life or
// resumes it. ErrSandboxGone when the API no longer has it.
func (c *Client) Locate(ctx context.Context, id string) (core.Endpoint, error) {
	d, err := c.detail(ctx, id)
	if err != nil {
		return core.Endpoint{}, err
	}
	return c.endpoint(id, d.Domain, d.EnvdAccessToken), nil
}
