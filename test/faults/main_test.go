package faults_test

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// faultParallel is the fewest fault cases that run at once (one per CPU
// on a machine with more) unless -parallel says otherwise. A case spends
// most of its time waiting (a stalled call held to its deadline, a lease
// or a grant left to lapse): on two cores the reconcile cases took 101 s
// two at a time (the default, one per CPU) and 66 s four at a time, for
// the same CPU time.
const faultParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(max(faultParallel, runtime.GOMAXPROCS(0)))); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
