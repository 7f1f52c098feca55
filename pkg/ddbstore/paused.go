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

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// Paused slots (pause-parking). A record pausing, paused or resuming
// holds a paused slot, counted by the item
//
//	PAU#<deployment>  "used": paused slots held (SANDBOX_MAX_PAUSED),
//	                  "revision": moved by every take, free and repair
//
// which every transition taking or freeing one moves in the same
// transaction as the record; reconcile's repair compares the revision. The record says which slots it holds
// (no_running_slot, paused_slot), so Free returns exactly those.

var _ core.PauseStore = (*Store)(nil)

func pausedPK(deployment string) string { return "PAU#" + deployment }

// keepsParkTime reports whether a claim into st keeps the record's park
// time: the paused-slot states keep the warm park time (a pause given up
// returns to warm parked when it was) until the pause settles.
func keepsParkTime(st core.State) bool {
	switch st {
	case core.StateWarm, core.StatePausing, core.StatePaused, core.StateResuming:
		return true
	}
	return false
}

// pausedTake is the transaction item that takes one paused slot, within
// limit when limit > 0.
func (s *Store) pausedTake(limit int) (types.TransactWriteItem, error) {
	b := expression.NewBuilder().WithUpdate(revised(expression.Add(expression.Name("used"), expression.Value(1))))
	if limit > 0 {
		b = b.WithCondition(expression.Or(expression.AttributeNotExists(expression.Name("used")),
			expression.Name("used").LessThan(expression.Value(limit))))
	}
	return s.pausedCountItem(b)
}

// pausedRelease is the transaction item that frees one paused slot.
func (s *Store) pausedRelease() types.TransactWriteItem {
	it, err := s.pausedCountItem(expression.NewBuilder().WithUpdate(revised(expression.Add(expression.Name("used"), expression.Value(-1)))))
	if err != nil {
		panic(err) // a constant expression: cannot fail
	}
	return it
}

// revised makes a paused-count update also move the count's revision, so
// that a repair can tell a count that moved and came back from one that
// never moved.
func revised(u expression.UpdateBuilder) expression.UpdateBuilder {
	return u.Add(expression.Name("revision"), expression.Value(1))
}

// pausedCountItem is the transaction item of b on the paused count.
func (s *Store) pausedCountItem(b expression.Builder) (types.TransactWriteItem, error) {
	expr, err := b.Build()
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Update: &types.Update{TableName: &s.table, Key: s.key(pausedPK(s.deployment)),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()}}, nil
}

// slotsRelease are the transaction items that free the slots rec holds:
// its running slot (in its bucket, rec.Slot, with its user's and tenant's
// counts when it is in them) and its paused slot.
func (s *Store) slotsRelease(rec core.Record) ([]types.TransactWriteItem, error) {
	var items []types.TransactWriteItem
	if rec.Slots.Running() {
		var err error
		if items, err = s.slotRelease(nil, rec.ThreadKey, rec.Slot); err != nil {
			return nil, err
		}
	}
	if rec.Slots.Paused {
		items = append(items, s.pausedRelease())
	}
	return items, nil
}

// claimUpdate is the record update of a claim into to under c's lease
// (keeping the park time).
func (s *Store) claimUpdate(c core.Claim, to core.State, at time.Time) expression.UpdateBuilder {
	u := expression.Set(expression.Name("updated_at"), expression.Value(ms(c.Now))).
		Add(expression.Name("fence"), expression.Value(1)).
		Set(expression.Name("lease_owner"), expression.Value(c.Owner)).
		Set(expression.Name("lease_expires"), expression.Value(ms(c.LeaseUntil))).
		Set(expression.Name("prev_state"), expression.Name("state")).
		Set(expression.Name("state"), expression.Value(string(to)))
	return meter(s.stateIndex(u, to, at, c.SandboxID, core.ThreadKey{}), c.Now)
}

