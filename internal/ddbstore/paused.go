package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Paused slots (pause-parking). A record pausing, paused or resuming
// holds a paused slot, counted in a bucket of the paused slots' ledger
// (pausedSlots, see ledger), whose limit is SANDBOX_MAX_PAUSED. Every
// transition taking or freeing a paused slot moves its bucket in the same
// transaction as the record; reconcile's counter repair compares each
// bucket with its holders. The record says which slots it holds
// (no_running_slot, paused_slot, paused_bucket), so Free returns exactly
// those. A pause checks the drain in the bucket it takes: SetDraining
// flags the paused buckets as it does the running slots'. A pause and its
// resume write their bucket in two transactions; 32 buckets keep them off
// BenchmarkHotKeys' hottest keys (docs/benchmarks.md).
const PausedBuckets = 32

var _ core.PauseStore = (*Store)(nil)

// pausedBucketOf is the paused bucket a record names, bounded (an item
// naming none, or one out of range, counts in bucket 0).
func pausedBucketOf(b int) int {
	if b < 0 || b >= PausedBuckets {
		return 0
	}
	return b
}

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

// pausedTake is the transaction item that takes one paused slot in
// bucket b under limit (none when 0: reconcile's adoption takes a slot
// whatever, the paused sandbox exists) and, for a pause (pausing), unless
// the deployment drains.
func (s *Store) pausedTake(b, limit int, pausing bool) (types.TransactWriteItem, error) {
	return s.bucketUpdate(pausedSlots, pausedBucketOf(b), takeCondition(limit, pausing), slotTaken())
}

// revised makes a count update also move the count's revision (see
// ledger).
func revised(u expression.UpdateBuilder) expression.UpdateBuilder {
	return u.Add(expression.Name("revision"), expression.Value(1))
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
		items = append(items, s.tenantPausedRelease(rec)...)
	}
	return items, nil
}

// tenantPausedRelease is the transaction items that free rec's paused
// slot: its paused bucket's, and its tenant's paused count when counted
// in it.
func (s *Store) tenantPausedRelease(rec core.Record) []types.TransactWriteItem {
	items := []types.TransactWriteItem{must(s.bucketUpdate(pausedSlots, pausedBucketOf(int(rec.Slots.PausedRef)), nil, slotFreed()))}
	if rec.Slots.TenantPaused && rec.Tenant != "" {
		items = append(items, s.counterRelease(tenantPausedPK(s.deployment, rec.Tenant)))
	}
	return items
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
	return s.txnUpdate(s.key(sandboxPK(id)), &cond, upd, true)
}

// claimRefusal says why a claim's record condition failed, from the item
// as it was (ErrNotFound, ErrConflict or ErrLeaseHeld, as Claim); user,
// when set, must own the record too.
func (s *Store) claimRefusal(ctx context.Context, c core.Claim, user string, r types.CancellationReason) error {
	old, err := s.oldRecord(ctx, r.Item)
	if err != nil {
		return err
	}
	if user != "" && old.User != user {
		return core.ErrNotFound
	}
	_, err = claimRefused(c, old)
	return err
}

// ClaimPause implements core.PauseStore: one transaction of the record
// (warm to pausing, leased, holding a paused slot) and a paused bucket
// (another when that one is full: see takeIn), then a read of the
// record.
func (s *Store) ClaimPause(ctx context.Context, c core.Claim, limit int) (core.Record, error) {
	c.From = []core.State{core.StateWarm}
	return s.claimPause(ctx, pauseClaim{op: "claim pause", c: c, limit: limit})
}

// ClaimReleasePause implements core.PauseStore: ClaimPause of a releasing
// record at the release's fence, parked now and ending at r.ExpiresAt.
// Its running-slot bucket is not written: the record keeps its running slot
// until the settle frees it (or the abort parks it warm).
func (s *Store) ClaimReleasePause(ctx context.Context, r core.ReleasePause) (core.Record, error) {
	c := r.Claim
	c.From = []core.State{core.StateReleasing}
	fence := expression.Name("fence").Equal(expression.Value(r.Fence))
	return s.claimPause(ctx, pauseClaim{op: "claim pause at release", c: c, limit: r.Limit, cond: &fence,
		set: func(u expression.UpdateBuilder) expression.UpdateBuilder {
			return u.Set(expression.Name("parked_at"), expression.Value(ms(c.Now))).
				Set(expression.Name("expires_at"), expression.Value(ms(r.ExpiresAt)))
		}})
}

