package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// errGrantedElsewhere: a grant found its ticket granted by a peer's
// dispatch since the grant read it waiting.
var errGrantedElsewhere = fmt.Errorf("ticket granted by a peer: %w", core.ErrConflict)

// Reserve takes a slot and binds the thread to the reservation,
// atomically (see takeSlot for the bucket it takes).
func (s *Store) Reserve(ctx context.Context, r core.Reservation) error {
	if r.Handover != nil {
		err := s.reserveHandedOver(ctx, r)
		if err == nil {
			s.slots.remember(r.Token, core.Slot{Ref: r.Handover.Slot.Ref, Quota: true})
		}
		return err
	}
	b, err := s.takeSlotOrGrant(ctx, r.Limit, threadHome(r.ThreadKey, r.Limit), r.Grant, func(b int) error { return s.reserveIn(ctx, r, b) })
	if err == nil {
		s.slots.remember(r.Token, core.Slot{Ref: core.SlotRef(b), Quota: true})
	}
	return err
}

// takeSlot runs take, a transaction taking a running slot in bucket b,
// under limit, bucket home first (takeIn). When no bucket has room it
// refuses for capacity, or for the drain, with every bucket's sums as the
// refusal's details.
func (s *Store) takeSlot(ctx context.Context, limit, home int, take func(int) error) (int, error) {
	b, err := s.takeIn(ctx, runningSlots, limit, home, take)
	var full *ledgerFull
	if !errors.As(err, &full) {
		return b, err
	}
	st, tenants := bucketStatus(full.buckets)
	st.Limit = limit
	reason := api.RefusalCapacity
	if full.draining {
		reason = api.RefusalDraining
	}
	return b, &core.CapacityError{Reason: reason, Status: st, Tenants: tenants}
}

// bucketRefusal says why running-slot bucket av (returned by a failed
// take) refused a slot under limit: draining, limits unset for limit, or
// full (limitRefusal).
func bucketRefusal(av map[string]types.AttributeValue, limit int) error {
	if decodeBucket(av).Draining {
		return &core.CapacityError{Reason: api.RefusalDraining, Status: core.CapacityStatus{Limit: limit, Draining: true}}
	}
	return limitRefusal(av, limit)
}

// takeUpdate is the bucket update taking one slot of bucket b (tenant,
// when not empty, joins the bucket's tenant set).
func (s *Store) takeUpdate(b int, limit int, tenant string) (types.TransactWriteItem, error) {
	u := slotTaken()
	if tenant != "" {
		u = u.Add(expression.Name("tenants"), expression.Value(tenantSet(tenant)))
	}
	return s.bucketUpdate(runningSlots, b, takeCondition(limit, true), u)
}

// reserveIn is Reserve in bucket b: errBucketFull when b has no room.
func (s *Store) reserveIn(ctx context.Context, r core.Reservation, b int) error {
	take, err := s.slotTake(b, r.Limit, r.Tenant, r.Grant)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	userItem, err := s.counterTake(userPK(s.deployment, r.ThreadKey), r.MaxPerUser)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	tenantItem, err := s.counterTake(tenantPK(s.deployment, r.Tenant), r.MaxPerTenant)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	return s.writeReservation(ctx, r, b, append([]types.TransactWriteItem{userItem, tenantItem}, take...))
}

// reserveHandedOver is Reserve taking over the running slot r.Handover
// holds (core.Reservation.Handover), as if freed and taken again at once:
// the tombstone's gone update (fenced) and, in its bucket, the slot
// changing holder (its used count unchanged: within its limit, set for
// r.Limit, and not draining; else ErrConflict, or the draining refusal).
// The user's and tenant's counts move from the tombstone's thread to r's;
// a count both share keeps the slot and is checked against r's quota.
func (s *Store) reserveHandedOver(ctx context.Context, r core.Reservation) error {
	h := *r.Handover
	if r.Grant != nil || h.Tenant == "" || !h.Slots.Running() {
		return fmt.Errorf("reserve: a handover needs a tenant's tombstone holding a running slot, and no grant: %w", core.ErrConflict)
	}
	gone, err := s.goneUpdate(h, r.Now, false)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	cond := expression.Name("lim_of").Equal(expression.Value(r.Limit)).
		And(expression.Name("used").LessThanEqual(expression.Name("lim"))).And(notDraining())
	bucket, err := s.bucketUpdate(runningSlots, int(h.Slot.Ref), &cond, expression.Add(expression.Name("revision"), expression.Value(1)).
		Add(expression.Name("tenants"), expression.Value(tenantSet(r.Tenant))))
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	items := []types.TransactWriteItem{gone, bucket}
	for _, c := range []struct {
		to, from string
		max      int
	}{
		{userPK(s.deployment, r.ThreadKey), userPK(s.deployment, h.ThreadKey), r.MaxPerUser},
		{tenantPK(s.deployment, r.Tenant), tenantPK(s.deployment, h.Tenant), r.MaxPerTenant},
	} {
		shared := h.Slot.Quota && c.from == c.to // the slot stays in this count
		delta := 1
		if shared {
			delta = 0
		}
		move, err := s.counterMove(c.to, delta, c.max)
		if err != nil {
			return fmt.Errorf("reserve: %w", err)
		}
		items = append(items, move)
		if h.Slot.Quota && !shared {
			items = append(items, s.counterRelease(c.from))
		}
	}
	if h.Slots.Paused {
		items = append(items, s.tenantPausedRelease(h)...)
	}
	err = s.writeReservation(ctx, r, int(h.Slot.Ref), items)
	if errors.Is(err, errBucketFull) || errors.Is(err, errLimitsUnset) {
		return fmt.Errorf("reserve: the slot of %s cannot change holder: %w", h.SandboxID, core.ErrConflict)
	}
	return err
}

