package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// API lists the DynamoDB calls the store makes (*dynamodb.Client fits).
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	// Scan is reconcile's only: the counter repair's exact count of the
	// records and its sweep of the slot counts (RepairCounters).
	Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	// ExecuteStatement reads the wait queue's shards in one call
	// (AnyWaiting): a SELECT on their partition keys, never a scan.
	ExecuteStatement(ctx context.Context, in *dynamodb.ExecuteStatementInput, opts ...func(*dynamodb.Options)) (*dynamodb.ExecuteStatementOutput, error)
}

// CallTimeout bounds each DynamoDB call (SDK retries included).
const CallTimeout = 10 * time.Second

// goneTTL is how long a gone record is kept for inspection before DynamoDB
// TTL may delete it.
const goneTTL = 7 * 24 * time.Hour

// Store implements core.Store on one DynamoDB table.
type Store struct {
	db         API
	table      string
	deployment string
	sealer     Sealer // nil: access tokens are stored in plaintext
	slots      reservationSlots
	scan       int   // tickets a read of the wait queue's head returns (queueScan)
	sweep      int32 // the parts of the counter repair's sweep (sweepSegments)
	shards     int   // the state index's keys per state (WithLimit)
	limit      int   // the deployment limit (WithLimit; 0: not known)
	log        *slog.Logger
}

var _ core.Store = (*Store)(nil)

// New returns a store over table, scoping the capacity ledger and state
// index to deployment.
func New(db API, table, deployment string, opts ...Option) *Store {
	s := &Store{db: db, table: table, deployment: deployment, scan: queueScan, sweep: sweepSegments, shards: IndexShards,
		log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// WithLogger makes the store log the failures it recovers from without
// returning them (a read it replaces by another); without it, it logs
// nothing.
func WithLogger(l *slog.Logger) Option {
	return func(s *Store) {
		if l != nil {
			s.log = l
		}
	}
}

// key is the key of item pk (sort key sortKey).
func (s *Store) key(pk string) map[string]types.AttributeValue { return keySK(pk, sortKey) }

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, CallTimeout)
}

// Lookup reads the thread's binding, its home running-slot bucket under limit
// (threadHome: the draining flag) and the tenant's slot count in one
// BatchGetItem (strongly consistent), retrying
// unprocessed keys.
func (s *Store) Lookup(ctx context.Context, key core.ThreadKey, limit int) (core.Lookup, error) {
	bucket := s.bucketPK(runningSlots, threadHome(key, limit))
	items, err := s.batchGet(ctx, []map[string]types.AttributeValue{s.key(bindingPK(key)), s.key(bucket),
		s.key(tenantPK(s.deployment, key.Tenant))}, true)
	if err != nil {
		return core.Lookup{}, fmt.Errorf("lookup: %w", err)
	}
	look := core.Lookup{Binding: core.Binding{ThreadKey: key}}
	for _, av := range items {
		switch stringAttr(av, AttrPK) {
		case "":
		case bucket:
			look.Draining = decodeBucket(av).Draining
		case tenantPK(s.deployment, key.Tenant):
			look.TenantUsed = decodeCounter(av)
		default:
			if look.Binding, err = decodeBinding(av, key); err != nil {
				return core.Lookup{}, err
			}
			look.Bound = true
		}
	}
	return look, nil
}

// decodeBinding decodes the binding av of thread key.
func decodeBinding(av map[string]types.AttributeValue, key core.ThreadKey) (core.Binding, error) {
	var b bindingItem
	if err := attributevalue.UnmarshalMap(av, &b); err != nil {
		return core.Binding{}, fmt.Errorf("decode binding: %w", err)
	}
	return core.Binding{ThreadKey: key, SandboxID: b.SandboxID, Reservation: b.Reservation,
		ReservationExpiresAt: fromMS(b.ReservationExpires)}, nil
}

// decodeCounter reads a slot counter item's "used" (0 if absent).
func decodeCounter(av map[string]types.AttributeValue) int {
	var c struct {
		Used int `dynamodbav:"used"`
	}
	_ = attributevalue.UnmarshalMap(av, &c)
	return c.Used
}

// SetDraining writes every bucket in one transaction, which DynamoDB
// bounds to 100 items: this fails to compile when the buckets outgrow it.
const _ = uint(100 - CapacityBuckets - PausedBuckets)

// Draining reads bucket 0's draining flag (SetDraining writes every
// bucket at once; an eventually consistent GetItem).
func (s *Store) Draining(ctx context.Context) (bool, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.GetItem(cctx, &dynamodb.GetItemInput{TableName: &s.table, Key: s.key(s.bucketPK(runningSlots, 0)),
		ProjectionExpression: aws.String("draining")})
	if err != nil {
		return false, unavailable("read draining", err)
	}
	return decodeBucket(out.Item).Draining, nil
}

