package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// queueFixture is a store on a fresh table with helpers to fill the
// deployment, queue waiters and read the buckets' raw counts.
type queueFixture struct {
	t      *testing.T
	s      *ddbstore.Store
	client *dynamodb.Client
	table  string
	limit  int
	n      int
}

func newQueueFixture(t *testing.T, limit int) *queueFixture {
	client, table := newTable(t)
	return &queueFixture{t: t, s: ddbstore.New(client, table, "test"), client: client, table: table, limit: limit}
}

// fill holds n more slots with active records and returns them.
func (f *queueFixture) fill(n int) []core.Record {
	f.t.Helper()
	var recs []core.Record
	for range n {
		f.n++
		key := core.ThreadKey{Tenant: "busy", User: "u", Thread: fmt.Sprint("t", f.n)}
		id := fmt.Sprint("sb", f.n)
		token := "res-" + id
		if err := f.s.Reserve(context.Background(), core.Reservation{Token: token, ThreadKey: key, Limit: f.limit, Now: t0,
			ExpiresAt: t0.Add(time.Minute)}); err != nil {
			f.t.Fatalf("Reserve %s: %v", id, err)
		}
		rec, err := f.s.Finalize(context.Background(), token, core.Record{SandboxID: id, ThreadKey: key, State: core.StateActive,
			Backend: "e2b", CreatedAt: t0, UpdatedAt: t0})
		if err != nil {
			f.t.Fatalf("Finalize %s: %v", id, err)
		}
		recs = append(recs, rec)
	}
	return recs
}

// free frees rec's slot (no dispatch: the engine runs it) and returns
// its bucket.
func (f *queueFixture) free(rec core.Record) core.SlotRef {
	f.t.Helper()
	if err := f.s.Free(context.Background(), rec, t0); err != nil {
		f.t.Fatalf("Free %s: %v", rec.SandboxID, err)
	}
	return rec.Slot.Ref
}

// enter queues a ticket for tenant arriving at at, waiting a minute.
func (f *queueFixture) enter(tenant, id string, at time.Time) core.Ticket {
	f.t.Helper()
	tk, err := f.s.EnterWait(context.Background(), core.Waiter{Tenant: tenant, Ticket: id, Max: 10, Now: at, Until: at.Add(time.Minute)})
	if err != nil {
		f.t.Fatalf("EnterWait %s/%s: %v", tenant, id, err)
	}
	return tk
}

func (f *queueFixture) dispatch(d core.Dispatch) core.DispatchResult {
	f.t.Helper()
	d.Limit = f.limit
	if d.GrantFor == 0 {
		d.GrantFor = 5 * time.Second
	}
	res, err := f.s.Dispatch(context.Background(), d)
	if err != nil {
		f.t.Fatalf("Dispatch: %v", err)
	}
	return res
}

func (f *queueFixture) poll(tk core.Ticket) core.TicketState {
	f.t.Helper()
	ts, err := f.s.PollTicket(context.Background(), tk)
	if err != nil {
		f.t.Fatalf("PollTicket %s: %v", tk.ID, err)
	}
	return ts
}

// takeAndFree takes the slot granted to tk with a reservation, then
// frees the reservation (no dispatch), and returns the slot's bucket.
func (f *queueFixture) takeAndFree(tk core.Ticket, now time.Time) core.SlotRef {
	f.t.Helper()
	ts := f.poll(tk)
	key := core.ThreadKey{Tenant: tk.Tenant, User: "u", Thread: tk.ID}
	if err := f.s.Reserve(context.Background(), core.Reservation{Token: "res-" + tk.ID, ThreadKey: key, Limit: f.limit,
		Now: now, ExpiresAt: now.Add(time.Minute), Grant: &ts.Grant}); err != nil {
		f.t.Fatalf("take %s's grant: %v", tk.ID, err)
	}
	if err := f.s.FreeReservation(context.Background(), "res-"+tk.ID, key); err != nil {
		f.t.Fatalf("free %s's reservation: %v", tk.ID, err)
	}
	return ts.Grant.Slot
}

