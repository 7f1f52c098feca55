package core_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// claimOutageStore fails every Claim as a store outage would.
type claimOutageStore struct{ core.Store }

func (s claimOutageStore) Claim(context.Context, core.Claim) (core.Record, error) {
	return core.Record{}, fmt.Errorf("claim: %w: throttled", core.ErrStoreUnavailable)
}

// TestReconcileNeverDropsAnError: a claim that fails for an outage (not
// for contention) is counted in the pass's Errors and logged once; before,
// the pass skipped the item as if a peer held it.
func TestReconcileNeverDropsAnError(t *testing.T) {
	h := newRecHarness(t, nil)
	ctx := context.Background()
	rec := h.acquire(t, "t1")
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := h.eng.SetDraining(ctx, true); err != nil { // every warm sandbox is due
		t.Fatalf("SetDraining: %v", err)
	}
	var logs bytes.Buffer
	eng, err := core.New(h.s, claimOutageStore{h.store}, h.prov, nil, core.WithClock(h.clock.now),
		core.WithReconcileSettings(h.rs),
		core.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	st, _ := eng.Reconcile(ctx)
	if st.Errors == 0 || st.Expired != 0 {
		t.Errorf("stats = %+v, want Errors > 0 and nothing expired", st)
	}
	if n := strings.Count(logs.String(), `"msg":"reconcile: claim idle warm sandbox failed"`); n != 1 {
		t.Errorf("%d log lines for the failed claim, want 1:\n%s", n, logs.String())
	}
	if !h.fake.Alive(rec.SandboxID) {
		t.Error("the sandbox was killed without a claim")
	}
}
