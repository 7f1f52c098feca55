package faults_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/faults"
)

// webhookSteps are the DynamoDB writes of a provider's killed webhook:
// the record of its event id, the destroy claim of the sandbox's record
// and the free of its slot. Reconcile is the backstop of each.
var webhookSteps = []step{
	{"webhook/seen", ddbLayer, faults.BodyContains(faults.DynamoDB("UpdateItem"), "WHK#"), webhookStep},
	{"webhook/claim", ddbLayer, faults.BodyContains(faults.DynamoDB("UpdateItem"), `"S":"destroying"`), webhookStep},
	{"webhook/free", ddbLayer, faults.BodyContains(faults.DynamoDB("TransactWriteItems"), `"S":"gone"`), webhookStep},
}

// killedBehind acquires for thread, then kills its sandbox at the provider
// behind the broker's back, and returns its id.
func (st *stack) killedBehind(thread string) string {
	st.t.Helper()
	res, ok := st.acquire(thread)
	if !ok {
		st.t.Fatalf("setup acquire failed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st.clean.Kill(ctx, res.Record.SandboxID); err != nil {
		st.t.Fatalf("kill behind the broker's back: %v", err)
	}
	return res.Record.SandboxID
}

// webhook applies the provider's killed webhook event id about sandbox
// id, in an invocation.
func (st *stack) webhook(eventID, id string) (core.WebhookOutcome, error) {
	ctx, cancel := invocation()
	defer cancel()
	return st.eng.ApplyProviderEvent(ctx, core.ProviderEvent{ID: eventID, Kind: core.ProviderKilled, SandboxID: id, At: st.clock.now()})
}

// webhookStep kills the thread's sandbox behind the broker's back, then
// applies the killed webhook under the fault.
func webhookStep(st *stack, thread string, arm, disarm func()) (map[string][]byte, core.ReleaseResult, bool) {
	id := st.killedBehind(thread)
	arm()
	out, err := st.webhook("ev-"+thread, id)
	disarm()
	st.t.Logf("webhook under the fault: %s, %v", out, err)
	return nil, core.ReleaseResult{}, false
}

// TestWebhookLostOrDuplicated: a killed webhook that never comes leaves
// the slot to reconcile, which frees it; one delivered twice frees the
// slot once and refuses the second as a replay. The invariants hold
// either way, and the thread works again.
func TestWebhookLostOrDuplicated(t *testing.T) {
	host := startHost(t)
	t.Run("lost", func(t *testing.T) {
		t.Parallel()
		st := newStack(t, host, stackConfig{})
		st.killedBehind("t-lost")
		st.settle()
		st.checkInvariants()
		if _, ok := st.acquire("t-lost"); !ok {
			t.Errorf("acquire after a lost webhook failed")
		}
	})
	t.Run("duplicated", func(t *testing.T) {
		t.Parallel()
		st := newStack(t, host, stackConfig{})
		id := st.killedBehind("t-dup")
		if out, err := st.webhook("ev-dup", id); err != nil || out != core.WebhookApplied {
			t.Fatalf("first delivery = %s, %v; want applied", out, err)
		}
		st.checkInvariants() // freed at once, no reconcile pass
		if _, err := st.webhook("ev-dup", id); !errors.Is(err, core.ErrReplayed) {
			t.Errorf("second delivery = %v, want ErrReplayed", err)
		}
		st.settle()
		st.checkInvariants()
		if _, ok := st.acquire("t-dup"); !ok {
			t.Errorf("acquire after a duplicated webhook failed")
		}
	})
}
