package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"golang.org/x/sync/errgroup"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// The counter repair keeps, between reconcile passes, the differences it
// saw (pk REC#<deployment>, sk COUNTS, attribute "noted": counter name ->
// "<stored>|<counted>|<revision>", where a bucket's "slots#<b>" is its
// used and granted slots; see RepairCounters).
const countsSK = "COUNTS"

// sweepSegments is how many parts the counter repair's sweep splits the
// table into (sweepCounts): each pass scans one, so every user's and
// tenant's slot count is read at least once in sweepSegments passes. A
// sweep gets at most sweepBudget of the pass.
const (
	sweepSegments = 16
	sweepBudget   = 20 * time.Second
)

// maxNoted bounds the differences the repair notes for the next pass (its
// item stays far below DynamoDB's 400 KB): a drift wider than that is
// corrected maxNoted counters a pass, the first by name.
const maxNoted = 2000

// exactRoom is the time an exact count leaves, of its caller's, for the
// corrections and the noted differences after it.
const exactRoom = CallTimeout

// slotTally is what the slot holders say each counter kept with the
// slots should be.
type slotTally struct {
	states map[core.State]int // holders of running slots, by state
	used   [CapacityBuckets]int
	quota  map[string]int     // USR#/TEN#/TPA# key -> slots counted in it
	paused [PausedBuckets]int // records holding a paused slot, by paused bucket
	pool   int                // pool places held
}

// tallyStates are the states a tally reads: those holding running slots,
// and the paused records (a paused slot only).
var tallyStates = append(slices.Clone(slotStates), core.StatePaused)

// holdsRunningSlot reports whether an entry of st holds a running slot:
// every one but a paused record or a paused record's tombstone.
func holdsRunningSlot(st core.State, it item) bool {
	return !it.NoRunningSlot && st != core.StatePaused
}

// holdsPausedSlot reports whether an entry of st holds a paused slot:
// every record pausing, paused or resuming does; a tombstone, a pool
// member or one being claimed does when marked so.
func holdsPausedSlot(st core.State, it item) bool {
	switch st {
	case core.StatePausing, core.StatePaused, core.StateResuming:
		return true
	case core.StateDestroying, core.StatePooled, core.StateClaiming:
		return it.PausedSlot
	}
	return false
}

// holdsPoolPlace reports whether an entry of st holds a pool place: a
// thread-less reservation (a refill), or a thread-less record marked so
// (a member, one being paused or destroyed).
func holdsPoolPlace(st core.State, it item) bool {
	switch st {
	case core.StateCreating:
		return it.Tenant == ""
	case core.StatePooled, core.StatePausing, core.StateDestroying:
		return it.PoolPlace
	}
	return false
}

// holder is what a tally counts of one slot holder, as a read last saw it.
type holder struct {
	state        core.State
	running      bool // holds a running slot (not a paused record or tombstone)
	bucket       int
	quota        bool // counted in its user's and tenant's slot counts (as its flag says: a free takes them down by it)
	tenant, user string
	pausedSlot   bool
	pausedBucket int
	tenantPaused bool // its paused slot is counted in its tenant's paused count
	poolPlace    bool
}

// holders are the slot holders a read saw, keyed by holder: a record by
// its item key, a reservation by its token. A holder that a read sees
// twice (it moved to a state read later) is kept as last seen, and a
// record finalized from a reservation (it carries the token) replaces the
// reservation, whichever of the two was read first: without this a tally
// counts the mover twice, and a repair that trusts it raises a counter
// above what is held. (A finalized token is kept as a holder of nothing
// under finalizedKey.)
type holders map[string]holder

// finalizedKey is where holders mark a reservation finalized as a record.
func finalizedKey(token string) string { return "finalized#" + token }

