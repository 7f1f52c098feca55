package sandboxhost

import (
	"errors"
	"os"
	"testing"
)

// Two hosts in one process (tests, an embedding program) each get their
// own cgroup directories: closing one leaves the other's in place.
func TestHostsOfOneProcessKeepTheirOwnCgroups(t *testing.T) {
	first, err := probeCgroups()
	if errors.Is(err, errNoCgroups) || os.IsPermission(err) {
		t.Skipf("no writable cgroups here: %v", err)
	}
	if err != nil {
		t.Fatalf("probeCgroups: %v", err)
	}
	second, err := probeCgroups()
	if err != nil {
		first.close()
		t.Fatalf("probeCgroups (second host): %v", err)
	}
	defer second.close()
	first.close()
	for ctrl, dir := range second.parents {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s: the second host's cgroup %s after the first host closed: %v, want it kept", ctrl, dir, err)
		}
	}
}