// repairsNothing runs the counter repair passes times and fails the test
// for each pass that corrects anything (why says what should have been
// counted).
func (f *queueFixture) repairsNothing(passes int, why string) {
	f.t.Helper()
	for i := range passes {
		rep, err := f.s.RepairCounters(context.Background(), f.limit)
		if err != nil {
			f.t.Fatalf("repair %d: %v", i, err)
		}
		if rep.Slots != 0 || rep.Counters != 0 {
			f.t.Errorf("repair %d: slots %+d, counters %d; want %snothing repaired", i, rep.Slots, rep.Counters, why)
		}
	}
}

// counts sums the buckets' raw used and granted counts.
func (f *queueFixture) counts() (used, granted int) {
	used, granted, _ = f.bucketSums()
	return used, granted
}

// bucketSums sums the buckets' raw used and granted counts and their
// revisions.
func (f *queueFixture) bucketSums() (used, granted, revision int) {
	f.t.Helper()
	out, err := f.client.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(f.table), ConsistentRead: aws.Bool(true),
		FilterExpression:          aws.String("begins_with(pk, :cap)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":cap": &types.AttributeValueMemberS{Value: "CAP#test"}}})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, it := range out.Items {
		for attr, sum := range map[string]*int{"used": &used, "granted": &granted, "revision": &revision} {
			if n, ok := it[attr].(*types.AttributeValueMemberN); ok {
				v, _ := strconv.Atoi(n.Value)
				*sum += v
			}
		}
	}
	return used, granted, revision
}

func ids(ts []core.Ticket) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

// TestEnterWaitRounds: a tenant's first waiter joins the round of the
// queue's first live ticket, each further one it holds lands one round
// after its latest; the queue reads back in (round, arrival) order.
func TestEnterWaitRounds(t *testing.T) {
	t.Parallel()
	f := newQueueFixture(t, 1)
	recs := f.fill(1)
	steps := []struct {
		tenant, id string
		leave      string // instead: the ticket that leaves
		want       int
	}{
		{tenant: "a", id: "a1", want: 0},
		{tenant: "a", id: "a2", want: 1},
		{tenant: "a", id: "a3", want: 2},
		{tenant: "b", id: "b1", want: 0}, // a new tenant: the head's round
		{tenant: "c", id: "c1", want: 0},
		{tenant: "b", id: "b2", want: 1},
		{leave: "a1"},
		{leave: "b1"},
		{leave: "c1"},
		{tenant: "d", id: "d1", want: 1}, // round 0 served: the head is a2's round
		{tenant: "c", id: "c2", want: 1}, // c holds no ticket any more
		{tenant: "a", id: "a4", want: 3},
	}
	held := map[string]core.Ticket{}
	for i, st := range steps {
		at := t0.Add(time.Duration(i) * time.Second)
		if st.leave != "" {
			if err := f.s.LeaveWait(context.Background(), held[st.leave], at, time.Second); err != nil {
				t.Fatalf("step %d: leave %s: %v", i, st.leave, err)
			}
			delete(held, st.leave)
			continue
		}
		tk := f.enter(st.tenant, st.id, at)
		if tk.Round != st.want {
			t.Errorf("step %d: %s's round = %d, want %d", i, st.id, tk.Round, st.want)
		}
		held[st.id] = tk
	}
	// The queue's order: one slot, freed again by each waiter served.
	now := t0.Add(30 * time.Second)
	res := f.dispatch(core.Dispatch{Now: now, Freed: core.NoSlotRef, Scan: true})
	if len(res.Granted) != 0 || res.Head != "a2" {
		t.Fatalf("full deployment: granted %v, head %q; want none and a2", ids(res.Granted), res.Head)
	}
	bucket := f.free(recs[0])
	want := []string{"a2", "b2", "d1", "c2", "a3", "a4"}
	var got []string
	for range want {
		res := f.dispatch(core.Dispatch{Now: now, Freed: bucket})
		if len(res.Granted) != 1 {
			t.Fatalf("after %v: granted %v, want one", got, ids(res.Granted))
		}
		tk := held[res.Granted[0].ID]
		got = append(got, tk.ID)
		bucket = f.takeAndFree(tk, now)
	}
	if !slices.Equal(got, want) {
		t.Errorf("service order %v, want %v", got, want)
	}
}

