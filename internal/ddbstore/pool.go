package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// The pre-warmed pool. Pool records and reservations name no thread
// (empty tenant, user and thread). The pool's places are a ledger of
// one bucket (poolPlaces, see ledger) whose limit is the pool's size. It
// counts pool reservations (refills in flight), pooled records, and
// thread-less records being paused or destroyed. Its item also keeps the
// refill's back-off ("refill_failures", "refill_until": RefillBackoff),
// which moves no revision.
//
// Every write that adds or removes one of those moves the count in the
// same transaction: ReservePool takes a place, ClaimPoolMember gives it
// back (the member becomes the thread's), and freeing a thread-less
// record or reservation (Free, FreeReservation) gives it back with the
// slot.

var _ core.PoolStore = (*Store)(nil)

// poolPlaceFreed is the transaction item that gives a pool place back.
func (s *Store) poolPlaceFreed() types.TransactWriteItem {
	return must(s.bucketUpdate(poolPlaces, 0, nil, slotFreed()))
}

// errPoolLimitUnset: the pool's place limit is not set for the size a
// refill enforces.
var errPoolLimitUnset = errors.New("pool place limit not set for this size")

// ReservePool takes a slot (in a running-slot bucket, as Reserve) and a
// pool place and writes the pool reservation, in one transaction. It sets
// the place limit first when the size changed (setLimits).
func (s *Store) ReservePool(ctx context.Context, r core.PoolReservation) error {
	for attempt := 0; ; attempt++ {
		b, err := s.takeSlot(ctx, r.Limit, homeBucket(r.Token, r.Limit), func(b int) error { return s.reservePoolIn(ctx, r, b) })
		if err == nil {
			s.slots.remember(r.Token, core.Slot{Ref: core.SlotRef(b)})
		}
		if !errors.Is(err, errPoolLimitUnset) {
			return err
		}
		if attempt >= limitAttempts {
			// Peers kept setting the limit for other sizes (a deploy
			// changing it): certainly not applied, as a full pool.
			return fmt.Errorf("reserve pool: %w", core.ErrPoolFull)
		}
		places, err := s.readLedger(ctx, poolPlaces, 0, true)
		if err != nil {
			return fmt.Errorf("reserve pool: %w", err)
		}
		if err := s.setLimits(ctx, poolPlaces, places, r.Size); err != nil && !errors.Is(err, core.ErrConflict) {
			return fmt.Errorf("reserve pool: %w", err)
		}
	}
}

// reservePoolIn is ReservePool in bucket b.
func (s *Store) reservePoolIn(ctx context.Context, r core.PoolReservation, b int) error {
	bucket, err := s.takeUpdate(b, r.Limit, "")
	if err != nil {
		return fmt.Errorf("reserve pool: %w", err)
	}
	place, err := s.bucketUpdate(poolPlaces, 0, takeCondition(r.Size, false), slotTaken())
	if err != nil {
		return fmt.Errorf("reserve pool: %w", err)
	}
	resItem, err := attributevalue.MarshalMap(item{
		PK: reservationPK(r.Token), SK: sortKey, State: string(core.StateCreating), Reservation: r.Token,
		Deployment: s.deployment, CreatedAt: ms(r.Now), UpdatedAt: ms(r.Now), ExpiresAt: ms(r.ExpiresAt),
		Bucket: b,
		GSI1PK: s.statePK(core.StateCreating, r.Token), GSI1SK: stateSK(r.Now, r.Token),
	})
	if err != nil {
		return fmt.Errorf("reserve pool: %w", err)
	}
	failed, err := s.writeTxn(ctx, "reserve pool", []types.TransactWriteItem{bucket, place, s.putNew(resItem)})
	switch {
	case len(failed) == 0:
		return err
	case has(failed, s.bucketPK(poolPlaces, 0)):
		if errors.Is(limitRefusal(failed[s.bucketPK(poolPlaces, 0)].Item, r.Size), errLimitsUnset) {
			return errPoolLimitUnset
		}
		return core.ErrPoolFull
	case has(failed, reservationPK(r.Token)):
		return fmt.Errorf("reservation %s exists: %w", r.Token, core.ErrConflict)
	}
	return bucketRefusal(failed[s.bucketPK(runningSlots, b)].Item, r.Limit)
}

// FinalizePool turns a pool reservation into a pooled record (its slot and
// place carry over, its bucket counting it pooled), in one transaction.
func (s *Store) FinalizePool(ctx context.Context, token string, rec core.Record) (core.Record, error) {
	rec.Fence = 1
	rec.ThreadKey = core.ThreadKey{}
	rec.State = core.StatePooled
	return s.consumeReservation(ctx, "finalize pool", token, rec, true)
}

