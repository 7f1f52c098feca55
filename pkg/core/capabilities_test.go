package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
	"github.com/sandbox-broker/sandbox-broker/pkg/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/pkg/ddbstore"
)

// declaredProvider is the fake with other declared capabilities, and
// endpoints that carry no protocol (as records stored before endpoints
// had one do).
type declaredProvider struct {
	*coretest.FakeProvider
	caps core.Capabilities
}

func (p declaredProvider) Capabilities() core.Capabilities { return p.caps }

func (p declaredProvider) Create(ctx context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	ref, err := p.FakeProvider.Create(ctx, spec)
	ref.Endpoint.Protocol = ""
	return ref, err
}

func TestNewRequiresADeclaredProtocol(t *testing.T) {
	p := declaredProvider{FakeProvider: coretest.NewFakeProvider()}
	if _, err := core.New(core.DefaultSettings(), ddbstore.New(nil, "t", "d"), p, nil); err == nil {
		t.Fatal("core.New with a provider declaring no protocol succeeded, want an error")
	}
}

func TestAcquireFillsAStoredEndpointsMissingProtocol(t *testing.T) {
	client := testenv.DynamoClient(t)
	table := freshTable(t, client, "caps")
	s := core.DefaultSettings()
	s.Deployment = "test"
	s.AcquireTimeout = 5 * time.Second
	p := declaredProvider{FakeProvider: coretest.NewFakeProvider(), caps: core.Capabilities{Protocol: core.ProtocolAIO}}
	eng, err := core.New(s, ddbstore.New(client, table, s.Deployment), p, &fakeSyncer{})
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	for _, want := range []core.Source{core.SourceCreated, core.SourceReused} {
		res, err := eng.Acquire(context.Background(), key("t1"))
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if res.Source != want || res.Record.Endpoint.Protocol != core.ProtocolAIO {
			t.Errorf("Acquire = source %s, protocol %q; want %s, %q", res.Source, res.Record.Endpoint.Protocol, want, core.ProtocolAIO)
		}
	}
}