// TestDispatchGrantsInFairOrderAndTheGrantIsTaken: a freed slot is
// granted to the first waiting ticket (held in trust: used unchanged), the
// waiter's reservation takes it over (ticket and place gone, used still
// the same), and the next free goes to the next ticket in order.
func TestDispatchGrantsInFairOrderAndTheGrantIsTaken(t *testing.T) {
	t.Parallel()
	f := newQueueFixture(t, 2)
	recs := f.fill(2)
	a1 := f.enter("a", "a1", t0)
	a2 := f.enter("a", "a2", t0.Add(time.Second))
	b1 := f.enter("b", "b1", t0.Add(2*time.Second))
	now := t0.Add(3 * time.Second)

	b := f.free(recs[0])
	res := f.dispatch(core.Dispatch{Now: now, Freed: b})
	if got := ids(res.Granted); !slices.Equal(got, []string{"a1"}) || res.Head != "b1" {
		t.Fatalf("granted %v, head %q; want [a1] and b1 (round 0 before a's second)", got, res.Head)
	}
	if used, granted := f.counts(); used != 2 || granted != 1 {
		t.Errorf("used %d granted %d, want 2 and 1 (the freed slot held in trust)", used, granted)
	}
	ts := f.poll(a1)
	if !ts.Granted || ts.Grant.Slot != b {
		t.Fatalf("a1 = %+v, want granted in bucket %d", ts, b)
	}
	// Nobody else can take the trusted slot.
	var ce *core.CapacityError
	if err := f.s.Reserve(context.Background(), core.Reservation{Token: "res-x", ThreadKey: core.ThreadKey{Tenant: "x", User: "u", Thread: "t"},
		Limit: f.limit, Now: now, ExpiresAt: now.Add(time.Minute)}); !errors.As(err, &ce) || ce.Reason != api.RefusalCapacity {
		t.Errorf("a reservation without the grant: %v, want a capacity refusal", err)
	}
	key := core.ThreadKey{Tenant: "a", User: "u", Thread: "a1"}
	if err := f.s.Reserve(context.Background(), core.Reservation{Token: "res-a1", ThreadKey: key, Limit: f.limit, Now: now,
		ExpiresAt: now.Add(time.Minute), Grant: &ts.Grant}); err != nil {
		t.Fatalf("Reserve with a1's grant: %v", err)
	}
	if used, granted := f.counts(); used != 2 || granted != 0 {
		t.Errorf("after the take: used %d granted %d, want 2 and 0", used, granted)
	}
	if ts := f.poll(a1); !ts.Gone {
		t.Errorf("a1 after the take = %+v, want gone", ts)
	}
	// Taking it twice fails, and changes nothing.
	if err := f.s.Reserve(context.Background(), core.Reservation{Token: "res-a1b", ThreadKey: core.ThreadKey{Tenant: "a", User: "u", Thread: "a1b"},
		Limit: f.limit, Now: now, ExpiresAt: now.Add(time.Minute), Grant: &ts.Grant}); !errors.Is(err, core.ErrGrantLost) {
		t.Errorf("second take of a1's grant: %v, want ErrGrantLost", err)
	}
	// a's place was given back with the take: a may queue 10 again.
	res = f.dispatch(core.Dispatch{Now: now, Freed: f.free(recs[1])})
	if got := ids(res.Granted); !slices.Equal(got, []string{"b1"}) {
		t.Errorf("second free granted %v, want [b1]", got)
	}
	if ts := f.poll(a2); ts.Granted || ts.Gone {
		t.Errorf("a2 = %+v, want still waiting", ts)
	}
	_ = b1
}

