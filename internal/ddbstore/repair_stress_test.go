package ddbstore_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// The load of TestRepairCountersUnderLoadCorrectsNothing: a limit no
// take reaches, and the tenants and users its threads belong to.
const stressLimit = 1000

var (
	stressTenants = []string{"acme", "beta"}
	stressUsers   = []string{"u1", "u2", "u3"}
)

// threadActor drives one thread through the store's lifecycles: reserve,
// finalize or free the reservation, move between active, releasing and
// warm, reuse, pause and resume, destroy and free.
type threadActor struct {
	s    *ddbstore.Store
	id   int
	key  core.ThreadKey
	n    int
	rec  *core.Record
	last string
	rng  *rand.Rand
	ops  *atomic.Int64
	errs *atomic.Int64
}

// now is the thread's clock: a second a step.
func (w *threadActor) now() time.Time { return t0.Add(time.Duration(w.n) * time.Second) }

// refresh reads the thread's record again (none once it is gone).
func (w *threadActor) refresh(ctx context.Context) {
	if w.rec == nil {
		return
	}
	r, err := w.s.Get(ctx, w.rec.SandboxID)
	if err != nil || r.State == core.StateGone {
		w.rec = nil
		return
	}
	w.rec = &r
}

// note counts an operation, and a refused one.
func (w *threadActor) note(err error) {
	if err != nil {
		w.errs.Add(1)
	}
	w.ops.Add(1)
}

// step makes one move of the thread: a new sandbox when it has none,
// else one move from the state its record is in.
func (w *threadActor) step(ctx context.Context) {
	w.n++
	p := w.rng.IntN(100)
	if w.rec == nil {
		w.create(ctx, p)
		return
	}
	r := *w.rec
	var gone bool
	switch r.State {
	case core.StateActive, core.StateReleasing:
		gone = w.fromRunning(ctx, r, p)
	case core.StateWarm:
		gone = w.fromWarm(ctx, r, p)
	case core.StatePaused:
		gone = w.fromPaused(ctx, r, p)
	default:
		gone = w.free(ctx, r)
	}
	if !gone {
		w.refresh(ctx)
	}
}

// create reserves a slot for the thread (replacing its last sandbox),
// then frees the reservation or finalizes it.
func (w *threadActor) create(ctx context.Context, p int) {
	now := w.now()
	token := fmt.Sprintf("r%d-%d", w.id, w.n)
	err := w.s.Reserve(ctx, core.Reservation{Token: token, ThreadKey: w.key, Limit: stressLimit, Now: now, ExpiresAt: now.Add(time.Minute), ReplaceSandboxID: w.last})
	w.note(err)
	if err != nil {
		w.last = "" // the binding names no record of ours any more
		return
	}
	if p < 20 {
		w.note(w.s.FreeReservation(ctx, token, w.key))
		w.last = ""
		return
	}
	rec, err := w.s.Finalize(ctx, token, core.Record{SandboxID: fmt.Sprintf("sbx-%d-%d", w.id, w.n), ThreadKey: w.key, State: core.StateActive, Backend: "e2b",
		ReservationToken: token, Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: "tok"},
		CreatedAt: now, UpdatedAt: now})
	w.note(err)
	if err == nil {
		w.rec, w.last = &rec, rec.SandboxID
	}
}

// apply moves r to state to (its count with it).
func (w *threadActor) apply(ctx context.Context, r core.Record, to core.State) {
	now := w.now()
	u := core.Update{SandboxID: r.SandboxID, Fence: r.Fence, State: to, Now: now, Slot: r.Slot, ExpiresAt: now.Add(time.Hour)}
	if to == core.StateWarm {
		u.ParkedAt, u.Owner = now, w.key
	}
	_, err := w.s.Apply(ctx, u)
	w.note(err)
}

// free frees r's slots, and reports whether it did.
func (w *threadActor) free(ctx context.Context, r core.Record) bool {
	err := w.s.Free(ctx, r, w.now())
	w.note(err)
	if err == nil {
		w.rec = nil
	}
	return err == nil
}