// recordTxnItem is a conditional update of the record in a transaction,
// returning the old item when its condition fails.
func (s *Store) recordTxnItem(id string, cond expression.ConditionBuilder, upd expression.UpdateBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Update: &types.Update{TableName: &s.table, Key: s.key(sandboxPK(id)),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld}}, nil
}

// claimRefusal says why a claim's record condition failed, from the item
// as it was (ErrNotFound, ErrConflict or ErrLeaseHeld, as Claim); user,
// when set, must own the record too.
func (s *Store) claimRefusal(ctx context.Context, c core.Claim, user string, r types.CancellationReason) error {
	if len(r.Item) == 0 {
		return core.ErrNotFound
	}
	old, err := s.decodeRecord(ctx, r.Item)
	if err != nil {
		return err
	}
	switch {
	case old.Tenant != c.Tenant, user != "" && old.User != user:
		return core.ErrNotFound
	case old.State != c.From[0]:
		return fmt.Errorf("sandbox %s is %s: %w", c.SandboxID, old.State, core.ErrConflict)
	}
	return fmt.Errorf("sandbox %s: %w", c.SandboxID, core.ErrLeaseHeld)
}

// ClaimPause implements core.PauseStore: one transaction of the record
// (warm to pausing, leased, holding a paused slot) and the paused count,
// then a read of the record.
func (s *Store) ClaimPause(ctx context.Context, c core.Claim, limit int) (core.Record, error) {
	c.From = []core.State{core.StateWarm}
	return s.claimPause(ctx, "claim pause", c, limit, nil)
}

// claimPause is ClaimPause from c.From, the record also meeting extra
// when set.
func (s *Store) claimPause(ctx context.Context, op string, c core.Claim, limit int, extra *expression.ConditionBuilder) (core.Record, error) {
	if c.LeaseUntil.IsZero() {
		return core.Record{}, fmt.Errorf("%s: a lease is required", op)
	}
	cond := claimCondition(c)
	if extra != nil {
		cond = cond.And(*extra)
	}
	upd := s.claimUpdate(c, core.StatePausing, c.Now).Set(expression.Name("paused_slot"), expression.Value(true))
	rec, err := s.recordTxnItem(c.SandboxID, cond, upd)
	if err != nil {
		return core.Record{}, fmt.Errorf("%s: %w", op, err)
	}
	take, err := s.pausedTake(limit)
	if err != nil {
		return core.Record{}, fmt.Errorf("%s: %w", op, err)
	}
	failed, err := s.writeTxn(ctx, op, []types.TransactWriteItem{rec, take})
	if r, ok := failed[sandboxPK(c.SandboxID)]; ok {
		return core.Record{}, s.claimRefusal(ctx, c, "", r)
	}
	if has(failed, pausedPK(s.deployment)) {
		return core.Record{}, fmt.Errorf("%s %s: %w", op, c.SandboxID, core.ErrPausedFull)
	}
	if err != nil {
		return core.Record{}, err
	}
	return s.Get(ctx, c.SandboxID)
}

// fenced is the condition that the record's fence is still fence and its
// state one of states.
func fenced(fence int64, states ...core.State) expression.ConditionBuilder {
	cond := expression.AttributeExists(expression.Name(AttrPK)).
		And(expression.Name("fence").Equal(expression.Value(fence)))
	if len(states) > 0 {
		rest := make([]expression.OperandBuilder, 0, len(states)-1)
		for _, st := range states[1:] {
			rest = append(rest, expression.Value(string(st)))
		}
		cond = cond.And(expression.Name("state").In(expression.Value(string(states[0])), rest...))
	}
	return cond
}