// SomePoolMembers lists up to limit pooled records, the newest first
// (the oldest may be past their age, awaiting recycling): one query of
// the index key every member is filed under (poolShard).
func (s *Store) SomePoolMembers(ctx context.Context, limit int) ([]core.Record, error) {
	return s.inKey(ctx, core.StatePooled, s.statePK(core.StatePooled, ""), limit, true)
}

// PoolMembers lists pooled records, oldest first.
func (s *Store) PoolMembers(ctx context.Context, limit int) ([]core.Record, error) {
	return s.recordsInState(ctx, core.StatePooled, nil, limit)
}

// ClaimPoolMember binds a pooled member to a thread in one transaction:
// the record (pooled, thread-less -> claiming for the thread, under the
// claimer's lease), the binding, the ledger (not draining; the tenant
// joins its tenant set), the user's and tenant's counts (within their
// caps) and the pool's count (one place given back). A member parked
// paused takes a running slot in a running-slot bucket (as a reservation
// does, see takeSlot) and keeps its paused slot until its activation
// (SettleResume).
func (s *Store) ClaimPoolMember(ctx context.Context, c core.PoolClaim) (core.Record, error) {
	if !c.Member.Slots.Paused {
		return s.claimPoolMemberIn(ctx, c, int(c.Member.Slot.Ref))
	}
	var rec core.Record
	_, err := s.takeSlotOrGrant(ctx, c.Limit, threadHome(c.ThreadKey, c.Limit), c.Grant, func(b int) error {
		var err error
		rec, err = s.claimPoolMemberIn(ctx, c, b)
		return err
	})
	return rec, err
}

// claimPoolMemberIn is ClaimPoolMember, the thread's running slot in
// bucket b (a running member's own slot, or one a paused member takes).
func (s *Store) claimPoolMemberIn(ctx context.Context, c core.PoolClaim, b int) (core.Record, error) {
	m := c.Member
	recItem, err := s.poolClaimRecord(c, b)
	if err != nil {
		return core.Record{}, fmt.Errorf("claim pool member: %w", err)
	}
	bind, err := s.bindingPut(c.ThreadKey, m.SandboxID, c.Now, replaceCondition(c.ReplaceSandboxID, c.ReplaceReservation))
	if err != nil {
		return core.Record{}, fmt.Errorf("claim pool member: %w", err)
	}
	capItems, err := s.poolClaimSlot(c, b)
	if err != nil {
		return core.Record{}, fmt.Errorf("claim pool member: %w", err)
	}
	failed, err := s.writeTxn(ctx, "claim pool member", append([]types.TransactWriteItem{recItem, bind, s.poolPlaceFreed()}, capItems...))
	if done, ok := s.poolClaimApplied(ctx, c, failed); ok {
		return done, nil
	}
	if err := s.poolClaimRefusal(c, b, failed, err); err != nil {
		return core.Record{}, err
	}
	rec := m
	rec.ThreadKey, rec.Seed = c.ThreadKey, c.Seed()
	rec.State, rec.PrevState = core.StateClaiming, core.StatePooled
	rec.Fence++
	rec.LeaseOwner, rec.LeaseExpiresAt = c.Owner, c.LeaseUntil
	rec.UpdatedAt = c.Now
	rec.PrevMeteredAt, rec.MeteredAt, rec.MeteredState = poolMetered(m, c.Now), c.Now, core.StatePooled
	rec.Slot = core.Slot{Ref: core.SlotRef(b), Quota: true}
	if m.Slots.Paused {
		rec.Slots = core.Slots{Paused: true, PausedRef: m.Slots.PausedRef}
	}
	return rec, nil
}