// SetDraining marks the deployment draining (or not): every bucket of
// the running and paused slots' ledgers, in one transaction (96 items,
// within DynamoDB's 100 a transaction); then, starting a drain, every
// waiting ticket of the wait queue.
func (s *Store) SetDraining(ctx context.Context, draining bool) error {
	items := make([]types.TransactWriteItem, 0, CapacityBuckets+PausedBuckets)
	for _, l := range []ledger{runningSlots, pausedSlots} {
		for b := range l.n {
			it, err := s.bucketUpdate(l, b, nil, expression.Set(expression.Name("draining"), expression.Value(draining)).
				Add(expression.Name("revision"), expression.Value(1)))
			if err != nil {
				return fmt.Errorf("set draining: %w", err)
			}
			items = append(items, it)
		}
	}
	if _, err := s.writeTxn(ctx, "set draining", items); err != nil {
		return err
	}
	if draining {
		return s.markDraining(ctx)
	}
	return nil
}

// replaceCondition is the condition on a thread's binding for a
// reservation or a pool claim: it still names replaceID, or
// replaceReservation, or (both empty) there is none.
func replaceCondition(replaceID, replaceReservation string) expression.ConditionBuilder {
	switch {
	case replaceID != "":
		return expression.Name("sandbox_id").Equal(expression.Value(replaceID))
	case replaceReservation != "":
		return expression.Name("reservation").Equal(expression.Value(replaceReservation))
	default:
		return expression.AttributeNotExists(expression.Name(AttrPK))
	}
}

// notDraining is the condition that the ledger does not say draining.
func notDraining() expression.ConditionBuilder {
	return expression.Or(expression.AttributeNotExists(expression.Name("draining")),
		expression.Name("draining").Equal(expression.Value(false)))
}

// Get reads a sandbox record.
func (s *Store) Get(ctx context.Context, id string) (core.Record, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.table, Key: s.key(sandboxPK(id)), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return core.Record{}, unavailable("get record", err)
	}
	if out.Item == nil {
		return core.Record{}, core.ErrNotFound
	}
	return s.decodeRecord(ctx, out.Item)
}

func (s *Store) decodeRecord(ctx context.Context, av map[string]types.AttributeValue) (core.Record, error) {
	var it item
	if err := attributevalue.UnmarshalMap(av, &it); err != nil {
		return core.Record{}, fmt.Errorf("decode record: %w", err)
	}
	return s.recordOf(ctx, it)
}

// stateIndex returns the clauses that file a record under state in gsi1,
// and in the owner index (gsi2) when state is warm and its thread, owner,
// is given (out of it otherwise; see ownerIndex).
func (s *Store) stateIndex(u expression.UpdateBuilder, st core.State, at time.Time, id string, owner core.ThreadKey) expression.UpdateBuilder {
	u = ownerIndex(u, s.deployment, st, at, id, owner)
	if st == core.StateGone {
		return u.Remove(expression.Name(AttrGSI1PK)).Remove(expression.Name(AttrGSI1SK))
	}
	return u.Set(expression.Name(AttrGSI1PK), expression.Value(s.statePK(st, id))).
		Set(expression.Name(AttrGSI1SK), expression.Value(stateSK(at, id)))
}

// markDestroying records when a record first became a tombstone; later
// writes (kill retries) keep the first time.
func markDestroying(u expression.UpdateBuilder, st core.State, now time.Time) expression.UpdateBuilder {
	if st != core.StateDestroying {
		return u
	}
	return u.Set(expression.Name("destroying_since"),
		expression.IfNotExists(expression.Name("destroying_since"), expression.Value(ms(now))))
}

// claimCondition is Claim's condition: the record exists, belongs to
// c.Tenant, is in one of c.From, and carries no live lease of another owner.
func claimCondition(c core.Claim) expression.ConditionBuilder {
	states := make([]expression.OperandBuilder, 0, len(c.From))
	for _, st := range c.From[1:] {
		states = append(states, expression.Value(string(st)))
	}
	return expression.AttributeExists(expression.Name(AttrPK)).
		And(expression.Name("tenant").Equal(expression.Value(c.Tenant))).
		And(expression.Name("state").In(expression.Value(string(c.From[0])), states...)).
		And(expression.Or(
			expression.AttributeNotExists(expression.Name("lease_owner")),
			expression.Name("lease_expires").LessThanEqual(expression.Value(ms(c.Now))),
			expression.Name("lease_owner").Equal(expression.Value(c.Owner)),
		))
}

