package ddbstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// idInLane returns the first ticket id with prefix that joins lane of a
// queue of lanes lanes.
func idInLane(prefix string, lane, lanes int) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("%s%03d", prefix, i); ddbstore.TicketLane(id, lanes) == lane {
			return id
		}
	}
}

// enterLane queues ticket id (its own tenant's) in a queue of lanes
// lanes, arriving at at and waiting a minute, and checks it joined the
// lane its hash picks.
func (f *queueFixture) enterLane(id string, at time.Time, lanes int) core.Ticket {
	f.t.Helper()
	tk, err := f.s.EnterWait(context.Background(), core.Waiter{Tenant: "tenant-" + id, Ticket: id, Max: 10, Lanes: lanes,
		Now: at, Until: at.Add(time.Minute)})
	if err != nil {
		f.t.Fatalf("EnterWait %s: %v", id, err)
	}
	if want := ddbstore.TicketLane(id, lanes); tk.Lane != want {
		f.t.Fatalf("EnterWait %s: lane %d, want %d", id, tk.Lane, want)
	}
	return tk
}

// TestLanesServeTheirOwnOrder: in a queue of two lanes, on a limit of two
// slots (bucket 0's frees serve lane 0, bucket 1's lane 1), each ticket is
// stored in its lane's shards; a free grants its own lane's first waiting
// ticket, even when another lane's waited longer, and another lane's
// first when nobody waits in its own; a waiter's turn serves its own lane
// only; a reconcile's dispatch serves every lane, in (round, arrival)
// order; a granted ticket that leaves passes its slot on in its lane.
func TestLanesServeTheirOwnOrder(t *testing.T) {
	const lanes = 2
	f := newQueueFixture(t, 2)
	recs := f.fill(2)
	byBucket := map[int]core.Record{}
	for _, r := range recs {
		byBucket[r.Slot.Bucket] = r
	}
	if len(byBucket) != 2 {
		t.Fatalf("the two records hold buckets %v, want 0 and 1", byBucket)
	}
	enter := func(id string, at time.Time) core.Ticket { return f.enterLane(id, at, lanes) }
	free := func(b int, now time.Time) []string {
		t.Helper()
		return ids(f.dispatch(core.Dispatch{Now: now, Bucket: b, Lanes: lanes}).Granted)
	}
	a1 := enter(idInLane("a", 1, lanes), t0)
	b0 := enter(idInLane("b", 0, lanes), t0.Add(time.Millisecond))
	c1 := enter(idInLane("c", 1, lanes), t0.Add(2*time.Millisecond))
	e1 := enter(idInLane("e", 1, lanes), t0.Add(4*time.Millisecond))
	now := t0.Add(time.Second)

	for pk, n := range f.queuePartitions() {
		shard, _ := strconv.Atoi(pk[strings.LastIndexByte(pk, '#')+1:])
		if lane := shard / ddbstore.QueueShards; lane != 0 && lane != 1 {
			t.Errorf("%d tickets in %s, a shard of lane %d: want lanes 0 and 1 only", n, pk, lane)
		}
	}
	steps := []struct {
		name string
		do   func() []string
		want []string
	}{
		{"bucket 0's free", func() []string { f.free(byBucket[0]); return free(0, now) }, []string{b0.ID}},
		{"bucket 1's free", func() []string { f.free(byBucket[1]); return free(1, now) }, []string{a1.ID}},
		{"bucket 0's free, lane 0 empty", func() []string { return free(f.takeAndFree(b0, now), now) }, []string{c1.ID}},
	}
	for _, st := range steps {
		if got := st.do(); !slices.Equal(got, st.want) {
			t.Fatalf("%s granted %v, want %v", st.name, got, st.want)
		}
	}
	// Lane 0 gets a ticket ahead of e1 in (round, arrival) order; a1's
	// slot is freed without a dispatch. e1's turn serves lane 1: itself.
	d0 := enter(idInLane("d", 0, lanes), t0.Add(3*time.Millisecond))
	if d0.Key >= e1.Key {
		t.Fatalf("d0's key %s is not ahead of e1's %s", d0.Key, e1.Key)
	}
	f.takeAndFree(a1, now)
	res := f.dispatch(core.Dispatch{Now: now, Bucket: -1, Self: e1.ID, Lane: e1.Lane, Lanes: lanes})
	if got := ids(res.Granted); !slices.Equal(got, []string{e1.ID}) || !res.Read {
		t.Fatalf("e1's turn granted %v (buckets read %v), want [%s], read", got, res.Read, e1.ID)
	}
	if ts := f.poll(d0); ts.Granted || ts.Gone {
		t.Fatalf("d0 = %+v, want still waiting", ts)
	}
	// e1 leaves with its grant: nobody else waits in lane 1, so the slot
	// is freed, and reconcile's dispatch gives it to d0.
	if err := f.s.LeaveWait(context.Background(), e1, now, 5*time.Second); err != nil {
		t.Fatalf("LeaveWait e1: %v", err)
	}
	if ts := f.poll(d0); ts.Granted {
		t.Fatalf("e1's grant passed on to d0 in another lane")
	}
	if got := ids(f.dispatch(core.Dispatch{Now: now, Bucket: -1, Scan: true, AllLanes: true, Lanes: lanes}).Granted); !slices.Equal(got, []string{d0.ID}) {
		t.Fatalf("reconcile's dispatch granted %v, want [%s]", got, d0.ID)
	}
}