// poolClaimRecord is the transaction item moving c's member from pooled
// to claiming for c's thread, its running slot in bucket b: a running
// member's own slot, as listed; a paused member holds none yet.
func (s *Store) poolClaimRecord(c core.PoolClaim, b int) (types.TransactWriteItem, error) {
	m := c.Member
	upd := expression.Set(expression.Name("quota"), expression.Value(true))
	// The member as listed: its fence unchanged (no pause, abort or claim
	// since) and, listed running, still holding its running slot (a
	// member parked paused since holds none, and one whose slot was in the
	// first bucket then names no bucket, as slotCondition(m.Slot) expects).
	held := slotCondition(m.Slot).And(expression.AttributeNotExists(expression.Name("no_running_slot")))
	if m.Slots.Paused {
		held = expression.Name("paused_slot").Equal(expression.Value(true)).
			And(expression.Name("no_running_slot").Equal(expression.Value(true)))
		upd = upd.Set(expression.Name("bucket"), expression.Value(b)).Remove(expression.Name("no_running_slot"))
	}
	return s.recordTxnItem(m.SandboxID,
		expression.Name("state").Equal(expression.Value(string(core.StatePooled))).
			And(expression.AttributeExists(expression.Name(attrPoolPlace))).And(held).
			And(expression.Name("fence").Equal(expression.Value(m.Fence))),
		s.stateIndex(upd.Set(expression.Name("state"), expression.Value(string(core.StateClaiming))).
			Set(expression.Name("prev_state"), expression.Value(string(core.StatePooled))).
			Set(expression.Name("tenant"), expression.Value(c.Tenant)).
			Set(expression.Name("user_id"), expression.Value(c.User)).
			Set(expression.Name("thread_id"), expression.Value(c.Thread)).
			Set(expression.Name("seed"), expression.Value(c.Seed())).
			Set(expression.Name("lease_owner"), expression.Value(c.Owner)).
			Set(expression.Name("lease_expires"), expression.Value(ms(c.LeaseUntil))).
			Set(expression.Name("updated_at"), expression.Value(ms(c.Now))).
			Set(expression.Name("prev_metered_at"), expression.Value(ms(poolMetered(m, c.Now)))).
			Set(expression.Name("metered_at"), expression.Value(ms(c.Now))).
			Set(expression.Name("metered_state"), expression.Value(string(core.StatePooled))).
			Remove(expression.Name(attrPoolPlace)).
			Add(expression.Name("fence"), expression.Value(1)), core.StateClaiming, c.Now, m.SandboxID, core.ThreadKey{}))
}

// poolClaimSlot is the transaction items of c's slot in bucket b: the
// user's and tenant's counts, and a slot taken (a paused member) or the
// draining check of the member's own bucket (a running one).
func (s *Store) poolClaimSlot(c core.PoolClaim, b int) ([]types.TransactWriteItem, error) {
	user, err := s.counterTake(userPK(s.deployment, c.ThreadKey), c.MaxPerUser)
	if err != nil {
		return nil, err
	}
	tenant, err := s.counterTake(tenantPK(s.deployment, c.Tenant), tenantBound(c))
	if err != nil {
		return nil, err
	}
	tenant.Update.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	items := []types.TransactWriteItem{user, tenant}
	if c.Member.Slots.Paused {
		take, err := s.slotTake(b, c.Limit, c.Tenant, c.Grant)
		return append(items, take...), err
	}
	notDrain := notDraining()
	check, err := s.bucketUpdate(runningSlots, b, &notDrain, expression.Add(expression.Name("tenants"), expression.Value(tenantSet(c.Tenant))))
	return append(items, check), err
}

// poolClaimApplied reports whether a claim refused on its member finds it
// claimed already by this claim: the SDK sends a transaction again when
// a reply is lost, and the member claimed for this thread under this
// claimer's lease is this claim, applied.
func (s *Store) poolClaimApplied(ctx context.Context, c core.PoolClaim, failed map[string]types.CancellationReason) (core.Record, bool) {
	r, ok := failed[sandboxPK(c.Member.SandboxID)]
	if !ok || len(r.Item) == 0 {
		return core.Record{}, false
	}
	old, err := s.decodeRecord(ctx, r.Item)
	if err != nil || old.State != core.StateClaiming || old.ThreadKey != c.ThreadKey || old.LeaseOwner != c.Owner {
		return core.Record{}, false
	}
	return old, true
}

// poolClaimRefusal says why c's transaction in bucket b failed (err, the
// items refused): a lost race for the member first (the caller tries the
// next one), then the thread's binding, then the quotas, draining (or,
// for a paused member, a full bucket) last. Nil when it applied.
func (s *Store) poolClaimRefusal(c core.PoolClaim, b int, failed map[string]types.CancellationReason, err error) error {
	switch {
	case has(failed, sandboxPK(c.Member.SandboxID)):
		return fmt.Errorf("pool member %s: %w", c.Member.SandboxID, core.ErrConflict)
	case has(failed, bindingPK(c.ThreadKey)):
		return fmt.Errorf("thread %s: %w", c.ThreadKey, core.ErrThreadBound)
	case s.grantFailed(failed, c.Grant):
		return fmt.Errorf("claim pool member: %w", core.ErrGrantLost)
	case has(failed, userPK(s.deployment, c.ThreadKey)):
		return &core.CapacityError{Reason: api.RefusalUserQuota, RetryAfter: 5 * time.Second}
	case has(failed, tenantPK(s.deployment, c.Tenant)):
		return tenantRefusal(c, failed[tenantPK(s.deployment, c.Tenant)].Item)
	case has(failed, s.bucketPK(runningSlots, b)) && c.Member.Slots.Paused:
		return bucketRefusal(failed[s.bucketPK(runningSlots, b)].Item, c.Limit)
	case has(failed, s.bucketPK(runningSlots, b)):
		return &core.CapacityError{Reason: api.RefusalDraining, Status: core.CapacityStatus{Draining: true}}
	case len(failed) > 0:
		return fmt.Errorf("claim pool member: condition failed on an unexpected item: %w", core.ErrConflict)
	}
	return err
}

