package devstack

import (
	"net"
	"os"
	"os/exec"
	"testing"
)

// TestOwnsListener: a port is told apart by the process that listens on
// it, not by whether something answers there.
func TestOwnsListener(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp on this system: ownsListener cannot tell and answers true")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	for _, tc := range []struct {
		name string
		pid  int
		addr string
		want bool
	}{
		{"this process's listener", os.Getpid(), l.Addr().String(), true},
		{"another process's pid", other.Process.Pid, l.Addr().String(), false},
		{"a port nobody listens on", os.Getpid(), closedAddr, false},
	} {
		if got := ownsListener(tc.pid, tc.addr); got != tc.want {
			t.Errorf("%s: ownsListener(%d, %s) = %v, want %v", tc.name, tc.pid, tc.addr, got, tc.want)
		}
	}
}

// TestFreeAddrsAreDistinct: the ports of one pick differ (an emulator
// given the same port twice could not bind its second listener).
func TestFreeAddrsAreDistinct(t *testing.T) {
	for range 20 {
		addrs, err := freeAddrs(4)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, a := range addrs {
			if seen[a] {
				t.Fatalf("freeAddrs(4) = %v: %s twice", addrs, a)
			}
			seen[a] = true
		}
	}
}
