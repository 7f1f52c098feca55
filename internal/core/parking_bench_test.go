package core_test

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
)

// The pause-parking figure: a synthetic agent workload replayed through
// the engine (DynamoDB Local, an injected clock) over a provider model with
// E2B's published times, with pause-parking off, after 300 s and at
// release. It reports running sandbox-seconds per thread-hour (what a
// deployment pays its provider, from the usage metering) and the latency
// of a returning thread's acquire.

// parkingModel is the provider's latency per call: e2bModel's start and
// round trip, and E2B's published pause ("about 4 seconds per 1 GB of
// RAM": 2 s for the default 512 MB sandbox) and resume ("about 1 second")
// times.
var parkingModel = struct {
	Create, Resume, Pause, RoundTrip time.Duration
}{Create: e2bModel.Create, Resume: time.Second, Pause: 2 * time.Second, RoundTrip: e2bModel.RoundTrip}

// ddbCallLatency is an assumed in-region DynamoDB call latency, added per
// call an acquire makes (DynamoDB Local's own time is not the cloud's).
const ddbCallLatency = 5 * time.Millisecond

// modelKey keys the modeled provider time spent under a context.
type modelKey struct{}

// modelTime accumulates modeled provider time for the calls made under ctx.
func modelTime(ctx context.Context, d time.Duration) {
	if acc, ok := ctx.Value(modelKey{}).(*atomic.Int64); ok {
		acc.Add(int64(d))
	}
}

// modelProvider is the fake with parkingModel's latency accounted (not
// slept: the workload's clock is simulated).
type modelProvider struct{ *coretest.FakeProvider }

func (p modelProvider) Capabilities() core.Capabilities {
	c := p.FakeProvider.Capabilities()
	c.Pause = p
	return c
}

func (p modelProvider) Create(ctx context.Context, spec core.CreateSpec) (core.SandboxRef, error) {
	modelTime(ctx, parkingModel.Create+parkingModel.RoundTrip)
	return p.FakeProvider.Create(ctx, spec)
}

func (p modelProvider) Info(ctx context.Context, id string) (core.SandboxInfo, error) {
	modelTime(ctx, parkingModel.RoundTrip)
	return p.FakeProvider.Info(ctx, id)
}

func (p modelProvider) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	modelTime(ctx, parkingModel.RoundTrip)
	return p.FakeProvider.SetTimeout(ctx, id, d)
}

func (p modelProvider) Run(ctx context.Context, ref core.SandboxRef, c core.Command) (core.CommandResult, error) {
	modelTime(ctx, parkingModel.RoundTrip)
	return p.FakeProvider.Run(ctx, ref, c)
}

func (p modelProvider) Kill(ctx context.Context, id string) error {
	modelTime(ctx, parkingModel.RoundTrip)
	return p.FakeProvider.Kill(ctx, id)
}

func (p modelProvider) Pause(ctx context.Context, id string) error {
	modelTime(ctx, parkingModel.Pause)
	return p.FakeProvider.Pause(ctx, id)
}

func (p modelProvider) Resume(ctx context.Context, id string, timeout time.Duration) error {
	modelTime(ctx, parkingModel.Resume)
	return p.FakeProvider.Resume(ctx, id, timeout)
}

// usageSums is a log handler that adds up the usage lines' seconds.
type usageSums struct {
	mu              sync.Mutex
	running, paused float64
}

func (u *usageSums) Enabled(context.Context, slog.Level) bool { return true }
func (u *usageSums) WithAttrs([]slog.Attr) slog.Handler       { return u }
func (u *usageSums) WithGroup(string) slog.Handler            { return u }
func (u *usageSums) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "usage" {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case core.MetricRunningSeconds:
			u.running += a.Value.Float64()
		case core.MetricPausedSeconds:
			u.paused += a.Value.Float64()
		}
		return true
	})
	return nil
}

// workload is the synthetic agent workload: threads that each work turns
// of 1 to 5 minutes (uniform) separated by idle gaps drawn from a
// log-normal distribution (median GapMedian, shape GapSigma: long-tailed,
// about one gap in eight longer than the 30-minute idle timeout), for
// Hours simulated hours.
type workload struct {
	Threads   int
	Hours     float64
	GapMedian time.Duration
	GapSigma  float64
	Seed      uint64
}

// workloadFromEnv is the default workload (200 threads, 4 hours), scaled
// by BENCH_THREADS and BENCH_HOURS when set.
func workloadFromEnv(b *testing.B) workload {
	w := workload{Threads: 200, Hours: 4, GapMedian: 5 * time.Minute, GapSigma: 1.5, Seed: 15}
	if v := os.Getenv("BENCH_THREADS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("BENCH_THREADS=%q: want a positive integer", v)
		}
		w.Threads = n
	}
	if v := os.Getenv("BENCH_HOURS"); v != "" {
		h, err := strconv.ParseFloat(v, 64)
		if err != nil || h <= 0 {
			b.Fatalf("BENCH_HOURS=%q: want a positive number", v)
		}
		w.Hours = h
	}
	return w
}

// simEvent is one thread's next step at a simulated time.
type simEvent struct {
	at      time.Time
	thread  int
	release bool   // else acquire
	id      string // the sandbox to release
}

type simQueue []simEvent

func (q simQueue) Len() int           { return len(q) }
func (q simQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q simQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)        { *q = append(*q, x.(simEvent)) }
func (q *simQueue) Pop() any          { old := *q; e := old[len(old)-1]; *q = old[:len(old)-1]; return e }

