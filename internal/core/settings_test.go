package core_test

import (
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// A tenant's waiter places are read in one call of at most 100 keys, so
// MaxWaitersPerTenant is 0 (the most, 100) to 100.
func TestMaxWaitersPerTenantBounds(t *testing.T) {
	for _, tt := range []struct {
		n  int
		ok bool
	}{{-1, false}, {0, true}, {10, true}, {100, true}, {101, false}, {10000, false}} {
		s := core.DefaultSettings()
		s.MaxWaitersPerTenant = tt.n
		err := s.Validate()
		if got := err == nil; got != tt.ok {
			t.Errorf("MaxWaitersPerTenant %d: Validate() = %v, want ok %t", tt.n, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "MaxWaitersPerTenant") {
			t.Errorf("MaxWaitersPerTenant %d: Validate() = %v, want an error naming MaxWaitersPerTenant", tt.n, err)
		}
	}
}

// TenantUsage is one of its two values; empty reads as metrics.
func TestTenantUsageValues(t *testing.T) {
	for v, ok := range map[core.TenantUsage]bool{"": true, core.TenantUsageMetrics: true, core.TenantUsageEvents: true, "logs": false} {
		s := core.DefaultSettings()
		s.TenantUsage = v
		err := s.Validate()
		if got := err == nil; got != ok {
			t.Errorf("TenantUsage %q: Validate() = %v, want ok %t", v, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "TenantUsage:") {
			t.Errorf("TenantUsage %q: Validate() = %v, want an error naming TenantUsage", v, err)
		}
	}
}