// TestFreedSlotsServeTheLaneTheyAreFor: a free whose dispatch names a lane
// (a lane head's eviction) grants that lane's head, whatever its bucket's
// lane; a lapsed grant freed in a lane where nobody else waits is given to
// another lane's head by the same dispatch.
func TestFreedSlotsServeTheLaneTheyAreFor(t *testing.T) {
	const lanes = 2
	f := newQueueFixture(t, 2)
	recs := f.fill(2)
	var inLane1 core.Record
	for _, r := range recs {
		if r.Slot.Bucket%lanes == 1 {
			inLane1 = r
		}
	}
	enter := func(id string, at time.Time) core.Ticket { return f.enterLane(id, at, lanes) }
	a1 := enter(idInLane("a", 1, lanes), t0)
	b0 := enter(idInLane("b", 0, lanes), t0.Add(time.Millisecond))
	now := t0.Add(time.Second)

	f.free(inLane1)
	res := f.dispatch(core.Dispatch{Now: now, Bucket: inLane1.Slot.Bucket, Lanes: lanes, Lane: 0, ServeLane: true})
	if got := ids(res.Granted); !slices.Equal(got, []string{b0.ID}) {
		t.Fatalf("the free for lane 0's head granted %v, want [%s] (not lane 1's older %s)", got, b0.ID, a1.ID)
	}
	later := now.Add(6 * time.Second) // b0's grant lapsed unseen
	res = f.dispatch(core.Dispatch{Now: later, Bucket: -1, Lanes: lanes, Lane: 0, ServeLane: true})
	if got := ids(res.Granted); !slices.Equal(got, []string{a1.ID}) || res.Cleaned != 1 {
		t.Fatalf("lane 0's dispatch after b0's grant lapsed granted %v (cleaned %d), want [%s], 1 cleaned", got, res.Cleaned, a1.ID)
	}
	if ts := f.poll(b0); !ts.Gone {
		t.Errorf("b0 = %+v, want gone (its lapsed grant passed on)", ts)
	}
}

// TestDispatchReadsTheLanesThereAre: a dispatch that names no lane (a free
// that knows no bucket) reads the shards of the queue's lanes only; only
// reconcile's (AllLanes) reads every lane there may be and the partition
// the queue had before it was spread.
func TestDispatchReadsTheLanesThereAre(t *testing.T) {
	s, calls := countedStore(t)
	for _, tc := range []struct {
		name    string
		d       core.Dispatch
		queries int
	}{
		{"one lane", core.Dispatch{Bucket: -1, Scan: true, Lanes: 1}, ddbstore.QueueShards},
		{"two lanes", core.Dispatch{Bucket: -1, Scan: true, Lanes: 2}, 2 * ddbstore.QueueShards},
		{"reconcile", core.Dispatch{Bucket: -1, Scan: true, AllLanes: true, Lanes: 1}, core.MaxWaitLanes*ddbstore.QueueShards + 1},
	} {
		tc.d.Now, tc.d.Limit, tc.d.GrantFor = t0, 4, 5*time.Second
		calls.counts()
		if _, err := s.Dispatch(context.Background(), tc.d); err != nil {
			t.Fatalf("%s: Dispatch: %v", tc.name, err)
		}
		if got := calls.counts()["Query"]; got != tc.queries {
			t.Errorf("%s: the dispatch of an empty queue made %d Queries, want %d", tc.name, got, tc.queries)
		}
	}
}
