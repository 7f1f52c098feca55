package core_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// emfMeta is the "_aws" member of an EMF record.
type emfMeta struct {
	Timestamp         int64
	CloudWatchMetrics []struct {
		Namespace  string
		Dimensions [][]string
		Metrics    []struct{ Name, Unit string }
	}
}

// usageLine is one metered interval as logged (an EMF record with the
// dimensions Deployment and Tenant).
type usageLine struct {
	AWS        emfMeta `json:"_aws"`
	Deployment string
	Tenant     string
	Running    *float64  `json:"SandboxRunningSeconds"`
	Paused     *float64  `json:"SandboxPausedSeconds"`
	SandboxID  string    `json:"sandbox_id"`
	State      string    `json:"state"`
	From       time.Time `json:"from"`
	To         time.Time `json:"to"`
	Final      bool      `json:"final"`
}

// usageLines parses the usage lines of a JSON log, checking each is a
// well-formed EMF record of one usage metric under [Deployment Tenant].
func usageLines(t *testing.T, logs []byte) []usageLine {
	t.Helper()
	return usageLinesUnder(t, logs, "[[Deployment Tenant]]")
}

// usageLinesUnder is usageLines with the dimension sets dims (as
// fmt.Sprint prints them).
func usageLinesUnder(t *testing.T, logs []byte, dims string) []usageLine {
	t.Helper()
	var out []usageLine
	sc := bufio.NewScanner(bytes.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if !bytes.Contains(sc.Bytes(), []byte(`"msg":"usage"`)) {
			continue
		}
		var l usageLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("usage line %s: %v", sc.Bytes(), err)
		}
		d := l.AWS.CloudWatchMetrics
		if len(d) != 1 || d[0].Namespace != core.MetricsNamespace || fmt.Sprint(d[0].Dimensions) != dims ||
			len(d[0].Metrics) != 1 || d[0].Metrics[0].Unit != "Seconds" || (l.Running == nil) == (l.Paused == nil) {
			t.Fatalf("usage line %s: want one Seconds metric under %s", sc.Bytes(), dims)
		}
		out = append(out, l)
	}
	return out
}

// meteredLife checks that each sandbox's metered intervals add up to its
// metered life, from its create (the one interval in state creating) to
// its free (the one final interval), so none was lost or counted twice,
// and returns each sandbox's running seconds.
func meteredLife(t *testing.T, lines []usageLine) map[string]float64 {
	t.Helper()
	type acc struct {
		sum, running   float64
		start, end     time.Time
		starts, finals int
		tenants        map[string]bool
	}
	by := map[string]*acc{}
	for _, l := range lines {
		a := by[l.SandboxID]
		if a == nil {
			a = &acc{}
			by[l.SandboxID] = a
		}
		if l.Running != nil {
			a.sum += *l.Running
			a.running += *l.Running
		} else {
			a.sum += *l.Paused
		}
		if l.State == string(core.StateCreating) {
			a.starts++
			a.start = l.From
		}
		if l.Final {
			a.finals++
			a.end = l.To
		}
	}
	out := map[string]float64{}
	for id, a := range by {
		if a.starts != 1 || a.finals != 1 {
			t.Errorf("sandbox %s: %d create intervals, %d final ones; want one of each", id, a.starts, a.finals)
			continue
		}
		if life := a.end.Sub(a.start).Seconds(); math.Abs(a.sum-life) > 1e-6 {
			t.Errorf("sandbox %s: intervals add up to %.3f s, its metered life is %.3f s", id, a.sum, life)
		}
		out[id] = a.running
	}
	return out
}

// TestUsageMeteringCoversLifetime: a sandbox's metered running seconds,
// across create, reuse, release, reclaim and idle expiry, add up to its
// life from its create to its destruction, in intervals that never
// overlap, each under the tenant's dimension.
func TestUsageMeteringCoversLifetime(t *testing.T) {
	var logs bytes.Buffer
	events := &eventLog{}
	h := newHarness(t, func(s *core.Settings) { s.IdleTimeout = time.Minute },
		core.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))), core.WithEventSink(events))
	ctx := context.Background()
	began := h.clock.now()
	rec := h.acquire(t, key("t1"), core.SourceCreated)
	for _, step := range []func(){
		func() { h.acquire(t, key("t1"), core.SourceReused) },
		func() {
			if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
				t.Fatalf("Release: %v", err)
			}
		},
		func() { h.acquire(t, key("t1"), core.SourceReclaimed) },
		func() {
			if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
				t.Fatalf("Release: %v", err)
			}
		},
	} {
		h.clock.advance(17 * time.Second)
		step()
	}
	h.clock.advance(2 * time.Minute)
	if st, err := h.eng.Reconcile(ctx); err != nil || st.Expired != 1 {
		t.Fatalf("Reconcile = %+v, %v; want 1 expired", st, err)
	}
	lines := usageLines(t, logs.Bytes())
	for _, l := range lines {
		if l.Tenant != "acme" || l.Deployment != "test" || l.Paused != nil {
			t.Errorf("usage line %+v: want running time of tenant acme in deployment test", l)
		}
	}
	running := meteredLife(t, lines)[rec.SandboxID]
	all := events.all()
	created, destroyed := all[0], all[len(all)-1]
	if created.Time.Before(began) {
		t.Errorf("created at %s, before the acquire began (%s)", created.Time, began)
	}
	if created.Kind != core.EventCreated || destroyed.Kind != core.EventDestroyed {
		t.Fatalf("events %v: want created first, destroyed last", events.seen(rec.SandboxID))
	}
	// Metered from the create's start (after began) to the free (before
	// the destroyed event), across every advance of the clock; stores
	// keep whole milliseconds, so the start may read up to one before
	// began.
	advanced, most := (4*17*time.Second + 2*time.Minute).Seconds(), destroyed.Time.Sub(began.Truncate(time.Millisecond)).Seconds()
	if running < advanced || running > most {
		t.Errorf("metered running seconds = %.3f, want between the %.0f s the clock was advanced and the %.3f s from the first acquire to the destroyed event", running, advanced, most)
	}
	if lines[0].State != string(core.StateCreating) {
		t.Errorf("first interval's state = %q, want creating (metered from the create)", lines[0].State)
	}
}

