package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// lateTimer is a context whose deadline has passed while its timer has
// not yet fired: Err is still nil, as a loaded machine can leave it.
type lateTimer struct {
	context.Context
	deadline time.Time
}

func (c lateTimer) Deadline() (time.Time, bool) { return c.deadline, true }

// A call that fails on its deadline before the context's timer ends it is
// classified by the deadline's time: the command's timeout, or the
// caller's own deadline when that one passed.
func TestExecErrClassifiesByTheDeadlinesTime(t *testing.T) {
	past := lateTimer{Context: context.Background(), deadline: time.Now().Add(-time.Millisecond)}
	cut := connect.NewError(connect.CodeCanceled, context.DeadlineExceeded)
	e := &Envd{}
	if err := e.execErr(context.Background(), past, cut); !errors.Is(err, ErrExecTimeout) {
		t.Errorf("the command's deadline passed: %v, want ErrExecTimeout", err)
	}
	if err := e.execErr(past, past, cut); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrExecTimeout) {
		t.Errorf("the caller's deadline passed: %v, want context.DeadlineExceeded", err)
	}
	if err := e.execErr(context.Background(), context.Background(), cut); errors.Is(err, ErrExecTimeout) {
		t.Errorf("no deadline passed: %v, want no timeout", err)
	}
}
