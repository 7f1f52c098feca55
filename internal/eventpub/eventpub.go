// Package eventpub publishes the broker's lifecycle events (core.Event)
// to Amazon EventBridge: source Source, detail-type DetailType(kind),
// detail the event's JSON, on one event bus.
package eventpub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Source is the source of every event the broker publishes.
const Source = "sandbox-broker"

// EventBridge's PutEvents limits (Amazon EventBridge API reference).
const (
	// MaxEntries is the most entries one PutEvents call takes.
	MaxEntries = 10
	// MaxEntryBytes is the largest entry PutEvents accepts, counted as
	// EventBridge counts it (entrySize).
	MaxEntryBytes = 256 * 1024
)

// DetailType is the detail-type of events of kind: "sandbox." + kind
// (sandbox.created, sandbox.released, ...).
func DetailType(kind core.EventKind) string { return "sandbox." + string(kind) }

// API is the part of the EventBridge client the publisher calls.
type API interface {
	PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, opts ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

var _ API = (*eventbridge.Client)(nil)

// Publisher publishes lifecycle events to one event bus.
type Publisher struct {
	api API
	bus string
}

var _ core.EventSink = (*Publisher)(nil)

// New returns a publisher to bus (a name or an ARN; "" is the account's
// default bus).
func New(api API, bus string) *Publisher {
	return &Publisher{api: api, bus: bus}
}

// ErrTooLarge: an event's entry is larger than MaxEntryBytes (never sent).
var ErrTooLarge = errors.New("event entry larger than 256 KB")

// Publish implements core.EventSink: one PutEvents call, and once more for
// the entries EventBridge reported failed (FailedEntryCount), within ctx.
func (p *Publisher) Publish(ctx context.Context, ev core.Event) error {
	return p.PublishAll(ctx, []core.Event{ev})
}

// PublishAll publishes evs in calls of at most MaxEntries. Entries that
// EventBridge reports failed are sent again once; the error then names how
// many of evs were not published and the first failure's code.
func (p *Publisher) PublishAll(ctx context.Context, evs []core.Event) error {
	var entries []types.PutEventsRequestEntry
	var errs []error
	for _, ev := range evs {
		e, err := p.entry(ev)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		entries = append(entries, e)
	}
	for start := 0; start < len(entries); start += MaxEntries {
		batch := entries[start:min(start+MaxEntries, len(entries))]
		if err := p.put(ctx, batch); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// entry is ev as a PutEvents entry.
func (p *Publisher) entry(ev core.Event) (types.PutEventsRequestEntry, error) {
	detail, err := json.Marshal(ev)
	if err != nil {
		return types.PutEventsRequestEntry{}, fmt.Errorf("event detail: %w", err)
	}
	e := types.PutEventsRequestEntry{
		Source:     aws.String(Source),
		DetailType: aws.String(DetailType(ev.Kind)),
		Detail:     aws.String(string(detail)),
	}
	if p.bus != "" {
		e.EventBusName = aws.String(p.bus)
	}
	if !ev.Time.IsZero() {
		e.Time = aws.Time(ev.Time)
	}
	if n := entrySize(e); n > MaxEntryBytes {
		return types.PutEventsRequestEntry{}, fmt.Errorf("%s event of sandbox %s: %d bytes: %w", ev.Kind, ev.SandboxID, n, ErrTooLarge)
	}
	return e, nil
}

// entrySize is e's size as EventBridge counts it against MaxEntryBytes:
// 14 bytes for a time, the UTF-8 bytes of source, detail-type, detail and
// each resource.
func entrySize(e types.PutEventsRequestEntry) int {
	n := 0
	if e.Time != nil {
		n += 14
	}
	n += len(aws.ToString(e.Source)) + len(aws.ToString(e.DetailType)) + len(aws.ToString(e.Detail))
	for _, r := range e.Resources {
		n += len(r)
	}
	return n
}

// put sends one batch; failed entries are sent once more.
func (p *Publisher) put(ctx context.Context, batch []types.PutEventsRequestEntry) error {
	failed, err := p.putOnce(ctx, batch)
	if err != nil {
		return err
	}
	if len(failed) == 0 {
		return nil
	}
	retry := make([]types.PutEventsRequestEntry, len(failed))
	for i, f := range failed {
		retry[i] = f.entry
	}
	again, err := p.putOnce(ctx, retry)
	if err != nil {
		return fmt.Errorf("%d of %d events failed (%s), and their retry: %w", len(failed), len(batch), failed[0].code, err)
	}
	if len(again) > 0 {
		codes := make([]string, len(again))
		for i, f := range again {
			codes[i] = f.code
		}
		return fmt.Errorf("%d of %d events not published: %s", len(again), len(batch), strings.Join(codes, ", "))
	}
	return nil
}

// failure is an entry EventBridge refused, with its error code.
type failure struct {
	entry types.PutEventsRequestEntry
	code  string
}

// putOnce makes one PutEvents call and returns the entries it reported
// failed (the reply's Entries match the request's, in order).
func (p *Publisher) putOnce(ctx context.Context, batch []types.PutEventsRequestEntry) ([]failure, error) {
	out, err := p.api.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: batch})
	if err != nil {
		return nil, fmt.Errorf("put events: %w", err)
	}
	if out.FailedEntryCount == 0 {
		return nil, nil
	}
	var failed []failure
	for i, r := range out.Entries {
		if i < len(batch) && r.ErrorCode != nil {
			failed = append(failed, failure{entry: batch[i], code: aws.ToString(r.ErrorCode) + ": " + aws.ToString(r.ErrorMessage)})
		}
	}
	if len(failed) == 0 || len(out.Entries) != len(batch) {
		// A reply that counts failures but does not say which: every entry
		// is in doubt; none is sent twice blindly.
		return nil, fmt.Errorf("put events: %d entries failed, reply lists %d of %d entries", out.FailedEntryCount, len(out.Entries), len(batch))
	}
	return failed, nil
}