// Claim takes a lease on a record (and optionally moves its state).
func (s *Store) Claim(ctx context.Context, c core.Claim) (core.Record, error) {
	if len(c.From) == 0 {
		return core.Record{}, errors.New("claim: no source states")
	}
	cond := claimCondition(c)
	upd := expression.Set(expression.Name("updated_at"), expression.Value(ms(c.Now))).
		Add(expression.Name("fence"), expression.Value(1))
	if c.LeaseUntil.IsZero() {
		upd = upd.Remove(expression.Name("lease_owner")).Remove(expression.Name("lease_expires"))
	} else {
		upd = upd.Set(expression.Name("lease_owner"), expression.Value(c.Owner)).
			Set(expression.Name("lease_expires"), expression.Value(ms(c.LeaseUntil)))
	}
	if c.To != "" {
		// SET evaluates right-hand sides against the item before the update.
		upd = upd.Set(expression.Name("prev_state"), expression.Name("state")).
			Set(expression.Name("state"), expression.Value(string(c.To)))
		upd = s.stateIndex(upd, c.To, c.Now, c.SandboxID, core.ThreadKey{})
		upd = markDestroying(upd, c.To, c.Now)
		upd = meter(upd, c.Now)
		if !keepsParkTime(c.To) {
			upd = upd.Remove(expression.Name("parked_at"))
		}
	}
	if c.Below != nil || c.PausedBelow != nil {
		return s.claimBelow(ctx, c, cond, upd)
	}
	rec, old, err := s.update(ctx, "claim", sandboxPK(c.SandboxID), cond, upd)
	if err == nil || old == nil {
		return rec, err
	}
	return claimRefused(c, *old)
}

// claimRefused says which part of c's condition the record, as it was
// found, failed.
func claimRefused(c core.Claim, old core.Record) (core.Record, error) {
	if old.Tenant != c.Tenant {
		return core.Record{}, core.ErrNotFound
	}
	inFrom := false
	for _, st := range c.From {
		inFrom = inFrom || old.State == st
	}
	if !inFrom {
		return old, fmt.Errorf("sandbox %s is %s: %w", c.SandboxID, old.State, core.ErrConflict)
	}
	return old, fmt.Errorf("sandbox %s: %w", c.SandboxID, core.ErrLeaseHeld)
}

// claimBelow is Claim with c.Below or c.PausedBelow: the record's update
// and checks of the tenants' counts, in one transaction, then a read of
// the record (a transaction returns no item).
func (s *Store) claimBelow(ctx context.Context, c core.Claim, cond expression.ConditionBuilder, upd expression.UpdateBuilder) (core.Record, error) {
	recItem, err := s.recordTxnItem(c.SandboxID, cond, upd)
	if err != nil {
		return core.Record{}, fmt.Errorf("claim: build expression: %w", err)
	}
	checks, err := s.claimChecks(c)
	if err != nil {
		return core.Record{}, fmt.Errorf("claim: %w", err)
	}
	failed, err := s.writeTxn(ctx, "claim", append([]types.TransactWriteItem{recItem}, checks...))
	switch r, recordFailed := failed[sandboxPK(c.SandboxID)]; {
	case recordFailed:
		old, err := s.oldRecord(ctx, r.Item)
		if err != nil {
			return core.Record{}, err
		}
		return claimRefused(c, old)
	case len(failed) > 0:
		return core.Record{}, fmt.Errorf("claim sandbox %s: a tenant's count is not as the claim requires: %w", c.SandboxID, core.ErrAtFairShare)
	case err != nil:
		return core.Record{}, err
	}
	rec, err := s.Get(ctx, c.SandboxID)
	if err != nil {
		// Applied: the caller holds the claim, whose lease lapses if it
		// cannot go on without the record.
		return core.Record{}, fmt.Errorf("claim applied, record not read: %w: %w", core.ErrStoreUnavailable, err)
	}
	return rec, nil
}