// writeReservation writes r's reservation (in bucket b) and binding with
// slot, the items that take its slot and counts, in one transaction, and
// says why it was refused.
func (s *Store) writeReservation(ctx context.Context, r core.Reservation, b int, slot []types.TransactWriteItem) error {
	resItem, err := attributevalue.MarshalMap(item{
		PK: reservationPK(r.Token), SK: sortKey, Tenant: r.Tenant, User: r.User, Thread: r.Thread, Seed: r.Seed,
		State: string(core.StateCreating), Reservation: r.Token, Deployment: s.deployment,
		CreatedAt: ms(r.Now), UpdatedAt: ms(r.Now), ExpiresAt: ms(r.ExpiresAt),
		Bucket: b, Quota: true,
		GSI1PK: s.statePK(core.StateCreating, r.Token), GSI1SK: stateSK(r.Now, r.Token),
	})
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	bindItem, err := attributevalue.MarshalMap(bindingItem{PK: bindingPK(r.ThreadKey), SK: sortKey,
		Reservation: r.Token, ReservationExpires: ms(r.ExpiresAt), UpdatedAt: ms(r.Now)})
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	bind, err := s.txnPut(bindItem, replaceCondition(r.ReplaceSandboxID, r.ReplaceReservation))
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	failed, err := s.writeTxn(ctx, "reserve", append([]types.TransactWriteItem{s.putNew(resItem), bind}, slot...))
	if len(failed) == 0 {
		return err
	}
	// Several conditions may fail at once: report what the caller can act
	// on first (a binding race, then the user's and the tenant's quota),
	// capacity last, so neither a lost race nor a tenant at its quota ever
	// triggers an eviction.
	full, bucketFailed := failed[s.bucketPK(runningSlots, b)]
	quota := s.quotaRefusal(failed, r.ThreadKey, r.Limit)
	switch {
	case has(failed, bindingPK(r.ThreadKey)):
		return fmt.Errorf("thread %s: %w", r.ThreadKey, core.ErrThreadBound)
	case has(failed, reservationPK(r.Token)):
		return fmt.Errorf("reservation %s exists: %w", r.Token, core.ErrConflict)
	case r.Handover != nil && has(failed, sandboxPK(r.Handover.SandboxID)):
		return fmt.Errorf("reserve: sandbox %s fence %d: %w", r.Handover.SandboxID, r.Handover.Fence, core.ErrStaleFence)
	case s.grantFailed(failed, r.Grant):
		return fmt.Errorf("reserve: %w", core.ErrGrantLost)
	case quota != nil:
		return quota
	case bucketFailed:
		return bucketRefusal(full.Item, r.Limit)
	}
	return fmt.Errorf("reserve: condition failed on an unexpected item: %w", core.ErrConflict)
}

// quotaRefusal is the refusal of a take whose user's count (of thread
// key) or, else, tenant's count failed its condition, reporting limit;
// nil when neither did.
func (s *Store) quotaRefusal(failed map[string]types.CancellationReason, key core.ThreadKey, limit int) error {
	reason := api.RefusalUserQuota
	switch {
	case has(failed, userPK(s.deployment, key)):
	case has(failed, tenantPK(s.deployment, key.Tenant)):
		reason = api.RefusalTenantQuota
	default:
		return nil
	}
	return &core.CapacityError{Reason: reason, RetryAfter: 5 * time.Second, Status: core.CapacityStatus{Limit: limit}}
}

// reservationSlots remembers the bucket of the reservations this process
// took, so that Finalize and FreeReservation name the right bucket at the
// first try. It is a hint: both check the reservation's slot in their
// transaction and, when the hint is missing or wrong, take the slot from
// the refused reservation and try once more.
type reservationSlots struct {
	mu sync.Mutex
	m  map[string]core.Slot
}

