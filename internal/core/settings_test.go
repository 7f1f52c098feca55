package core_test

import (
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// TestWaitLaneCount: a lane count set is kept, but never above the limit
// (burst slots included: a lane needs a bucket of its own); unset, it is
// one lane whatever the limit; one out of range is refused, naming the
// field.
func TestWaitLaneCount(t *testing.T) {
	tests := []struct {
		name                   string
		replicas, burst, lanes int
		want                   int
	}{
		{"unset", 3, 0, 0, 1},
		{"unset, huge deployment", 100000, 0, 0, 1},
		{"set", 3, 0, 3, 3},
		{"set above the limit", 3, 0, 8, 3},
		{"burst slots count", 2, 2, 8, 4},
		{"the most", 100000, 0, core.MaxWaitLanes, core.MaxWaitLanes},
	}
	for _, tt := range tests {
		s := core.DefaultSettings()
		s.Replicas, s.WaitLanes = tt.replicas, tt.lanes
		if tt.burst > 0 {
			s.Policy, s.BurstLimit = core.PolicyBurst, tt.burst
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("%s: Validate: %v", tt.name, err)
		}
		if got := s.WaitLaneCount(); got != tt.want {
			t.Errorf("%s: WaitLaneCount() = %d, want %d", tt.name, got, tt.want)
		}
	}
	for _, lanes := range []int{-1, core.MaxWaitLanes + 1} {
		s := core.DefaultSettings()
		s.WaitLanes = lanes
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "WaitLanes") {
			t.Errorf("WaitLanes %d: Validate() = %v, want an error naming WaitLanes", lanes, err)
		}
	}
}

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