// parkingResult is one replay's figures.
type parkingResult struct {
	runningPerThreadHour, pausedPerThreadHour float64
	p50, p99                                  time.Duration
	sources                                   map[core.Source]int
}

// replay runs w through an engine with pauseAfter and returns its figures.
func replay(b *testing.B, w workload, pauseAfter time.Duration) parkingResult {
	b.Helper()
	start := time.Date(2026, 1, 5, 9, 0, 0, 0, time.UTC)
	var clockNS atomic.Int64
	clockNS.Store(start.UnixNano())
	now := func() time.Time { return time.Unix(0, clockNS.Load()).UTC() }
	fake := coretest.NewFakeProvider()
	fake.Pausable = true
	usage := &usageSums{}
	eng, counter, _, _ := benchEngineWith(b, modelProvider{fake}, func(s *core.Settings) {
		s.Replicas = w.Threads
		s.PauseAfter = pauseAfter
	}, core.WithClock(now), core.WithLogger(slog.New(usage)))

	rng := rand.New(rand.NewPCG(w.Seed, 1))
	end := start.Add(time.Duration(w.Hours * float64(time.Hour)))
	q := &simQueue{}
	for i := range w.Threads {
		heap.Push(q, simEvent{at: start.Add(time.Duration(rng.Float64() * float64(30*time.Minute))), thread: i})
	}
	const reconcileEvery = time.Minute
	nextPass := start.Add(reconcileEvery)
	first := make([]time.Time, w.Threads) // each thread's first acquire
	var latencies []time.Duration
	res := parkingResult{sources: map[core.Source]int{}}
	for q.Len() > 0 {
		ev := heap.Pop(q).(simEvent)
		for !nextPass.After(ev.at) && nextPass.Before(end) {
			clockNS.Store(nextPass.UnixNano())
			if _, err := eng.Reconcile(context.Background()); err != nil {
				b.Fatalf("reconcile at %s: %v", nextPass, err)
			}
			nextPass = nextPass.Add(reconcileEvery)
		}
		if !ev.at.Before(end) {
			continue // the window is over: the thread stops
		}
		clockNS.Store(ev.at.UnixNano())
		k := core.ThreadKey{Tenant: "bench", User: "u", Thread: fmt.Sprintf("t%03d", ev.thread)}
		if ev.release {
			if _, err := eng.Release(context.Background(), k.Tenant, ev.id); err != nil {
				b.Fatalf("release %s at %s: %v", ev.id, ev.at, err)
			}
			gap := time.Duration(float64(w.GapMedian) * math.Exp(w.GapSigma*rng.NormFloat64()))
			heap.Push(q, simEvent{at: ev.at.Add(gap), thread: ev.thread})
			continue
		}
		acc := &atomic.Int64{}
		calls := counter.n.Load()
		r, err := eng.Acquire(context.WithValue(context.Background(), modelKey{}, acc), k)
		if err != nil {
			b.Fatalf("acquire %s at %s: %v", k, ev.at, err)
		}
		if first[ev.thread].IsZero() {
			first[ev.thread] = ev.at
		} else {
			latencies = append(latencies, time.Duration(acc.Load())+time.Duration(counter.n.Load()-calls)*ddbCallLatency)
			res.sources[r.Source]++
		}
		turn := time.Minute + time.Duration(rng.Float64()*float64(4*time.Minute))
		heap.Push(q, simEvent{at: ev.at.Add(turn), thread: ev.thread, release: true, id: r.Record.SandboxID})
	}
	// The window's end: everything is destroyed at once, so the last
	// intervals are metered up to it.
	clockNS.Store(end.UnixNano())
	if err := eng.SetDraining(context.Background(), true); err != nil {
		b.Fatal(err)
	}
	for range 3 {
		if _, err := eng.Reconcile(context.Background()); err != nil {
			b.Fatalf("final reconcile: %v", err)
		}
	}
	threadHours := 0.0 // from each thread's first acquire to the window's end
	for _, f := range first {
		if !f.IsZero() {
			threadHours += end.Sub(f).Hours()
		}
	}
	res.runningPerThreadHour = usage.running / threadHours
	res.pausedPerThreadHour = usage.paused / threadHours
	slices.Sort(latencies)
	if n := len(latencies); n > 0 {
		res.p50, res.p99 = latencies[n/2], latencies[min(n-1, n*99/100)]
	}
	return res
}

// BenchmarkPauseParking reports, per pause-parking setting, running and
// paused sandbox-seconds per thread-hour and a returning thread's acquire
// latency p50 and p99 (modeled provider time plus ddbCallLatency per
// DynamoDB call), for the workload of workloadFromEnv.
func BenchmarkPauseParking(b *testing.B) {
	w := workloadFromEnv(b)
	for _, mode := range []struct {
		name  string
		after time.Duration
	}{
		{"pause=off", core.PauseNever},
		{"pause=after-300s", 300 * time.Second},
		{"pause=at-release", 0},
	} {
		b.Run(mode.name, func(b *testing.B) {
			var r parkingResult
			for b.Loop() {
				r = replay(b, w, mode.after)
			}
			b.ReportMetric(r.runningPerThreadHour, "running-s/thread-h")
			b.ReportMetric(r.pausedPerThreadHour, "paused-s/thread-h")
			b.ReportMetric(float64(r.p50.Milliseconds()), "reclaim-p50-ms")
			b.ReportMetric(float64(r.p99.Milliseconds()), "reclaim-p99-ms")
			b.Logf("%s: %d threads, %.1f h: sources of returning acquires %v", mode.name, w.Threads, w.Hours, r.sources)
		})
	}
}
