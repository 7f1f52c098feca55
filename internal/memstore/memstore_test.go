package memstore_test

import (
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/memstore"
	"github.com/sandbox-broker/sandbox-broker/internal/storetest"
)

// TestConformance holds the in-memory store to the store contract.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s := memstore.New()
		return storetest.Subject{Store: s, FailNext: func(applied bool) { s.FailNext("", applied) }}
	})
}
