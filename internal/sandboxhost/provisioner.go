package sandboxhost

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
)

// DefaultMountContract is the mount contract version the provisioner face
// advertises unless ProvisionerOptions says otherwise (the first version
// that verifies and isolates users).
const DefaultMountContract = 2

// errDuplicateID: a create asked for an id that is already live.
var errDuplicateID = errors.New("sandbox id already in use")

// provisionerIDPattern is the accepted shape of a requested sandbox id.
var provisionerIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ProvisionerOptions configures the provisioner face of a Host.
type ProvisionerOptions struct {
	// APIKey is required in X-API-Key on every /api call. Required.
	APIKey string
	// ContractVersion is the advertised mount contract version; 0 means
	// DefaultMountContract. Ignored when Legacy is set.
	ContractVersion int
	// BackendNamespace identifies this backend in discovery answers; ""
	// means "local-<random>".
	BackendNamespace string
	// Legacy makes the face behave like an old provisioner: no
	// /api/capabilities and no reconciliation route (404), contract 0, and
	// create replies without user, thread or contract version.
	Legacy bool
}

// Provisioner is the second face of a Host: the Kubernetes-provisioner API
// (/api/...) and, under /aio/{id}, the AIO sandbox API subset the broker
// uses, over the host's sandboxes and processes. Create it with
// Host.Provisioner; serve Handler.
type Provisioner struct {
	h        *Host
	opts     ProvisionerOptions
	contract int
	ns       string

	mu    sync.Mutex
	base  string // public base URL, e.g. http://127.0.0.1:40125
	boxes map[string]*provBox
}

// provBox is what the provisioner knows of one of its sandboxes.
type provBox struct {
	id, user, thread string
	hasThread        bool
	incarnation      string
	metadata         map[string]string
}

// Provisioner returns the provisioner face of h. baseURL is the public
// base URL its Handler is served at (sandbox_url values are
// baseURL/aio/<id>).
//
// Errors: a missing APIKey.
func (h *Host) Provisioner(baseURL string, opts ProvisionerOptions) (*Provisioner, error) {
	if opts.APIKey == "" {
		return nil, errors.New("sandboxhost: provisioner APIKey is required")
	}
	p := &Provisioner{h: h, opts: opts, contract: opts.ContractVersion, ns: opts.BackendNamespace,
		base: strings.TrimRight(baseURL, "/"), boxes: map[string]*provBox{}}
	if p.contract <= 0 {
		p.contract = DefaultMountContract
	}
	if opts.Legacy {
		p.contract = 0
	}
	if p.ns == "" {
		p.ns = "local-" + randomID(10)
	}
	return p, nil
}

// provError is FastAPI's error body {"detail": ...}.
type provError struct {
	Detail any `json:"detail"`
}

// provCreateRequest is POST /api/sandboxes's body (metadata and env are
// this host's extensions).
type provCreateRequest struct {
	SandboxID        string            `json:"sandbox_id"`
	ThreadID         *string           `json:"thread_id"`
	UserID           string            `json:"user_id"`
	RequiredContract *int              `json:"required_mount_contract_version"`
	ExtraMounts      []json.RawMessage `json:"extra_mounts"`
	Metadata         map[string]string `json:"metadata"`
	Env              map[string]string `json:"env"`
}

// provSandbox is a sandbox in provisioner replies.
type provSandbox struct {
	SandboxID        string            `json:"sandbox_id"`
	SandboxURL       string            `json:"sandbox_url"`
	Status           string            `json:"status"`
	UserID           string            `json:"user_id,omitempty"`
	ThreadID         *string           `json:"thread_id,omitempty"`
	Contract         *int              `json:"mount_contract_version,omitempty"`
	Metadata         map[string]string `json:"metadata"` // always present: this host stores metadata
	AccessToken      string            `json:"access_token,omitempty"`
	IncarnationID    string            `json:"incarnation_id,omitempty"`
	BackendNamespace string            `json:"backend_namespace,omitempty"`
}