// see records the entry it, read in state st.
func (h holders) see(st core.State, it item) {
	switch {
	case strings.HasPrefix(it.PK, "SBX#") && it.Reservation != "":
		delete(h, reservationPK(it.Reservation))
		h[finalizedKey(it.Reservation)] = holder{}
	case strings.HasPrefix(it.PK, "RES#"):
		if _, done := h[finalizedKey(strings.TrimPrefix(it.PK, "RES#"))]; done {
			return
		}
	}
	h[it.PK] = holder{
		state: st, running: holdsRunningSlot(st, it), bucket: min(max(it.Bucket, 0), CapacityBuckets-1),
		quota: it.Quota, tenant: it.Tenant, user: it.User,
		pausedSlot: holdsPausedSlot(st, it), pausedBucket: pausedBucketOf(it.PausedBucket), poolPlace: holdsPoolPlace(st, it),
		tenantPaused: holdsPausedSlot(st, it) && it.TenantPaused && it.Tenant != "",
	}
}

// tally counts the holders in every counter they hold a place of.
func (h holders) tally(deployment string) *slotTally {
	t := &slotTally{quota: map[string]int{}, states: map[core.State]int{}}
	for _, o := range h {
		if o.pausedSlot {
			t.paused[o.pausedBucket]++
		}
		if o.tenantPaused {
			t.quota[tenantPausedPK(deployment, o.tenant)]++
		}
		if o.poolPlace {
			t.pool++
		}
		if !o.running {
			continue
		}
		t.used[o.bucket]++
		t.states[o.state]++
		k := core.ThreadKey{Tenant: o.tenant, User: o.user}
		held := 0
		if o.quota {
			held = 1
		}
		t.quota[tenantPK(deployment, k.Tenant)] += held
		t.quota[userPK(deployment, k)] += held
	}
	return t
}

// tallySlots reads every slot-holding index entry (the whole fleet: for
// reconcile only), one query of each index key of tallyStates, one state
// after another, and returns the tally of every counter kept with the
// slots. The states are not read at one instant: a holder that moves back
// to a state read already is missed; see exactTally. It reads the first
// shards keys of each state (tallyShards: every key an entry may be under)
// and files the entries it finds under a key the store no longer reads
// (its shard count went down) under their key now (refile).
func (s *Store) tallySlots(ctx context.Context, shards int) (*slotTally, error) {
	h := holders{}
	var stray []item
	for _, st := range tallyStates {
		err := s.eachItemIn(ctx, st, shardPKs(s.deployment, st, max(shards, s.shards)), func(it item) {
			h.see(st, it)
			if it.GSI1PK != s.statePK(st, entryID(it)) {
				stray = append(stray, it)
			}
		})
		if err != nil {
			return nil, err
		}
	}
	for _, it := range stray[:min(len(stray), maxRefiled)] {
		if ctx.Err() != nil {
			break
		}
		s.refile(ctx, it)
	}
	return h.tally(s.deployment), nil
}

// maxRefiled bounds the index entries one tally moves (refile): the rest
// wait for the next pass, so that a changed shard count does not use up a
// pass.
const maxRefiled = 500

// entryID is the id an index entry is filed by: a record's sandbox id, a
// reservation's token.
func entryID(it item) string {
	if id, ok := strings.CutPrefix(it.PK, "SBX#"); ok {
		return id
	}
	return strings.TrimPrefix(it.PK, "RES#")
}

// refile moves an index entry to its state's key under the store's shard
// count, if the item is still filed where it was read. Best effort: an
// entry not moved is found again by the next pass.
func (s *Store) refile(ctx context.Context, it item) {
	to := s.statePK(core.State(it.State), entryID(it))
	_ = s.conditionalUpdate(ctx, "refile index entry", it.PK, expression.Name(AttrGSI1PK).Equal(expression.Value(it.GSI1PK)),
		expression.Set(expression.Name(AttrGSI1PK), expression.Value(to)))
}