// claim claims r from from to to under the thread's lease.
func (w *threadActor) claim(ctx context.Context, r core.Record, from, to core.State) (core.Record, error) {
	now := w.now()
	c, err := w.s.Claim(ctx, core.Claim{SandboxID: r.SandboxID, Tenant: r.Tenant, From: []core.State{from}, To: to,
		Owner: fmt.Sprint("w", w.id), Now: now, LeaseUntil: now.Add(time.Minute)})
	w.note(err)
	return c, err
}

// fromRunning releases, parks, resumes work or frees an active or
// releasing record; gone: it freed it.
func (w *threadActor) fromRunning(ctx context.Context, r core.Record, p int) (gone bool) {
	switch {
	case r.State == core.StateReleasing && p < 70:
		w.apply(ctx, r, core.StateWarm)
	case r.State == core.StateReleasing:
		w.apply(ctx, r, core.StateActive)
	case p < 50:
		w.apply(ctx, r, core.StateReleasing)
	case p < 60:
		w.apply(ctx, r, core.StateWarm)
	default:
		return w.free(ctx, r)
	}
	return false
}

// fromWarm reuses (one claim: the count stays warm), pauses (settled or
// aborted), destroys or frees a warm record; gone: it freed it.
func (w *threadActor) fromWarm(ctx context.Context, r core.Record, p int) (gone bool) {
	now := w.now()
	switch {
	case p < 35:
		_, _ = w.claim(ctx, r, core.StateWarm, core.StateActive)
	case p < 70:
		pr, err := w.s.ClaimPause(ctx, core.Claim{SandboxID: r.SandboxID, Tenant: r.Tenant, Owner: fmt.Sprint("w", w.id), Now: now, LeaseUntil: now.Add(time.Minute)}, 500)
		w.note(err)
		if err != nil {
			return false
		}
		if w.rng.IntN(3) == 0 {
			_, err = w.s.AbortPause(ctx, pr, now)
		} else {
			_, err = w.s.SettlePause(ctx, pr, now)
		}
		w.note(err)
	case p < 85:
		if c, err := w.claim(ctx, r, core.StateWarm, core.StateDestroying); err == nil {
			return w.free(ctx, c)
		}
	default:
		return w.free(ctx, r)
	}
	return false
}

// fromPaused resumes or destroys a paused record; gone: it freed it.
func (w *threadActor) fromPaused(ctx context.Context, r core.Record, p int) (gone bool) {
	now := w.now()
	if p >= 70 {
		if c, err := w.claim(ctx, r, core.StatePaused, core.StateDestroying); err == nil {
			return w.free(ctx, c)
		}
		return false
	}
	rc, err := w.s.ClaimResume(ctx, core.ResumeClaim{Claim: core.Claim{SandboxID: r.SandboxID, Owner: fmt.Sprint("w", w.id), Now: now, LeaseUntil: now.Add(time.Minute)},
		Key: w.key, Limit: stressLimit})
	w.note(err)
	if err == nil {
		_, err = w.s.SettleResume(ctx, rc, now, now.Add(time.Hour))
		w.note(err)
	}
	return false
}

// actor is what the load's actors share: the store, a step count that
// is also their clock (a second a step), their randomness, and the count
// of operations.
type actor struct {
	s   *ddbstore.Store
	n   int
	rng *rand.Rand
	ops *atomic.Int64
}

// tick counts a step and returns its time.
func (a *actor) tick() time.Time {
	a.n++
	a.ops.Add(1)
	return t0.Add(time.Duration(a.n) * time.Second)
}

// poolActor drives the pool: refills, pool pauses, claims by threads, frees.
type poolActor struct{ actor }