// TestDispatchSkipsLapsedTickets: a waiting ticket whose waiter's wait
// ended is removed, and the slot goes to the next.
func TestDispatchSkipsLapsedTickets(t *testing.T) {
	t.Parallel()
	f := newQueueFixture(t, 1)
	recs := f.fill(1)
	dead, err := f.s.EnterWait(context.Background(), core.Waiter{Tenant: "a", Ticket: "dead", Max: 10, Now: t0, Until: t0.Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	live := f.enter("b", "live", t0.Add(500*time.Millisecond))
	res := f.dispatch(core.Dispatch{Now: t0.Add(2 * time.Second), Freed: f.free(recs[0])})
	if got := ids(res.Granted); !slices.Equal(got, []string{"live"}) || res.Cleaned != 1 {
		t.Fatalf("granted %v, cleaned %d; want [live] and 1", got, res.Cleaned)
	}
	if ts := f.poll(dead); !ts.Gone {
		t.Errorf("lapsed ticket = %+v, want removed", ts)
	}
	if ts := f.poll(live); !ts.Granted {
		t.Errorf("live ticket = %+v, want granted", ts)
	}
}

// TestLapsedGrantPassesOnOrFrees: a grant whose waiter never took it
// passes to the next live waiting ticket (no bucket change) and, when
// none waits, its slot is freed; a waiter that leaves holding a grant
// passes it on the same way.
func TestLapsedGrantPassesOnOrFrees(t *testing.T) {
	t.Parallel()
	f := newQueueFixture(t, 1)
	recs := f.fill(1)
	a := f.enter("a", "a", t0)
	b := f.enter("b", "b", t0.Add(time.Millisecond))
	c := f.enter("c", "c", t0.Add(2*time.Millisecond))
	now := t0.Add(time.Second)
	res := f.dispatch(core.Dispatch{Now: now, Freed: f.free(recs[0])})
	if got := ids(res.Granted); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("granted %v, want [a]", got)
	}
	// a's invocation died: its grant lapses and passes to b. The slot
	// only changes holder, but the bucket's revision moves (the counter
	// repair counts grants only while it holds still).
	later := now.Add(6 * time.Second)
	_, _, rev := f.bucketSums()
	res = f.dispatch(core.Dispatch{Now: later, Freed: core.NoSlotRef})
	if got := ids(res.Granted); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("after a's grant lapsed: granted %v, want [b]", got)
	}
	if _, _, after := f.bucketSums(); after <= rev {
		t.Errorf("the buckets' revisions sum to %d after the grant passed on, want more than %d", after, rev)
	}
	if used, granted := f.counts(); used != 1 || granted != 1 {
		t.Errorf("used %d granted %d, want 1 and 1 (the same slot, passed on)", used, granted)
	}
	if ts := f.poll(a); !ts.Gone {
		t.Errorf("a = %+v, want gone", ts)
	}
	// b leaves (timed out, say) holding it: c gets it.
	_, _, rev = f.bucketSums()
	if err := f.s.LeaveWait(context.Background(), b, later, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if ts := f.poll(c); !ts.Granted {
		t.Fatalf("c after b left = %+v, want granted", ts)
	}
	if _, _, after := f.bucketSums(); after <= rev {
		t.Errorf("the buckets' revisions sum to %d after b left, want more than %d", after, rev)
	}
	// c's grant lapses with nobody waiting: the slot is freed.
	res = f.dispatch(core.Dispatch{Now: later.Add(6 * time.Second), Freed: core.NoSlotRef})
	if len(res.Granted) != 0 || res.Cleaned != 1 {
		t.Errorf("granted %v, cleaned %d; want none and 1", ids(res.Granted), res.Cleaned)
	}
	if used, granted := f.counts(); used != 0 || granted != 0 {
		t.Errorf("used %d granted %d, want 0 and 0", used, granted)
	}
}

// TestConcurrentDispatchersNeverOvergrant: many dispatchers at once grant
// exactly the free slots, each to a different ticket, the first in order.
func TestConcurrentDispatchersNeverOvergrant(t *testing.T) {
	t.Parallel()
	const limit, freed, waiters, dispatchers = 6, 3, 10, 12
	f := newQueueFixture(t, limit)
	recs := f.fill(limit)
	var tickets []core.Ticket
	for i := range waiters {
		tickets = append(tickets, f.enter(fmt.Sprint("t", i), fmt.Sprintf("w%02d", i), t0.Add(time.Duration(i)*time.Millisecond)))
	}
	var buckets []core.SlotRef
	for _, r := range recs[:freed] {
		buckets = append(buckets, f.free(r))
	}
	now := t0.Add(time.Second)
	var ds []core.Dispatch
	for i := range dispatchers {
		ds = append(ds, core.Dispatch{Now: now, Limit: limit, Freed: buckets[i%freed], Scan: i%2 == 0, GrantFor: 5 * time.Second})
	}
	granted := dispatchAtOnce(t, f, ds)
	if want := []string{"w00", "w01", "w02"}; !slices.Equal(granted, want) {
		t.Errorf("granted %v, want %v (each once, the first three)", granted, want)
	}
	for i, tk := range tickets {
		if ts := f.poll(tk); ts.Granted != (i < freed) {
			t.Errorf("ticket %s granted = %v, want %v", tk.ID, ts.Granted, i < freed)
		}
	}
	if used, g := f.counts(); used != limit || g != freed {
		t.Errorf("used %d granted %d, want %d and %d", used, g, limit, freed)
	}
}

// TestFreesRacingOnTheHeadGrantEveryFreedSlot: the dispatches of frees
// that end at once (with the head's own turn among them, or not) race on
// the same head ticket; a dispatch that finds it granted by a peer must
// keep its slot for the next tickets, past the tickets a read returns
// when more slots were freed than that (the tickets behind them): every
// freed slot ends granted, each to a different ticket, the first in order.
func TestFreesRacingOnTheHeadGrantEveryFreedSlot(t *testing.T) {
	t.Parallel()
	const rounds = 5
	tests := []struct {
		name                  string
		limit, freed, waiters int
		withTurn              bool
		scan                  int // the tickets a read returns (0: the store's own)
	}{
		{name: "frees", limit: 8, freed: 5, waiters: 12},
		{name: "frees and the head's turn", limit: 8, freed: 5, waiters: 12, withTurn: true},
		{name: "more frees than a read returns", limit: 16, freed: 12, waiters: 20, scan: 8},
		{name: "more frees than two reads return", limit: 24, freed: 20, waiters: 28, scan: 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for round := range rounds {
				f := newQueueFixture(t, tc.limit)
				if tc.scan > 0 {
					ddbstore.SetQueueScan(f.s, tc.scan)
				}
				recs := f.fill(tc.limit)
				var tickets []core.Ticket
				var want []string
				for i := range tc.waiters {
					id := fmt.Sprintf("w%02d", i)
					tickets = append(tickets, f.enter(fmt.Sprint("t", i), id, t0.Add(time.Duration(i)*time.Millisecond)))
					if i < tc.freed {
						want = append(want, id)
					}
				}
				now := t0.Add(time.Second)
				var ds []core.Dispatch
				for _, r := range recs[:tc.freed] {
					ds = append(ds, core.Dispatch{Now: now, Limit: tc.limit, Freed: f.free(r), GrantFor: 5 * time.Second})
				}
				if tc.withTurn {
					ds = append(ds, core.Dispatch{Now: now, Limit: tc.limit, Freed: core.NoSlotRef, Self: tickets[0].ID, GrantFor: 5 * time.Second})
				}
				granted := dispatchAtOnce(t, f, ds)
				if !slices.Equal(granted, want) {
					t.Fatalf("round %d: granted %v, want %v (each once, the first %d)", round, granted, want, tc.freed)
				}
				if used, g := f.counts(); used != tc.limit || g != tc.freed {
					t.Fatalf("round %d: used %d granted %d, want %d and %d", round, used, g, tc.limit, tc.freed)
				}
			}
		})
	}
}