// TestUsageMeteringUnderConcurrency: tenants' acquires and releases race
// (and capacity evicts); every sandbox's intervals still tile its life,
// from its create to its destruction, so a tenant's metered seconds are
// exactly its sandboxes' lives.
func TestUsageMeteringUnderConcurrency(t *testing.T) {
	var logs bytes.Buffer
	h := newHarness(t, func(s *core.Settings) { s.Replicas = 3; s.Policy = core.PolicyReject },
		core.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := core.ThreadKey{Tenant: fmt.Sprintf("tenant%d", w%2), User: "u", Thread: fmt.Sprintf("t%d", w%4)}
			for range 8 {
				res, err := h.eng.Acquire(ctx, k)
				if err != nil {
					continue // capacity or a peer's lease: part of the race
				}
				_, _ = h.eng.Release(ctx, k.Tenant, res.Record.SandboxID)
			}
		}()
	}
	wg.Wait()
	if err := h.eng.SetDraining(ctx, true); err != nil {
		t.Fatalf("SetDraining: %v", err)
	}
	if _, err := h.eng.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if c := h.capacity(t); c.Used != 0 {
		t.Fatalf("used = %d after draining, want 0 (every sandbox destroyed)", c.Used)
	}
	if n := len(meteredLife(t, usageLines(t, logs.Bytes()))); n < 2 {
		t.Errorf("%d sandboxes metered, want several", n)
	}
}

// TestUsageMeteringOfPoolMembers: a pool member's time before a thread
// claims it is the pool's (Tenant "(pool)"), its time after is the
// claiming tenant's, and the intervals still cover its life; an unclaimed
// member's whole life is the pool's.
func TestUsageMeteringOfPoolMembers(t *testing.T) {
	var logs bytes.Buffer
	h := newPoolHarness(t, 2, nil, core.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	ctx := context.Background()
	h.refill(t, 2)
	h.clock.advance(30 * time.Second)
	rec := h.acquire(t, key("t1"), core.SourcePool)
	h.clock.advance(20 * time.Second)
	if _, err := h.eng.Release(ctx, "acme", rec.SandboxID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := h.eng.SetDraining(ctx, true); err != nil {
		t.Fatalf("SetDraining: %v", err)
	}
	if _, err := h.eng.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if c := h.capacity(t); c.Used != 0 {
		t.Fatalf("used = %d after draining, want 0", c.Used)
	}
	lines := usageLines(t, logs.Bytes())
	running := meteredLife(t, lines)
	if len(running) < 2 {
		t.Fatalf("%d sandboxes metered, want the claimed member and at least one other", len(running))
	}
	perTenant := map[string]map[string]float64{}
	for _, l := range lines {
		if perTenant[l.SandboxID] == nil {
			perTenant[l.SandboxID] = map[string]float64{}
		}
		perTenant[l.SandboxID][l.Tenant] += *l.Running
	}
	for id, by := range perTenant {
		if id == rec.SandboxID {
			if by[core.UsagePoolTenant] < 30 || by["acme"] < 20 || len(by) != 2 {
				t.Errorf("claimed member %s metered %v, want >= 30 s for the pool, >= 20 s for acme", id, by)
			}
			continue
		}
		if len(by) != 1 || by[core.UsagePoolTenant] < 50 {
			t.Errorf("unclaimed member %s metered %v, want >= 50 s, all the pool's", id, by)
		}
	}
}

// TestTenantUsageSwitch: under TenantUsageEvents the usage lines are
// metrics of the deployment alone (no Tenant dimension, so no custom
// metrics per tenant), still naming the tenant as a plain member, and the
// lifecycle events carry the tenant's seconds; under TenantUsageMetrics
// the same cycle is metered under [Deployment Tenant].
func TestTenantUsageSwitch(t *testing.T) {
	for usage, dims := range map[core.TenantUsage]string{
		core.TenantUsageMetrics: "[[Deployment Tenant]]",
		core.TenantUsageEvents:  "[[Deployment]]",
	} {
		t.Run(string(usage), func(t *testing.T) {
			var logs bytes.Buffer
			events := &eventLog{}
			h := newHarness(t, func(s *core.Settings) { s.TenantUsage = usage },
				core.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))), core.WithEventSink(events))
			rec := h.acquire(t, key("t1"), core.SourceCreated)
			h.clock.advance(40 * time.Second)
			if _, err := h.eng.Release(context.Background(), "acme", rec.SandboxID); err != nil {
				t.Fatalf("Release: %v", err)
			}
			lines := usageLinesUnder(t, logs.Bytes(), dims)
			var metered float64
			for _, l := range lines {
				if l.Tenant != "acme" || l.Deployment != "test" || l.Running == nil {
					t.Errorf("usage line %+v: want running time naming tenant acme in deployment test", l)
					continue
				}
				metered += *l.Running
			}
			if metered < 40 {
				t.Errorf("metered %.3f s, want at least the 40 s the sandbox ran", metered)
			}
			all := events.all()
			if len(all) == 0 {
				t.Fatal("no lifecycle events")
			}
			if last := all[len(all)-1]; last.Kind != core.EventReleased || last.Tenant != "acme" || last.RunningSeconds < 40 {
				t.Errorf("last event %+v: want released, tenant acme, at least 40 running seconds", last)
			}
		})
	}
}
