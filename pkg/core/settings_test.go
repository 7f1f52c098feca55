package core_test

import (
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// TestWaitLaneCount: a lane count set is kept, but never above the limit
// (a lane needs a bucket of its own); unset, it is one lane per 256 slots
// of the limit (burst slots included), at most MaxWaitLanes; one out of
// range is refused, naming the field.
func TestWaitLaneCount(t *testing.T) {
	tests := []struct {
		name                   string
		replicas, burst, lanes int
		want                   int
	}{
		{"small deployment", 3, 0, 0, 1},
		{"256 slots", 256, 0, 0, 1},
		{"257 slots", 257, 0, 0, 2},
		{"burst slots count", 200, 100, 0, 2},
		{"huge deployment", 100000, 0, 0, core.MaxWaitLanes},
		{"set", 3, 0, 3, 3},
		{"set above the limit", 3, 0, 8, 3},
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