// tenantBound is the count a pool claim's tenant must stay below: its
// quota (c.MaxPerTenant), or its fair share (c.Below) when lower; 0 for
// none.
func tenantBound(c core.PoolClaim) int {
	bound := c.MaxPerTenant
	if c.Below != nil && (bound == 0 || c.Below.Slots < bound) {
		bound = c.Below.Slots
	}
	return bound
}

// tenantRefusal is why a pool claim's tenant count refused it, from the
// count as found (old): its quota when it holds c.MaxPerTenant slots,
// else its fair share (c.Below).
func tenantRefusal(c core.PoolClaim, old map[string]types.AttributeValue) error {
	used := decodeCounter(old) // an absent count is zero
	if c.Below == nil || (c.MaxPerTenant > 0 && used >= c.MaxPerTenant) {
		return &core.CapacityError{Reason: api.RefusalTenantQuota, RetryAfter: 5 * time.Second}
	}
	return fmt.Errorf("tenant %s holds %d slots: %w", c.Tenant, used, core.ErrAtFairShare)
}

// ClaimPoolPause implements core.PoolStore: ClaimPause of a pooled member
// holding a running slot.
func (s *Store) ClaimPoolPause(ctx context.Context, c core.Claim, limit int) (core.Record, error) {
	c.From, c.Tenant = []core.State{core.StatePooled}, ""
	running := expression.AttributeExists(expression.Name(attrPoolPlace)).
		And(expression.AttributeNotExists(expression.Name("no_running_slot")))
	return s.claimPause(ctx, pauseClaim{op: "claim pool pause", c: c, limit: limit, cond: &running})
}

// SettlePoolPause implements core.PoolStore: the member is pooled again
// (indexed by its creation, as FinalizePool has it), holding its paused
// slot only.
func (s *Store) SettlePoolPause(ctx context.Context, rec core.Record, now time.Time) (core.Record, error) {
	return s.settlePause(ctx, "settle pool pause", rec, now, core.StatePooled, rec.CreatedAt)
}

// AbortPoolPause implements core.PoolStore: the member is pooled again,
// running, its paused slot freed.
func (s *Store) AbortPoolPause(ctx context.Context, rec core.Record, now time.Time) (core.Record, error) {
	return s.abortPause(ctx, "abort pool pause", rec, now, core.StatePooled, rec.CreatedAt, expression.UpdateBuilder{})
}

// poolMetered is when member m's usage was last metered (its time in the
// pool starts there), now for a member written before metering.
func poolMetered(m core.Record, now time.Time) time.Time {
	if m.MeteredAt.IsZero() {
		return now
	}
	return m.MeteredAt
}

// AdoptPoolSandbox records an untracked pool sandbox (a refill that died
// after its create, or a sandbox whose record is gone) as rec, thread-less: consuming the reservation when
// given (its slot and place carry over), else taking a slot and a place
// without a limit check (the sandbox exists whatever the counts say).
func (s *Store) AdoptPoolSandbox(ctx context.Context, rec core.Record, reservation string) (core.Record, error) {
	rec.ThreadKey = core.ThreadKey{}
	rec.Slots = core.Slots{}
	return s.adopt(ctx, "adopt pool sandbox "+rec.SandboxID, core.Adoption{Record: rec, Reservation: reservation}, true)
}

// notLivePut is the put of a pool record that replaces no record, or a
// gone one (a sandbox whose kill did not take: it holds no slot and no
// place).
func (s *Store) notLivePut(item map[string]types.AttributeValue) types.TransactWriteItem {
	notLive := "attribute_not_exists(pk) OR #state = :gone"
	return types.TransactWriteItem{Put: &types.Put{TableName: &s.table, Item: item, ConditionExpression: &notLive,
		ExpressionAttributeNames:  map[string]string{"#state": "state"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":gone": &types.AttributeValueMemberS{Value: string(core.StateGone)}}}}
}