// exactTally counts every holder once, as no read of the state index can
// while holders move: the reservations from the index (its creating
// entries) first, then the records and reservations from the table
// itself (a strongly consistent Scan of this deployment's). An item's key
// never changes, so the Scan returns each record that exists throughout
// it exactly once, in the state it is in when read, and each reservation
// too (whatever the index's lag). A reservation finalized during the Scan
// may be read neither as itself nor as its record, but the first read
// found it; found as both, it is counted once (same token). It reads the
// whole table: the counter repair runs it only when a correction is due
// (see RepairCounters).
func (s *Store) exactTally(ctx context.Context) (*slotTally, error) {
	h := holders{}
	creating := s.statePKs(core.StateCreating)
	if err := s.eachItemIn(ctx, core.StateCreating, creating, func(it item) { h.see(core.StateCreating, it) }); err != nil {
		return nil, err
	}
	err := s.scanRecords(ctx, func(it item) {
		if st := core.State(it.State); slices.Contains(tallyStates, st) {
			h.see(st, it)
		}
	})
	if err != nil {
		return nil, err
	}
	return h.tally(s.deployment), nil
}

// eachItemIn calls fn with every index entry of state st under the keys
// pks, decoded.
func (s *Store) eachItemIn(ctx context.Context, st core.State, pks []string, fn func(item)) error {
	var derr error
	err := s.eachInKeys(ctx, pks, st, nil, 0, func(av map[string]types.AttributeValue) bool {
		var it item
		if derr = attributevalue.UnmarshalMap(av, &it); derr != nil {
			return false
		}
		fn(it)
		return true
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return fmt.Errorf("tally %s: %w", st, err)
	}
	return nil
}

// recordScanSegments is how many parts of the table the exact count's
// Scan reads at once (a parallel Scan), so that a large table is read
// within a reconcile pass.
const recordScanSegments = 4

// scanRecords calls fn, one call at a time, with every record and
// reservation of the deployment (a strongly consistent parallel Scan of
// the whole table).
func (s *Store) scanRecords(ctx context.Context, fn func(item)) error {
	filter := expression.And(
		expression.Or(expression.Name(AttrPK).BeginsWith("SBX#"), expression.Name(AttrPK).BeginsWith("RES#")),
		expression.Name("deployment").Equal(expression.Value(s.deployment)))
	expr, err := expression.NewBuilder().WithFilter(filter).Build()
	if err != nil {
		return fmt.Errorf("scan records: %w", err)
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for seg := range int32(recordScanSegments) {
		g.Go(func() error {
			in := &dynamodb.ScanInput{TableName: &s.table, FilterExpression: expr.Filter(),
				ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
				ConsistentRead: aws.Bool(true), Segment: aws.Int32(seg), TotalSegments: aws.Int32(recordScanSegments)}
			return s.scanEach(gctx, "scan records", in, func(av map[string]types.AttributeValue) error {
				var it item
				if err := attributevalue.UnmarshalMap(av, &it); err != nil {
					return fmt.Errorf("decode record: %w", err)
				}
				mu.Lock()
				defer mu.Unlock()
				fn(it)
				return nil
			})
		})
	}
	return g.Wait()
}

// scanEach runs the Scan in page by page, each page under its own
// deadline, calling fn with every item.
func (s *Store) scanEach(ctx context.Context, op string, in *dynamodb.ScanInput, fn func(map[string]types.AttributeValue) error) error {
	for {
		cctx, cancel := s.ctx(ctx)
		out, err := s.db.Scan(cctx, in)
		cancel()
		if err != nil {
			return unavailable(op, err)
		}
		for _, av := range out.Items {
			if err := fn(av); err != nil {
				return err
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// RepairCounters implements core.CapacityStore.
//
// A counter is corrected to its tally only when three things agree: the
// last pass noted the same difference at the same revision (no take or
// free moved the counter since, so this pass's tally was read while it
// held still), an exact count of the holders (exactTally) gives the same,
// and the revision is still the one read when the correction is written.
// The tally reads the state index one state after another and can miss a
// holder that moves meanwhile (a reused sandbox going back to active);
// the exact count cannot, so a miss never lowers a counter.
func (s *Store) RepairCounters(ctx context.Context, limit int) (core.CounterRepair, error) {
	var rep core.CounterRepair
	countedAt := time.Now().UTC() // before the tally's reads
	r, err := s.readForRepair(ctx)
	if err != nil {
		return rep, err
	}
	noted := map[string]string{}
	due := r.dueRepairs(noted)
	errs := r.errs
	rep.Pool = &r.pool
	var confirm *slotTally
	if len(due) > 0 || r.notePool(noted) {
		ectx, cancel := exactCtx(ctx)
		exactAt := time.Now().UTC()
		confirm, err = s.exactTally(ectx)
		cancel()
		if err != nil {
			errs = append(errs, err) // the differences stay noted for the next pass
			due, rep.Pool = nil, nil
		} else {
			// The pool place count is repaired by the caller, on two
			// passes' counts: give it the confirmed one.
			r.pool.Counted = confirm.pool
			countedAt = exactAt
		}
	}
	for _, d := range due {
		if d.counted(confirm, r.grants) != d.want {
			delete(noted, d.name) // not seen again: note afresh next pass
			continue
		}
		if err := d.apply(ctx, s, &rep); err != nil && !errors.Is(err, core.ErrConflict) {
			errs = append(errs, err)
		}
	}
	tally := r.tally
	if confirm != nil {
		tally = confirm
	}
	if err := s.saveNotedCounts(ctx, notedState{Noted: noted, Sweep: (r.sweep + 1) % s.sweep,
		States: stateCounts(tally), CountedAt: countedAt}); err != nil {
		errs = append(errs, err)
	}
	if rep.Slots == 0 {
		// Rebalance from what was read (a repair would have moved "used").
		rebalanced, err := s.rebalance(ctx, r.buckets, limit)
		rep.Rebalanced = rebalanced
		if err != nil {
			errs = append(errs, err)
		}
	}
	dropped, err := s.dropIdleTenants(ctx, r.buckets, r.stored, r.tally)
	rep.TenantsDropped = dropped
	if err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

// notePool notes the pool place count's difference with the tally and
// reports whether the last pass noted the same: the pool count is
// repaired by the caller, on two passes' figures, and the second of two
// equal ones is then the exact count's.
func (r *repairRead) notePool(noted map[string]string) bool {
	if r.pool.Used == r.pool.Counted {
		return false
	}
	v := fmt.Sprintf("%d|%d%s", r.pool.Used, r.pool.Counted, revisionMark(r.pool.Revision))
	noted["pool"] = v
	return r.prev["pool"] == v
}

// exactCtx bounds an exact count to end exactRoom before ctx does, so
// that what follows it is still written.
func exactCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, dl.Add(-exactRoom))
	}
	return context.WithCancel(ctx)
}

// repairRead is what a counter repair reads: every counter with its
// revision, the tally of the index, and the differences the last pass
// noted.
type repairRead struct {
	buckets   []bucketItem
	paused    []bucketItem
	pool      core.HolderCount
	tally     *slotTally
	grants    map[int]int          // granted tickets by bucket
	quotaKeys []string             // the USR#/TEN# counters read
	stored    map[string]countItem // those that exist
	prev      map[string]string
	sweep     int32   // the segment of the table this pass swept (sweepCounts)
	errs      []error // what failed without stopping the repair
}

// readForRepair reads the buckets, the paused buckets and the pool count
// before the tally (a take or free between the two moves their
// revision), then the granted tickets (slots held in trust, in no index)
// and the users' and tenants' counters: those the index names, those the
// fair-share sets name, those noted last time, and those this pass's
// sweep finds not zero.
func (s *Store) readForRepair(ctx context.Context) (*repairRead, error) {
	r := &repairRead{}
	var err error
	if r.buckets, err = s.readLedger(ctx, runningSlots, 0, true); err != nil {
		return nil, err
	}
	noted, err := s.notedCounts(ctx, true)
	if err != nil {
		return nil, err
	}
	r.prev, r.sweep = noted.Noted, noted.Sweep%s.sweep
	// The sweep is a help, not a need: one that fails or takes too long
	// leaves its segment to its next turn and the repair goes on.
	sctx, cancel := context.WithTimeout(ctx, sweepBudget)
	stray, err := s.sweepCounts(sctx, r.sweep)
	cancel()
	if err != nil {
		r.errs = append(r.errs, err)
	}
	if r.paused, r.pool, r.tally, err = s.countHolders(ctx, tallyShards(r.buckets)); err != nil {
		return nil, err
	}
	if r.grants, err = s.queueGrants(ctx); err != nil {
		return nil, err
	}
	quotaKeys := map[string]bool{}
	for k := range r.tally.quota {
		quotaKeys[k] = true
	}
	for _, b := range r.buckets {
		for _, t := range b.Tenants {
			quotaKeys[tenantPK(s.deployment, t)] = true
		}
	}
	for k := range r.prev {
		if isQuotaKey(k) {
			quotaKeys[k] = true
		}
	}
	for _, k := range stray {
		quotaKeys[k] = true
	}
	r.quotaKeys = slices.Sorted(maps.Keys(quotaKeys))
	if r.stored, err = s.readCounters(ctx, r.quotaKeys); err != nil {
		return nil, err
	}
	return r, nil
}

// dueRepair is one counter whose difference the last pass saw too.
type dueRepair struct {
	name    string                                        // the noted name
	want    string                                        // the count this pass's tally gives
	counted func(t *slotTally, grants map[int]int) string // the count a tally gives
	apply   func(ctx context.Context, s *Store, rep *core.CounterRepair) error
}

// dueRepairs notes in noted every difference between a counter and the
// tally, and returns those the last pass noted unchanged.
func (r *repairRead) dueRepairs(noted map[string]string) []dueRepair {
	var due []dueRepair
	// note notes d's difference with the counter (have; rev: its revision)
	// and keeps d when the last pass noted the same.
	note := func(d dueRepair, have string, rev int64) {
		if have == d.want {
			return
		}
		if len(noted) >= maxNoted {
			return
		}
		v := have + "|" + d.want + revisionMark(rev)
		noted[d.name] = v
		if r.prev[d.name] == v {
			due = append(due, d)
		}
	}
	for _, b := range r.buckets {
		// Its used and granted slots (under "revision": every take, free
		// and grant moves it), in one write, so that counters drifted
		// together are corrected together.
		i := b.Index
		slots := func(t *slotTally, g map[int]int) string { return fmt.Sprintf("%d,%d", t.used[i]+g[i], g[i]) }
		note(dueRepair{name: "slots#" + strconv.Itoa(i), want: slots(r.tally, r.grants), counted: slots,
			apply: func(ctx context.Context, s *Store, rep *core.CounterRepair) error {
				used, granted := r.tally.used[i]+r.grants[i], r.grants[i]
				err := s.setBucketSlots(ctx, b, used, granted)
				if err == nil {
					rep.Slots += used - b.Used
					if granted != b.Granted {
						rep.Counters++
					}
				}
				return err
			}}, fmt.Sprintf("%d,%d", b.Used, b.Granted), b.Revision)
	}
	for i, c := range r.paused {
		note(dueRepair{name: "paused#" + strconv.Itoa(i), want: strconv.Itoa(r.tally.paused[i]),
			counted: func(t *slotTally, _ map[int]int) string { return strconv.Itoa(t.paused[i]) },
			apply: func(ctx context.Context, s *Store, rep *core.CounterRepair) error {
				err := s.repairCount(ctx, "paused slots", s.bucketPK(pausedSlots, i), "used", c.Revision, r.tally.paused[i])
				if err == nil {
					rep.PausedSlots += r.tally.paused[i] - c.Used
				}
				return err
			}}, strconv.Itoa(c.Used), c.Revision)
	}
	for _, k := range r.quotaKeys {
		c := r.stored[k]
		note(dueRepair{name: k, want: strconv.Itoa(r.tally.quota[k]),
			counted: func(t *slotTally, _ map[int]int) string { return strconv.Itoa(t.quota[k]) },
			apply: func(ctx context.Context, s *Store, rep *core.CounterRepair) error {
				err := s.repairCount(ctx, "slots", k, "used", c.Revision, r.tally.quota[k])
				if err == nil {
					rep.Counters++
				}
				return err
			}}, strconv.Itoa(c.Used), c.Revision)
	}
	return due
}

// isQuotaKey reports whether pk is a user's or tenant's slot count or a
// tenant's paused count.
func isQuotaKey(pk string) bool {
	return strings.HasPrefix(pk, "TEN#") || strings.HasPrefix(pk, "USR#") || strings.HasPrefix(pk, "TPA#")
}

// revisionMark is a counter's revision as a noted difference ends with it.
func revisionMark(n int64) string { return "|" + strconv.FormatInt(n, 10) }

// setBucketSlots sets bucket b's used and granted slots if its revision
// (moved by every take, free and grant) is still the one read (ErrConflict
// otherwise), moving the revision.
func (s *Store) setBucketSlots(ctx context.Context, b bucketItem, used, granted int) error {
	cond := valueIs("revision", b.Revision)
	return s.conditionalUpdate(ctx, "repair bucket slots", s.bucketPK(runningSlots, b.Index), cond,
		expression.Set(expression.Name("used"), expression.Value(used)).Set(expression.Name("granted"), expression.Value(granted)).
			Add(expression.Name("revision"), expression.Value(1)))
}

// valueIs is the condition that number attribute attr is still v (absent
// counts as 0).
func valueIs[N int | int64](attr string, v N) expression.ConditionBuilder {
	cond := expression.Name(attr).Equal(expression.Value(v))
	if v == 0 {
		cond = expression.Or(expression.AttributeNotExists(expression.Name(attr)), cond)
	}
	return cond
}

// conditionalUpdate applies upd to the item pk if cond holds
// (ErrConflict otherwise).
func (s *Store) conditionalUpdate(ctx context.Context, op, pk string, cond expression.ConditionBuilder, upd expression.UpdateBuilder) error {
	_, err := s.updateItem(ctx, op, s.key(pk), cond, upd, "", false)
	if _, failed := conditionFailed(err); failed {
		return fmt.Errorf("%s %s: %w", op, pk, core.ErrConflict)
	}
	return err
}

// rebalance rewrites the buckets' limits for limit (setLimits) when they
// are not set for it or a bucket holds more than its limit; a bucket that
// moved meanwhile leaves it to the next pass (or the next reservation).
func (s *Store) rebalance(ctx context.Context, buckets []bucketItem, limit int) (bool, error) {
	if !needsLimits(buckets, limit) {
		return false, nil
	}
	switch err := s.setLimits(ctx, runningSlots, buckets, limit); {
	case err == nil:
		return true, nil
	case errors.Is(err, core.ErrConflict):
		return false, nil
	default:
		return false, err
	}
}

// dropIdleTenants removes from the buckets' tenant sets every tenant whose
// slot count is zero (as read and as counted), each in one transaction
// with a check of its count, so that a tenant whose reservation lands
// meanwhile stays.
func (s *Store) dropIdleTenants(ctx context.Context, buckets []bucketItem, stored map[string]countItem, tally *slotTally) ([]string, error) {
	holders := map[string][]int{}
	for _, b := range buckets {
		for _, t := range b.Tenants {
			holders[t] = append(holders[t], b.Index)
		}
	}
	var dropped []string
	for _, t := range slices.Sorted(maps.Keys(holders)) {
		pk := tenantPK(s.deployment, t)
		if stored[pk].Used > 0 || tally.quota[pk] > 0 {
			continue
		}
		check, err := s.conditionCheck(pk, expression.Or(
			expression.AttributeNotExists(expression.Name("used")),
			expression.Name("used").LessThanEqual(expression.Value(0))))
		if err != nil {
			return dropped, fmt.Errorf("drop idle tenant: %w", err)
		}
		items := []types.TransactWriteItem{check}
		for _, b := range holders[t] {
			drop, err := s.txnUpdate(s.key(s.bucketPK(runningSlots, b)), nil,
				expression.Delete(expression.Name("tenants"), expression.Value(tenantSet(t))), false)
			if err != nil {
				return dropped, fmt.Errorf("drop idle tenant: %w", err)
			}
			items = append(items, drop)
		}
		switch err := s.transact(ctx, "drop idle tenant", items); {
		case err == nil:
			dropped = append(dropped, t)
		case errors.Is(err, core.ErrConflict): // the tenant holds slots
		default:
			return dropped, err
		}
	}
	return dropped, nil
}
