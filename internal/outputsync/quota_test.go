package outputsync

import (
	"bytes"
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/memstore"
)

// writeSparse makes rel a sparse file of size bytes that takes (almost)
// no blocks on disk.
func writeSparse(t *testing.T, home, rel string, size int64) {
	t.Helper()
	writeFile(t, home, rel, nil, t0)
	p := home + "/" + rel
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, t0, t0); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 >= 1<<20 {
		t.Skipf("the file system does not keep %s sparse (%d blocks)", rel, st.Blocks)
	}
}

// A sparse file is counted by what S3 would store (its apparent size),
// before it is read: past the per-file cap, the thread's quota or the
// tenant's, it is excluded and never opened, whatever few blocks it takes.
func TestSync_SparseFileCountedByStoredSize(t *testing.T) {
	t.Parallel()
	const size = 300 << 20
	for _, tc := range []struct {
		name   string
		opts   Options
		reason string
	}{
		{"file cap", Options{}, ReasonFileTooLarge},
		{"thread quota", Options{MaxFileBytes: 1 << 30, MaxThreadBytes: 100 << 20}, ReasonThreadQuota},
		{"tenant quota", Options{MaxFileBytes: 1 << 30, MaxTenantBytes: 100 << 20, Ledger: memstore.New()}, ReasonTenantQuota},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newSyncEnv(t)
			writeSparse(t, e.sb.home, "outputs/hole.bin", size)
			writeFile(t, e.sb.home, "outputs/small.txt", []byte("ok"), t0)
			res := e.mustSync(e.syncer(tc.opts), "sb1")
			if got := deferredReasons(res); got["outputs/hole.bin"] != tc.reason || res.Uploaded != 1 || res.Bytes != 2 {
				t.Errorf("pass: uploaded %d (%d bytes), not copied %v; want small.txt only and hole.bin %s", res.Uploaded, res.Bytes, got, tc.reason)
			}
			for _, p := range e.sb.openedPaths() {
				if p == e.sb.home+"/outputs/hole.bin" {
					t.Errorf("the sparse file was opened; it must be refused by its listed size")
				}
			}
			if _, ok := e.object("outputs/hole.bin"); ok {
				t.Errorf("the sparse file is in S3")
			}
		})
	}
}

// The tenant's quota counts every thread of the tenant: a thread's pass
// sees what the tenant's other threads store, another thread's pass never
// resets it, and other tenants are apart. The ledger records each
// thread's bytes as stored.
func TestSync_TenantQuotaAcrossThreads(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ledger := memstore.New()
	s := e.syncer(Options{MaxTenantBytes: 25, Ledger: ledger})
	ten := func(b byte) []byte { return bytes.Repeat([]byte{b}, 10) }
	writeFile(t, e.sb.home, "outputs/a.bin", ten('a'), t0)
	writeFile(t, e.sb.home, "outputs/b.bin", ten('b'), t0)
	t1, t2 := e.key, core.ThreadKey{Tenant: "acme", User: "u2", Thread: "t2"}
	if res := e.mustSync(s, "sb1"); res.Uploaded != 2 || !res.Complete {
		t.Fatalf("t1: uploaded %d, complete %v; want both files", res.Uploaded, res.Complete)
	}
	e.wantStored(ledger, t1, 20, 20)

	// t2's sandbox holds one file of 10 bytes: 20 + 10 > 25.
	if err := os.Remove(e.sb.home + "/outputs/b.bin"); err != nil {
		t.Fatal(err)
	}
	e.key = t2
	for pass := range 2 {
		res := e.mustSync(s, "sb2")
		if got := deferredReasons(res); got["outputs/a.bin"] != ReasonTenantQuota || res.Uploaded != 0 || !res.Complete {
			t.Fatalf("t2 pass %d: uploaded %d, not copied %v, complete %v; want a.bin excluded for the tenant's quota", pass, res.Uploaded, got, res.Complete)
		}
	}
	e.wantStored(ledger, t2, 0, 20)

	// 5 bytes fit; another tenant has its own quota.
	writeFile(t, e.sb.home, "outputs/a.bin", ten('c')[:5], t0.Add(time.Second))
	if res := e.mustSync(s, "sb2"); res.Uploaded != 1 {
		t.Fatalf("t2 with 5 bytes: uploaded %d, not copied %v; want it to fit", res.Uploaded, deferredReasons(res))
	}
	e.wantStored(ledger, t2, 5, 25)
	e.key = core.ThreadKey{Tenant: "zeta", User: "u1", Thread: "t1"}
	writeFile(t, e.sb.home, "outputs/a.bin", ten('z'), t0.Add(2*time.Second))
	if res := e.mustSync(s, "sb3"); res.Uploaded != 1 {
		t.Fatalf("another tenant: uploaded %d, not copied %v; want its own quota", res.Uploaded, deferredReasons(res))
	}
	e.wantStored(ledger, e.key, 10, 10)
}