// maxRememberedSlots bounds the hints kept (a reservation whose create
// stays ambiguous is never finalized here; its hint is dropped in bulk).
const maxRememberedSlots = 4096

func (r *reservationSlots) remember(token string, slot core.Slot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || len(r.m) >= maxRememberedSlots {
		r.m = map[string]core.Slot{}
	}
	r.m[token] = slot
}

// guess returns the slot token's reservation most likely has (quota: in
// its user's and tenant's counts, as a thread's reservation is and a pool
// reservation is not), and forgets it.
func (r *reservationSlots) guess(token string, quota bool) core.Slot {
	r.mu.Lock()
	defer r.mu.Unlock()
	if slot, ok := r.m[token]; ok {
		delete(r.m, token)
		return slot
	}
	return core.Slot{Ref: core.SlotRef(shardOf(token, CapacityBuckets)), Quota: quota}
}

// slotCondition is the condition that an item's stored slot is slot.
func slotCondition(slot core.Slot) expression.ConditionBuilder {
	cond := expression.AttributeExists(expression.Name(AttrPK))
	if slot.Ref == 0 {
		cond = cond.And(expression.AttributeNotExists(expression.Name("bucket")))
	} else {
		cond = cond.And(expression.Name("bucket").Equal(expression.Value(slot.Ref)))
	}
	if slot.Quota {
		cond = cond.And(expression.Name("quota").Equal(expression.Value(true)))
	} else {
		cond = cond.And(expression.AttributeNotExists(expression.Name("quota")))
	}
	return cond
}

// withReservationSlot runs the transaction build(slot) makes, whose first
// item deletes token's reservation under slotCondition(slot): with the
// remembered slot first and, when the reservation exists with another
// slot, once more with the one it has. It returns the failed items as
// writeTxn does, and ErrNotFound when the reservation does not exist.
func (s *Store) withReservationSlot(ctx context.Context, op, token string, quota bool, build func(core.Slot) ([]types.TransactWriteItem, error)) (map[string]types.CancellationReason, error) {
	slot := s.slots.guess(token, quota)
	for attempt := 0; ; attempt++ {
		items, err := build(slot)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		failed, err := s.writeTxn(ctx, op, items)
		r, ok := failed[reservationPK(token)]
		if !ok {
			return failed, err
		}
		if len(r.Item) == 0 {
			return nil, fmt.Errorf("%s: reservation %s: %w", op, token, core.ErrNotFound)
		}
		var it item
		if derr := attributevalue.UnmarshalMap(r.Item, &it); derr != nil {
			return nil, fmt.Errorf("%s: decode reservation: %w", op, derr)
		}
		stored := core.Slot{Ref: core.SlotRef(it.Bucket), Quota: it.Quota}
		if stored == slot || attempt > 0 {
			return failed, err
		}
		slot = stored
	}
}

// reservationDelete is the transaction item deleting token's reservation
// if it still has slot (the old item is returned when it does not).
func (s *Store) reservationDelete(token string, slot core.Slot) (types.TransactWriteItem, error) {
	return s.txnDelete(s.key(reservationPK(token)), slotCondition(slot))
}

// Finalize turns a reservation into an active record and rebinds the
// thread; the record keeps the reservation's slot, and its bucket counts
// it active instead of creating, in the same transaction.
func (s *Store) Finalize(ctx context.Context, token string, rec core.Record) (core.Record, error) {
	rec.Fence = 1
	named := expression.Name("reservation").Equal(expression.Value(token))
	bind, err := s.txnUpdate(s.key(bindingPK(rec.ThreadKey)), &named,
		expression.Set(expression.Name("sandbox_id"), expression.Value(rec.SandboxID)).
			Set(expression.Name("updated_at"), expression.Value(ms(rec.UpdatedAt))).
			Remove(expression.Name("reservation")).Remove(expression.Name("reservation_expires")), false)
	if err != nil {
		return core.Record{}, fmt.Errorf("finalize: %w", err)
	}
	return s.consumeReservation(ctx, "finalize", token, rec, false, bind)
}

// consumeReservation turns token's reservation into the record rec
// (fromReservation; with pool, a pool record), with also in the same
// transaction: ErrConflict when the reservation is gone or another
// condition failed (the record exists, the binding moved).
func (s *Store) consumeReservation(ctx context.Context, op, token string, rec core.Record, pool bool, also ...types.TransactWriteItem) (core.Record, error) {
	var final core.Record
	failed, err := s.withReservationSlot(ctx, op, token, !pool, func(slot core.Slot) ([]types.TransactWriteItem, error) {
		var items []types.TransactWriteItem
		var err error
		final, items, err = s.fromReservation(ctx, token, slot, rec, pool)
		return append(items, also...), err
	})
	if len(failed) > 0 || errors.Is(err, core.ErrNotFound) {
		return core.Record{}, fmt.Errorf("%s reservation %s: %w", op, token, core.ErrConflict)
	}
	if err != nil {
		return core.Record{}, err
	}
	return final, nil
}

