package wiring

import (
	"crypto/tls"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"

	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// TestKeepIdleKeepsAFanOutsConnections: the store's client keeps enough
// idle connections per host for one fan-out of the store, keeps the rest
// of the SDK client's transport (a custom CA bundle's TLS settings), and
// leaves a client it cannot configure as it is.
func TestKeepIdleKeepsAFanOutsConnections(t *testing.T) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS13}
	custom := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) { tr.TLSClientConfig = tlsCfg })
	plain := &http.Client{}
	cases := []struct {
		name     string
		in       aws.HTTPClient
		wantIdle int
		wantTLS  *tls.Config
	}{
		{"sdk default", awshttp.NewBuildableClient(), ddbstore.ConcurrentCalls, nil},
		{"custom tls kept", custom, ddbstore.ConcurrentCalls, tlsCfg},
		{"larger pool kept", awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) { tr.MaxIdleConnsPerHost = 500 }), 500, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := keepIdle(c.in, ddbstore.ConcurrentCalls).(*awshttp.BuildableClient)
			if !ok {
				t.Fatalf("keepIdle returned %T, want *BuildableClient", got)
			}
			tr := got.GetTransport()
			if tr.MaxIdleConnsPerHost != c.wantIdle {
				t.Errorf("MaxIdleConnsPerHost = %d, want %d", tr.MaxIdleConnsPerHost, c.wantIdle)
			}
			if tr.MaxIdleConns != 0 && tr.MaxIdleConns < tr.MaxIdleConnsPerHost {
				t.Errorf("MaxIdleConns = %d, below MaxIdleConnsPerHost %d", tr.MaxIdleConns, tr.MaxIdleConnsPerHost)
			}
			if c.wantTLS != nil && (tr.TLSClientConfig == nil || tr.TLSClientConfig.MinVersion != c.wantTLS.MinVersion) {
				t.Errorf("TLSClientConfig = %+v, want the custom one (MinVersion %x)", tr.TLSClientConfig, c.wantTLS.MinVersion)
			}
		})
	}
	if got := keepIdle(plain, ddbstore.ConcurrentCalls); got != plain {
		t.Errorf("keepIdle(%T) = %v, want the client unchanged", plain, got)
	}
	if ddbstore.ConcurrentCalls <= awshttp.DefaultHTTPTransportMaxIdleConnsPerHost {
		t.Errorf("ConcurrentCalls = %d: no more than the SDK's default pool (%d), keepIdle is not needed", ddbstore.ConcurrentCalls, awshttp.DefaultHTTPTransportMaxIdleConnsPerHost)
	}
}
