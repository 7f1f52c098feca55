package core_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

// latencyModel is a provider's latency, added to every call of the local
// host: Create takes Create more than a round trip, Resume takes Resume
// more, every other call (control plane or envd) one RoundTrip.
type latencyModel struct {
	Create    time.Duration
	Resume    time.Duration
	RoundTrip time.Duration
}

// e2bModel is E2B's published sandbox start time ("~150 ms") and resume
// time (about 1 s for a paused sandbox), and an assumed 20 ms round trip
// from the broker's region to E2B's API and to a sandbox's envd.
var e2bModel = latencyModel{Create: 150 * time.Millisecond, Resume: time.Second, RoundTrip: 20 * time.Millisecond}

// timedProvider adds a latency model to a provider and measures the wall
// time during which at least one of its calls is in flight (the
// provider's share of an acquire; the rest is the broker's own).
type timedProvider struct {
	core.Provider
	model latencyModel

	mu     sync.Mutex
	active int
	since  time.Time
	busy   time.Duration
}

// call marks a provider call in flight for its model latency d; the
// returned function ends it.
func (p *timedProvider) call(ctx context.Context, d time.Duration) func() {
	p.mu.Lock()
	if p.active == 0 {
		p.since = time.Now()
	}
	p.active++
	p.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.active--; p.active == 0 {
			p.busy += time.Since(p.since)
		}
	}
}

// takeBusy returns the provider's busy time since the last call and resets it.
func (p *timedProvider) takeBusy() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.busy
	p.busy = 0
	return b
}

// Capabilities are the provider's, its pause and resume timed too.
func (p *timedProvider) Capabilities() core.Capabilities {
	c := p.Provider.Capabilities()
	if c.Pause != nil {
		c.Pause = timedPauser{p: p, next: c.Pause}
	}
	return c
}

// timedPauser is a provider's Pauser under its timedProvider's model.
type timedPauser struct {
	p    *timedProvider
	next core.Pauser
}

func (t timedPauser) Pause(ctx context.Context, id string) error {
	defer t.p.call(ctx, t.p.model.RoundTrip)()
	return t.next.Pause(ctx, id)
}

func (t timedPauser) Resume(ctx context.Context, id string, timeout time.Duration) error {
	defer t.p.call(ctx, t.p.model.Resume+t.p.model.RoundTrip)()
	return t.next.Resume(ctx, id, timeout)
}

func (p *timedProvider) Create(ctx context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	defer p.call(ctx, p.model.Create+p.model.RoundTrip)()
	return p.Provider.Create(ctx, spec)
}

func (p *timedProvider) Info(ctx context.Context, id string) (core.SandboxInfo, error) {
	defer p.call(ctx, p.model.RoundTrip)()
	return p.Provider.Info(ctx, id)
}

func (p *timedProvider) Kill(ctx context.Context, id string) error {
	defer p.call(ctx, p.model.RoundTrip)()
	return p.Provider.Kill(ctx, id)
}

func (p *timedProvider) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	defer p.call(ctx, p.model.RoundTrip)()
	return p.Provider.SetTimeout(ctx, id, d)
}

func (p *timedProvider) Run(ctx context.Context, ref core.SandboxRef, cmd core.Command) (core.CommandResult, error) {
	defer p.call(ctx, p.model.RoundTrip)()
	return p.Provider.Run(ctx, ref, cmd)
}

func (p *timedProvider) OpenFile(ctx context.Context, ref core.SandboxRef, path string, maxBytes int64) (io.ReadCloser, error) {
	defer p.call(ctx, p.model.RoundTrip)()
	return p.Provider.OpenFile(ctx, ref, path, maxBytes)
}

func (p *timedProvider) WriteFile(ctx context.Context, ref core.SandboxRef, path string, r io.Reader) error {
	defer p.call(ctx, p.model.RoundTrip)()
	return p.Provider.WriteFile(ctx, ref, path, r)
}

// poolBenchPairs is how many claims and creates one iteration measures.
const poolBenchPairs = 40