// settle runs a fenced transition of rec (in one of from) with the slot
// items that go with it; a failed record condition is ErrStaleFence.
func (s *Store) settle(ctx context.Context, op string, rec core.Record, now time.Time, from []core.State, upd expression.UpdateBuilder, slots ...types.TransactWriteItem) error {
	upd = meter(upd, now).Add(expression.Name("fence"), expression.Value(1)).
		Set(expression.Name("prev_state"), expression.Name("state")).
		Remove(expression.Name("lease_owner")).Remove(expression.Name("lease_expires"))
	it, err := s.recordTxnItem(rec.SandboxID, fenced(rec.Fence, from...), upd)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	failed, err := s.writeTxn(ctx, op, append([]types.TransactWriteItem{it}, slots...))
	if has(failed, sandboxPK(rec.SandboxID)) {
		return fmt.Errorf("%s %s fence %d: %w", op, rec.SandboxID, rec.Fence, core.ErrStaleFence)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s: condition failed on an unexpected item: %w", op, core.ErrConflict)
	}
	return err
}

// settled is rec as a settle leaves it (metered as meter does).
func settled(rec core.Record, st core.State, now time.Time) core.Record {
	rec.PrevMeteredAt, rec.MeteredAt, rec.MeteredState = rec.MeteredAt, now, rec.State
	if rec.PrevMeteredAt.IsZero() {
		rec.PrevMeteredAt = now
	}
	rec.PrevState, rec.State = rec.State, st
	rec.Fence++
	rec.LeaseOwner, rec.LeaseExpiresAt = "", time.Time{}
	rec.UpdatedAt = now
	return rec
}

// SettlePause implements core.PauseStore.
func (s *Store) SettlePause(ctx context.Context, rec core.Record, now time.Time) (core.Record, error) {
	return s.settlePause(ctx, "settle pause", rec, now, core.StatePaused, now)
}

// settlePause moves rec (pausing or resuming) to state to, indexed at at,
// holding its paused slot only: its running slot is freed.
func (s *Store) settlePause(ctx context.Context, op string, rec core.Record, now time.Time, to core.State, at time.Time) (core.Record, error) {
	upd := expression.Set(expression.Name("state"), expression.Value(string(to))).
		Set(expression.Name("updated_at"), expression.Value(ms(now))).
		Set(expression.Name("parked_at"), expression.Value(ms(now))).
		Set(expression.Name("no_running_slot"), expression.Value(true)).
		Set(expression.Name("paused_slot"), expression.Value(true)).
		Remove(expression.Name("expires_at")) // the provider does not end a paused sandbox: reconcile does (its TTL)
	upd = s.stateIndex(upd, to, at, rec.SandboxID, core.ThreadKey{}).
		Remove(expression.Name("bucket")).Remove(expression.Name("counted")).Remove(expression.Name("quota"))
	running := rec
	running.Slots = core.Slots{} // the running slot and its counters only
	release, err := s.slotsRelease(running)
	if err != nil {
		return core.Record{}, fmt.Errorf("%s: %w", op, err)
	}
	if err := s.settle(ctx, op, rec, now, []core.State{core.StatePausing, core.StateResuming}, upd, release...); err != nil {
		return core.Record{}, err
	}
	rec = settled(rec, to, now)
	rec.ParkedAt, rec.ExpiresAt, rec.Slots, rec.Slot = now, time.Time{}, core.Slots{NoRunning: true, Paused: true}, core.Slot{}
	return rec, nil
}

// AbortPause implements core.PauseStore.
func (s *Store) AbortPause(ctx context.Context, rec core.Record, now time.Time) (core.Record, error) {
	upd := expression.Set(expression.Name("parked_at"), expression.Value(ms(rec.ParkedAt)))
	return s.abortPause(ctx, "abort pause", rec, now, core.StateWarm, rec.ParkedAt, upd)
}

// abortPause moves rec (pausing) back to state to, indexed at at, with
// upd, and frees its paused slot.
func (s *Store) abortPause(ctx context.Context, op string, rec core.Record, now time.Time, to core.State, at time.Time, upd expression.UpdateBuilder) (core.Record, error) {
	upd = upd.Set(expression.Name("state"), expression.Value(string(to))).
		Set(expression.Name("updated_at"), expression.Value(ms(now))).
		Remove(expression.Name("paused_slot"))
	upd = s.stateIndex(upd, to, at, rec.SandboxID, rec.ThreadKey)
	if err := s.settle(ctx, op, rec, now, []core.State{core.StatePausing}, upd,
		s.pausedRelease()); err != nil {
		return core.Record{}, err
	}
	rec = settled(rec, to, now)
	rec.Slots = core.Slots{}
	return rec, nil
}

