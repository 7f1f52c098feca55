package providers_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/httpapi"
	"github.com/sandbox-broker/sandbox-broker/internal/providers"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

func TestRegistryNamesAreTheConfigsProviders(t *testing.T) {
	if got, want := providers.Builtin().Names(), config.ProviderNames; !slices.Equal(got, want) {
		t.Errorf("registry names = %v, want config.ProviderNames %v", got, want)
	}
}

// A backend registered in the registry only (here the conformance fake)
// is served by the HTTP adapter and read by the Go client with no code of
// theirs naming it: its endpoint's protocol picks the connection's keys
// and the client's helper.
func TestRegisteredBackendThroughHTTPAndClient(t *testing.T) {
	fake := coretest.NewFakeProvider()
	reg := providers.Builtin()
	reg["fake"] = func(config.Config, *slog.Logger) (core.Provider, error) { return fake, nil }
	prov, err := reg.New(config.Config{Provider: "fake"}, nil)
	if err != nil {
		t.Fatalf("registry New: %v", err)
	}

	db := testenv.DynamoClient(t)
	table := testenv.UniqueName(t, "registry")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ddbstore.CreateTable(ctx, db, table); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	s := core.DefaultSettings()
	s.Deployment = "registry"
	eng, err := core.New(s, ddbstore.New(db, table, s.Deployment), prov, nil)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	srv := httptest.NewServer(gateway(httpapi.NewHandler(eng, slog.New(slog.DiscardHandler)), "acme"))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, "token")
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}

	sb, err := c.Acquire(ctx, "alice", "t1")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	want := client.Connection{Protocol: client.KindEnvd, EnvdURL: "http://envd.invalid", EnvdAccessToken: "tok-" + sb.SandboxID}
	if sb.Backend != "fake" || sb.Source != "created" || sb.Connection != want {
		t.Errorf("Acquire = backend %q source %q connection %+v; want fake, created, %+v", sb.Backend, sb.Source, sb.Connection, want)
	}
	if kind := sb.Connection.Kind(); kind != client.KindEnvd {
		t.Errorf("Connection.Kind() = %q, want %q", kind, client.KindEnvd)
	}
	if _, err := client.NewEnvd(sb.SandboxID, sb.Connection, nil); err != nil {
		t.Errorf("NewEnvd on the fake's connection: %v", err)
	}
	rec, err := c.Get(ctx, sb.SandboxID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	var got struct{ Backend, State string }
	if err := json.Unmarshal(rec, &got); err != nil || got.Backend != "fake" || got.State != "active" {
		t.Errorf("Get = %s (%v), want backend fake, state active", rec, err)
	}
	rel, err := c.Release(ctx, sb.SandboxID)
	if err != nil || rel.State != "warm" {
		t.Errorf("Release = %+v, %v; want warm", rel, err)
	}
	again, err := c.Acquire(ctx, "alice", "t1")
	if err != nil || again.SandboxID != sb.SandboxID || again.Source != "reclaimed" || again.Connection != want {
		t.Errorf("second Acquire = %+v, %v; want %s reclaimed with %+v", again, err, sb.SandboxID, want)
	}
}

// gateway serves h the way API Gateway does for tenant: the route key
// and path parameters of the request, and the authorizer's tenant.
func gateway(h httpapi.Handler, tenant string) http.Handler {
	routes := []string{httpapi.RouteAcquire, httpapi.RouteGet, httpapi.RouteCapacity, httpapi.RouteRelease, httpapi.RouteSync}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: r.URL.EscapedPath(), Body: string(body),
			RequestContext: events.APIGatewayV2HTTPRequestContext{
				RequestID:  "req",
				HTTP:       events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: r.Method, Path: r.URL.Path},
				Authorizer: &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{Lambda: map[string]any{"tenant": tenant}},
			}}
		for _, route := range routes {
			if params, ok := match(route, r.Method, r.URL.Path); ok {
				ev.RouteKey, ev.PathParameters = route, params
				break
			}
		}
		resp, err := h(r.Context(), ev)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for k, v := range resp.Headers {
			w.Header().Set(k, v)
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.WriteString(w, resp.Body)
	})
}

// match reports whether method and path fit route ("METHOD /a/{p}/b"),
// with the values of its {parameters}.
func match(route, method, path string) (map[string]string, bool) {
	m, pattern, _ := strings.Cut(route, " ")
	want, got := strings.Split(pattern, "/"), strings.Split(path, "/")
	if m != method || len(want) != len(got) {
		return nil, false
	}
	params := map[string]string{}
	for i, seg := range want {
		switch {
		case strings.HasPrefix(seg, "{"):
			params[strings.Trim(seg, "{}")] = got[i]
		case seg != got[i]:
			return nil, false
		}
	}
	return params, true
}
