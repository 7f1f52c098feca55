package sandboxhost

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
)

// Control-plane constants (E2B OpenAPI spec).
const (
	headerAPIKey    = "X-API-Key"
	headerNextToken = "X-Next-Token"
	defaultTemplate = "base"
	// defaultListLimit and maxListLimit bound GET /v2/sandboxes pages.
	defaultListLimit = 100
	maxListLimit     = 100
	maxAPIBody       = 1 << 20
	// Resources reported for every sandbox (informational only).
	reportedCPUCount = 2
	reportedMemoryMB = 512
	reportedDiskMB   = 1024
)

// timeoutRequest is the body of POST /sandboxes/{id}/timeout and connect.
type timeoutRequest struct {
	Timeout *float64 `json:"timeout"` // seconds
	// Memory (connect) false asks to resume from the files alone (E2B's
	// "reboot"): the host keeps memory only, so it refuses it.
	Memory *bool `json:"memory"`
}

// createRequest is the body of POST /sandboxes and /v2/sandboxes: E2B's
// NewSandbox with its auto-pause fields (autoPause true: the timeout
// pauses the sandbox instead of killing it).
type createRequest struct {
	e2bapi.NewSandbox
	AutoPause       *bool `json:"autoPause"`
	AutoPauseMemory *bool `json:"autoPauseMemory"`
}

// pauseRequest is the body of POST /sandboxes/{id}/pause.
type pauseRequest struct {
	// Memory false asks for a files-only snapshot: the host keeps memory
	// only, so it refuses it.
	Memory *bool `json:"memory"`
}

// refreshRequest is the body of POST /sandboxes/{id}/refreshes.
type refreshRequest struct {
	Duration *float64 `json:"duration"` // seconds
}

// APIHandler serves the E2B control plane: POST /sandboxes and
// /v2/sandboxes (create), GET /sandboxes and /v2/sandboxes (list), GET and
// DELETE /sandboxes/{id}, POST /sandboxes/{id}/timeout, POST
// /sandboxes/{id}/refreshes, POST /sandboxes/{id}/pause, GET
// /sandboxes/{id}/metrics (metrics.go), POST
// /sandboxes/{id}/connect and /v2/sandboxes/{id}/connect. Every request
// needs X-API-Key (any header case) equal to Options.APIKey, else 401
// JSON. Reads never extend a sandbox's life.
func (h *Host) APIHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", h.handleCreate)
	mux.HandleFunc("POST /v2/sandboxes", h.handleCreate)
	mux.HandleFunc("GET /sandboxes", h.handleListV1)
	mux.HandleFunc("GET /v2/sandboxes", h.handleListV2)
	mux.HandleFunc("GET /sandboxes/{id}", h.handleGet)
	mux.HandleFunc("DELETE /sandboxes/{id}", h.handleKill)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", h.handleTimeout)
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", h.handleRefresh)
	mux.HandleFunc("POST /sandboxes/{id}/connect", h.handleConnect)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", h.handleConnect)
	mux.HandleFunc("POST /sandboxes/{id}/pause", h.handlePause)
	mux.HandleFunc("GET /sandboxes/{id}/metrics", h.handleMetrics)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, e2bapi.Error{Code: http.StatusNotFound, Message: "no route " + r.Method + " " + r.URL.Path})
	})
	key := []byte(h.opts.APIKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(headerAPIKey)), key) != 1 {
			writeJSON(w, http.StatusUnauthorized, e2bapi.Error{Code: http.StatusUnauthorized, Message: "invalid or missing API key"})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"code":500,"message":"encode reply"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func badRequest(w http.ResponseWriter, format string, args ...any) {
	writeJSON(w, http.StatusBadRequest, e2bapi.Error{Code: http.StatusBadRequest, Message: fmt.Sprintf(format, args...)})
}

func notFound(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusNotFound, e2bapi.Error{Code: http.StatusNotFound, Message: fmt.Sprintf("sandbox %q not found", id)})
}

// readBody decodes a JSON body into v; an empty body leaves v untouched.
func readBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxAPIBody+1))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if len(b) > maxAPIBody {
		return errors.New("body too large")
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	return nil
}

