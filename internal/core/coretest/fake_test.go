package coretest_test

import (
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/core/providertest"
)

// TestFakeProviderMeetsContract keeps the fault-injection fake in line with
// the contract the real providers pass (internal/e2b runs the same suite).
func TestFakeProviderMeetsContract(t *testing.T) {
	providertest.Run(t, coretest.NewFakeProvider())
	pausable := coretest.NewFakeProvider()
	pausable.Pausable = true
	providertest.RunWith(t, pausable, providertest.Capabilities{Pause: true})
	locating := coretest.NewFakeProvider()
	locating.Locating = true
	providertest.Run(t, locating)
}
