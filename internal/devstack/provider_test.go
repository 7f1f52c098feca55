package devstack

import "testing"

func TestProviderOf(t *testing.T) {
	tests := []struct {
		o    Options
		want string
	}{
		{Options{}, "e2b"},
		{Options{FunctionEnv: []string{"SANDBOX_REPLICAS=1", "SANDBOX_PROVIDER=provisioner"}}, "provisioner"},
		{Options{Provider: "e2b", FunctionEnv: []string{"SANDBOX_PROVIDER=provisioner"}}, "e2b"},
		{Options{Provider: "provisioner"}, "provisioner"},
	}
	for _, tt := range tests {
		if got := providerOf(tt.o); got != tt.want {
			t.Errorf("providerOf(%+v) = %q, want %q", tt.o, got, tt.want)
		}
	}
}
