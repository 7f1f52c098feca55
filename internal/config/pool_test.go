package config

import (
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

func TestParsePoolSettings(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want Pool
	}{
		{"defaults: no pool", nil, Pool{PoolSettings: core.PoolSettings{Size: 0, MaxAge: time.Hour}}},
		{"overrides", []string{"SANDBOX_POOL_SIZE=4", "SANDBOX_POOL_MAX_AGE_SECONDS=900", "POOL_REFILL_FUNCTION=broker-reconcile"},
			Pool{PoolSettings: core.PoolSettings{Size: 4, MaxAge: 15 * time.Minute}, RefillFunction: "broker-reconcile"}},
		{"parked paused", []string{"SANDBOX_POOL_SIZE=2", "SANDBOX_POOL_PARKED=paused"},
			Pool{PoolSettings: core.PoolSettings{Size: 2, MaxAge: time.Hour, Parked: core.PoolParkedPaused}}},
		{"parked running", []string{"SANDBOX_POOL_SIZE=2", "SANDBOX_POOL_PARKED=running"},
			Pool{PoolSettings: core.PoolSettings{Size: 2, MaxAge: time.Hour, Parked: core.PoolParkedRunning}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, warnings, err := Parse(base(tc.env...))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(warnings) != 0 {
				t.Errorf("warnings = %v, want none (the pool variables are known)", warnings)
			}
			if c.Pool != tc.want {
				t.Errorf("pool = %+v, want %+v", c.Pool, tc.want)
			}
		})
	}
	for _, bad := range []string{"SANDBOX_POOL_SIZE=-1", "SANDBOX_POOL_SIZE=x", "SANDBOX_POOL_MAX_AGE_SECONDS=0",
		"SANDBOX_POOL_MAX_AGE_SECONDS=86401", "SANDBOX_POOL_PARKED=frozen"} {
		name, _, _ := strings.Cut(bad, "=")
		if _, _, err := Parse(base(bad)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Parse(%s) = %v, want an error naming %s", bad, err, name)
		}
	}
}
