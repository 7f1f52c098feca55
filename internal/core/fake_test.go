package core_test

import (
	"context"
	"sync"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// fakeSyncer records sync passes; hook, when set, runs inside each pass.
// incomplete makes passes report Complete false; untilDone makes them run
// until their context ends (then report incomplete). deadlines records
// each pass's context deadline (zero: none).
type fakeSyncer struct {
	mu         sync.Mutex
	passes     []string
	deadlines  []time.Time
	err        error
	hook       func()
	incomplete bool
	untilDone  bool
}

func (s *fakeSyncer) Sync(ctx context.Context, t core.SyncTarget) (core.SyncResult, error) {
	s.mu.Lock()
	s.passes = append(s.passes, t.Ref.ID)
	dl, _ := ctx.Deadline()
	s.deadlines = append(s.deadlines, dl)
	hook, err, incomplete, untilDone := s.hook, s.err, s.incomplete, s.untilDone
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	if untilDone {
		<-ctx.Done()
		incomplete = true
	}
	if err != nil {
		return core.SyncResult{}, err
	}
	if incomplete {
		return core.SyncResult{Uploaded: 1, Deferred: []core.DeferredFile{{Path: "outputs/big", Reason: "deadline"}}}, nil
	}
	return core.SyncResult{Uploaded: 1, Complete: true}, nil
}

func (s *fakeSyncer) set(f func(s *fakeSyncer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// count is how many passes ran for the sandbox id.
func (s *fakeSyncer) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.passes {
		if p == id {
			n++
		}
	}
	return n
}
