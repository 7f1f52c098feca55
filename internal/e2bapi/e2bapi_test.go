package e2bapi_test

import (
	"strconv"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/e2bapi"
	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

func TestEnvdURLAndDomainOf(t *testing.T) {
	if got, want := e2bapi.EnvdURL("sb1", "e2b.app"), "https://"+strconv.Itoa(envd.Port)+"-sb1.e2b.app"; got != want {
		t.Errorf("EnvdURL = %q, want %q", got, want)
	}
	tests := []struct {
		name, id, url string
		want          string // "" = nil
	}{
		{"derived address", "sb1", e2bapi.EnvdURL("sb1", "e2b.app"), "e2b.app"},
		{"derived, nested domain", "sb1", e2bapi.EnvdURL("sb1", "eu.sandbox.example"), "eu.sandbox.example"},
		{"another sandbox's address", "sb2", e2bapi.EnvdURL("sb1", "e2b.app"), ""},
		{"another port", "sb1", "https://8080-sb1.e2b.app", ""},
		{"one URL for every sandbox", "sb1", "http://127.0.0.1:4000", ""},
		{"no domain", "sb1", "https://" + strconv.Itoa(envd.Port) + "-sb1.", ""},
		{"unparsable", "sb1", "://", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := e2bapi.DomainOf(tc.id, tc.url)
			switch {
			case tc.want == "" && got != nil:
				t.Errorf("DomainOf(%q, %q) = %q, want nil", tc.id, tc.url, *got)
			case tc.want != "" && (got == nil || *got != tc.want):
				t.Errorf("DomainOf(%q, %q) = %v, want %q", tc.id, tc.url, got, tc.want)
			}
		})
	}
}
