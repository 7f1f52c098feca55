package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// The E2B-compatible face, under /e2b: with E2B_API_URL=<api_url>/e2b and
// E2B_API_KEY=<the tenant's token> (sent as X-API-Key), the official E2B
// SDKs' Sandbox.connect(id) works for a sandbox the tenant holds. Only
// connect is served; every other E2B control-plane route answers 403
// pointing at the broker's acquire and release, without touching the
// broker or the provider.
const (
	// RouteE2BConnect and RouteE2BConnectV2 are E2B's connect, in the form
	// of E2B's OpenAPI spec and the one the SDKs send.
	RouteE2BConnect   = "POST /e2b/sandboxes/{id}/connect"
	RouteE2BConnectV2 = "POST /e2b/v2/sandboxes/{id}/connect"
	// RouteE2BOther is every other path under /e2b.
	RouteE2BOther = "ANY /e2b/{proxy+}"
)

// E2BEnvdVersion is the envd version connect reports. The SDKs gate
// features on it (raw uploads from 0.5.7, the newest gate at 0.6.4); the
// broker does not record each sandbox's envd version, and its own clients
// already rely on envd 0.5.7 or newer.
const E2BEnvdVersion = "0.6.4"

// e2bPaths maps /e2b paths to routes when API Gateway did not route the
// request (the raw path): connect forms, anything else under /e2b.
func e2bRoute(segs []string) (want, id string, ok bool) {
	if len(segs) == 0 || segs[0] != "e2b" {
		return "", "", false
	}
	switch {
	case len(segs) == 4 && segs[1] == "sandboxes" && segs[3] == "connect":
		return RouteE2BConnect, segs[2], true
	case len(segs) == 5 && segs[1] == "v2" && segs[2] == "sandboxes" && segs[4] == "connect":
		return RouteE2BConnectV2, segs[3], true
	}
	return RouteE2BOther, "", true
}

func (r *request) e2bError(status int, code api.ErrorCode, msg string, retryAfter int) events.APIGatewayV2HTTPResponse {
	r.code = code
	resp := r.json(status, e2bapi.Error{Code: status, Message: msg})
	if retryAfter > 0 {
		resp.Headers["Retry-After"] = strconv.Itoa(retryAfter)
	}
	return resp
}

// e2bRefusal is the answer to every /e2b route but connect.
const e2bRefusal = "sandbox-broker serves only Sandbox.connect under /e2b: the broker owns each sandbox's lifetime. " +
	"Get a sandbox with POST /v1/sandboxes/acquire and hand it back with POST /v1/sandboxes/{id}/release " +
	"(create, kill, timeouts, pause, resume and list are not available through /e2b)"

// serveE2B answers the /e2b routes for tenant.
func (h *handler) serveE2B(ctx context.Context, r *request, route, id string) events.APIGatewayV2HTTPResponse {
	if route == RouteE2BOther {
		return r.e2bError(http.StatusForbidden, api.CodeForbidden, e2bRefusal, 0)
	}
	if err := core.ValidateSandboxID(id); err != nil {
		return r.e2bError(http.StatusBadRequest, api.CodeValidation, "sandbox id: "+err.Error(), 0)
	}
	// Get reads the record only: connect neither extends the sandbox's
	// life nor resumes it, and reaches no provider.
	rec, err := h.broker.Get(ctx, r.tenant, id)
	switch {
	case errors.Is(err, core.ErrNotFound) || (err == nil && rec.State != core.StateActive):
		// Released (warm), another tenant's, or unknown: E2B's not-found.
		return r.e2bError(http.StatusNotFound, api.CodeSandboxNotFound,
			fmt.Sprintf("sandbox %q not found: acquire it with POST /v1/sandboxes/acquire first (connect works while the tenant holds it)", id), 0)
	case err != nil:
		resp := r.fail(err)
		r.detail = err.Error()
		return r.e2bError(resp.StatusCode, r.code, "sandbox-broker could not read the sandbox, retry later", atoi(resp.Headers["Retry-After"]))
	}
	if rec.Endpoint.Protocol != core.ProtocolEnvd {
		return r.e2bError(http.StatusBadRequest, api.CodeValidation, fmt.Sprintf(
			"sandbox %q runs on backend %q, reached by the %s protocol, not E2B's envd: the E2B SDK cannot work in it; "+
				"use the connection of POST /v1/sandboxes/acquire", id, rec.Backend, rec.Endpoint.Protocol), 0)
	}
	return r.json(http.StatusOK, e2bapi.Sandbox{
		SandboxID:       rec.SandboxID,
		EnvdVersion:     E2BEnvdVersion,
		EnvdAccessToken: rec.Endpoint.AccessToken,
		Domain:          e2bapi.DomainOf(rec.SandboxID, rec.Endpoint.URL),
	})
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
