package providers

import (
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/provisioner"
)

func TestNew(t *testing.T) {
	tests := []struct {
		name     string
		cfg      config.Config
		wantName string // "" = error
	}{
		{"default e2b", config.Config{E2B: config.E2B{APIURL: "http://127.0.0.1:1", APIKey: "k"}}, "e2b"},
		{"e2b", config.Config{Provider: config.ProviderE2B, E2B: config.E2B{APIURL: "http://127.0.0.1:1", APIKey: "k"}}, "e2b"},
		{"provisioner", config.Config{Provider: config.ProviderProvisioner, Provisioner: config.Provisioner{URL: "http://127.0.0.1:2"}}, provisioner.Name},
		{"provisioner without URL", config.Config{Provider: config.ProviderProvisioner}, ""},
		{"e2b without key", config.Config{Provider: config.ProviderE2B, E2B: config.E2B{APIURL: "http://127.0.0.1:1"}}, ""},
		{"unknown", config.Config{Provider: "nomad"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(tt.cfg, nil)
			if tt.wantName == "" {
				if err == nil {
					t.Fatalf("New = %v, want an error", p.Name())
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if p.Name() != tt.wantName {
				t.Errorf("Name() = %q, want %q", p.Name(), tt.wantName)
			}
		})
	}
}