// claimChecks are the checks of the tenants' counts a claim carries:
// c.Below's tenant holds fewer than c.Below.Slots slots; c.PausedBelow's
// tenant holds at most Held paused slots and the record's tenant at least
// Held+2 (absent counts are zero).
func (s *Store) claimChecks(c core.Claim) ([]types.TransactWriteItem, error) {
	var checks []types.TransactWriteItem
	if b := c.Below; b != nil {
		it, err := s.conditionCheck(tenantPK(s.deployment, b.Tenant), expression.Or(
			expression.AttributeNotExists(expression.Name("used")),
			expression.Name("used").LessThan(expression.Value(b.Slots))))
		if err != nil {
			return nil, err
		}
		checks = append(checks, it)
	}
	if p := c.PausedBelow; p != nil {
		if p.Tenant == c.Tenant {
			return nil, fmt.Errorf("a paused share check of tenant %s against itself", p.Tenant)
		}
		mine, err := s.conditionCheck(tenantPausedPK(s.deployment, p.Tenant), expression.Or(
			expression.AttributeNotExists(expression.Name("used")),
			expression.Name("used").LessThanEqual(expression.Value(p.Held))))
		if err != nil {
			return nil, err
		}
		theirs, err := s.conditionCheck(tenantPausedPK(s.deployment, c.Tenant),
			expression.Name("used").GreaterThanEqual(expression.Value(p.Held+2)))
		if err != nil {
			return nil, err
		}
		checks = append(checks, mine, theirs)
	}
	return checks, nil
}

// update runs a conditional UpdateItem returning the new record; on a
// condition failure it returns the old record (nil when the item does not
// exist, with core.ErrNotFound).
func (s *Store) update(ctx context.Context, op, pk string, cond expression.ConditionBuilder, upd expression.UpdateBuilder) (core.Record, *core.Record, error) {
	ctx, cancel := s.ctx(ctx) // the decode (a sealed token opened) under the call's timeout too
	defer cancel()
	av, err := s.updateItem(ctx, op, s.key(pk), cond, upd, types.ReturnValueAllNew, true)
	if item, failed := conditionFailed(err); failed {
		old, err := s.oldRecord(ctx, item)
		if err != nil {
			return core.Record{}, nil, err
		}
		return core.Record{}, &old, fmt.Errorf("%s: condition failed", op)
	}
	if err != nil {
		return core.Record{}, nil, err
	}
	rec, err := s.decodeRecord(ctx, av)
	return rec, nil, err
}

// oldRecord decodes the record a failed condition returned: ErrNotFound
// when there is none.
func (s *Store) oldRecord(ctx context.Context, av map[string]types.AttributeValue) (core.Record, error) {
	if len(av) == 0 {
		return core.Record{}, core.ErrNotFound
	}
	return s.decodeRecord(ctx, av)
}

// Apply makes a fenced update.
func (s *Store) Apply(ctx context.Context, u core.Update) (core.Record, error) {
	cond := expression.AttributeExists(expression.Name(AttrPK)).
		And(expression.Name("fence").Equal(expression.Value(u.Fence)))
	at := u.Now
	if parkedState(u.State) {
		at = u.ParkedAt
	}
	upd := expression.Set(expression.Name("state"), expression.Value(string(u.State))).
		Set(expression.Name("updated_at"), expression.Value(ms(u.Now))).
		Add(expression.Name("fence"), expression.Value(1))
	upd = s.stateIndex(upd, u.State, at, u.SandboxID, u.Owner)
	upd = markDestroying(upd, u.State, u.Now)
	if parkedState(u.State) {
		upd = upd.Set(expression.Name("parked_at"), expression.Value(ms(u.ParkedAt)))
	} else {
		upd = upd.Remove(expression.Name("parked_at"))
	}
	if !u.ExpiresAt.IsZero() {
		upd = upd.Set(expression.Name("expires_at"), expression.Value(ms(u.ExpiresAt)))
	}
	if !u.KeepLease {
		upd = upd.Remove(expression.Name("lease_owner")).Remove(expression.Name("lease_expires"))
	}
	if u.KillAttempt {
		upd = upd.Add(expression.Name("kill_attempts"), expression.Value(1))
	}
	if u.EndReason != "" {
		upd = upd.Set(expression.Name("end_reason"), expression.Value(u.EndReason))
	}
	rec, old, err := s.update(ctx, "apply", sandboxPK(u.SandboxID), cond, meter(upd, u.Now))
	if err != nil && old != nil {
		return *old, fmt.Errorf("sandbox %s fence %d, now %d: %w", u.SandboxID, u.Fence, old.Fence, core.ErrStaleFence)
	}
	return rec, err
}

// dropBinding deletes the thread's binding if attr still equals value.
// Best effort: a binding left behind names a reservation or record that no
// longer exists, which acquire treats as no binding.
func (s *Store) dropBinding(ctx context.Context, key core.ThreadKey, attr, value string) {
	expr, err := expression.NewBuilder().WithCondition(expression.Name(attr).Equal(expression.Value(value))).Build()
	if err != nil {
		return
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	_, _ = s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: &s.table, Key: s.key(bindingPK(key)),
		ConditionExpression: expr.Condition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()})
}

