package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// The counter repair keeps, between reconcile passes, the differences it
// saw (pk REC#<deployment>, sk COUNTS, attribute "noted": counter name ->
// "<stored>|<counted>"); a difference is corrected only when the next pass
// sees it again, unchanged.
const countsSK = "COUNTS"

// slotTally is what the state index says one counter should be.
type slotTally struct {
	used   [CapacityBuckets]int
	counts [CapacityBuckets]map[string]int
	quota  map[string]int     // USR#/TEN# key -> slots counted in it
	paused [PausedBuckets]int // records holding a paused slot, by paused bucket
	pool   int                // pool places held
}

// tallyStates are the states a tally reads: those holding running slots,
// and the paused records (a paused slot only).
var tallyStates = append(slices.Clone(slotStates), core.StatePaused)

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

// tallySlots reads every slot-holding index entry (the whole fleet: for
// reconcile only), one query of each index key of tallyStates, and
// returns the tally of every counter kept with the slots and up to
// maxItems entries an older version stored (not counted per state, or
// not in the quota counts).
func (s *Store) tallySlots(ctx context.Context, maxItems int) (*slotTally, []item, error) {
	t := &slotTally{quota: map[string]int{}}
	for b := range t.counts {
		t.counts[b] = map[string]int{}
	}
	var legacy []item
	for _, st := range tallyStates {
		var derr error
		err := s.eachInState(ctx, st, nil, 0, func(av map[string]types.AttributeValue) bool {
			var it item
			if derr = attributevalue.UnmarshalMap(av, &it); derr != nil {
				return false
			}
			if holdsPausedSlot(st, it) {
				t.paused[pausedBucketOf(it.PausedBucket)]++
			}
			if holdsPoolPlace(st, it) {
				t.pool++
			}
			if it.NoRunningSlot || st == core.StatePaused {
				return true // paused (or its tombstone): no running slot, no counts
			}
			b := min(max(it.Bucket, 0), CapacityBuckets-1)
			t.used[b]++
			if it.Counted != "" {
				t.counts[b][it.Counted]++
			}
			k := core.ThreadKey{Tenant: it.Tenant, User: it.User, Thread: it.Thread}
			if it.Quota {
				t.quota[tenantPK(s.deployment, k.Tenant)]++
				t.quota[userPK(s.deployment, k)]++
			} else {
				t.quota[tenantPK(s.deployment, k.Tenant)] += 0
				t.quota[userPK(s.deployment, k)] += 0
			}
			if (it.Counted == "" || !it.Quota) && len(legacy) < maxItems {
				legacy = append(legacy, it)
			}
			return true
		})
		if err == nil {
			err = derr
		}
		if err != nil {
			return nil, nil, fmt.Errorf("tally %s: %w", st, err)
		}
	}
	return t, legacy, nil
}