// fromReservation returns rec (fence 1) holding the slot of token's
// reservation, and the transaction items that make it so: the
// reservation's delete (conditional on its slot) and the record's put (a
// pool record's with its pool place).
func (s *Store) fromReservation(ctx context.Context, token string, slot core.Slot, rec core.Record, pool bool) (core.Record, []types.TransactWriteItem, error) {
	rec.Fence = 1
	rec.ReservationToken = token // the counter repair counts the record and its reservation once by it
	rec.Slot = core.Slot{Ref: slot.Ref, Quota: slot.Quota}
	put, err := s.recordPut(ctx, rec, pool)
	if err != nil {
		return rec, nil, err
	}
	del, err := s.reservationDelete(token, slot)
	if err != nil {
		return rec, nil, err
	}
	return rec, []types.TransactWriteItem{del, put}, nil
}

// recordPut is the transaction item putting rec (its token sealed) where
// no record is; with pool, a pool record holding a place, which may
// replace a gone record (notLivePut).
func (s *Store) recordPut(ctx context.Context, rec core.Record, pool bool) (types.TransactWriteItem, error) {
	ri := s.recordItem(rec)
	ri.PoolPlace = pool
	if err := s.seal(ctx, &ri); err != nil {
		return types.TransactWriteItem{}, err
	}
	av, err := attributevalue.MarshalMap(ri)
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	if pool {
		return s.notLivePut(av), nil
	}
	return s.putNew(av), nil
}

// FreeReservation drops a reservation and its slot (in its bucket, and its
// user's and tenant's counts when it is in them), then (best effort) the
// binding if it still names the reservation.
func (s *Store) FreeReservation(ctx context.Context, token string, key core.ThreadKey) error {
	if key == (core.ThreadKey{}) {
		return s.freePoolReservation(ctx, token)
	}
	failed, err := s.releaseReservation(ctx, "free reservation", token, key, true)
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("free reservation %s: %w", token, core.ErrConflict)
	}
	s.dropBinding(ctx, key, "reservation", token)
	return nil
}

// releaseReservation deletes token's reservation and frees its slot
// (slotRelease, for thread key), with also in the same transaction; quota
// is the slot's likely kind (reservationSlots.guess). It returns what
// withReservationSlot does.
func (s *Store) releaseReservation(ctx context.Context, op, token string, key core.ThreadKey, quota bool, also ...types.TransactWriteItem) (map[string]types.CancellationReason, error) {
	return s.withReservationSlot(ctx, op, token, quota, func(slot core.Slot) ([]types.TransactWriteItem, error) {
		del, err := s.reservationDelete(token, slot)
		if err != nil {
			return nil, err
		}
		return s.slotRelease(append([]types.TransactWriteItem{del}, also...), key, slot)
	})
}

// slotRelease appends to items the writes that return a slot: its
// bucket's used count, and its user's and
// tenant's counts when the slot is in them.
func (s *Store) slotRelease(items []types.TransactWriteItem, key core.ThreadKey, slot core.Slot) ([]types.TransactWriteItem, error) {
	bucket, err := s.bucketUpdate(runningSlots, int(slot.Ref), nil, slotFreed())
	if err != nil {
		return nil, err
	}
	items = append(items, bucket)
	if slot.Quota {
		items = append(items, s.counterRelease(userPK(s.deployment, key)), s.counterRelease(tenantPK(s.deployment, key.Tenant)))
	}
	return items, nil
}

// Free marks a record gone and frees its slots (its running slot, rec.Slot,
// with its user's and tenant's, and its paused slot: current since the
// write is fenced by rec.Fence), atomically.
func (s *Store) Free(ctx context.Context, rec core.Record, now time.Time) error {
	id, fence := rec.SandboxID, rec.Fence
	if rec.Tenant == "" {
		// A pool member's record (or an adopted orphan naming no tenant).
		if err := s.freePoolRecord(ctx, rec, now); !errors.Is(err, errNotPoolRecord) {
			return err
		}
	}
	recUpdate, err := s.goneUpdate(rec, now, false)
	if err != nil {
		return fmt.Errorf("free: %w", err)
	}
	// The fence makes rec's slots the record's own: free exactly those.
	release, err := s.slotsRelease(rec)
	items := append([]types.TransactWriteItem{recUpdate}, release...)
	if err != nil {
		return fmt.Errorf("free: %w", err)
	}
	failed, err := s.writeTxn(ctx, "free", items)
	if has(failed, sandboxPK(id)) {
		return fmt.Errorf("free sandbox %s fence %d: %w", id, fence, core.ErrStaleFence)
	}
	return err
}
