// Package provisioner is a core.Provider for sandboxes run as Kubernetes
// pods by a "provisioner" HTTP service, each pod serving the AIO sandbox
// HTTP API (github.com/agent-infra/sandbox).
//
// Two clients live here:
//
//   - the provisioner API client (X-API-Key; /api/sandboxes create, list,
//     get, delete; /api/capabilities; /api/reconciliation/sandboxes/{id}),
//     with tolerant listing, identity verification of create replies,
//     mount contract versions with a cached, backed-off capability probe, and found/absent/unknown discovery;
//   - the AIO sandbox client (GET /v1/sandbox, POST /v1/bash/exec,
//     GET /v1/file/download, POST /v1/file/upload and /v1/file/write), whose
//     wire format follows the AIO sandbox's public OpenAPI spec
//     (website/docs/public/v1/openapi.json in agent-infra/sandbox).
//
// A core.SandboxRef of this provider carries an AIO endpoint: the
// sandbox's AIO base URL (the provisioner's sandbox_url) and, when the
// provisioner issued one, a bearer token for it.
//
// Provisioner pods have no expiry: SetTimeout only confirms the sandbox
// still exists, and SandboxInfo.EndAt is zero. The broker's reconcile pass
// expires idle warm sandboxes by killing them.
package provisioner