// step makes one move of the pool: a refill (finalized or freed), or,
// on a member, a pause (settled or aborted), a claim by a thread (then
// freed), or a recycle.
func (pw *poolActor) step(ctx context.Context) {
	now := pw.tick()
	members, _ := pw.s.PoolMembers(ctx, 20)
	p := pw.rng.IntN(100)
	if p < 35 || len(members) == 0 {
		pw.refill(ctx, now)
		return
	}
	m := members[pw.rng.IntN(len(members))]
	switch {
	case p < 60:
		pw.pause(ctx, m, now)
	case p < 80:
		pw.claim(ctx, m, now)
	default:
		c, err := pw.s.Claim(ctx, core.Claim{SandboxID: m.SandboxID, From: []core.State{core.StatePooled},
			To: core.StateDestroying, Owner: "recycle", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err == nil {
			_ = pw.s.Free(ctx, c, now)
		}
	}
}

func (pw *poolActor) refill(ctx context.Context, now time.Time) {
	token := fmt.Sprint("pr-", pw.n)
	if err := pw.s.ReservePool(ctx, core.PoolReservation{Token: token, Limit: stressLimit, Size: 6, Now: now, ExpiresAt: now.Add(time.Minute)}); err != nil {
		return
	}
	if pw.rng.IntN(5) == 0 {
		_ = pw.s.FreeReservation(ctx, token, core.ThreadKey{})
		return
	}
	_, _ = pw.s.FinalizePool(ctx, token, core.Record{SandboxID: fmt.Sprint("pm-", pw.n), Backend: "e2b", ReservationToken: token,
		Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: "tok"}, CreatedAt: now, UpdatedAt: now})
}

func (pw *poolActor) pause(ctx context.Context, m core.Record, now time.Time) {
	if m.Slots.Paused {
		return
	}
	pr, err := pw.s.ClaimPoolPause(ctx, core.Claim{SandboxID: m.SandboxID, Owner: "refill", Now: now, LeaseUntil: now.Add(time.Minute)}, 500)
	if err != nil {
		return
	}
	if pw.rng.IntN(2) == 0 {
		_, _ = pw.s.AbortPoolPause(ctx, pr, now)
	} else {
		_, _ = pw.s.SettlePoolPause(ctx, pr, now)
	}
}

func (pw *poolActor) claim(ctx context.Context, m core.Record, now time.Time) {
	key := core.ThreadKey{Tenant: stressTenants[pw.n%2], User: stressUsers[pw.n%3], Thread: fmt.Sprint("pt", pw.n)}
	rec, err := pw.s.ClaimPoolMember(ctx, core.PoolClaim{Member: m, ThreadKey: key, Owner: "pc", Now: now, LeaseUntil: now.Add(time.Minute), Limit: stressLimit})
	if err != nil {
		return
	}
	if rec.Slots.Paused {
		_, err = pw.s.SettleResume(ctx, rec, now, now.Add(time.Hour))
	} else {
		_, err = pw.s.Apply(ctx, core.Update{SandboxID: rec.SandboxID, Fence: rec.Fence, State: core.StateActive, Now: now, Slot: rec.Slot})
	}
	if err != nil {
		return
	}
	if got, err := pw.s.Get(ctx, rec.SandboxID); err == nil {
		_ = pw.s.Free(ctx, got, now)
	}
}

// queueActor enters the wait queue, dispatches, takes or leaves grants.
type queueActor struct {
	actor
	id int
}

// step queues a ticket, dispatches the queue, and takes the grant (then
// frees the reservation or the record) or leaves.
func (q *queueActor) step(ctx context.Context) {
	now := q.tick()
	id := fmt.Sprintf("q%d-%d", q.id, q.n)
	tenant := stressTenants[q.n%2]
	tk, err := q.s.EnterWait(ctx, core.Waiter{Tenant: tenant, Ticket: id, Max: 10, Now: now, Until: now.Add(time.Minute)})
	if err != nil {
		return
	}
	_, _ = q.s.Dispatch(ctx, core.Dispatch{Now: now, Limit: stressLimit, Freed: core.NoSlotRef, Scan: true, GrantFor: 5 * time.Second})
	ts, err := q.s.PollTicket(ctx, tk)
	if err != nil {
		return
	}
	if ts.Granted && q.rng.IntN(2) == 0 {
		key := core.ThreadKey{Tenant: tenant, User: "uq", Thread: id}
		g := ts.Grant
		if err := q.s.Reserve(ctx, core.Reservation{Token: "res-" + id, ThreadKey: key, Limit: stressLimit, Now: now, ExpiresAt: now.Add(time.Minute), Grant: &g}); err != nil {
			_ = q.s.LeaveWait(ctx, tk, now, 5*time.Second)
			return
		}
		if q.rng.IntN(2) == 0 {
			_ = q.s.FreeReservation(ctx, "res-"+id, key)
			return
		}
		rec, err := q.s.Finalize(ctx, "res-"+id, core.Record{SandboxID: "qs-" + id, ThreadKey: key, State: core.StateActive, Backend: "e2b",
			ReservationToken: "res-" + id, CreatedAt: now, UpdatedAt: now})
		if err == nil {
			_ = q.s.Free(ctx, rec, now)
		}
		return
	}
	_ = q.s.LeaveWait(ctx, tk, now, 5*time.Second)
}

// countersFromHolders reads the whole table (strongly consistent) and
// returns every counter kept with the slots that differs from what its
// holders say: the records and reservations, and the granted tickets.
func countersFromHolders(t *testing.T, client *dynamodb.Client, table string) []string {
	t.Helper()
	have, want := map[string]int{}, map[string]int{} // counter key[/attribute] -> value
	in := &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)}
	for {
		out, err := client.Scan(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		for _, av := range out.Items {
			var it rawItem
			if err := attributevalue.UnmarshalMap(av, &it); err != nil {
				t.Fatal(err)
			}
			it.stored(av, have)
			it.holds(want)
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	var bad []string
	keys := maps.Clone(have)
	maps.Copy(keys, want)
	for k := range keys {
		if want[k] != have[k] {
			bad = append(bad, fmt.Sprintf("%s: stored %d, held %d", k, have[k], want[k]))
		}
	}
	return bad
}

// rawItem is what countersFromHolders reads of an item.
type rawItem struct {
	PK           string `dynamodbav:"pk"`
	State        string `dynamodbav:"state"`
	Tenant       string `dynamodbav:"tenant"`
	User         string `dynamodbav:"user_id"`
	Bucket       int    `dynamodbav:"bucket"`
	Quota        bool   `dynamodbav:"quota"`
	NoRunning    bool   `dynamodbav:"no_running_slot"`
	PausedSlot   bool   `dynamodbav:"paused_slot"`
	PausedBucket int    `dynamodbav:"paused_bucket"`
	PoolPlace    bool   `dynamodbav:"pool_place"`
	Used         int    `dynamodbav:"used"`
	Granted      int    `dynamodbav:"granted"`
}

// stored records the counters a counter item keeps in have.
func (it rawItem) stored(av map[string]types.AttributeValue, have map[string]int) {
	switch {
	case strings.HasPrefix(it.PK, "CAP#test"):
		have[it.PK+"/used"], have[it.PK+"/granted"] = it.Used, it.Granted
	case strings.HasPrefix(it.PK, "USR#test#"), strings.HasPrefix(it.PK, "TEN#test#"), strings.HasPrefix(it.PK, "PAU#test"):
		have[it.PK] = it.Used
	case it.PK == "POOL#test":
		have[it.PK] = it.Used
	}
}

// holds adds the places a holder (a record, a reservation, a granted
// ticket) holds to want.
func (it rawItem) holds(want map[string]int) {
	st := core.State(it.State)
	switch {
	case strings.HasPrefix(it.PK, "WQ#test") && it.State == "granted":
		want[capPK(it.Bucket)+"/used"]++
		want[capPK(it.Bucket)+"/granted"]++
		return
	case !strings.HasPrefix(it.PK, "SBX#") && !strings.HasPrefix(it.PK, "RES#"), st == core.StateGone, st == "":
		return
	}
	if !it.NoRunning && st != core.StatePaused {
		want[capPK(it.Bucket)+"/used"]++
		if it.Quota && it.Tenant != "" {
			want["TEN#test#"+it.Tenant]++
			want["USR#test#"+it.Tenant+"#"+it.User]++
		}
	}
	switch st {
	case core.StatePausing, core.StatePaused, core.StateResuming:
		want[ddbstore.PausedPK("test", it.PausedBucket)]++
	case core.StateDestroying, core.StatePooled, core.StateClaiming:
		if it.PausedSlot {
			want[ddbstore.PausedPK("test", it.PausedBucket)]++
		}
	}
	switch st {
	case core.StateCreating:
		if strings.HasPrefix(it.PK, "RES#") && it.Tenant == "" {
			want["POOL#test"]++
		}
	case core.StatePooled, core.StatePausing, core.StateDestroying:
		if it.PoolPlace {
			want["POOL#test"]++
		}
	}
}

// capPK is capacity bucket b's key in deployment "test".
func capPK(b int) string {
	if b == 0 {
		return "CAP#test"
	}
	return "CAP#test#" + strconv.Itoa(b)
}

// TestRepairCountersUnderLoadCorrectsNothing runs threads' lifecycles,
// the pool (refills, pauses, claims, recycling) and the wait queue
// (tickets granted, taken, left) against the store while the counter
// repair runs pass after pass, sweeping the whole table each pass. Every
// operation keeps the counters right, so no pass may correct anything,
// and after the load every counter equals what its holders say, read
// from the table itself. A drift made then is corrected by the quiet
// passes that follow, and nothing else is.
func TestRepairCountersUnderLoadCorrectsNothing(t *testing.T) {
	t.Parallel()
	const threads, queues, busyPasses, quietPasses = 10, 2, 4, 3
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	rs := ddbstore.New(client, table, "test")
	ddbstore.SetSweepSegments(rs, 1)
	ctx := context.Background()
	var ops, errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	run := func(step func(context.Context)) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					step(ctx)
				}
			}
		})
	}
	for i := range threads {
		w := &threadActor{s: s, id: i, key: core.ThreadKey{Tenant: stressTenants[i%2], User: stressUsers[i%3], Thread: fmt.Sprint("t", i)},
			rng: rand.New(rand.NewPCG(seed, uint64(i))), ops: &ops, errs: &errs}
		run(w.step)
	}
	run((&poolActor{actor{s: s, rng: rand.New(rand.NewPCG(seed, 1000)), ops: &ops}}).step)
	for i := range queues {
		run((&queueActor{actor{s: s, rng: rand.New(rand.NewPCG(seed, uint64(2000+i))), ops: &ops}, i}).step)
	}
	var pool core.NotedCount
	// pass runs one repair pass and returns the counters it corrected,
	// failing the test for any other correction.
	pass := func(phase string, n int) int {
		rep, err := rs.RepairCounters(ctx, stressLimit)
		if err != nil {
			t.Logf("%s pass %d: %v", phase, n, err)
		}
		if rep.Slots != 0 || rep.PausedSlots != 0 {
			t.Errorf("%s pass %d corrected used slots by %+d, paused slots by %+d; want nothing (the counters were right)",
				phase, n, rep.Slots, rep.PausedSlots)
		}
		// The pool place count is repaired by reconcile on two passes'
		// figures (core): it must never see the same wrong one twice.
		if sp := rep.Pool; sp != nil {
			if pool.Noted && pool.Revision == sp.Revision && pool.Used == sp.Used && pool.Counted == sp.Counted && sp.Used != sp.Counted {
				t.Errorf("%s pass %d: the pool place count would be corrected from %d to %d", phase, n, sp.Used, sp.Counted)
			}
			pool = core.NotedCount{Used: sp.Used, Counted: sp.Counted, Revision: sp.Revision, Noted: true}
		}
		return rep.Counters
	}
	for n := range busyPasses {
		if fixed := pass("busy", n); fixed != 0 {
			t.Errorf("busy pass %d corrected %d counters, want none (the counters were right)", n, fixed)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d operations (%d refused)", ops.Load(), errs.Load())
	if ops.Load() < 100 {
		t.Fatalf("the load made %d operations, want at least 100", ops.Load())
	}
	if bad := countersFromHolders(t, client, table); len(bad) > 0 {
		t.Errorf("after the load, counters differ from their holders:\n%s", strings.Join(bad, "\n"))
	}
	// One real drift, now that the load is over: the quiet passes correct
	// it, and only it.
	if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "TEN#test#acme"}, "sk": &types.AttributeValueMemberS{Value: "R"}},
		UpdateExpression:          aws.String("ADD used :two"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":two": &types.AttributeValueMemberN{Value: "2"}}}); err != nil {
		t.Fatal(err)
	}
	fixed := 0
	for n := range quietPasses {
		fixed += pass("quiet", n)
	}
	if fixed != 1 {
		t.Errorf("the quiet passes corrected %d counters, want 1 (the drift)", fixed)
	}
	if bad := countersFromHolders(t, client, table); len(bad) > 0 {
		t.Errorf("after the quiet passes, counters differ from their holders:\n%s", strings.Join(bad, "\n"))
	}
}
