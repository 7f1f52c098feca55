package httpapi

import (
	"context"
	"net/http"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// Option configures the handler.
type Option func(*handler)

// WithAdminTenants allows the given tenants (from the authorizer, like every
// caller) on the /v1/admin routes. Without it those routes answer 403.
func WithAdminTenants(tenants ...string) Option {
	return func(h *handler) {
		if h.admins == nil {
			h.admins = map[string]bool{}
		}
		for _, t := range tenants {
			if t != "" {
				h.admins[t] = true
			}
		}
	}
}

// WithMetrics makes the handler write CloudWatch embedded-metric-format
// lines (core.LogEMF, dimension Deployment = deployment): CapacityUsed and
// CapacityLimit at GET /v1/capacity and at a 429 for capacity,
// CapacityRejected (1) at every 429, and SyncDeferredFiles after every sync
// pass a sync or release answers with. Without it (or with "") no metrics
// are written.
func WithMetrics(deployment string) Option {
	return func(h *handler) { h.deployment = deployment }
}

// WithTenantClaim names the JWT claim that carries the caller's tenant
// (BROKER_TENANT_CLAIM; Cognito issues custom attributes as
// "custom:<name>"). "" keeps DefaultTenantClaim.
func WithTenantClaim(claim string) Option {
	return func(h *handler) { h.tenantClaim = claim }
}

// setDraining serves POST /v1/admin/drain and /v1/admin/undrain: 200
// {"draining": bool}; 403 FORBIDDEN for a tenant that is not an admin.
func (h *handler) setDraining(ctx context.Context, r *request, draining bool) events.APIGatewayV2HTTPResponse {
	if !h.admins[r.tenant] {
		return r.errorResponse(http.StatusForbidden, apiError{Code: api.CodeForbidden, Message: "admin route: this tenant is not an administrator", Reason: api.ReasonNotAdmin}, 0)
	}
	if err := h.broker.SetDraining(ctx, draining); err != nil {
		return r.fail(err)
	}
	return r.json(http.StatusOK, api.DrainStatus{Draining: draining})
}

// WithE2BTemplate names the deployment's template (SANDBOX_TEMPLATE): the
// templateID an E2B create may name besides "base", and the one the /e2b
// replies report.
func WithE2BTemplate(template string) Option {
	return func(h *handler) { h.e2bTemplate = template }
}
