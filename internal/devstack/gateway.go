package devstack

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/uuid"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/internal/httpapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// maxRequestBody is the largest body the local gateway passes to a
// function: the API's own limit. A larger body is refused with 413 before
// any function is invoked and without being read whole (the Content-Length
// is checked first; a body without one is read at most one byte past the
// limit). In AWS the HTTP API's payload quota is a fixed 10 MB, so there the
// function itself refuses what lies between (httpapi.MaxBodyBytes).
const maxRequestBody = httpapi.MaxBodyBytes

// Quotas of an API Gateway HTTP API that AWS enforces and the local
// gateway enforces the same way, so that local runs see what AWS would do.
const (
	// maxRequestHead bounds the request line and the header values
	// together, in bytes; a larger request is refused (431) unread.
	maxRequestHead = 10240
	// integrationTimeout is the most the gateway waits for a function's
	// answer, counted from the request's arrival: reading the body,
	// waiting for a free instance and the invocation itself. Past it the
	// caller gets 503 while the invocation, once started, runs on.
	integrationTimeout = 30 * time.Second
)

// errIntegrationTimeout: the function did not answer within integrationTimeout.
var errIntegrationTimeout = errors.New("the integration did not answer within 30 s")

// headSize is the size of r's request line and header values, as
// API Gateway counts it.
func headSize(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 2
	for _, vs := range r.Header {
		for _, v := range vs {
			n += len(v)
		}
	}
	return n
}

// gateway serves the template's routes like an API Gateway HTTP API with
// payload format 2.0 and a static-token Lambda authorizer.
type gateway struct {
	app     App
	fns     map[string]*lambdaFn
	tokens  map[string]string // bearer token -> tenant
	log     *slog.Logger
	region  string
	apiHost string
	// timeout is the integration timeout (0: integrationTimeout).
	timeout time.Duration
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// apiMessage writes API Gateway's own error shape {"message": "..."}.
func apiMessage(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `{"message":%q}`, msg)
}

var errBodyTooLarge = fmt.Errorf("request body exceeds %d bytes", maxRequestBody)

// readBody reads the request body, refusing one over maxRequestBody before
// reading anything when its Content-Length says so, else after reading one
// byte past the limit.
func readBody(r *http.Request) ([]byte, error) {
	if r.ContentLength > maxRequestBody {
		return nil, errBodyTooLarge
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBody+1))
	if err != nil {
		return nil, fmt.Errorf("read request body: %w", err)
	}
	if len(body) > maxRequestBody {
		return nil, errBodyTooLarge
	}
	return body, nil
}

