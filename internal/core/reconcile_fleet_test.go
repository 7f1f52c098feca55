package core_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// countingDynamo returns a DynamoDB Local client whose calls are counted
// by an SDK middleware.
func countingDynamo(t testing.TB) (*dynamodb.Client, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	base := testenv.DynamoClient(t)
	c := dynamodb.New(base.Options(), func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
			return s.Initialize.Add(middleware.InitializeMiddlewareFunc("count", func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				n.Add(1)
				return next.HandleInitialize(ctx, in)
			}), middleware.Before)
		})
	})
	return c, &n
}

type fleet struct {
	eng   *core.Engine
	store *ddbstore.Store
	fake  *coretest.FakeProvider
	calls *atomic.Int64
	clock *recClock
}

// newFleet makes n sandboxes tagged for the deployment (one per thread)
// that DynamoDB does not know yet.
func newFleet(t testing.TB, n int, rs core.ReconcileSettings) *fleet {
	t.Helper()
	db, calls := countingDynamo(t)
	table := freshTable(t, db, "fleet")
	ctx := context.Background()
	s := core.DefaultSettings()
	s.Deployment = "fleet"
	s.Replicas = n
	f := &fleet{store: ddbstore.New(db, table, s.Deployment), fake: coretest.NewFakeProvider(), calls: calls, clock: &recClock{}}
	created := f.clock.now().UTC().Format(time.RFC3339)
	for i := range n {
		if _, err := f.fake.Create(ctx, core.CreateSpec{Metadata: map[string]string{core.MetaDeployment: s.Deployment,
			core.MetaTenant: "acme", core.MetaUser: "u" + strconv.Itoa(i%50), core.MetaThread: "t" + strconv.Itoa(i), core.MetaCreatedAt: created}}); err != nil {
			t.Fatalf("Create: %v", err)
		}
	}
	eng, err := core.New(s, f.store, f.fake, nil, core.WithClock(f.clock.now), core.WithReconcileSettings(rs),
		core.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	f.eng = eng
	return f
}

type cycleCost struct {
	passes, discovered, adopted int
	providerCalls, dynamoCalls  int64
	wall                        time.Duration
}

// cycle runs passes until one completes the inventory walk, checking
// every pass against the budgets.
func (f *fleet) cycle(t testing.TB, rs core.ReconcileSettings, maxPasses int) cycleCost {
	t.Helper()
	var c cycleCost
	p0, d0, start := f.fake.Count(""), f.calls.Load(), time.Now()
	for c.passes < maxPasses {
		st, err := f.eng.Reconcile(context.Background())
		if err != nil {
			t.Fatalf("pass %d: %v", c.passes+1, err)
		}
		c.passes++
		if st.Discovered > rs.MaxItems || st.Pages > rs.MaxPages {
			t.Fatalf("pass %d over budget: %+v", c.passes, st)
		}
		c.discovered += st.Discovered
		c.adopted += st.Adopted
		if st.InventoryComplete {
			break
		}
	}
	c.providerCalls, c.dynamoCalls, c.wall = int64(f.fake.Count(""))-int64(p0), f.calls.Load()-d0, time.Since(start)
	return c
}

// fleetSize is 300 by default (bounded for `go test ./internal/core`);
// SBX_RECONCILE_FLEET=10000 runs a pass over 10,000 sandboxes.
func fleetSize(t testing.TB) int {
	if v := os.Getenv("SBX_RECONCILE_FLEET"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SBX_RECONCILE_FLEET=%q: want a positive integer", v)
		}
		return n
	}
	return 300
}

// TestReconcileLargeFleetAcrossPasses: a fleet larger than one pass's
// budget is fully reconciled over several passes (every sandbox adopted,
// the ledger counting each), each pass within its item and page budgets;
// the next walk over the reconciled fleet changes nothing.
func TestReconcileLargeFleetAcrossPasses(t *testing.T) {
	t.Parallel()
	n := fleetSize(t)
	rs := core.DefaultReconcileSettings()
	rs.MaxItems = max(n/10, 1)
	rs.MaxPages = 5
	rs.MaxDuration = 10 * time.Minute
	f := newFleet(t, n, rs)
	first := f.cycle(t, rs, 3*n)
	if first.discovered != n || first.adopted != n {
		t.Errorf("first walk: %+v; want %d discovered and adopted", first, n)
	}
	perPass := min(rs.MaxItems, rs.MaxPages*rs.PageSize)
	wantPasses := (n + perPass - 1) / perPass
	if first.passes < wantPasses || first.passes > wantPasses+1 {
		t.Errorf("first walk took %d passes, want %d or %d", first.passes, wantPasses, wantPasses+1)
	}
	capa, err := f.store.Capacity(context.Background())
	if err != nil || capa.Used != n || capa.Warm != n {
		t.Errorf("capacity = %+v, %v; want %d used and warm", capa, err, n)
	}
	second := f.cycle(t, rs, 3*n)
	if second.discovered != n || second.adopted != 0 {
		t.Errorf("second walk: %+v; want %d discovered, nothing adopted", second, n)
	}
	t.Logf("fleet %d: adopting walk %d passes, %.2f provider and %.2f DynamoDB calls and %s per sandbox; steady walk %d passes, %.3f provider and %.3f DynamoDB calls and %s per sandbox",
		n, first.passes, float64(first.providerCalls)/float64(n), float64(first.dynamoCalls)/float64(n), first.wall/time.Duration(n),
		second.passes, float64(second.providerCalls)/float64(n), float64(second.dynamoCalls)/float64(n), second.wall/time.Duration(n))
}

// BenchmarkReconcileWalk reports provider calls, DynamoDB calls and wall
// time per reconciled sandbox for a walk over an already reconciled fleet
// (the steady state of the schedule), at 100, 1,000 and 10,000 sandboxes:
//
//	go test -run '^$' -bench BenchmarkReconcileWalk -benchtime 1x ./internal/core/
func BenchmarkReconcileWalk(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			rs := core.DefaultReconcileSettings()
			rs.MaxDuration = 10 * time.Minute
			f := newFleet(b, n, rs)
			adopt := f.cycle(b, rs, 10*n) // the first walk adopts every sandbox
			b.ResetTimer()
			var total cycleCost
			for b.Loop() {
				c := f.cycle(b, rs, 10*n)
				total.passes += c.passes
				total.providerCalls += c.providerCalls
				total.dynamoCalls += c.dynamoCalls
				total.wall += c.wall
				total.discovered += c.discovered
			}
			d := float64(total.discovered)
			b.ReportMetric(float64(total.providerCalls)/d, "provider-calls/sandbox")
			b.ReportMetric(float64(total.dynamoCalls)/d, "ddb-calls/sandbox")
			b.ReportMetric(float64(total.wall.Microseconds())/d, "µs/sandbox")
			b.ReportMetric(float64(total.passes)/float64(b.N), "passes/walk")
			b.ReportMetric(float64(adopt.dynamoCalls)/float64(n), "adopting-ddb-calls/sandbox")
			b.ReportMetric(float64(adopt.providerCalls)/float64(n), "adopting-provider-calls/sandbox")
			b.ReportMetric(float64(adopt.wall.Microseconds())/float64(n), "adopting-µs/sandbox")
		})
	}
}
