package httpapi

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// e2bListMax is the largest page of E2B's list (E2B's own bound).
const e2bListMax = 100

// e2bState is E2B's state of a record: "running" when handed out (or
// being handed out), "paused" when parked for its thread (warm or
// paused), "" when it is ending.
func e2bState(st core.State) string {
	switch st {
	case core.StateActive, core.StateCreating, core.StateResuming:
		return "running"
	case core.StateReleasing, core.StateWarm, core.StatePausing, core.StatePaused:
		return "paused"
	}
	return ""
}

// e2bListed is rec as E2B's list shows it; metadata carries its thread.
func (h *handler) e2bListed(rec core.Record) e2bapi.ListedSandbox {
	return e2bapi.ListedSandbox{
		TemplateID: h.templateID(), SandboxID: rec.SandboxID, ClientID: e2bClientID,
		StartedAt: rec.CreatedAt, EndAt: rec.ExpiresAt,
		Metadata:    map[string]string{"user_id": rec.User, "thread_id": rec.Thread},
		State:       e2bState(rec.State),
		EnvdVersion: E2BEnvdVersion, VolumeMounts: []any{},
	}
}

// e2bInfo is get info: the tenant's own sandbox, running or parked.
func (h *handler) e2bInfo(ctx context.Context, r *request, id string) events.APIGatewayV2HTTPResponse {
	rec, err := h.broker.Get(ctx, r.tenant, id)
	if err != nil {
		return r.e2bFail(err, id)
	}
	if e2bState(rec.State) == "" {
		return r.e2bNotFound(id)
	}
	return r.json(http.StatusOK, e2bapi.SandboxDetail{ListedSandbox: h.e2bListed(rec),
		EnvdAccessToken: rec.Endpoint.AccessToken, Domain: e2bapi.DomainOf(rec.SandboxID, rec.Endpoint.URL)})
}

// e2bListQuery is a list's filters.
type e2bListQuery struct {
	metadata       map[string]string
	running, pause bool
	limit          int
	desc           bool
	after          *listedAt // the previous page's last sandbox
	startedAfter   time.Time
	template       string
}

// parseE2BList reads list's query: metadata (a query string inside the
// value: the SDKs encode it twice), state (comma-separated or repeated;
// without it v2 lists both states, v1 running ones), limit, nextToken,
// startedAfter, template and order (asc or desc by start time; desc,
// newest first, by default).
func parseE2BList(q url.Values, v1 bool) (e2bListQuery, error) {
	lq := e2bListQuery{metadata: map[string]string{}, running: true, pause: !v1, limit: e2bListMax, desc: true, template: q.Get("template")}
	bad := func(field, msg string) error { return &core.ValidationError{Field: field, Message: msg} }
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		lq.desc = false
	default:
		return lq, bad("order", "must be asc or desc")
	}
	if tok := q.Get("nextToken"); tok != "" {
		after, err := parseListToken(tok)
		if err != nil {
			return lq, err
		}
		lq.after = after
	}
	if raw := q.Get("metadata"); raw != "" {
		mq, err := url.ParseQuery(raw)
		if err != nil {
			return lq, bad("metadata", "must be a query string of key=value pairs")
		}
		for k, vs := range mq {
			lq.metadata[k] = vs[len(vs)-1]
		}
	}
	if states, ok := q["state"]; ok {
		lq.running, lq.pause = false, false
		for _, st := range strings.Split(strings.Join(states, ","), ",") {
			switch strings.TrimSpace(st) {
			case "running":
				lq.running = true
			case "paused":
				lq.pause = true
			case "":
			default:
				return lq, bad("state", fmt.Sprintf("%q is not running or paused", st))
			}
		}
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > e2bListMax {
			return lq, bad("limit", fmt.Sprintf("must be 1 to %d", e2bListMax))
		}
		lq.limit = n
	}
	if s := q.Get("startedAfter"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return lq, bad("startedAfter", "must be an RFC 3339 time")
		}
		lq.startedAfter = t
	}
	return lq, nil
}

// match reports whether listed sandbox ls passes the filters.
func (lq e2bListQuery) match(ls e2bapi.ListedSandbox, created time.Time) bool {
	if (ls.State == "running" && !lq.running) || (ls.State == "paused" && !lq.pause) || ls.State == "" {
		return false
	}
	if lq.template != "" && lq.template != ls.TemplateID {
		return false
	}
	if !lq.startedAfter.IsZero() && !created.After(lq.startedAfter) {
		return false
	}
	for k, v := range lq.metadata {
		if ls.Metadata[k] != v {
			return false
		}
	}
	return true
}

// e2bListReadMax bounds the tenant's sandboxes one list reads to order
// them (E2B orders before paging, so every page reads them all).
const e2bListReadMax = 20 * e2bListMax

// e2bList is list: one page of the tenant's own sandboxes, filtered and
// ordered by start time (newest first unless order=asc), the next page's
// token in X-Next-Token. The order holds across pages: each page reads
// the tenant's sandboxes (up to e2bListReadMax) and starts after the
// previous page's last one.
func (h *handler) e2bList(ctx context.Context, r *request, v1 bool) events.APIGatewayV2HTTPResponse {
	lq, err := parseE2BList(queryOf(r.ev), v1)
	if err != nil {
		return r.e2bInvalid(err)
	}
	var out []listedAt
	seen := map[string]bool{} // a record moving state between store pages may come twice
	for cursor, n := "", 0; n == 0 || cursor != ""; n++ {
		recs, next, err := h.broker.Sandboxes(ctx, r.tenant, cursor, e2bListMax)
		if err != nil {
			return r.e2bFail(err, "")
		}
		for _, rec := range recs {
			if ls := h.e2bListed(rec); lq.match(ls, rec.CreatedAt) && !seen[rec.SandboxID] {
				seen[rec.SandboxID] = true
				out = append(out, listedAt{ls, rec.CreatedAt})
			}
		}
		if cursor = next; (n+1)*e2bListMax >= e2bListReadMax {
			break
		}
	}
	page, next := lq.page(out)
	resp := r.json(http.StatusOK, page)
	if next != "" {
		resp.Headers["X-Next-Token"] = next
	}
	return resp
}