// ClaimResume implements core.PauseStore: one transaction of the record
// (paused to resuming, leased, holding a running slot again in a capacity
// bucket, as a reservation takes one: see takeSlot), the bucket and the
// user's and tenant's counters, then a read of the record.
func (s *Store) ClaimResume(ctx context.Context, r core.ResumeClaim) (core.Record, error) {
	c := r.Claim
	c.From = []core.State{core.StatePaused}
	if c.LeaseUntil.IsZero() {
		return core.Record{}, fmt.Errorf("claim resume: a lease is required")
	}
	c.Tenant = r.Key.Tenant
	_, err := s.takeSlotOrGrant(ctx, r.Limit, homeBucket(c.SandboxID, r.Limit), r.Grant, func(b int) error { return s.claimResumeIn(ctx, r, c, b) })
	if err != nil {
		return core.Record{}, err
	}
	return s.Get(ctx, c.SandboxID)
}

// claimResumeIn is ClaimResume's transaction, its running slot in bucket b.
func (s *Store) claimResumeIn(ctx context.Context, r core.ResumeClaim, c core.Claim, b int) error {
	upd := s.claimUpdate(c, core.StateResuming, c.Now).Remove(expression.Name("no_running_slot")).
		Set(expression.Name("bucket"), expression.Value(b)).
		Set(expression.Name("counted"), expression.Value(string(core.StateResuming))).
		Set(expression.Name("quota"), expression.Value(true))
	cond := claimCondition(c).And(expression.Name("user_id").Equal(expression.Value(r.Key.User)))
	rec, err := s.recordTxnItem(c.SandboxID, cond, upd)
	if err != nil {
		return fmt.Errorf("claim resume: %w", err)
	}
	take, err := s.slotTake(b, r.Limit, core.StateResuming, c.Tenant, r.Grant)
	if err != nil {
		return fmt.Errorf("claim resume: %w", err)
	}
	key := r.Key
	user, err := s.counterTake(userPK(s.deployment, key), r.MaxPerUser)
	if err != nil {
		return fmt.Errorf("claim resume: %w", err)
	}
	tenant, err := s.counterTake(tenantPK(s.deployment, c.Tenant), r.MaxPerTenant)
	if err != nil {
		return fmt.Errorf("claim resume: %w", err)
	}
	failed, err := s.writeTxn(ctx, "claim resume", append([]types.TransactWriteItem{rec, user, tenant}, take...))
	if f, ok := failed[sandboxPK(c.SandboxID)]; ok {
		return s.claimRefusal(ctx, c, key.User, f)
	}
	switch {
	case s.grantFailed(failed, r.Grant):
		return fmt.Errorf("claim resume: %w", core.ErrGrantLost)
	case has(failed, userPK(s.deployment, key)):
		return &core.CapacityError{Reason: core.RefusalUserQuota, RetryAfter: 5 * time.Second, Status: core.CapacityStatus{Limit: r.Limit}}
	case has(failed, tenantPK(s.deployment, key.Tenant)):
		return &core.CapacityError{Reason: core.RefusalTenantQuota, RetryAfter: 5 * time.Second, Status: core.CapacityStatus{Limit: r.Limit}}
	case has(failed, bucketPK(s.deployment, b)):
		return bucketRefusal(failed[bucketPK(s.deployment, b)].Item, r.Limit)
	case len(failed) > 0:
		return fmt.Errorf("claim resume: condition failed on an unexpected item: %w", core.ErrConflict)
	}
	return err
}