// dispatchAtOnce runs the dispatches ds concurrently and returns the
// tickets they granted, sorted.
func dispatchAtOnce(t *testing.T, f *queueFixture, ds []core.Dispatch) []string {
	t.Helper()
	var mu sync.Mutex
	var granted []string
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, d := range ds {
		wg.Go(func() {
			<-start
			res, err := f.s.Dispatch(context.Background(), d)
			if err != nil {
				t.Errorf("dispatcher %d: %v", i, err)
				return
			}
			mu.Lock()
			granted = append(granted, ids(res.Granted)...)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	slices.Sort(granted)
	return granted
}

// TestCounterRepairKeepsTrustedSlots: slots held in trust for granted
// tickets are in no index; the repair counts them from the queue and
// leaves them (and the granted count) alone.
func TestCounterRepairKeepsTrustedSlots(t *testing.T) {
	t.Parallel()
	f := newQueueFixture(t, 3)
	recs := f.fill(3)
	f.enter("a", "a", t0)
	f.enter("b", "b", t0.Add(time.Millisecond))
	now := t0.Add(time.Second)
	for _, r := range recs[:2] {
		f.dispatch(core.Dispatch{Now: now, Freed: f.free(r)})
	}
	if used, granted := f.counts(); used != 3 || granted != 2 {
		t.Fatalf("before repair: used %d granted %d, want 3 and 2", used, granted)
	}
	f.repairsNothing(3, "")
	if used, granted := f.counts(); used != 3 || granted != 2 {
		t.Errorf("after repair: used %d granted %d, want 3 and 2", used, granted)
	}
}

// raceDB passes every call to DynamoDB Local, running before and after
// around each grant transaction (two updates: a capacity bucket and a
// wait queue ticket), and answering the strongly consistent GetItems of a
// ticket with probe's error when it gives one.
type raceDB struct {
	ddbstore.API
	before, after func()
	probe         func(ctx context.Context) error
}

func (r *raceDB) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	grant := len(in.TransactItems) == 2 && in.TransactItems[0].Update != nil && in.TransactItems[1].Update != nil &&
		strings.HasPrefix(pkOfKey(in.TransactItems[0].Update.Key), "CAP#") && strings.HasPrefix(pkOfKey(in.TransactItems[1].Update.Key), "WQ#")
	if grant && r.before != nil {
		r.before()
	}
	out, err := r.API.TransactWriteItems(ctx, in, opts...)
	if grant && r.after != nil {
		r.after()
	}
	return out, err
}

func (r *raceDB) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if r.probe != nil && aws.ToBool(in.ConsistentRead) && strings.HasPrefix(pkOfKey(in.Key), "WQ#") {
		if err := r.probe(ctx); err != nil {
			return nil, err
		}
	}
	return r.API.GetItem(ctx, in, opts...)
}

// pkOfKey is an item key's partition key.
func pkOfKey(key map[string]types.AttributeValue) string {
	pk, _ := key[ddbstore.AttrPK].(*types.AttributeValueMemberS)
	if pk == nil {
		return ""
	}
	return pk.Value
}

// TestDispatchCutAfterLosingTheHeadLeavesNothingHalfDone: a free's
// dispatch loses the head ticket to a peer's free, then fails while it
// walks on (the read of the next ticket fails or stalls, or the call
// ends during the pause before that read). It wrote nothing for the next
// ticket, so its slot is simply free: the next ticket still waits,
// nothing was granted twice, the counters need no repair, and the next
// dispatch grants the freed slot to the next ticket.
func TestDispatchCutAfterLosingTheHeadLeavesNothingHalfDone(t *testing.T) {
	// Not parallel: one short deadline covers a peer's whole dispatch.
	errRead := &smithy.GenericAPIError{Code: "InternalServerError", Message: "injected"}
	tests := []struct {
		name  string
		cut   bool                            // the call ends once the head is lost
		probe func(ctx context.Context) error // the read of the next ticket
	}{
		{name: "the read fails", probe: func(context.Context) error { return errRead }},
		{name: "the read stalls", probe: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
		{name: "cut during the pause", cut: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const limit = 2
			f := newQueueFixture(t, limit)
			recs := f.fill(limit)
			w0 := f.enter("t0", "w0", t0)
			w1 := f.enter("t1", "w1", t0.Add(time.Millisecond))
			now := t0.Add(time.Second)
			mine, peer := f.free(recs[0]), f.free(recs[1])
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var grants int
			db := &raceDB{API: f.client, probe: tc.probe}
			db.before = func() {
				if grants++; grants == 1 { // the peer grants the head between this dispatch's read and its grant
					f.dispatch(core.Dispatch{Now: now, Freed: peer})
				}
			}
			db.after = func() {
				if tc.cut {
					cancel()
				}
			}
			s := ddbstore.New(db, f.table, "test")
			if _, err := s.Dispatch(ctx, core.Dispatch{Now: now, Limit: limit, Freed: mine, GrantFor: 5 * time.Second}); err == nil {
				t.Fatal("dispatch: got nil error, want the injected failure")
			}
			if grants != 1 {
				t.Fatalf("dispatch sent %d grants, want 1 (the lost one)", grants)
			}
			if ts := f.poll(w0); !ts.Granted {
				t.Fatalf("w0: got %+v, want granted by the peer", ts)
			}
			if ts := f.poll(w1); ts.Granted || ts.Gone {
				t.Fatalf("w1: got %+v, want still waiting", ts)
			}
			if used, g := f.counts(); used != 1 || g != 1 {
				t.Fatalf("after the cut dispatch: used %d granted %d, want 1 and 1 (the peer's grant)", used, g)
			}
			f.repairsNothing(2, "")
			res := f.dispatch(core.Dispatch{Now: now, Freed: mine})
			if got := ids(res.Granted); !slices.Equal(got, []string{w1.ID}) {
				t.Fatalf("next dispatch granted %v, want [%s]", got, w1.ID)
			}
		})
	}
}

// TestDispatchLooksBehindGrantedTickets: a grant stays at the queue's
// head until its waiter's next poll takes it, so at a high rate a read of
// the head can hold only granted tickets. A waiter's turn then finds
// itself the head behind them, and a free's dispatch reads the tickets
// behind them and grants its slot to the first still waiting.
func TestDispatchLooksBehindGrantedTickets(t *testing.T) {
	t.Parallel()
	const limit, scan, granted = 12, 8, 10
	f := newQueueFixture(t, limit)
	ddbstore.SetQueueScan(f.s, scan)
	recs := f.fill(limit)
	for i := range granted + 2 {
		f.enter(fmt.Sprint("t", i), fmt.Sprintf("w%02d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	now := t0.Add(time.Second)
	for i, r := range recs[:granted] {
		res := f.dispatch(core.Dispatch{Now: now, Freed: f.free(r)})
		if got, want := ids(res.Granted), []string{fmt.Sprintf("w%02d", i)}; !slices.Equal(got, want) {
			t.Fatalf("free %d: granted %v, want %v", i, got, want)
		}
	}
	// The next waiter's turn finds itself the head behind them (and so
	// reads the buckets, to free a slot for itself).
	next := fmt.Sprintf("w%02d", granted)
	if res := f.dispatch(core.Dispatch{Now: now, Freed: core.NoSlotRef, Self: next}); res.Head != next || !res.Read {
		t.Fatalf("turn of %s behind %d granted tickets: head %q, read the buckets %v; want itself, true", next, granted, res.Head, res.Read)
	}
	res := f.dispatch(core.Dispatch{Now: now, Freed: f.free(recs[granted])})
	if got, want := ids(res.Granted), []string{next}; !slices.Equal(got, want) {
		t.Fatalf("free behind %d granted tickets: granted %v, want %v", granted, got, want)
	}
	if used, g := f.counts(); used != limit || g != granted+1 {
		t.Fatalf("used %d granted %d, want %d and %d (every freed slot held in trust)", used, g, limit, granted+1)
	}
}

// TestLapsedGrantsPassOnBehindGrantedTickets: when grants awaiting their
// waiters fill a read of the head, a grant that lapsed there goes to the
// first ticket still waiting behind them, whether a dispatch or the
// waiter leaving passes it on; it does not free its slot for acquires
// that do not wait.
func TestLapsedGrantsPassOnBehindGrantedTickets(t *testing.T) {
	t.Parallel()
	const limit, scan, pile = 12, 8, 10
	tests := []struct {
		name string
		pass func(f *queueFixture, head core.Ticket, rec core.Record, at time.Time) []string
		want []string // granted by the pass, besides the pile
	}{
		{name: "a free's dispatch", pass: func(f *queueFixture, _ core.Ticket, rec core.Record, at time.Time) []string {
			return ids(f.dispatch(core.Dispatch{Now: at, Freed: f.free(rec)}).Granted)
		}, want: []string{"w10", "w11"}},
		{name: "the waiter leaving", pass: func(f *queueFixture, head core.Ticket, _ core.Record, at time.Time) []string {
			if err := f.s.LeaveWait(context.Background(), head, at, 5*time.Second); err != nil {
				f.t.Fatalf("LeaveWait: %v", err)
			}
			return nil
		}, want: []string{"w10"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newQueueFixture(t, limit)
			ddbstore.SetQueueScan(f.s, scan)
			recs := f.fill(limit)
			var tickets []core.Ticket
			for i := range pile + 2 {
				tickets = append(tickets, f.enter(fmt.Sprint("t", i), fmt.Sprintf("w%02d", i), t0.Add(time.Duration(i)*time.Millisecond)))
			}
			now := t0.Add(time.Second)
			for i, r := range recs[:pile] {
				grantFor := time.Minute
				if i == 0 {
					grantFor = time.Second // the head's grant lapses first
				}
				f.dispatch(core.Dispatch{Now: now, Freed: f.free(r), GrantFor: grantFor})
			}
			at := now.Add(2 * time.Second)
			got := tc.pass(f, tickets[0], recs[pile], at)
			for _, tk := range tickets[pile:] {
				if f.poll(tk).Granted && !slices.Contains(got, tk.ID) {
					got = append(got, tk.ID)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("granted behind the pile: %v, want %v", got, tc.want)
			}
			if ts := f.poll(tickets[0]); !ts.Gone {
				t.Fatalf("the lapsed head: got %+v, want gone", ts)
			}
			if _, g := f.counts(); g != pile-1+len(tc.want) {
				t.Fatalf("granted %d slots, want %d (the pile's, the lapsed one passed on, a freed one)", g, pile-1+len(tc.want))
			}
		})
	}
}

// turnDB passes every call to DynamoDB Local, counting the transactions
// and running afterRead once, after the first BatchGetItem.
type turnDB struct {
	ddbstore.API
	afterRead func()
	txns      atomic.Int32
}

func (d *turnDB) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	out, err := d.API.BatchGetItem(ctx, in, opts...)
	if hook := d.afterRead; hook != nil {
		d.afterRead = nil
		hook()
	}
	return out, err
}

func (d *turnDB) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	d.txns.Add(1)
	return d.API.TransactWriteItems(ctx, in, opts...)
}

// TestATurnReadsItsTicketBeforeGrantingItself: the head's turn reads the
// buckets for room; when a free's dispatch granted its ticket meanwhile,
// the turn sees it in a read of its ticket and sends no grant (which
// would be cancelled), and stops there: the ticket behind it is left to
// the frees, the other freed slot free, and nothing to repair.
func TestATurnReadsItsTicketBeforeGrantingItself(t *testing.T) {
	t.Parallel()
	const limit = 4
	f := newQueueFixture(t, limit)
	recs := f.fill(limit)
	w0 := f.enter("a", "w0", t0)
	w1 := f.enter("b", "w1", t0.Add(time.Millisecond))
	freed := f.free(recs[0])
	f.free(recs[1])
	now := t0.Add(time.Second)
	db := &turnDB{API: f.client}
	db.afterRead = func() { // a free's dispatch grants the head the slot it freed
		if res := f.dispatch(core.Dispatch{Now: now, Freed: freed}); !slices.Equal(ids(res.Granted), []string{w0.ID}) {
			t.Errorf("the free's dispatch granted %v, want [%s]", ids(res.Granted), w0.ID)
		}
	}
	turn := ddbstore.New(db, f.table, "test")
	res, err := turn.Dispatch(context.Background(), core.Dispatch{Now: now, Limit: limit, Freed: core.NoSlotRef, Self: w0.ID, GrantFor: 5 * time.Second})
	if err != nil {
		t.Fatalf("the turn's Dispatch: %v", err)
	}
	if res.Head != w1.ID || len(res.Granted) != 0 || !res.Read {
		t.Errorf("turn: head %q, granted %v, read the buckets %v; want %s, no grant, read", res.Head, ids(res.Granted), res.Read, w1.ID)
	}
	if n := db.txns.Load(); n != 0 {
		t.Errorf("the turn sent %d transactions, want none", n)
	}
	if used, granted := f.counts(); used != limit-1 || granted != 1 {
		t.Errorf("used %d granted %d, want %d and 1: the other freed slot still free", used, granted, limit-1)
	}
	if ts := f.poll(w0); !ts.Granted || ts.Grant.Slot != freed {
		t.Errorf("w0 = %+v, want granted in bucket %d", ts, freed)
	}
	if ts := f.poll(w1); ts.Granted || ts.Gone {
		t.Errorf("w1 = %+v, want still waiting", ts)
	}
	f.repairsNothing(1, "")
}