// RepairCounters implements core.ReconcileStore.
func (s *Store) RepairCounters(ctx context.Context, limit, maxItems int) (core.CounterRepair, error) {
	var rep core.CounterRepair
	buckets, _, err := s.readBuckets(ctx, "", true)
	if err != nil {
		return rep, err
	}
	prev, err := s.notedCounts(ctx)
	if err != nil {
		return rep, err
	}
	// The paused buckets and the pool count are read before the tally, as
	// the capacity buckets: a take or free between the two moves their
	// revision.
	paused, pool, tally, legacy, err := s.countHolders(ctx, maxItems)
	if err != nil {
		return rep, err
	}
	rep.Pool = &pool
	// Slots held in trust for granted tickets are in no index: count them
	// from the queue.
	grants, err := s.queueGrants(ctx)
	if err != nil {
		return rep, err
	}
	for b, n := range grants {
		tally.used[b] += n
	}
	// The users' and tenants' counts: those the index names, those the
	// fair-share sets name, and those noted last time.
	quotaKeys := map[string]bool{}
	for k := range tally.quota {
		quotaKeys[k] = true
	}
	for _, b := range buckets {
		for _, t := range b.Tenants {
			quotaKeys[tenantPK(s.deployment, t)] = true
		}
	}
	for k := range prev {
		if strings.HasPrefix(k, "TEN#") || strings.HasPrefix(k, "USR#") {
			quotaKeys[k] = true
		}
	}
	stored, err := s.readCounters(ctx, slices.Sorted(maps.Keys(quotaKeys)))
	if err != nil {
		return rep, err
	}

	noted := map[string]string{}
	var errs []error
	// note records a difference and reports whether the last pass saw it too.
	note := func(name string, have, want int, extra string) bool {
		if have == want {
			return false
		}
		v := fmt.Sprintf("%d|%d%s", have, want, extra)
		noted[name] = v
		return prev[name] == v
	}
	for _, b := range buckets {
		rev := "|" + strconv.FormatInt(b.Revision, 10)
		if note("used#"+strconv.Itoa(b.Index), b.Used, tally.used[b.Index], rev) {
			switch err := s.setBucketUsed(ctx, b, tally.used[b.Index]); {
			case err == nil:
				rep.Slots += tally.used[b.Index] - b.Used
			case !errors.Is(err, core.ErrConflict):
				errs = append(errs, err)
			}
		}
		if note("granted#"+strconv.Itoa(b.Index), b.Granted, grants[b.Index], "") {
			switch err := s.casCounter(ctx, bucketPK(s.deployment, b.Index), "granted", b.Granted, grants[b.Index]); {
			case err == nil:
				rep.Counters++
			case !errors.Is(err, core.ErrConflict):
				errs = append(errs, err)
			}
		}
		states := maps.Clone(b.Counts)
		maps.Copy(states, tally.counts[b.Index])
		for st := range states {
			have, want := b.Counts[st], tally.counts[b.Index][st]
			if note("n#"+strconv.Itoa(b.Index)+"#"+st, have, want, "") {
				switch err := s.casCounter(ctx, bucketPK(s.deployment, b.Index), countAttr(core.State(st)), have, want); {
				case err == nil:
					rep.Counters++
				case !errors.Is(err, core.ErrConflict):
					errs = append(errs, err)
				}
			}
		}
	}
	for b, c := range paused {
		if note("paused#"+strconv.Itoa(b), c.Used, tally.paused[b], "|"+strconv.FormatInt(c.Revision, 10)) {
			switch err := s.repairCount(ctx, "paused slots", pausedPK(s.deployment, b), "used", c.Revision, tally.paused[b]); {
			case err == nil:
				rep.PausedSlots += tally.paused[b] - c.Used
			case !errors.Is(err, core.ErrConflict):
				errs = append(errs, err)
			}
		}
	}
	for k := range quotaKeys {
		if note(k, stored[k], tally.quota[k], "") {
			switch err := s.casCounter(ctx, k, "used", stored[k], tally.quota[k]); {
			case err == nil:
				rep.Counters++
			case !errors.Is(err, core.ErrConflict):
				errs = append(errs, err)
			}
		}
	}
	for _, it := range legacy {
		switch err := s.countLegacy(ctx, it); {
		case err == nil:
			rep.Counted++
		case !errors.Is(err, core.ErrConflict):
			errs = append(errs, err)
		}
	}
	if rep.Counted > 0 {
		noted = map[string]string{} // the counts moved under the tally: note afresh next pass
	}
	if err := s.saveNotedCounts(ctx, noted); err != nil {
		errs = append(errs, err)
	}
	if rep.Slots == 0 && rep.Counted == 0 {
		// Rebalance from what was read (a repair would have moved "used").
		rebalanced, err := s.rebalance(ctx, buckets, limit)
		rep.Rebalanced = rebalanced
		if err != nil {
			errs = append(errs, err)
		}
	}
	dropped, err := s.dropIdleTenants(ctx, buckets, stored, tally)
	rep.TenantsDropped = dropped
	if err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

// CountHolders reads the paused slots held and the pool place count
// (with revisions: the paused buckets' summed), then counts their holders
// from the state index, as RepairCounters does; it repairs nothing.
func (s *Store) CountHolders(ctx context.Context) (paused, pool core.HolderCount, err error) {
	counts, pool, tally, _, err := s.countHolders(ctx, 0)
	if err != nil {
		return paused, pool, err
	}
	sum := pausedSum(counts)
	paused = core.HolderCount{Used: sum.Used, Revision: sum.Revision}
	for _, n := range tally.paused {
		paused.Counted += n
	}
	return paused, pool, nil
}

// countHolders reads the paused buckets and the pool place count with
// their revisions (strongly consistent), then tallies the state index
// (tallySlots): their holders, and every other counter's.
func (s *Store) countHolders(ctx context.Context, maxItems int) (paused []countItem, pool core.HolderCount, tally *slotTally, legacy []item, err error) {
	if paused, err = s.readPaused(ctx, true); err != nil {
		return nil, pool, nil, nil, err
	}
	if pool.Used, pool.Revision, err = s.poolPlaces(ctx, true); err != nil {
		return nil, pool, nil, nil, err
	}
	if tally, legacy, err = s.tallySlots(ctx, maxItems); err != nil {
		return nil, pool, nil, nil, err
	}
	pool.Counted = tally.pool
	return paused, pool, tally, legacy, nil
}

// readCounters reads the "used" of the USR#/TEN# counters keys (absent: 0).
func (s *Store) readCounters(ctx context.Context, keys []string) (map[string]int, error) {
	avs := make([]map[string]types.AttributeValue, 0, len(keys))
	for _, k := range keys {
		avs = append(avs, s.key(k))
	}
	items, err := s.batchGetAll(ctx, avs)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, av := range items {
		if pk, _ := av[AttrPK].(*types.AttributeValueMemberS); pk != nil {
			out[pk.Value] = decodeCounter(av)
		}
	}
	return out, nil
}

// notedCounts reads the differences the last repair noted.
func (s *Store) notedCounts(ctx context.Context) (map[string]string, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.GetItem(cctx, &dynamodb.GetItemInput{TableName: &s.table, Key: keySK(reconcilePK(s.deployment), countsSK),
		ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, unavailable("get noted counts", err)
	}
	var it struct {
		Noted map[string]string `dynamodbav:"noted"`
	}
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return nil, fmt.Errorf("decode noted counts: %w", err)
	}
	return it.Noted, nil
}

func (s *Store) saveNotedCounts(ctx context.Context, noted map[string]string) error {
	av, err := attributevalue.MarshalMap(struct {
		Noted map[string]string `dynamodbav:"noted"`
	}{noted})
	if err != nil {
		return fmt.Errorf("save noted counts: %w", err)
	}
	maps.Copy(av, keySK(reconcilePK(s.deployment), countsSK))
	return s.transact(ctx, "save noted counts", []types.TransactWriteItem{{Put: &types.Put{TableName: &s.table, Item: av}}})
}

// setBucketUsed sets bucket b's used count if its revision is still the
// one read (ErrConflict otherwise), bumping the revision.
func (s *Store) setBucketUsed(ctx context.Context, b bucketItem, used int) error {
	cond := expression.Name("revision").Equal(expression.Value(b.Revision))
	if b.Revision == 0 {
		cond = expression.Or(expression.AttributeNotExists(expression.Name("revision")), cond)
	}
	return s.conditionalUpdate(ctx, "repair bucket used", bucketPK(s.deployment, b.Index), cond,
		expression.Set(expression.Name("used"), expression.Value(used)).Add(expression.Name("revision"), expression.Value(1)))
}

// casCounter sets attribute attr of item pk from have to want
// (ErrConflict if it is no longer have; absent counts as 0).
func (s *Store) casCounter(ctx context.Context, pk, attr string, have, want int) error {
	cond := expression.Name(attr).Equal(expression.Value(have))
	if have == 0 {
		cond = expression.Or(expression.AttributeNotExists(expression.Name(attr)), cond)
	}
	return s.conditionalUpdate(ctx, "repair "+attr, pk, cond, expression.Set(expression.Name(attr), expression.Value(want)))
}

func (s *Store) conditionalUpdate(ctx context.Context, op, pk string, cond expression.ConditionBuilder, upd expression.UpdateBuilder) error {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err = s.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{TableName: &s.table, Key: s.key(pk),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return fmt.Errorf("%s %s: %w", op, pk, core.ErrConflict)
	}
	if err != nil {
		return unavailable(op, err)
	}
	return nil
}

// countLegacy counts a record (or reservation) an older version stored:
// in its bucket's per-state count and in its user's and tenant's slot
// counts, with the flags that say so, in one transaction conditional on
// the item being unchanged since read (its fence; a reservation's flags).
func (s *Store) countLegacy(ctx context.Context, it item) error {
	cond := expression.AttributeExists(expression.Name(AttrPK)).And(expression.Name("state").Equal(expression.Value(it.State)))
	if strings.HasPrefix(it.PK, "SBX#") {
		cond = cond.And(expression.Name("fence").Equal(expression.Value(it.Fence)))
	}
	slot := core.Slot{Bucket: it.Bucket, Counted: core.State(it.Counted), Quota: it.Quota}
	cond = cond.And(slotCondition(slot))
	upd := expression.Set(expression.Name("quota"), expression.Value(true))
	var bucketUpd expression.UpdateBuilder
	moves := it.Counted == ""
	if moves {
		upd = upd.Set(expression.Name("counted"), expression.Value(it.State))
		bucketUpd = countMove(bucketUpd, "", core.State(it.State))
	}
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return fmt.Errorf("count legacy: %w", err)
	}
	items := []types.TransactWriteItem{{Update: &types.Update{TableName: &s.table, Key: s.key(it.PK),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()}}}
	if moves {
		bucket, err := s.bucketUpdate(it.Bucket, nil, bucketUpd)
		if err != nil {
			return fmt.Errorf("count legacy: %w", err)
		}
		items = append(items, bucket)
	}
	if !it.Quota {
		k := core.ThreadKey{Tenant: it.Tenant, User: it.User, Thread: it.Thread}
		user, err := s.counterTake(userPK(s.deployment, k), 0)
		if err != nil {
			return fmt.Errorf("count legacy: %w", err)
		}
		tenant, err := s.counterTake(tenantPK(s.deployment, k.Tenant), 0)
		if err != nil {
			return fmt.Errorf("count legacy: %w", err)
		}
		items = append(items, user, tenant)
	}
	return s.transact(ctx, "count legacy "+it.PK, items)
}