// pauseClaim is a claim into pausing: c from c.From, taking a paused slot
// within limit, the record also meeting cond and updated by set when
// they are set; op names it in errors.
type pauseClaim struct {
	op    string
	c     core.Claim
	limit int
	cond  *expression.ConditionBuilder
	set   func(expression.UpdateBuilder) expression.UpdateBuilder
}

// claimPause runs p in the paused bucket a hash of the sandbox picks, or
// another with room (takeIn): ErrPausedFull when none has, ErrDraining
// when the deployment drains.
func (s *Store) claimPause(ctx context.Context, p pauseClaim) (core.Record, error) {
	if p.c.LeaseUntil.IsZero() {
		return core.Record{}, fmt.Errorf("%s: a lease is required", p.op)
	}
	var out core.Record
	_, err := s.takeIn(ctx, pausedSlots, p.limit, pausedSlots.homeOf(p.c.SandboxID, p.limit), func(b int) error {
		var err error
		out, err = s.claimPauseIn(ctx, p, b)
		return err
	})
	var full *ledgerFull
	switch {
	case errors.As(err, &full) && full.draining:
		return core.Record{}, fmt.Errorf("%s %s: %w", p.op, p.c.SandboxID, core.ErrDraining)
	case errors.As(err, &full):
		return core.Record{}, fmt.Errorf("%s %s: %w", p.op, p.c.SandboxID, core.ErrPausedFull)
	}
	return out, err
}

