package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// The E2B-compatible face, under /e2b: with E2B_API_URL=<api_url>/e2b and
// E2B_API_KEY=<the tenant's token> (sent as X-API-Key), an E2B SDK program
// runs on brokered sandboxes unchanged. Each E2B control-plane call maps
// onto the broker's own (create = acquire for the thread in metadata,
// kill and pause = release parked paused, list = the tenant's own); calls
// the broker cannot honour answer E2B's error shape, never a silent
// success. The guide's table (docs/clients.md#e2b-sdks) is the mapping.
const (
	// RouteE2BConnect and RouteE2BConnectV2 are E2B's connect, in the form
	// of E2B's OpenAPI spec and the one the SDKs send (declared in the
	// templates; every other /e2b route arrives as RouteE2BOther and is
	// resolved from its path).
	RouteE2BConnect   = "POST /e2b/sandboxes/{id}/connect"
	RouteE2BConnectV2 = "POST /e2b/v2/sandboxes/{id}/connect"
	RouteE2BOther     = "ANY /e2b/{proxy+}"
)

// The E2B routes resolved from the path of a RouteE2BOther request.
const (
	e2bRouteCreate   = "POST /e2b/sandboxes"
	e2bRouteCreateV2 = "POST /e2b/v2/sandboxes"
	e2bRouteList     = "GET /e2b/sandboxes"
	e2bRouteListV2   = "GET /e2b/v2/sandboxes"
	e2bRouteInfo     = "GET /e2b/sandboxes/{id}"
	e2bRouteKill     = "DELETE /e2b/sandboxes/{id}"
	e2bRoutePause    = "POST /e2b/sandboxes/{id}/pause"
	e2bRouteResume   = "POST /e2b/sandboxes/{id}/resume"
	e2bRouteTimeout  = "POST /e2b/sandboxes/{id}/timeout"
	e2bRouteRefresh  = "POST /e2b/sandboxes/{id}/refreshes"
	e2bRouteMetrics  = "GET /e2b/sandboxes/{id}/metrics"
)

// E2BEnvdVersion is the envd version create and connect report. The SDKs
// gate features on it (raw uploads from 0.5.7, the newest gate at 0.6.4);
// the broker does not record each sandbox's envd version, and its own
// clients already rely on envd 0.5.7 or newer.
const E2BEnvdVersion = "0.6.4"

// e2bClientID is the clientID of the broker's E2B replies.
const e2bClientID = "sandbox-broker"

// e2bRoute resolves a path under /e2b (segs, split on "/") and method to
// its route and sandbox id; ok is false outside /e2b. A path or method
// the face does not serve is RouteE2BOther.
func e2bRoute(method string, segs []string) (route, id string, ok bool) {
	if len(segs) == 0 || segs[0] != "e2b" {
		return "", "", false
	}
	segs = segs[1:]
	v2 := len(segs) > 0 && segs[0] == "v2"
	if v2 {
		segs = segs[1:]
	}
	if len(segs) == 0 || segs[0] != "sandboxes" || len(segs) > 3 {
		return RouteE2BOther, "", true
	}
	var want string
	switch {
	case len(segs) == 1 && method == http.MethodPost:
		want = pick(v2, e2bRouteCreateV2, e2bRouteCreate)
	case len(segs) == 1 && method == http.MethodGet:
		want = pick(v2, e2bRouteListV2, e2bRouteList)
	case len(segs) == 2 && method == http.MethodGet:
		want, id = e2bRouteInfo, segs[1]
	case len(segs) == 2 && method == http.MethodDelete:
		want, id = e2bRouteKill, segs[1]
	case len(segs) == 3 && segs[2] == "connect" && method == http.MethodPost:
		want, id = pick(v2, RouteE2BConnectV2, RouteE2BConnect), segs[1]
	case len(segs) == 3 && method == http.MethodPost && !v2:
		want, id = map[string]string{"pause": e2bRoutePause, "resume": e2bRouteResume, "timeout": e2bRouteTimeout,
			"refreshes": e2bRouteRefresh}[segs[2]], segs[1]
	case len(segs) == 3 && segs[2] == "metrics" && method == http.MethodGet && !v2:
		want, id = e2bRouteMetrics, segs[1]
	}
	if want == "" {
		return RouteE2BOther, "", true
	}
	return want, id, true
}