// tooLarge answers 413 in the error shape the function answers for the
// same body (E2B's {code, message} under /e2b, the broker's elsewhere),
// so clients branch on one shape whichever refused it.
func tooLarge(w http.ResponseWriter, e2b bool) {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"code": api.CodeRequestTooLarge, "message": errBodyTooLarge.Error(), "reason": "",
		"retryable": false, "retry_after_seconds": 0,
	}})
	if e2b {
		b, _ = json.Marshal(e2bapi.Error{Code: http.StatusRequestEntityTooLarge, Message: errBodyTooLarge.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	_, _ = w.Write(b)
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	reqID := uuid.NewString()
	w.Header().Set("Apigw-Requestid", reqID)
	status := 0
	var route Route
	defer func() {
		g.log.Info("gateway", "request_id", reqID, "method", r.Method, "path", r.URL.EscapedPath(),
			"route", route.Key(), "function", route.Function, "status", status,
			"duration_ms", time.Since(start).Milliseconds())
	}()

	if headSize(r) > maxRequestHead {
		status = http.StatusRequestHeaderFieldsTooLarge
		apiMessage(w, status, "Request Header Fields Too Large")
		return
	}
	deadline := start.Add(cmp.Or(g.timeout, integrationTimeout))
	rawPath := r.URL.EscapedPath()
	route, params, found := g.app.match(r.Method, rawPath)
	if route.Path == "" {
		status = http.StatusNotFound
		if found {
			status = http.StatusMethodNotAllowed
		}
		route = Route{}
		apiMessage(w, status, http.StatusText(status))
		return
	}
	tenant, ok := "", true // a route without an authorizer passes as it is
	if route.TokenHeader != NoAuthorizer {
		tenant, ok = g.authorize(r, route.TokenHeader)
	}
	if !ok {
		status = http.StatusUnauthorized
		apiMessage(w, status, "Unauthorized")
		return
	}
	body, failed := readWithin(w, r, deadline, strings.HasPrefix(rawPath, "/e2b/"))
	if failed != 0 {
		status = failed
		return
	}
	ev := g.event(inbound{r: r, reqID: reqID, route: route, params: params, tenant: tenant, rawPath: rawPath, body: body, at: start})
	payload, err := json.Marshal(ev)
	if err != nil {
		status = http.StatusInternalServerError
		apiMessage(w, status, "Internal Server Error")
		return
	}
	fn := g.fns[route.Function]
	if fn == nil {
		status = http.StatusInternalServerError
		g.log.Error("gateway", "request_id", reqID, "error", fmt.Sprintf("route %s: %v %q", route.Key(), errNoFunction, route.Function))
		apiMessage(w, status, "Internal Server Error")
		return
	}
	ictx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	out, err := fn.invokeWithin(ictx, payload)
	if errors.Is(err, errIntegrationTimeout) {
		status = http.StatusServiceUnavailable
		g.log.Error("gateway", "request_id", reqID, "route", route.Key(), "error", err.Error())
		apiMessage(w, status, "Service Unavailable")
		return
	}
	if err != nil {
		// As API Gateway: a function error, crash or timeout is a 500 with
		// its own JSON message; the function's output is not passed on.
		status = http.StatusInternalServerError
		g.log.Error("gateway", "request_id", reqID, "route", route.Key(), "error", err.Error())
		apiMessage(w, status, http.StatusText(status))
		return
	}
	status = writeResponse(w, out)
}

// readWithin reads r's body by deadline (a slow body ends with the
// integration). When that fails it answers as API Gateway does (e2b: the
// E2B face's error shape) and returns the status sent, else 0. The
// deadline is lifted once the body is read: a read deadline passing
// later would cancel the request's context.
func readWithin(w http.ResponseWriter, r *http.Request, deadline time.Time, e2b bool) ([]byte, int) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(deadline)
	body, err := readBody(r)
	_ = rc.SetReadDeadline(time.Time{})
	if err == nil {
		return body, 0
	}
	w.Header().Set("Connection", "close") // do not drain the rest of the body
	if !errors.Is(err, errBodyTooLarge) {
		apiMessage(w, http.StatusBadRequest, "Bad Request")
		return nil, http.StatusBadRequest
	}
	tooLarge(w, e2b)
	return nil, http.StatusRequestEntityTooLarge
}

// authorize is the local authorizer: a token of BROKER_DEV_TOKENS in the
// route's token header names the tenant. In Authorization it must follow
// "Bearer "; in any other header (X-API-Key, as the E2B SDKs send it) it
// may stand alone, as API Gateway's JWT authorizer accepts it.
func (g *gateway) authorize(r *http.Request, header string) (string, bool) {
	if header == "" {
		header = "Authorization"
	}
	h := r.Header.Get(header)
	token := h
	if scheme, rest, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
		token = rest
	} else if strings.EqualFold(header, "Authorization") {
		return "", false
	}
	tenant, ok := g.tokens[strings.TrimSpace(token)]
	return tenant, ok
}

// inbound is a request the gateway routed and authorised: what its event
// is made of.
type inbound struct {
	r       *http.Request
	reqID   string
	route   Route
	params  map[string]string // path parameters
	tenant  string
	rawPath string
	body    []byte
	at      time.Time
}