// rebalance rewrites the buckets' limits for limit (setLimits) when they
// are not set for it or a bucket holds more than its limit; a bucket that
// moved meanwhile leaves it to the next pass (or the next reservation).
func (s *Store) rebalance(ctx context.Context, buckets []bucketItem, limit int) (bool, error) {
	if !needsLimits(buckets, limit) {
		return false, nil
	}
	switch err := s.setLimits(ctx, buckets, limit); {
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
func (s *Store) dropIdleTenants(ctx context.Context, buckets []bucketItem, stored map[string]int, tally *slotTally) ([]string, error) {
	holders := map[string][]int{}
	for _, b := range buckets {
		for _, t := range b.Tenants {
			holders[t] = append(holders[t], b.Index)
		}
	}
	var dropped []string
	for _, t := range slices.Sorted(maps.Keys(holders)) {
		pk := tenantPK(s.deployment, t)
		if stored[pk] > 0 || tally.quota[pk] > 0 {
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
			del := "DELETE #tenants :tenant"
			items = append(items, types.TransactWriteItem{Update: &types.Update{TableName: &s.table,
				Key: s.key(bucketPK(s.deployment, b)), UpdateExpression: &del,
				ExpressionAttributeNames:  map[string]string{"#tenants": "tenants"},
				ExpressionAttributeValues: map[string]types.AttributeValue{":tenant": tenantSet(t)}}})
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
