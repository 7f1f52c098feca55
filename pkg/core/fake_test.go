package core_test

import (
	"context"
	"sync"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// fakeSyncer records sync passes; hook, when set, runs inside each pass.
type fakeSyncer struct {
	mu     sync.Mutex
	passes []string
	err    error
	hook   func()
}

func (s *fakeSyncer) Sync(_ context.Context, t core.SyncTarget) (core.SyncResult, error) {
	s.mu.Lock()
	s.passes = append(s.passes, t.Ref.ID)
	hook, err := s.hook, s.err
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err != nil {
		return core.SyncResult{}, err
	}
	return core.SyncResult{Uploaded: 1, Complete: true}, nil
}