// Handler serves the provisioner API and the AIO API:
//
//	GET    /api/capabilities                    {mount_contract_version, backend_namespace}
//	GET    /api/sandboxes                       {"sandboxes": [...]}
//	POST   /api/sandboxes                       create (409 mount_contract_changed on a version mismatch)
//	GET    /api/sandboxes/{id}                  status "Running"; 404 when gone
//	DELETE /api/sandboxes/{id}                  kill; 404 when gone
//	GET    /api/reconciliation/sandboxes/{id}   {status: found|absent, backend_namespace, ...}
//	/aio/{id}/v1/...                            the AIO subset (see aio.go)
//
// /api routes need X-API-Key; /aio routes need "Authorization: Bearer
// <access_token>" (the token from the create reply).
func (p *Provisioner) Handler() http.Handler {
	api := http.NewServeMux()
	api.HandleFunc("GET /api/capabilities", p.handleCapabilities)
	api.HandleFunc("GET /api/sandboxes", p.handleList)
	api.HandleFunc("POST /api/sandboxes", p.handleCreate)
	api.HandleFunc("GET /api/sandboxes/{id}", p.handleGet)
	api.HandleFunc("DELETE /api/sandboxes/{id}", p.handleDelete)
	api.HandleFunc("GET /api/reconciliation/sandboxes/{id}", p.handleDiscover)
	aio := p.aioHandler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rest, ok := strings.CutPrefix(r.URL.Path, "/aio/"); ok {
			id, sub, _ := strings.Cut(rest, "/")
			p.serveAIO(w, r, id, "/"+sub, aio)
			return
		}
		key := r.Header.Get(headerAPIKey)
		if subtle.ConstantTimeCompare([]byte(key), []byte(p.opts.APIKey)) != 1 {
			writeJSON(w, http.StatusUnauthorized, provError{Detail: "invalid or missing API key"})
			return
		}
		api.ServeHTTP(w, r)
	})
}

// live returns the provisioner's live sandbox id (forgetting one that died).
func (p *Provisioner) live(id string) (*provBox, *sandbox, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	box, ok := p.boxes[id]
	if !ok {
		return nil, nil, false
	}
	sb, err := p.h.get(id)
	if err != nil {
		delete(p.boxes, id)
		return nil, nil, false
	}
	return box, sb, true
}

// url is the AIO base URL of sandbox id.
func (p *Provisioner) url(id string) string { return p.base + "/aio/" + id }

// view renders box for replies (no access token).
func (p *Provisioner) view(box *provBox) provSandbox {
	v := provSandbox{SandboxID: box.id, SandboxURL: p.url(box.id), Status: "Running",
		Metadata: box.metadata, IncarnationID: box.incarnation, BackendNamespace: p.ns}
	if !p.opts.Legacy {
		c := p.contract
		v.Contract = &c
		v.UserID = box.user
		if box.hasThread {
			t := box.thread
			v.ThreadID = &t
		}
	}
	return v
}

