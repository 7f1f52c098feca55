package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// newLocatingHarness is newHarness over a fake provider that addresses a
// sandbox by id (Capabilities.Locate) and refuses commands without the
// sandbox's access token.
func newLocatingHarness(t *testing.T) *harness {
	t.Helper()
	prov := coretest.NewFakeProvider()
	prov.Locating, prov.CheckTokens = true, true
	return newHarnessWith(t, prov, nil)
}

// abandonedCreate leaves at the provider a sandbox of thread that no
// record names: a create whose client gave up before its reply.
func (h *harness) abandonedCreate(t *testing.T, thread string) string {
	t.Helper()
	ref, err := h.prov.Create(context.Background(), core.CreateSpec{Metadata: map[string]string{core.MetaDeployment: "test",
		core.MetaTenant: "acme", core.MetaUser: "alice", core.MetaThread: thread,
		core.MetaCreatedAt: h.clock.now().UTC().Format(time.RFC3339)}})
	if err != nil {
		t.Fatal(err)
	}
	return ref.ID
}

// TestAdoptedSandboxGetsItsAccessToken: a sandbox reconcile adopts for its
// thread carries its endpoint and access token, so the thread's next
// acquire takes it back and reaches it, rather than discarding it.
func TestAdoptedSandboxGetsItsAccessToken(t *testing.T) {
	h := newLocatingHarness(t)
	ctx := context.Background()
	id := h.abandonedCreate(t, "t1")
	if st, err := h.eng.Reconcile(ctx); err != nil || st.Adopted != 1 {
		t.Fatalf("Reconcile = %+v, %v; want the sandbox adopted", st, err)
	}
	rec, err := h.store.Get(ctx, id)
	if err != nil || rec.Endpoint.AccessToken != "tok-"+id {
		t.Fatalf("adopted record = %+v, %v; want its access token", rec, err)
	}
	if got := h.acquire(t, key("t1"), core.SourceReclaimed); got.SandboxID != id {
		t.Errorf("acquire got %s; want the adopted %s", got.SandboxID, id)
	}
}

// TestAdoptionWaitsForTheAccessToken: when the sandbox's endpoint cannot
// be read, the adoption waits for the next pass and takes no slot
// meanwhile.
func TestAdoptionWaitsForTheAccessToken(t *testing.T) {
	h := newLocatingHarness(t)
	ctx := context.Background()
	id := h.abandonedCreate(t, "t1")
	h.prov.Set(func(f *coretest.FakeProvider) { f.LocateErr = errors.New("e2b: 503") })
	st, err := h.eng.Reconcile(ctx)
	if err != nil || st.Adopted != 0 || st.Deferred < 1 {
		t.Fatalf("Reconcile = %+v, %v; want the adoption deferred", st, err)
	}
	if capa := h.capacity(t); capa.Used != 0 {
		t.Errorf("capacity = %+v; want no slot taken", capa)
	}
	h.prov.Set(func(f *coretest.FakeProvider) { f.LocateErr = nil })
	if st, err := h.eng.Reconcile(ctx); err != nil || st.Adopted != 1 {
		t.Fatalf("next Reconcile = %+v, %v; want it adopted", st, err)
	}
	if got := h.acquire(t, key("t1"), core.SourceReclaimed); got.SandboxID != id {
		t.Errorf("acquire got %s; want the adopted %s", got.SandboxID, id)
	}
}
