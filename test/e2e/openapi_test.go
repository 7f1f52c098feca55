package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/sandbox-broker/sandbox-broker/internal/devstack"
	brokerapi "github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// newAPI is the HTTP API client of the tests: every request and reply goes
// through contractTransport, so each is checked against the OpenAPI
// document (pkg/api/openapi.yaml).
func newAPI(t *testing.T, s *devstack.Stack) api {
	return api{t: t, base: s.Info.APIURL, http: &http.Client{
		Timeout:   2 * time.Minute,
		Transport: newContractTransport(t, s.Info.APIURL),
	}}
}

// contractTransport checks each exchange with the broker against the
// OpenAPI document, failing the test when
//   - a reply does not match its operation's documented reply (status,
//     headers, body: replies are closed objects, so an undocumented field
//     fails too);
//   - the broker answers 2xx to a request the document has no operation
//     for, or a request the document says is invalid.
//
// Requests the broker refuses (4xx) may be invalid: the tests send such
// requests on purpose.
type contractTransport struct {
	t      *testing.T
	router routers.Router
	next   http.RoundTripper
}

var contract = sync.OnceValues(func() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(brokerapi.OpenAPIYAML)
	if err != nil {
		return nil, fmt.Errorf("load pkg/api/openapi.yaml: %w", err)
	}
	return doc, nil
})

func newContractTransport(t *testing.T, baseURL string) *contractTransport {
	t.Helper()
	base, err := contract()
	if err != nil {
		t.Fatal(err)
	}
	doc := *base // the routes match against the stack's own address
	doc.Servers = openapi3.Servers{{URL: baseURL}}
	router, err := legacy.NewRouter(&doc)
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	return &contractTransport{t: t, router: router, next: http.DefaultTransport}
}

func (c *contractTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		reqBody = b
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	resp, err := c.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	respBody, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	if err := c.check(req, reqBody, resp, respBody); err != nil {
		c.t.Errorf("OpenAPI contract: %s %s -> %d: %v\nrequest: %s\nreply: %s", req.Method, req.URL.Path, resp.StatusCode, err, reqBody, respBody)
	}
	return resp, nil
}

func (c *contractTransport) check(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) error {
	ok := resp.StatusCode/100 == 2
	probe := req.Clone(context.Background())
	probe.Body = io.NopCloser(bytes.NewReader(reqBody))
	route, params, err := c.router.FindRoute(probe)
	if err != nil {
		if ok {
			return fmt.Errorf("answered, but the document has no such operation: %v", err)
		}
		return nil
	}
	in := &openapi3filter.RequestValidationInput{
		Request: probe, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
	}
	if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil && ok {
		return fmt.Errorf("the broker accepted a request the document calls invalid: %v", err)
	}
	in.Request = req.Clone(context.Background())
	in.Request.Body = http.NoBody
	return openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(respBody)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true},
	})
}