// SettleResume implements core.PauseStore.
func (s *Store) SettleResume(ctx context.Context, rec core.Record, now, expiresAt time.Time) (core.Record, error) {
	upd := expression.Set(expression.Name("state"), expression.Value(string(core.StateActive))).
		Set(expression.Name("updated_at"), expression.Value(ms(now))).
		Set(expression.Name("expires_at"), expression.Value(ms(expiresAt))).
		Set(expression.Name("paused_ms"), expression.Value(rec.PausedFor.Milliseconds())).
		Remove(expression.Name("parked_at")).Remove(expression.Name("paused_slot")).Remove(expression.Name("no_running_slot"))
	upd = s.stateIndex(upd, core.StateActive, now, rec.SandboxID, core.ThreadKey{})
	slots := []types.TransactWriteItem{s.pausedRelease()}
	if rec.Slot.Counted != "" && rec.Slot.Counted != core.StateActive {
		upd = upd.Set(expression.Name("counted"), expression.Value(string(core.StateActive)))
		bucket, err := s.bucketUpdate(rec.Slot.Bucket, nil, countMove(expression.UpdateBuilder{}, rec.Slot.Counted, core.StateActive))
		if err != nil {
			return core.Record{}, fmt.Errorf("settle resume: %w", err)
		}
		slots = append(slots, bucket)
		rec.Slot.Counted = core.StateActive
	}
	if err := s.settle(ctx, "settle resume", rec, now, []core.State{core.StateResuming, core.StateClaiming}, upd, slots...); err != nil {
		return core.Record{}, err
	}
	rec = settled(rec, core.StateActive, now)
	rec.ParkedAt, rec.ExpiresAt, rec.Slots = time.Time{}, expiresAt, core.Slots{}
	return rec, nil
}

// PausedParkedBefore implements core.PauseStore.
func (s *Store) PausedParkedBefore(ctx context.Context, t time.Time, limit int) ([]core.Record, error) {
	sk := expression.Key(AttrGSI1SK).LessThan(expression.Value(stateSK(t, "")))
	return s.recordsInState(ctx, core.StatePaused, &sk, limit)
}

// PausedUsed reads the number of paused slots held (strongly consistent).
func (s *Store) PausedUsed(ctx context.Context) (int, error) {
	used, _, err := s.pausedCount(ctx)
	return used, err
}

// pausedCount reads the paused count and its revision (strongly consistent).
func (s *Store) pausedCount(ctx context.Context) (used int, revision int64, err error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.GetItem(cctx, &dynamodb.GetItemInput{TableName: &s.table, Key: s.key(pausedPK(s.deployment)), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return 0, 0, unavailable("get paused count", err)
	}
	var c struct {
		Used     int   `dynamodbav:"used"`
		Revision int64 `dynamodbav:"revision"`
	}
	_ = attributevalue.UnmarshalMap(out.Item, &c) // absent attributes stay zero
	return c.Used, c.Revision, nil
}

// RepairPausedSlots implements core.PauseStore (a conditional write on
// the count).
func (s *Store) RepairPausedSlots(ctx context.Context, revision int64, counted int) error {
	return s.repairCount(ctx, "paused slots", pausedPK(s.deployment), "used", revision, counted)
}

// repairCount sets attribute attr of the count item pk to counted if the
// item's revision is still revision (ErrConflict otherwise), moving the
// revision.
func (s *Store) repairCount(ctx context.Context, what, pk, attr string, revision int64, counted int) error {
	cond := expression.Name("revision").Equal(expression.Value(revision))
	if revision == 0 {
		cond = expression.Or(expression.AttributeNotExists(expression.Name("revision")), cond)
	}
	expr, err := expression.NewBuilder().WithCondition(cond).
		WithUpdate(revised(expression.Set(expression.Name(attr), expression.Value(counted)))).Build()
	if err != nil {
		return fmt.Errorf("repair %s: %w", what, err)
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err = s.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{TableName: &s.table, Key: s.key(pk),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return fmt.Errorf("%s count moved since revision %d: %w", what, revision, core.ErrConflict)
	}
	if err != nil {
		return unavailable("repair "+what, err)
	}
	return nil
}