// counterRelease is the transaction item that returns one slot of a user
// or tenant counter (pk), moving its revision (see RepairCounters).
func (s *Store) counterRelease(pk string) types.TransactWriteItem {
	return must(s.counterMove(pk, -1, 0))
}

// counterTake is the transaction item that takes one slot of a user or
// tenant counter (pk), conditional on the count staying within max when
// max > 0, moving its revision.
func (s *Store) counterTake(pk string, max int) (types.TransactWriteItem, error) {
	return s.counterMove(pk, 1, max)
}

// counterMove is the transaction item that adds delta slots to a user or
// tenant counter (pk), conditional on the count staying within max when
// max > 0, moving its revision. A delta of 0 keeps a slot that changes
// holder within the counter, checked as if given up and taken again.
func (s *Store) counterMove(pk string, delta, max int) (types.TransactWriteItem, error) {
	var cond *expression.ConditionBuilder
	if max > 0 {
		within := expression.Or(expression.AttributeNotExists(expression.Name("used")),
			expression.Name("used").LessThanEqual(expression.Value(max-delta)))
		cond = &within
	}
	return s.txnUpdate(s.key(pk), cond, revised(expression.Add(expression.Name("used"), expression.Value(delta))), false)
}

// tenantSet is the string set {tenant}, added to the ledger's "tenants".
func tenantSet(tenant string) *types.AttributeValueMemberSS {
	return &types.AttributeValueMemberSS{Value: []string{tenant}}
}

// goneUpdate is the transaction item marking rec gone, fenced by rec.Fence
// (and, when pool, only if the record holds a pool place; the old item is
// then returned on a failed condition).
func (s *Store) goneUpdate(rec core.Record, now time.Time, pool bool) (types.TransactWriteItem, error) {
	cond := expression.Name("fence").Equal(expression.Value(rec.Fence)).
		And(expression.Name("state").NotEqual(expression.Value(string(core.StateGone))))
	if pool {
		cond = cond.And(expression.AttributeExists(expression.Name(attrPoolPlace)))
	}
	upd := expression.Set(expression.Name("state"), expression.Value(string(core.StateGone))).
		Set(expression.Name("updated_at"), expression.Value(ms(now))).
		Set(expression.Name(AttrTTL), expression.Value(now.Add(goneTTL).Unix())).
		Add(expression.Name("fence"), expression.Value(1)).
		Remove(expression.Name(AttrGSI1PK)).Remove(expression.Name(AttrGSI1SK)).
		Remove(expression.Name(AttrGSI2PK)).Remove(expression.Name(AttrGSI2SK)).
		Remove(expression.Name("lease_owner")).Remove(expression.Name("lease_expires")).
		Remove(expression.Name("endpoint_token")).Remove(expression.Name("token_sealed")).
		Remove(expression.Name(attrPoolPlace))
	if rec.EndReason != "" {
		upd = upd.Set(expression.Name("end_reason"), expression.Value(rec.EndReason))
	}
	return s.txnUpdate(s.key(sandboxPK(rec.SandboxID)), &cond, upd, pool)
}

// CountStates counts the deployment's records in each of states, from
// the state index (every entry read): for checks and tools, never on a
// request's path.
func (s *Store) CountStates(ctx context.Context, states ...core.State) (map[core.State]int, error) {
	out := make(map[core.State]int, len(states))
	for _, st := range states {
		n := 0
		err := s.eachInState(ctx, st, nil, 0, func(map[string]types.AttributeValue) bool {
			n++
			return true
		})
		if err != nil {
			return nil, err
		}
		out[st] = n
	}
	return out, nil
}

// WarmParkedBefore lists warm records parked before t, oldest first.
func (s *Store) WarmParkedBefore(ctx context.Context, t time.Time, limit int) ([]core.Record, error) {
	sk := expression.Key(AttrGSI1SK).LessThan(expression.Value(stateSK(t, "")))
	return s.recordsInState(ctx, core.StateWarm, &sk, limit)
}

// Sample lists up to limit records in state, oldest first, of a random
// quarter of them (a quarter of the state's index shards); when those hold
// fewer than four, of all of them (see sampleInState).
func (s *Store) Sample(ctx context.Context, state core.State, limit int) ([]core.Record, error) {
	return s.sampleInState(ctx, state, nil, limit)
}

// Tombstones lists records in StateDestroying, oldest first.
func (s *Store) Tombstones(ctx context.Context, limit int) ([]core.Record, error) {
	return s.recordsInState(ctx, core.StateDestroying, nil, limit)
}
