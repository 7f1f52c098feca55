package core_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// TestReconcileAgainstLocalSandboxHost runs the reconciliation behaviours
// against real processes: the repository's E2B-compatible sandbox host on
// loopback, driven through internal/e2b, with DynamoDB Local.
func TestReconcileAgainstLocalSandboxHost(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const apiKey = "host-key"
	srv, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: apiKey, RootDir: t.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sandboxhost.Start: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	prov, err := e2b.New(e2b.Options{APIURL: srv.APIURL, SandboxURL: srv.EnvdURL, APIKey: apiKey, ListPageSize: 2})
	if err != nil {
		t.Fatalf("e2b.New: %v", err)
	}
	db := testenv.DynamoClient(t)
	table := freshTable(t, db, "rechost")
	s := core.DefaultSettings()
	s.Deployment = "hosttest"
	rs := core.DefaultReconcileSettings()
	rs.Grace = 0
	rs.OrphanTTL = time.Minute // far longer than the first pass takes on a loaded machine; the clock jumps past it
	clock := &recClock{}
	store := ddbstore.New(db, table, s.Deployment)
	eng, err := core.New(s, store, prov, nil, core.WithClock(clock.now), core.WithReconcileSettings(rs),
		core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	pass := func() core.ReconcileStats {
		t.Helper()
		st, err := eng.Reconcile(ctx)
		if err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
		return st
	}
	alive := func(id string) bool {
		_, err := prov.Info(ctx, id)
		return err == nil
	}

	res, err := eng.Acquire(ctx, key("t1"))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	canonical := res.Record.SandboxID
	warm, err := eng.Acquire(ctx, key("t2"))
	if err != nil {
		t.Fatalf("Acquire t2: %v", err)
	}
	if _, err := eng.Release(ctx, "acme", warm.Record.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	before, err := prov.Info(ctx, warm.Record.SandboxID)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	meta := map[string]string{core.MetaDeployment: s.Deployment, core.MetaTenant: "acme", core.MetaUser: "alice", core.MetaThread: "t1"}
	dup, err := prov.Create(ctx, core.CreateSpec{Timeout: time.Minute, Metadata: meta})
	if err != nil {
		t.Fatalf("Create duplicate: %v", err)
	}
	orphan, err := prov.Create(ctx, core.CreateSpec{Timeout: time.Minute, Metadata: map[string]string{core.MetaDeployment: s.Deployment}})
	if err != nil {
		t.Fatalf("Create orphan: %v", err)
	}

	st := pass()
	if st.Discovered != 4 || st.Killed != 1 || st.Deferred != 1 || !st.InventoryComplete {
		t.Errorf("first pass = %+v; want 4 discovered, the duplicate killed, the orphan deferred", st)
	}
	if alive(dup.ID) || !alive(canonical) || !alive(orphan.ID) {
		t.Errorf("alive: duplicate %v canonical %v orphan %v; want false true true", alive(dup.ID), alive(canonical), alive(orphan.ID))
	}
	after, err := prov.Info(ctx, warm.Record.SandboxID)
	if err != nil || !after.EndAt.Equal(before.EndAt) {
		t.Errorf("warm sandbox end moved from %s to %s (%v): reconcile extended its life", before.EndAt, after.EndAt, err)
	}

	clock.advance(rs.OrphanTTL + time.Second)
	if st := pass(); st.Killed != 1 || alive(orphan.ID) {
		t.Errorf("second pass = %+v, orphan alive %v; want it killed after its TTL", st, alive(orphan.ID))
	}

	if err := prov.Kill(ctx, canonical); err != nil { // out-of-band kill
		t.Fatalf("Kill: %v", err)
	}
	clock.advance(time.Second)
	if st := pass(); st.Dead != 1 {
		t.Errorf("third pass = %+v, want the vanished sandbox's record freed", st)
	}
	capa, err := store.Capacity(ctx)
	if err != nil || capa.Used != 1 {
		t.Errorf("capacity = %+v, %v; want 1 slot (the warm sandbox)", capa, err)
	}
}