// seconds validates a timeout in seconds (rounded up) against MaxTimeout.
func (h *Host) seconds(v float64, name string) (time.Duration, error) {
	if math.IsNaN(v) || v < 0 {
		return 0, fmt.Errorf("%s must be a non-negative number of seconds", name)
	}
	d := time.Duration(math.Ceil(v)) * time.Second
	if v > h.opts.MaxTimeout.Seconds() {
		return 0, fmt.Errorf("%s must be at most %d seconds", name, int64(h.opts.MaxTimeout.Seconds()))
	}
	return d, nil
}

func (h *Host) createdBody(sb *sandbox) e2bapi.Sandbox {
	return e2bapi.Sandbox{
		TemplateID:      sb.templateID,
		SandboxID:       sb.id,
		Alias:           sb.alias,
		ClientID:        h.clientID,
		EnvdVersion:     h.envdVer,
		EnvdAccessToken: sb.token,
	}
}

func (h *Host) listed(sb *sandbox) e2bapi.ListedSandbox {
	md := make(map[string]string, len(sb.metadata))
	for k, v := range sb.metadata {
		md[k] = v
	}
	state := "running"
	if sb.listedPaused() {
		state = "paused"
	}
	return e2bapi.ListedSandbox{
		TemplateID:   sb.templateID,
		Alias:        sb.alias,
		SandboxID:    sb.id,
		ClientID:     h.clientID,
		StartedAt:    sb.startedAt,
		EndAt:        sb.deadline(),
		CPUCount:     reportedCPUCount,
		MemoryMB:     reportedMemoryMB,
		DiskSizeMB:   reportedDiskMB,
		Metadata:     md,
		State:        state,
		EnvdVersion:  h.envdVer,
		VolumeMounts: []any{},
	}
}

// handleCreate serves POST /sandboxes and /v2/sandboxes: 201 with the
// sandbox's id, envd version and access token.
func (h *Host) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := readBody(r, &req); err != nil {
		badRequest(w, "%v", err)
		return
	}
	if req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
		badRequest(w, "a files-only auto-pause (autoPauseMemory false) is not supported by the local sandbox host")
		return
	}
	spec := createSpec{templateID: req.TemplateID, timeout: h.opts.DefaultTimeout, metadata: req.Metadata, envVars: req.EnvVars,
		autoPause: req.AutoPause != nil && *req.AutoPause}
	if spec.templateID == "" {
		spec.templateID = defaultTemplate
	}
	if req.Timeout != nil {
		d, err := h.seconds(*req.Timeout, "timeout")
		if err != nil {
			badRequest(w, "%v", err)
			return
		}
		if d == 0 {
			badRequest(w, "timeout must be at least 1 second")
			return
		}
		spec.timeout = d
	}
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			badRequest(w, "invalid envVars key %q", k)
			return
		}
	}
	sb, err := h.create(spec)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, ErrClosed) {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, e2bapi.Error{Code: status, Message: err.Error()})
		return
	}
	writeJSON(w, http.StatusCreated, h.createdBody(sb))
}

// listQuery is a parsed list filter.
type listQuery struct {
	metadata     map[string]string
	running      bool      // the "running" state is selected
	paused       bool      // the "paused" state is selected
	startedAfter time.Time // zero: any start
	template     string    // "": any template; else its id or alias
}

// parseListQuery reads metadata (a query string inside the query value,
// the SDK encodes it twice) and state (comma-separated and/or
// repeated). Without a state, running sandboxes are selected, and paused
// ones too when withPaused (GET /v2/sandboxes lists every state; GET
// /sandboxes, running ones).
func parseListQuery(q url.Values, withPaused bool) (listQuery, error) {
	lq := listQuery{metadata: map[string]string{}, running: true, paused: withPaused}
	if raw := q.Get("metadata"); raw != "" {
		mq, err := url.ParseQuery(raw)
		if err != nil {
			return lq, fmt.Errorf("invalid metadata filter: %w", err)
		}
		for k, vs := range mq {
			lq.metadata[k] = vs[len(vs)-1]
		}
	}
	if s := q.Get("startedAfter"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return lq, fmt.Errorf("invalid startedAfter %q (want an RFC 3339 time)", s)
		}
		lq.startedAfter = t
	}
	lq.template = q.Get("template")
	if states, ok := q["state"]; ok {
		lq.running, lq.paused = false, false
		for _, s := range states {
			for _, st := range strings.Split(s, ",") {
				switch strings.TrimSpace(st) {
				case "running":
					lq.running = true
				case "paused":
					lq.paused = true
				case "":
				default:
					return lq, fmt.Errorf("invalid state %q (want running or paused)", st)
				}
			}
		}
	}
	return lq, nil
}