// claimPauseIn is claimPause's transaction, its paused slot in bucket b:
// errBucketFull or errLimitsUnset when b refuses it (limitRefusal),
// ErrDraining when it says the
// deployment drains.
func (s *Store) claimPauseIn(ctx context.Context, p pauseClaim, b int) (core.Record, error) {
	c, op := p.c, p.op
	cond := claimCondition(c)
	if p.cond != nil {
		cond = cond.And(*p.cond)
	}
	upd := s.claimUpdate(c, core.StatePausing, c.Now).Set(expression.Name("paused_slot"), expression.Value(true)).
		Set(expression.Name("paused_bucket"), expression.Value(b))
	if c.Tenant != "" {
		upd = upd.Set(expression.Name("paused_tenant"), expression.Value(true))
	}
	if p.set != nil {
		upd = p.set(upd)
	}
	rec, err := s.recordTxnItem(c.SandboxID, cond, upd)
	if err != nil {
		return core.Record{}, fmt.Errorf("%s: %w", op, err)
	}
	take, err := s.pausedTake(b, p.limit, true)
	if err != nil {
		return core.Record{}, fmt.Errorf("%s: %w", op, err)
	}
	items := []types.TransactWriteItem{rec, take}
	if c.Tenant != "" {
		// The tenant's paused count, which a pause evicting another
		// tenant's paused sandbox compares (core.PausedBelow).
		count, err := s.counterTake(tenantPausedPK(s.deployment, c.Tenant), 0)
		if err != nil {
			return core.Record{}, fmt.Errorf("%s: %w", op, err)
		}
		items = append(items, count)
	}
	failed, err := s.writeTxn(ctx, op, items)
	if r, ok := failed[sandboxPK(c.SandboxID)]; ok {
		return core.Record{}, s.claimRefusal(ctx, c, "", r)
	}
	if r, ok := failed[s.bucketPK(pausedSlots, pausedBucketOf(b))]; ok {
		if decodeBucket(r.Item).Draining {
			return core.Record{}, fmt.Errorf("%s: %w", op, core.ErrDraining)
		}
		return core.Record{}, limitRefusal(r.Item, p.limit)
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
		Remove(expression.Name("bucket")).Remove(expression.Name("quota"))
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
	rec.ParkedAt, rec.ExpiresAt, rec.Slot = now, time.Time{}, core.Slot{}
	rec.Slots = core.Slots{NoRunning: true, Paused: true, PausedRef: rec.Slots.PausedRef, TenantPaused: rec.Slots.TenantPaused}
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
		Remove(expression.Name("paused_slot")).Remove(expression.Name("paused_bucket")).Remove(expression.Name("paused_tenant"))
	upd = s.stateIndex(upd, to, at, rec.SandboxID, rec.ThreadKey)
	if err := s.settle(ctx, op, rec, now, []core.State{core.StatePausing}, upd, s.tenantPausedRelease(rec)...); err != nil {
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
	_, err := s.takeSlotOrGrant(ctx, r.Limit, threadHome(r.Key, r.Limit), r.Grant, func(b int) error { return s.claimResumeIn(ctx, r, c, b) })
	if err != nil {
		return core.Record{}, err
	}
	return s.Get(ctx, c.SandboxID)
}

// claimResumeIn is ClaimResume's transaction, its running slot in bucket b.
func (s *Store) claimResumeIn(ctx context.Context, r core.ResumeClaim, c core.Claim, b int) error {
	upd := s.claimUpdate(c, core.StateResuming, c.Now).Remove(expression.Name("no_running_slot")).
		Set(expression.Name("bucket"), expression.Value(b)).
		Set(expression.Name("quota"), expression.Value(true))
	cond := claimCondition(c).And(expression.Name("user_id").Equal(expression.Value(r.Key.User)))
	rec, err := s.recordTxnItem(c.SandboxID, cond, upd)
	if err != nil {
		return fmt.Errorf("claim resume: %w", err)
	}
	take, err := s.slotTake(b, r.Limit, c.Tenant, r.Grant)
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
	quota := s.quotaRefusal(failed, key, r.Limit)
	switch {
	case s.grantFailed(failed, r.Grant):
		return fmt.Errorf("claim resume: %w", core.ErrGrantLost)
	case quota != nil:
		return quota
	case has(failed, s.bucketPK(runningSlots, b)):
		return bucketRefusal(failed[s.bucketPK(runningSlots, b)].Item, r.Limit)
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
		Remove(expression.Name("parked_at")).Remove(expression.Name("paused_slot")).Remove(expression.Name("paused_bucket")).
		Remove(expression.Name("paused_tenant")).Remove(expression.Name("no_running_slot"))
	upd = s.stateIndex(upd, core.StateActive, now, rec.SandboxID, core.ThreadKey{})
	if err := s.settle(ctx, "settle resume", rec, now, []core.State{core.StateResuming, core.StateClaiming}, upd, s.tenantPausedRelease(rec)...); err != nil {
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

// TenantsPaused implements core.PauseStore: one read of the tenants'
// counts, eventually consistent (the claim that acts on them checks them
// again).
func (s *Store) TenantsPaused(ctx context.Context, tenants []string) (map[string]int, error) {
	keys := make([]map[string]types.AttributeValue, len(tenants))
	for i, t := range tenants {
		keys[i] = s.key(tenantPausedPK(s.deployment, t))
	}
	items, err := s.batchGetAll(ctx, keys, false)
	if err != nil {
		return nil, fmt.Errorf("read tenants' paused counts: %w", err)
	}
	held := make(map[string]int, len(tenants))
	for _, av := range items {
		var c struct {
			PK   string `dynamodbav:"pk"`
			Used int    `dynamodbav:"used"`
		}
		if err := attributevalue.UnmarshalMap(av, &c); err != nil {
			return nil, fmt.Errorf("read tenants' paused counts: %w", err)
		}
		held[strings.TrimPrefix(c.PK, tenantPausedPK(s.deployment, ""))] = c.Used
	}
	return held, nil
}

// repairCount sets attribute attr of the count item pk to counted if the
// item's revision is still revision (ErrConflict otherwise), moving the
// revision.
func (s *Store) repairCount(ctx context.Context, what, pk, attr string, revision int64, counted int) error {
	return s.conditionalUpdate(ctx, "repair "+what, pk, valueIs("revision", revision),
		revised(expression.Set(expression.Name(attr), expression.Value(counted))))
}