// A pass whose record of the thread's new total lost its reply uploads
// nothing that adds bytes, and its end records what S3 holds; with the
// ledger unreadable, nothing that adds bytes is uploaded (deferred, the
// pass incomplete), and the next pass copies it.
func TestSync_TenantLedgerFaults(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ledger := memstore.New()
	s := e.syncer(Options{MaxTenantBytes: 100, Ledger: ledger})
	writeFile(t, e.sb.home, "outputs/a.bin", bytes.Repeat([]byte("a"), 10), t0)

	ledger.FailNext("RecordStored", true) // applied, reply lost
	res := e.mustSync(s, "sb1")
	if got := deferredReasons(res); got["outputs/a.bin"] != ReasonError || res.Uploaded != 0 || res.Complete {
		t.Fatalf("pass with its record lost: uploaded %d, not copied %v, complete %v; want a.bin deferred", res.Uploaded, got, res.Complete)
	}
	e.wantStored(ledger, e.key, 0, 0)
	ledger.FailNext("RecordStored", false)
	res = e.mustSync(s, "sb1")
	if res.Uploaded != 0 || res.Complete {
		t.Fatalf("pass with its record refused: uploaded %d, complete %v; want nothing", res.Uploaded, res.Complete)
	}
	res = e.mustSync(s, "sb1")
	if res.Uploaded != 1 || !res.Complete {
		t.Fatalf("next pass: uploaded %d, not copied %v; want a.bin", res.Uploaded, deferredReasons(res))
	}
	e.wantStored(ledger, e.key, 10, 10)
}

// wantStored checks what the ledger records for k's thread and tenant.
func (e *syncEnv) wantStored(ledger core.StorageStore, k core.ThreadKey, thread, tenant int64) {
	e.t.Helper()
	st, err := ledger.StoredBytes(context.Background(), k)
	if err != nil {
		e.t.Fatalf("StoredBytes: %v", err)
	}
	if st.Thread != thread || st.Tenant != tenant {
		e.t.Errorf("ledger for %s = %+v; want thread %d, tenant %d", k, st, thread, tenant)
	}
}

// Objects deleted by MirrorDeletes leave the thread's and the tenant's
// stored bytes.
func TestSync_TenantLedgerFollowsMirrorDeletes(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ledger := memstore.New()
	s := e.syncer(Options{MaxTenantBytes: 100, Ledger: ledger, MirrorDeletes: true})
	writeFile(t, e.sb.home, "outputs/a.bin", bytes.Repeat([]byte("a"), 10), t0)
	writeFile(t, e.sb.home, "outputs/b.bin", bytes.Repeat([]byte("b"), 7), t0)
	e.mustSync(s, "sb1")
	e.wantStored(ledger, e.key, 17, 17)
	if err := os.Remove(e.sb.home + "/outputs/a.bin"); err != nil {
		t.Fatal(err)
	}
	e.mustSync(s, "sb1")
	e.wantStored(ledger, e.key, 7, 7)
}