// quantile is the q-quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkPoolClaimVersusCreate measures a new thread's first acquire
// from its call to its reply (the sandbox ready: checked, bootstrapped,
// timeout set, recorded), when it claims a pool member and when it
// creates, side by side in one run: on the local sandbox host, and on the
// host with E2B's latency model (e2bModel), with members parked running
// and paused (a paused member's claim resumes it). It reports p50 and p99
// of both, the ratio of the p50s (the goal is at most 0.25), and the
// broker's own share of a claim (the time no provider call was in
// flight: DynamoDB and the engine). The store is DynamoDB Local; no
// outputs are restored (a restore costs both paths the same).
func BenchmarkPoolClaimVersusCreate(b *testing.B) {
	for _, tc := range []struct {
		name   string
		model  latencyModel
		parked core.PoolParking
	}{
		{"host/running", latencyModel{}, core.PoolParkedRunning},
		{"host/paused", latencyModel{}, core.PoolParkedPaused},
		{"e2b-model/running", e2bModel, core.PoolParkedRunning},
		{"e2b-model/paused", e2bModel, core.PoolParkedPaused},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			srv, err := sandboxhost.Start(ctx, sandboxhost.Options{APIKey: "bench-key", RootDir: b.TempDir()}, "127.0.0.1:0", "127.0.0.1:0")
			if err != nil {
				b.Fatalf("sandboxhost.Start: %v", err)
			}
			b.Cleanup(func() { _ = srv.Close() })
			client, err := e2b.New(e2b.Options{APIURL: srv.APIURL, SandboxURL: srv.EnvdURL, APIKey: "bench-key"})
			if err != nil {
				b.Fatalf("e2b.New: %v", err)
			}
			prov := &timedProvider{Provider: client, model: tc.model}
			ddb := testenv.DynamoClient(b)
			table := freshTable(b, ddb, "poolbench")
			s := core.DefaultSettings()
			s.Deployment = "poolbench"
			s.Replicas = 100000
			s.Policy = core.PolicyReject
			eng, err := core.New(s, ddbstore.New(ddb, table, s.Deployment), prov, nil,
				core.WithLogger(slog.New(slog.DiscardHandler)), core.WithPool(core.PoolSettings{Size: 1, MaxAge: time.Hour, Parked: tc.parked}))
			if err != nil {
				b.Fatalf("core.New: %v", err)
			}
			var claims, creates, broker []time.Duration
			acquire := func(thread string, want core.Source) time.Duration {
				prov.takeBusy()
				start := time.Now()
				res, err := eng.Acquire(ctx, core.ThreadKey{Tenant: "acme", User: "alice", Thread: thread})
				took := time.Since(start)
				if err != nil || res.Source != want {
					b.Fatalf("Acquire(%s) = %s, %v; want %s", thread, res.Source, err, want)
				}
				if want == core.SourcePool {
					broker = append(broker, took-prov.takeBusy())
				}
				b.StopTimer()
				_ = client.Kill(ctx, res.Record.SandboxID) // keep the host light; the record is not read again
				b.StartTimer()
				return took
			}
			n := 0
			b.ResetTimer()
			for range b.N {
				for range poolBenchPairs {
					n++
					b.StopTimer()
					if st, err := eng.RefillPool(ctx); err != nil || st.Created != 1 {
						b.Fatalf("RefillPool = %+v, %v; want one member", st, err)
					}
					b.StartTimer()
					claims = append(claims, acquire(fmt.Sprint("claim-", n), core.SourcePool))
					creates = append(creates, acquire(fmt.Sprint("create-", n), core.SourceCreated))
				}
			}
			b.StopTimer()
			var claimSum, brokerSum time.Duration
			for i := range claims {
				claimSum += claims[i]
				brokerSum += broker[i]
			}
			slices.Sort(claims)
			slices.Sort(creates)
			slices.Sort(broker)
			b.ReportMetric(ms(quantile(claims, 0.5)), "claim-p50-ms")
			b.ReportMetric(ms(quantile(claims, 0.99)), "claim-p99-ms")
			b.ReportMetric(ms(quantile(creates, 0.5)), "create-p50-ms")
			b.ReportMetric(ms(quantile(creates, 0.99)), "create-p99-ms")
			b.ReportMetric(float64(quantile(claims, 0.5))/float64(quantile(creates, 0.5)), "claim/create-p50")
			b.ReportMetric(ms(quantile(broker, 0.5)), "claim-broker-p50-ms")
			b.ReportMetric(float64(brokerSum)/float64(claimSum), "claim-broker-share")
		})
	}
}