// PoolCount reads the pool's taken places (strongly consistent; 0 if none).
func (s *Store) PoolCount(ctx context.Context) (int, error) {
	places, err := s.readLedger(ctx, poolPlaces, 0, true)
	n, _ := usedSum(places)
	return n, err
}

// RepairPoolPlaces implements core.PoolPlaceStore (a conditional write on the
// count, compared with the revision the caller read).
func (s *Store) RepairPoolPlaces(ctx context.Context, revision int64, counted int) error {
	return s.repairCount(ctx, "pool places", s.bucketPK(poolPlaces, 0), "used", revision, counted)
}

// attrPoolPlace marks a thread-less record holding a pool place (a
// pooled member, or a leftover adopted for its kill); a claim removes it.
const attrPoolPlace = "pool_place"

// errNotPoolRecord: the record holds no pool place (Free goes on as for
// any record).
var errNotPoolRecord = errors.New("not a pool record")

// freePoolRecord marks a record holding a pool place gone and gives back
// its slot and place (Free of a pool member), in one transaction;
// errNotPoolRecord when the record holds no place.
func (s *Store) freePoolRecord(ctx context.Context, rec core.Record, now time.Time) error {
	recUpdate, err := s.goneUpdate(rec, now, true)
	if err != nil {
		return fmt.Errorf("free pool member: %w", err)
	}
	release, err := s.slotsRelease(rec) // a running slot, a paused one, or both (a member being paused)
	items := append([]types.TransactWriteItem{recUpdate, s.poolPlaceFreed()}, release...)
	if err != nil {
		return fmt.Errorf("free pool member: %w", err)
	}
	failed, err := s.writeTxn(ctx, "free pool member", items)
	if r, ok := failed[sandboxPK(rec.SandboxID)]; ok {
		if old := r.Item; old != nil && old[attrPoolPlace] == nil {
			if f, _ := old["fence"].(*types.AttributeValueMemberN); f != nil && f.Value == fmt.Sprint(rec.Fence) {
				return errNotPoolRecord
			}
		}
		return fmt.Errorf("free sandbox %s fence %d: %w", rec.SandboxID, rec.Fence, core.ErrStaleFence)
	}
	return err
}

// freePoolReservation drops a pool reservation and gives back its slot and
// place (FreeReservation of a refill whose create failed or crashed).
func (s *Store) freePoolReservation(ctx context.Context, token string) error {
	failed, err := s.releaseReservation(ctx, "free pool reservation", token, core.ThreadKey{}, false, s.poolPlaceFreed())
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("free pool reservation %s: %w", token, core.ErrConflict)
	}
	return nil
}

// RefillBackoff reads the refill's back-off state from the pool places'
// item (strongly consistent; the zero value when none is set).
func (s *Store) RefillBackoff(ctx context.Context) (core.RefillBackoff, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.GetItem(cctx, &dynamodb.GetItemInput{TableName: &s.table, Key: s.key(s.bucketPK(poolPlaces, 0)),
		ConsistentRead: aws.Bool(true), ProjectionExpression: aws.String("refill_failures, refill_until")})
	if err != nil {
		return core.RefillBackoff{}, unavailable("get pool refill back-off", err)
	}
	var b struct {
		Failures int   `dynamodbav:"refill_failures"`
		Until    int64 `dynamodbav:"refill_until"`
	}
	if err := attributevalue.UnmarshalMap(out.Item, &b); err != nil {
		return core.RefillBackoff{}, fmt.Errorf("decode pool refill back-off: %w", err)
	}
	return core.RefillBackoff{Failures: b.Failures, Until: fromMS(b.Until)}, nil
}

// SetRefillBackoff writes the refill's back-off state on the pool places'
// item (one unconditional update; the zero value removes it).
func (s *Store) SetRefillBackoff(ctx context.Context, b core.RefillBackoff) error {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	in := &dynamodb.UpdateItemInput{TableName: &s.table, Key: s.key(s.bucketPK(poolPlaces, 0)),
		UpdateExpression: aws.String("REMOVE refill_failures, refill_until")}
	if b != (core.RefillBackoff{}) {
		in.UpdateExpression = aws.String("SET refill_failures = :f, refill_until = :u")
		in.ExpressionAttributeValues = map[string]types.AttributeValue{
			":f": &types.AttributeValueMemberN{Value: fmt.Sprint(b.Failures)},
			":u": &types.AttributeValueMemberN{Value: fmt.Sprint(ms(b.Until))}}
	}
	if _, err := s.db.UpdateItem(cctx, in); err != nil {
		return unavailable("set pool refill back-off", err)
	}
	return nil
}