// match reports whether sb passes the filter.
func (lq listQuery) match(sb *sandbox) bool {
	if paused := sb.listedPaused(); (paused && !lq.paused) || (!paused && !lq.running) {
		return false
	}
	if sb.startedAt.Before(lq.startedAfter) || (lq.template != "" && lq.template != sb.templateID && lq.template != sb.alias) {
		return false
	}
	for k, v := range lq.metadata {
		if got, ok := sb.metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// handleListV1 serves GET /sandboxes: every sandbox matching the metadata
// and state filters (default: running), unpaged.
func (h *Host) handleListV1(w http.ResponseWriter, r *http.Request) {
	lq, err := parseListQuery(r.URL.Query(), false)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	out := []e2bapi.ListedSandbox{}
	for _, sb := range h.list() {
		if lq.match(sb) {
			out = append(out, h.listed(sb))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// pagePos is a position in (startedAt, id) order.
type pagePos struct {
	startedAt time.Time
	id        string
}

// compare orders the position against sb: -1 before it, 0 at it, 1 after.
func (p pagePos) compare(sb *sandbox) int {
	if c := p.startedAt.Compare(sb.startedAt); c != 0 {
		return c
	}
	return strings.Compare(p.id, sb.id)
}

// pageToken encodes the position of sb in (startedAt, id) order.
func pageToken(sb *sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(sb.startedAt.UnixNano(), 10) + ":" + sb.id))
}

// parseToken decodes a pageToken.
func parseToken(tok string) (pagePos, error) {
	bad := errors.New("invalid nextToken")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return pagePos{}, bad
	}
	ns, id, ok := strings.Cut(string(b), ":")
	if !ok {
		return pagePos{}, bad
	}
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return pagePos{}, bad
	}
	return pagePos{startedAt: time.Unix(0, n).UTC(), id: id}, nil
}

// handleListV2 serves GET /v2/sandboxes: a page of at most limit (1..100,
// default 100) sandboxes matching the metadata, state, startedAfter and
// template filters (default: running and paused), newest first unless
// order is "asc"; X-Next-Token is set when more may follow.
func (h *Host) handleListV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	lq, err := parseListQuery(q, true)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	limit := defaultListLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListLimit {
			badRequest(w, "limit must be an integer in [1, %d]", maxListLimit)
			return
		}
		limit = n
	}
	desc := true
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		desc = false
	default:
		badRequest(w, "order must be asc or desc")
		return
	}
	var after *pagePos
	if tok := q.Get("nextToken"); tok != "" {
		pos, err := parseToken(tok)
		if err != nil {
			badRequest(w, "%v", err)
			return
		}
		after = &pos
	}
	out, next := h.listPage(lq, desc, after, limit)
	if next != nil {
		w.Header().Set(headerNextToken, pageToken(next))
	}
	writeJSON(w, http.StatusOK, out)
}

// listPage returns up to limit sandboxes matching lq in start order
// (newest first when desc) after position after (nil: from the first),
// and the last one listed when more may follow.
func (h *Host) listPage(lq listQuery, desc bool, after *pagePos, limit int) ([]e2bapi.ListedSandbox, *sandbox) {
	all := h.list()
	if desc {
		slices.Reverse(all)
	}
	out := []e2bapi.ListedSandbox{}
	var last *sandbox
	for _, sb := range all {
		if after != nil {
			c := after.compare(sb)
			if (!desc && c >= 0) || (desc && c <= 0) {
				continue
			}
		}
		if !lq.match(sb) {
			continue
		}
		if len(out) == limit {
			return out, last
		}
		out = append(out, h.listed(sb))
		last = sb
	}
	return out, nil
}

// handleGet serves GET /sandboxes/{id}: the detail, or 404 code 404.
func (h *Host) handleGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb, err := h.get(id)
	if err != nil {
		notFound(w, id)
		return
	}
	writeJSON(w, http.StatusOK, e2bapi.SandboxDetail{ListedSandbox: h.listed(sb), EnvdAccessToken: sb.token})
}

