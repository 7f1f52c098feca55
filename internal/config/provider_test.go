package config

import (
	"strings"
	"testing"
)

func TestParseProvider(t *testing.T) {
	common := []string{"TABLE_NAME=tbl", "OUTPUT_BUCKET=bkt", "TOKEN_LOCAL_KEY=" + testLocalKey}
	tests := []struct {
		name    string
		env     []string
		want    string // provider; "" = error
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{"default is e2b", []string{"E2B_API_KEY=k"}, ProviderE2B, "", func(t *testing.T, c Config) {
			if c.E2B.APIKey != "k" || c.Provisioner.URL != "" {
				t.Errorf("config = %+v", c)
			}
		}},
		{"provisioner without E2B key", []string{"SANDBOX_PROVIDER=provisioner", "PROVISIONER_URL=http://127.0.0.1:8002/", "PROVISIONER_API_KEY=pk"},
			ProviderProvisioner, "", func(t *testing.T, c Config) {
				if c.Provisioner.URL != "http://127.0.0.1:8002" || c.Provisioner.APIKey != "pk" || c.E2B.APIKey != "" {
					t.Errorf("config = %+v", c)
				}
				if s := c.String(); strings.Contains(s, "pk") || !strings.Contains(s, "provider=provisioner") {
					t.Errorf("String() = %s, want provider shown and key redacted", s)
				}
			}},
		{"provisioner key optional", []string{"SANDBOX_PROVIDER=provisioner", "PROVISIONER_URL=http://p:1"}, ProviderProvisioner, "", nil},
		{"provisioner needs a URL", []string{"SANDBOX_PROVIDER=provisioner"}, "", "PROVISIONER_URL", nil},
		{"provisioner URL must be http", []string{"SANDBOX_PROVIDER=provisioner", "PROVISIONER_URL=ftp://x"}, "", "PROVISIONER_URL", nil},
		{"unknown provider", []string{"SANDBOX_PROVIDER=lambda", "E2B_API_KEY=k"}, "", "SANDBOX_PROVIDER", nil},
		{"e2b still needs its key", []string{"SANDBOX_PROVIDER=e2b"}, "", "E2B_API_KEY", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, warnings, err := Parse(append(append([]string{}, common...), tt.env...))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse error = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(warnings) != 0 {
				t.Errorf("warnings = %v, want none (SANDBOX_PROVIDER is known)", warnings)
			}
			if c.Provider != tt.want {
				t.Errorf("Provider = %q, want %q", c.Provider, tt.want)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}