// listedAt is a listed sandbox and its record's creation time, the key
// list orders by.
type listedAt struct {
	ls e2bapi.ListedSandbox
	at time.Time
}

// before reports whether a comes before b in ascending order: by
// creation time, then id.
func (a listedAt) before(b listedAt) bool {
	if !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	return a.ls.SandboxID < b.ls.SandboxID
}

// page orders all and cuts the page after lq.after; next is the token
// of the page that follows ("" after the last).
func (lq e2bListQuery) page(all []listedAt) ([]e2bapi.ListedSandbox, string) {
	// follows reports whether x comes after y in the asked order.
	follows := func(x, y listedAt) bool {
		if lq.desc {
			return x.before(y)
		}
		return y.before(x)
	}
	slices.SortFunc(all, func(a, b listedAt) int {
		switch {
		case follows(b, a):
			return -1
		case follows(a, b):
			return 1
		}
		return 0
	})
	start := 0
	if lq.after != nil {
		start = len(all)
		if i := slices.IndexFunc(all, func(x listedAt) bool { return follows(x, *lq.after) }); i >= 0 {
			start = i
		}
	}
	out := []e2bapi.ListedSandbox{}
	for _, x := range all[start:min(len(all), start+lq.limit)] {
		out = append(out, x.ls)
	}
	if start+lq.limit >= len(all) {
		return out, ""
	}
	last := all[start+lq.limit-1]
	return out, base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(last.at.UnixNano(), 10) + "." + last.ls.SandboxID))
}

// parseListToken reads a token page handed out: the last listed
// sandbox's creation time and id.
func parseListToken(tok string) (*listedAt, error) {
	bad := &core.ValidationError{Field: "nextToken", Message: "is not a token this list handed out"}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return nil, bad
	}
	ns, id, ok := strings.Cut(string(raw), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || core.ValidateSandboxID(id) != nil {
		return nil, bad
	}
	return &listedAt{ls: e2bapi.ListedSandbox{SandboxID: id}, at: time.Unix(0, n)}, nil
}

// e2bMetrics is get metrics: the provider's figures for the tenant's own
// sandbox, passed through; start and end are E2B's Unix seconds.
func (h *handler) e2bMetrics(ctx context.Context, r *request, id string, body []byte) events.APIGatewayV2HTTPResponse {
	if err := decodeEmpty(body); err != nil {
		return r.e2bInvalid(err)
	}
	q := queryOf(r.ev)
	var at [2]time.Time
	for i, name := range []string{"start", "end"} {
		if s := q.Get(name); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 {
				return r.e2bInvalid(&core.ValidationError{Field: name, Message: "must be a time in Unix seconds"})
			}
			at[i] = time.Unix(n, 0).UTC()
		}
	}
	ms, err := h.broker.Metrics(ctx, r.tenant, id, at[0], at[1])
	if errors.Is(err, core.ErrNotOffered) {
		return r.e2bError(http.StatusNotImplemented, api.CodeRouteNotFound,
			"sandbox metrics are not offered by this deployment's sandbox provider", 0)
	}
	if err != nil {
		return r.e2bFail(err, id)
	}
	out := make([]e2bapi.SandboxMetric, len(ms))
	for i, m := range ms {
		out[i] = e2bapi.SandboxMetric{Timestamp: m.Timestamp.UTC(), TimestampUnix: m.Timestamp.Unix(), CPUCount: m.CPUCount,
			CPUUsedPct: m.CPUUsedPct, MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
	}
	return r.json(http.StatusOK, out)
}

// queryOf is the request's query, from its raw form when present (it
// keeps repeated keys) else from the decoded parameters.
func queryOf(ev events.APIGatewayV2HTTPRequest) url.Values {
	if ev.RawQueryString != "" {
		if q, err := url.ParseQuery(ev.RawQueryString); err == nil {
			return q
		}
	}
	q := url.Values{}
	for k, v := range ev.QueryStringParameters {
		q.Set(k, v)
	}
	return q
}

// e2bNotOffered names, for a call the face does not serve, the broker's
// equivalent or that it is not offered.
func e2bNotOffered(ev events.APIGatewayV2HTTPRequest) string {
	path := ev.RawPath
	if path == "" {
		path = ev.RequestContext.HTTP.Path
	}
	rest := strings.TrimPrefix(strings.TrimPrefix(path, "/e2b"), "/v2")
	first, _, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	why := map[string]string{
		"templates": "templates are not offered: the deployment runs one template (SANDBOX_TEMPLATE), built with E2B's own tools",
		"snapshots": "snapshots are not offered: pause the sandbox (POST /sandboxes/{id}/pause) to keep its files and memory for its thread",
		"volumes":   "volumes are not offered: a thread's outputs/ and workspace/ are stored in S3 at each release and restored into its next sandbox",
		"secrets":   "secrets are not offered: pass values per command (commands.run(cmd, {envs}))",
		"sandboxes": "this sandbox call is not offered by sandbox-broker (network updates, snapshots and logs among them)",
	}[first]
	if why == "" {
		why = "not an E2B call sandbox-broker serves"
	}
	return fmt.Sprintf("%s %s: %s; see docs/clients.md#e2b-sdks", method(ev), path, why)
}
