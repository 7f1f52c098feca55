package faults_test

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// caseParallelism is how many fault cases run at once unless -parallel
// says otherwise. A case spends most of its time waiting (stalled calls
// run to the invocation's deadline, reconcile passes wait out graces),
// not computing, so more cases than cores overlap their waits; the
// default, GOMAXPROCS, would leave a 2-core machine mostly idle.
const caseParallelism = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(caseParallelism)); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