func (p *Provisioner) handleCapabilities(w http.ResponseWriter, r *http.Request) {
	if p.opts.Legacy {
		writeJSON(w, http.StatusNotFound, provError{Detail: "Not Found"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"mount_contract_version": p.contract, "backend_namespace": p.ns})
}

func (p *Provisioner) handleList(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	ids := make([]string, 0, len(p.boxes))
	for id := range p.boxes {
		ids = append(ids, id)
	}
	p.mu.Unlock()
	out := []provSandbox{}
	for _, id := range ids {
		if box, _, ok := p.live(id); ok {
			out = append(out, p.view(box))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

func (p *Provisioner) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req provCreateRequest
	if err := readBody(r, &req); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: err.Error()})
		return
	}
	if !provisionerIDPattern.MatchString(req.SandboxID) {
		writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: "sandbox_id must match " + provisionerIDPattern.String()})
		return
	}
	if len(req.ExtraMounts) > 0 {
		writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: "extra_mounts are not supported by the local sandbox host"})
		return
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			writeJSON(w, http.StatusUnprocessableEntity, provError{Detail: fmt.Sprintf("invalid env name %q", k)})
			return
		}
	}
	if req.RequiredContract != nil && *req.RequiredContract != p.contract {
		writeJSON(w, http.StatusConflict, provError{Detail: map[string]any{
			"code": "mount_contract_changed", "expected": *req.RequiredContract, "actual": p.contract}})
		return
	}
	user := req.UserID
	if user == "" {
		user = "default"
	}
	if req.Metadata == nil {
		req.Metadata = map[string]string{}
	}
	box := &provBox{id: req.SandboxID, user: user, incarnation: randomID(16), metadata: req.Metadata}
	if req.ThreadID != nil {
		box.thread, box.hasThread = *req.ThreadID, true
	}
	if _, _, ok := p.live(req.SandboxID); ok {
		writeJSON(w, http.StatusConflict, provError{Detail: fmt.Sprintf("sandbox %q already exists", req.SandboxID)})
		return
	}
	sb, err := p.h.create(createSpec{id: req.SandboxID, templateID: "aio", timeout: p.h.opts.MaxTimeout,
		metadata: req.Metadata, envVars: req.Env})
	switch {
	case errors.Is(err, errDuplicateID):
		writeJSON(w, http.StatusConflict, provError{Detail: fmt.Sprintf("sandbox %q already exists", req.SandboxID)})
		return
	case err != nil:
		writeJSON(w, http.StatusServiceUnavailable, provError{Detail: err.Error()})
		return
	}
	p.mu.Lock()
	p.boxes[box.id] = box
	p.mu.Unlock()
	v := p.view(box)
	v.AccessToken = sb.token
	writeJSON(w, http.StatusOK, v)
}

func (p *Provisioner) handleGet(w http.ResponseWriter, r *http.Request) {
	box, _, ok := p.live(r.PathValue("id"))
	if !ok {
		writeJSON(w, http.StatusNotFound, provError{Detail: "sandbox not found"})
		return
	}
	writeJSON(w, http.StatusOK, p.view(box))
}

func (p *Provisioner) handleDelete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, _, ok := p.live(id); !ok {
		writeJSON(w, http.StatusNotFound, provError{Detail: "sandbox not found"})
		return
	}
	err := p.h.kill(id)
	p.mu.Lock()
	delete(p.boxes, id)
	p.mu.Unlock()
	if errors.Is(err, ErrNotFound) {
		writeJSON(w, http.StatusNotFound, provError{Detail: "sandbox not found"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "sandbox_id": id})
}

func (p *Provisioner) handleDiscover(w http.ResponseWriter, r *http.Request) {
	if p.opts.Legacy {
		writeJSON(w, http.StatusNotFound, provError{Detail: "Not Found"})
		return
	}
	id := r.PathValue("id")
	box, _, ok := p.live(id)
	if !ok {
		writeJSON(w, http.StatusOK, map[string]any{"sandbox_id": id, "status": "absent", "backend_namespace": p.ns})
		return
	}
	v := p.view(box)
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	m["status"] = "found"
	writeJSON(w, http.StatusOK, m)
}

// StartProvisioner serves the provisioner face of s's host on addr (a
// loopback "host:port"; port 0 picks a free one) and returns its base URL.
// Call it before Close; Close stops it with the other listeners.
//
// Errors: those of Host.Provisioner, a non-loopback address, a failed listen.
func (s *Server) StartProvisioner(addr string, opts ProvisionerOptions) (string, error) {
	ln, err := listenLoopback(addr)
	if err != nil {
		return "", err
	}
	base := "http://" + ln.Addr().String()
	p, err := s.Host.Provisioner(base, opts)
	if err != nil {
		ln.Close()
		return "", err
	}
	srv := &http.Server{Handler: p.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	s.servers = append(s.servers, srv)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.Host.log.Error("provisioner listener failed", "addr", base, "error", err.Error())
		}
	}()
	s.Host.log.Info("sandbox host provisioner listening", "provisioner_url", base)
	return base, nil
}
