package core_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/core/coretest"
	"github.com/sandbox-broker/sandbox-broker/internal/memstore"
)

// TestMetricsPassThrough: Metrics hands on the provider's figures for the
// tenant's own sandbox, handed out or parked, with the asked interval;
// another tenant's sandbox is ErrNotFound without a provider call; a
// provider declaring no Metrics is ErrNotOffered; a provider failure is
// an outage, its "gone" stays ErrSandboxGone.
func TestMetricsPassThrough(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	figures := []core.SandboxMetric{{Timestamp: at, CPUCount: 2, MemTotal: 1 << 30}}
	var asked []string
	var provErr error
	fp, store := coretest.NewFakeProvider(), memstore.New()
	metered := func(declare bool) *core.Engine {
		caps := fp.Capabilities()
		if declare {
			caps.Metrics = func(_ context.Context, id string, start, end time.Time) ([]core.SandboxMetric, error) {
				asked = append(asked, fmt.Sprintf("%s %d %d", id, start.Unix(), end.Unix()))
				return figures, provErr
			}
		}
		eng, err := core.New(core.DefaultSettings(), store, capsProvider{Provider: fp, caps: caps}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	ctx := context.Background()
	eng := metered(true)
	res, err := eng.Acquire(ctx, key("m1"))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Record.SandboxID
	start, end := at.Add(-time.Minute), at
	got, err := eng.Metrics(ctx, "acme", id, start, end)
	if err != nil || len(got) != 1 || got[0] != figures[0] {
		t.Fatalf("own sandbox: %v, %v; want the provider's figures", got, err)
	}
	if want := fmt.Sprintf("%s %d %d", id, start.Unix(), end.Unix()); len(asked) != 1 || asked[0] != want {
		t.Fatalf("provider asked %q, want [%s]", asked, want)
	}
	if _, err := eng.Metrics(ctx, "other", id, start, end); !errors.Is(err, core.ErrNotFound) || len(asked) != 1 {
		t.Errorf("another tenant's: %v (provider asked %d times), want ErrNotFound and no call", err, len(asked))
	}
	if _, err := eng.Release(ctx, "acme", id); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Metrics(ctx, "acme", id, time.Time{}, time.Time{}); err != nil {
		t.Errorf("parked sandbox: %v, want its figures", err)
	}
	provErr = fmt.Errorf("read: %w", core.ErrSandboxGone)
	if _, err := eng.Metrics(ctx, "acme", id, start, end); !errors.Is(err, core.ErrSandboxGone) {
		t.Errorf("provider says gone: %v, want ErrSandboxGone", err)
	}
	provErr = &core.ProviderError{Op: "metrics", StatusCode: 500, Ambiguous: true}
	if _, err := eng.Metrics(ctx, "acme", id, start, end); !errors.Is(err, core.ErrProviderUnavailable) {
		t.Errorf("provider fails: %v, want ErrProviderUnavailable", err)
	}
	if _, err := metered(false).Metrics(ctx, "acme", id, start, end); !errors.Is(err, core.ErrNotOffered) {
		t.Errorf("no Metrics declared: %v, want ErrNotOffered", err)
	}
}