func pick(v2 bool, a, b string) string {
	if v2 {
		return a
	}
	return b
}

// isE2B reports whether route is one of the /e2b face's.
func isE2B(route string) bool { return strings.Contains(route, " /e2b/") }

// serveE2B answers the /e2b routes for r.tenant.
func (h *handler) serveE2B(ctx context.Context, r *request, route, id string, body []byte) events.APIGatewayV2HTTPResponse {
	switch route {
	case RouteE2BOther:
		return r.e2bError(http.StatusNotImplemented, api.CodeRouteNotFound, e2bNotOffered(r.ev), 0)
	case e2bRouteCreate, e2bRouteCreateV2:
		return h.e2bCreate(ctx, r, body)
	case e2bRouteList, e2bRouteListV2:
		if err := decodeEmpty(body); err != nil {
			return r.e2bInvalid(err)
		}
		return h.e2bList(ctx, r, route == e2bRouteList)
	}
	if err := core.ValidateSandboxID(id); err != nil {
		return r.e2bInvalid(err)
	}
	switch route {
	case RouteE2BConnect, RouteE2BConnectV2, e2bRouteResume:
		return h.e2bConnect(ctx, r, id, body)
	case e2bRouteInfo:
		return h.e2bInfo(ctx, r, id)
	case e2bRouteKill, e2bRoutePause:
		return h.e2bRelease(ctx, r, route, id, body)
	case e2bRouteTimeout, e2bRouteRefresh:
		return h.e2bKeepAlive(ctx, r, route, id, body)
	case e2bRouteMetrics:
		return h.e2bMetrics(ctx, r, id, body)
	}
	return r.e2bError(http.StatusNotImplemented, api.CodeRouteNotFound, e2bNotOffered(r.ev), 0)
}

func (r *request) e2bError(status int, code api.ErrorCode, msg string, retryAfter int) events.APIGatewayV2HTTPResponse {
	r.code = code
	resp := r.json(status, e2bapi.Error{Code: status, Message: msg})
	if retryAfter > 0 {
		resp.Headers["Retry-After"] = strconv.Itoa(retryAfter)
	}
	return resp
}

// e2bInvalid answers a malformed request: 400 with the validation's text.
func (r *request) e2bInvalid(err error) events.APIGatewayV2HTTPResponse {
	return r.e2bError(http.StatusBadRequest, api.CodeValidation, err.Error(), 0)
}

// e2bNotFound is E2B's not-found for sandbox id (the SDKs recognise it by
// code 404 in the body).
func (r *request) e2bNotFound(id string) events.APIGatewayV2HTTPResponse {
	return r.e2bError(http.StatusNotFound, api.CodeSandboxNotFound, fmt.Sprintf("sandbox %q not found (or not running)", id), 0)
}

// e2bFail answers a broker error in E2B's shape, with the status and
// Retry-After of the broker's own mapping (capacity and quota: 429, which
// the SDKs retry; outages: 503).
func (r *request) e2bFail(err error, id string) events.APIGatewayV2HTTPResponse {
	if errors.Is(err, core.ErrNotFound) || errors.Is(err, core.ErrSandboxGone) {
		return r.e2bNotFound(id)
	}
	resp := r.fail(err)
	var reply api.ErrorReply
	msg := "sandbox-broker could not complete the call, retry later"
	if json.Unmarshal([]byte(resp.Body), &reply) == nil && reply.Error.Message != "" {
		msg = reply.Error.Message
		if reply.Error.Reason != "" {
			msg += " (" + reply.Error.Reason + ")"
		}
	}
	if r.detail == "" {
		r.detail = err.Error()
	}
	return r.e2bError(resp.StatusCode, r.code, msg, atoi(resp.Headers["Retry-After"]))
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