// handleKill serves DELETE /sandboxes/{id}: 204 once every process is
// dead and the directory removed; 404 code 404 if unknown.
func (h *Host) handleKill(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := h.kill(id); err != nil {
		notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleTimeout serves POST /sandboxes/{id}/timeout {timeout: seconds}:
// the sandbox now dies timeout seconds from now (earlier or later than
// before). 204; 404 when unknown or paused.
func (h *Host) handleTimeout(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req timeoutRequest
	if err := readBody(r, &req); err != nil {
		badRequest(w, "%v", err)
		return
	}
	if req.Timeout == nil {
		badRequest(w, "timeout is required")
		return
	}
	d, err := h.seconds(*req.Timeout, "timeout")
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	sb, err := h.get(id)
	if err != nil || !h.setDeadline(sb, d, false) {
		notFound(w, id) // E2B answers 404 for a paused sandbox too
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleRefresh serves POST /sandboxes/{id}/refreshes {duration: seconds}:
// extends the life to at least duration from now (default 60 s). 204;
// 404 when unknown or paused.
func (h *Host) handleRefresh(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req refreshRequest
	if err := readBody(r, &req); err != nil {
		badRequest(w, "%v", err)
		return
	}
	d := 60 * time.Second
	if req.Duration != nil {
		var err error
		if d, err = h.seconds(*req.Duration, "duration"); err != nil {
			badRequest(w, "%v", err)
			return
		}
	}
	sb, err := h.get(id)
	if err != nil || !h.setDeadline(sb, d, true) {
		notFound(w, id) // E2B answers 404 for a paused sandbox too
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleConnect serves POST /sandboxes/{id}/connect and
// /v2/sandboxes/{id}/connect {timeout?}: a paused sandbox is resumed and
// ends timeout from now (no timeout: the time it had left when paused),
// 201; a running one keeps running and, as E2B does it, a timeout only
// ever extends its life, never shortens it, 200. Either reply is the
// create-like body. 404 when unknown; 400 for {memory: false} (a resume
// from the files alone, which the host cannot do).
func (h *Host) handleConnect(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req timeoutRequest
	if err := readBody(r, &req); err != nil {
		badRequest(w, "%v", err)
		return
	}
	if req.Memory != nil && !*req.Memory {
		badRequest(w, "resuming from the files alone (memory false) is not supported by the local sandbox host")
		return
	}
	var d time.Duration
	if req.Timeout != nil {
		var err error
		if d, err = h.seconds(*req.Timeout, "timeout"); err != nil {
			badRequest(w, "%v", err)
			return
		}
	}
	sb, err := h.get(id)
	if err != nil {
		notFound(w, id)
		return
	}
	resumed, err := h.connect(sb, d)
	switch {
	case errors.Is(err, ErrNotFound):
		notFound(w, id)
		return
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, e2bapi.Error{Code: http.StatusInternalServerError, Message: err.Error()})
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, h.createdBody(sb))
}

// handlePause serves POST /sandboxes/{id}/pause {memory?}: 204 once every
// process of the sandbox is frozen; 409 when it is already paused (E2B's
// answer, which the SDK reads as "already paused"); 404 when unknown; 400
// for {memory: false} (a files-only snapshot, which the host cannot make).
func (h *Host) handlePause(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req pauseRequest
	if err := readBody(r, &req); err != nil {
		badRequest(w, "%v", err)
		return
	}
	if req.Memory != nil && !*req.Memory {
		badRequest(w, "a files-only pause (memory false) is not supported by the local sandbox host")
		return
	}
	sb, err := h.get(id)
	if err != nil {
		notFound(w, id)
		return
	}
	switch err := h.pause(sb); {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, ErrNotFound):
		notFound(w, id)
	case errors.Is(err, errAlreadyPaused):
		writeJSON(w, http.StatusConflict, e2bapi.Error{Code: http.StatusConflict, Message: fmt.Sprintf("sandbox %q is already paused", id)})
	default:
		writeJSON(w, http.StatusInternalServerError, e2bapi.Error{Code: http.StatusInternalServerError, Message: err.Error()})
	}
}