// event builds the API Gateway HTTP API payload format 2.0 event.
func (g *gateway) event(in inbound) events.APIGatewayV2HTTPRequest {
	r, reqID, route, params, tenant, rawPath, body, now := in.r, in.reqID, in.route, in.params, in.tenant, in.rawPath, in.body, in.at
	headers := map[string]string{}
	for k, vs := range r.Header {
		if strings.EqualFold(k, "Cookie") {
			continue
		}
		headers[strings.ToLower(k)] = strings.Join(vs, ",")
	}
	headers["host"] = r.Host
	var cookies []string
	for _, c := range r.Cookies() {
		cookies = append(cookies, c.String())
	}
	var qsp map[string]string
	if q := r.URL.Query(); len(q) > 0 {
		qsp = map[string]string{}
		keys := make([]string, 0, len(q))
		for k := range q {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			qsp[k] = strings.Join(q[k], ",")
		}
	}
	if len(params) == 0 {
		params = nil
	}
	sourceIP, _, _ := net.SplitHostPort(r.RemoteAddr)
	ev := events.APIGatewayV2HTTPRequest{
		Version:               "2.0",
		RouteKey:              route.Key(),
		RawPath:               rawPath,
		RawQueryString:        r.URL.RawQuery,
		Cookies:               cookies,
		Headers:               headers,
		QueryStringParameters: qsp,
		PathParameters:        params,
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			RouteKey:     route.Key(),
			AccountID:    "000000000000",
			Stage:        "$default",
			RequestID:    reqID,
			APIID:        "devstack",
			DomainName:   g.apiHost,
			DomainPrefix: "devstack",
			Time:         now.UTC().Format("02/Jan/2006:15:04:05 -0700"),
			TimeEpoch:    now.UnixMilli(),
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{
				Method:    r.Method,
				Path:      unescapePath(rawPath),
				Protocol:  r.Proto,
				SourceIP:  sourceIP,
				UserAgent: r.UserAgent(),
			},
		},
	}
	if tenant != "" {
		ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			Lambda: map[string]any{"tenant": tenant},
		}
	}
	if len(body) > 0 {
		if utf8.Valid(body) {
			ev.Body = string(body)
		} else {
			ev.Body = base64.StdEncoding.EncodeToString(body)
			ev.IsBase64Encoded = true
		}
	}
	return ev
}

func unescapePath(p string) string {
	if u, err := url.PathUnescape(p); err == nil {
		return u
	}
	return p
}

// writeResponse translates the function's payload format 2.0 response. A
// reply without statusCode is, as in API Gateway, a 200 with the reply as
// JSON body.
func writeResponse(w http.ResponseWriter, out []byte) int {
	var resp struct {
		StatusCode        *int                `json:"statusCode"`
		Headers           map[string]string   `json:"headers"`
		MultiValueHeaders map[string][]string `json:"multiValueHeaders"`
		Body              string              `json:"body"`
		IsBase64Encoded   bool                `json:"isBase64Encoded"`
		Cookies           []string            `json:"cookies"`
	}
	if err := json.Unmarshal(out, &resp); err != nil || resp.StatusCode == nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(out)
		return http.StatusOK
	}
	body := []byte(resp.Body)
	if resp.IsBase64Encoded {
		b, err := base64.StdEncoding.DecodeString(resp.Body)
		if err != nil {
			apiMessage(w, http.StatusInternalServerError, "Internal Server Error")
			return http.StatusInternalServerError
		}
		body = b
	}
	for k, vs := range resp.MultiValueHeaders {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	for k, v := range resp.Headers {
		w.Header().Set(k, v)
	}
	for _, c := range resp.Cookies {
		w.Header().Add("Set-Cookie", c)
	}
	status := *resp.StatusCode
	if status < 100 || status > 599 {
		apiMessage(w, http.StatusInternalServerError, "Internal Server Error")
		return http.StatusInternalServerError
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return status
}
