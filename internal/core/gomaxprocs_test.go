package core_test

import "runtime"

func testingGOMAXPROCS() int { return runtime.GOMAXPROCS(0) }
