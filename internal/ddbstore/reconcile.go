package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Items of the reconcile pass:
//
//	pk REC#<deployment>, sk R                     the inventory cursor (reconcileCursorItem)
//	pk REC#<deployment>, sk SEEN#<cycle>#<part>   ids (and reservation tokens) one pass saw
//	pk REC#<deployment>, sk COUNTS                the counter repair's notes (countsSK)
//	pk REC#<deployment>, sk OWED#<sandbox id>     a sandbox whose outputs are owed (outputs.go)
//	pk FST#<sandbox id>, sk R                     when reconcile first saw an anomalous sandbox
//
// SEEN, FST and OWED items carry a "ttl" (garbage collection only).

var _ core.ReconcileStore = (*Store)(nil)

const (
	seenTTL      = 2 * 24 * time.Hour
	firstSeenTTL = 7 * 24 * time.Hour
	// batchGetMax is BatchGetItem's limit of keys per call.
	batchGetMax = 100
)

func reconcilePK(deployment string) string { return "REC#" + deployment }
func firstSeenPK(id string) string         { return "FST#" + id }

// keySK builds a key with an explicit sort key.
func keySK(pk, sk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		AttrPK: &types.AttributeValueMemberS{Value: pk},
		AttrSK: &types.AttributeValueMemberS{Value: sk},
	}
}

// LookupMany reads records, bindings and reservations with BatchGetItem
// (strongly consistent, 100 keys per call, unprocessed keys retried).
func (s *Store) LookupMany(ctx context.Context, ids []string, keys []core.ThreadKey, tokens []string) (core.ReconcileLookup, error) {
	out := core.ReconcileLookup{Records: map[string]core.Record{}, Bindings: map[core.ThreadKey]core.Binding{},
		Reservations: map[string]core.PendingReservation{}}
	var all []map[string]types.AttributeValue
	seen := map[string]bool{}
	add := func(pk string) {
		if !seen[pk] {
			seen[pk] = true
			all = append(all, s.key(pk))
		}
	}
	for _, id := range ids {
		add(sandboxPK(id))
	}
	bindingKeys := map[string]core.ThreadKey{}
	for _, k := range keys {
		bindingKeys[bindingPK(k)] = k
		add(bindingPK(k))
	}
	for _, t := range tokens {
		add(reservationPK(t))
	}
	items, err := s.batchGetAll(ctx, all, true)
	if err != nil {
		return out, err
	}
	for _, av := range items {
		switch pk := stringAttr(av, AttrPK); {
		case strings.HasPrefix(pk, "SBX#"):
			rec, err := s.decodeRecord(ctx, av)
			if err != nil {
				return out, err
			}
			out.Records[rec.SandboxID] = rec
		case strings.HasPrefix(pk, "RES#"):
			var it item
			if err := attributevalue.UnmarshalMap(av, &it); err != nil {
				return out, fmt.Errorf("decode reservation: %w", err)
			}
			out.Reservations[it.Reservation] = core.PendingReservation{Token: it.Reservation,
				ThreadKey: core.ThreadKey{Tenant: it.Tenant, User: it.User, Thread: it.Thread},
				CreatedAt: fromMS(it.CreatedAt), ExpiresAt: fromMS(it.ExpiresAt)}
		case strings.HasPrefix(pk, "THR#"):
			k := bindingKeys[pk]
			b, err := decodeBinding(av, k)
			if err != nil {
				return out, err
			}
			out.Bindings[k] = b
		}
	}
	return out, nil
}

// batchGetAll reads keys (any number) with batchGet, batchGetMax at a
// time.
func (s *Store) batchGetAll(ctx context.Context, keys []map[string]types.AttributeValue, consistent bool) ([]map[string]types.AttributeValue, error) {
	var items []map[string]types.AttributeValue
	for len(keys) > 0 {
		n := min(len(keys), batchGetMax)
		got, err := s.batchGet(ctx, keys[:n], consistent)
		if err != nil {
			return nil, err
		}
		items = append(items, got...)
		keys = keys[n:]
	}
	return items, nil
}

// batchGet reads keys (at most batchGetMax), strongly consistent or not,
// retrying unprocessed keys.
func (s *Store) batchGet(ctx context.Context, keys []map[string]types.AttributeValue, consistent bool) ([]map[string]types.AttributeValue, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var items []map[string]types.AttributeValue
	for attempt := 0; len(keys) > 0; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(time.Duration(min(attempt, 10)*20) * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, unavailable("batch get", ctx.Err())
			case <-t.C:
			}
		}
		out, err := s.db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{
			s.table: {Keys: keys, ConsistentRead: aws.Bool(consistent)},
		}})
		if err != nil {
			return nil, unavailable("batch get", err)
		}
		items = append(items, out.Responses[s.table]...)
		keys = out.UnprocessedKeys[s.table].Keys
	}
	return items, nil
}

// bindingCondition is the condition that the binding is still from
// (absent when !bound).
func bindingCondition(from core.Binding, bound bool) expression.ConditionBuilder {
	switch {
	case !bound:
		return expression.AttributeNotExists(expression.Name(AttrPK))
	case from.SandboxID != "":
		return expression.Name("sandbox_id").Equal(expression.Value(from.SandboxID))
	default:
		return expression.Name("reservation").Equal(expression.Value(from.Reservation))
	}
}

func liveCondition() expression.ConditionBuilder {
	return expression.Name("state").In(expression.Value(string(core.StateActive)),
		expression.Value(string(core.StateReleasing)), expression.Value(string(core.StateWarm)),
		expression.Value(string(core.StatePausing)),
		expression.Value(string(core.StatePaused)), expression.Value(string(core.StateResuming)))
}

// bindingPut is a transaction item writing key's binding to sandboxID under cond.
func (s *Store) bindingPut(key core.ThreadKey, sandboxID string, now time.Time, cond expression.ConditionBuilder) (types.TransactWriteItem, error) {
	av, err := attributevalue.MarshalMap(bindingItem{PK: bindingPK(key), SK: sortKey, SandboxID: sandboxID, UpdatedAt: ms(now)})
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return s.txnPut(av, cond)
}

// transact runs a transaction (contention retried by writeTxn); a failed
// condition is core.ErrConflict.
func (s *Store) transact(ctx context.Context, op string, items []types.TransactWriteItem) error {
	failed, err := s.writeTxn(ctx, op, items)
	if len(failed) > 0 {
		return fmt.Errorf("%s: condition failed on %s: %w", op, strings.Join(slices.Sorted(maps.Keys(failed)), ", "), core.ErrConflict)
	}
	return err
}

// Adopt records an untracked sandbox in one transaction: the record, its
// slot (a consumed reservation, or a new deployment, user and tenant slot
// taken without a limit check; a paused record takes a paused slot
// instead, and a consumed reservation's running slot is freed), and optionally the binding or a check that the
// binding still names a canonical sandbox. ErrConflict when any condition
// fails (nothing written).
func (s *Store) Adopt(ctx context.Context, a core.Adoption) (core.Record, error) {
	return s.adopt(ctx, "adopt "+a.Record.SandboxID, a, false)
}

// adopt is Adopt; with pool, of a thread-less record holding a pool place
// (AdoptPoolSandbox): no binding, no user's or tenant's slot, and the
// place taken with the slot (or carried over from the reservation); its
// record may replace a gone one.
func (s *Store) adopt(ctx context.Context, op string, a core.Adoption, pool bool) (core.Record, error) {
	var bindItems []types.TransactWriteItem
	if a.Bind {
		it, err := s.bindingPut(a.Record.ThreadKey, a.Record.SandboxID, a.Record.UpdatedAt, bindingCondition(a.From, a.FromBound))
		if err != nil {
			return core.Record{}, fmt.Errorf("adopt: %w", err)
		}
		bindItems = append(bindItems, it)
	} else if a.Canonical != "" {
		it, err := s.conditionCheck(bindingPK(a.Record.ThreadKey), expression.Name("sandbox_id").Equal(expression.Value(a.Canonical)))
		if err != nil {
			return core.Record{}, fmt.Errorf("adopt: %w", err)
		}
		bindItems = append(bindItems, it)
	}
	if a.Record.Slots.Paused {
		a.Record.Slots.PausedRef = core.SlotRef(pausedSlots.homeOf(a.Record.SandboxID, 0))
		take, err := s.pausedTake(int(a.Record.Slots.PausedRef), 0, false) // as the running slot: the sandbox exists whatever the count says
		if err != nil {
			return core.Record{}, fmt.Errorf("adopt: %w", err)
		}
		bindItems = append(bindItems, take)
		if a.Record.Tenant != "" && !pool {
			a.Record.Slots.TenantPaused = true
			count, err := s.counterTake(tenantPausedPK(s.deployment, a.Record.Tenant), 0)
			if err != nil {
				return core.Record{}, fmt.Errorf("adopt: %w", err)
			}
			bindItems = append(bindItems, count)
		}
	}
	if !a.Record.Slots.Running() {
		return s.adoptPaused(ctx, op, a, bindItems)
	}
	if a.Reservation != "" {
		return s.consumeReservation(ctx, op, a.Reservation, a.Record, pool, bindItems...)
	}
	return s.adoptNew(ctx, op, a, pool, bindItems)
}

// adoptNew is Adopt of a running sandbox no reservation names: a new slot
// in the record's home bucket (one with a share of the store's limit), taken without a limit check (the sandbox
// runs already), with extra in the same transaction.
func (s *Store) adoptNew(ctx context.Context, op string, a core.Adoption, pool bool, bindItems []types.TransactWriteItem) (core.Record, error) {
	rec := a.Record
	rec.Fence = 1
	b := homeBucket(rec.SandboxID, s.limit)
	rec.Slot = core.Slot{Ref: core.SlotRef(b), Quota: !pool}
	put, err := s.recordPut(ctx, rec, pool)
	if err != nil {
		return core.Record{}, fmt.Errorf("adopt: %w", err)
	}
	take := slotTaken()
	if !pool {
		take = take.Add(expression.Name("tenants"), expression.Value(tenantSet(rec.Tenant)))
	}
	bucket, err := s.bucketUpdate(runningSlots, b, nil, take)
	if err != nil {
		return core.Record{}, fmt.Errorf("adopt: %w", err)
	}
	if pool {
		// The place is taken whatever the limit: the sandbox exists.
		place, err := s.bucketUpdate(poolPlaces, 0, nil, slotTaken())
		if err != nil {
			return core.Record{}, fmt.Errorf("adopt: %w", err)
		}
		items := append([]types.TransactWriteItem{put, bucket, place}, bindItems...)
		if err := s.transact(ctx, op, items); err != nil {
			return core.Record{}, err
		}
		return rec, nil
	}
	user, err := s.counterTake(userPK(s.deployment, rec.ThreadKey), 0)
	if err != nil {
		return core.Record{}, fmt.Errorf("adopt: %w", err)
	}
	tenant, err := s.counterTake(tenantPK(s.deployment, rec.Tenant), 0)
	if err != nil {
		return core.Record{}, fmt.Errorf("adopt: %w", err)
	}
	items := append([]types.TransactWriteItem{put, bucket, user, tenant}, bindItems...)
	if err := s.transact(ctx, op, items); err != nil {
		return core.Record{}, err
	}
	return rec, nil
}

// adoptPaused is Adopt of a record holding no running slot (a paused
// sandbox): a consumed reservation's running slot is freed.
func (s *Store) adoptPaused(ctx context.Context, op string, a core.Adoption, extra []types.TransactWriteItem) (core.Record, error) {
	rec := a.Record
	rec.Fence = 1
	rec.Slot = core.Slot{}
	put, err := s.recordPut(ctx, rec, false)
	if err != nil {
		return core.Record{}, fmt.Errorf("adopt: %w", err)
	}
	if a.Reservation == "" {
		if err := s.transact(ctx, op, append([]types.TransactWriteItem{put}, extra...)); err != nil {
			return core.Record{}, err
		}
		return rec, nil
	}
	failed, err := s.releaseReservation(ctx, op, a.Reservation, rec.ThreadKey, true, append([]types.TransactWriteItem{put}, extra...)...)
	if len(failed) > 0 || errors.Is(err, core.ErrNotFound) {
		return core.Record{}, fmt.Errorf("%s: condition failed: %w", op, core.ErrConflict)
	}
	if err != nil {
		return core.Record{}, err
	}
	return rec, nil
}

// Rebind points key's binding at sandboxID if the binding is still from
// and the record is live, in one transaction (ErrConflict otherwise).
func (s *Store) Rebind(ctx context.Context, key core.ThreadKey, sandboxID string, from core.Binding, fromBound bool) error {
	put, err := s.bindingPut(key, sandboxID, time.Now(), bindingCondition(from, fromBound))
	if err != nil {
		return fmt.Errorf("rebind: %w", err)
	}
	check, err := s.conditionCheck(sandboxPK(sandboxID), expression.AttributeExists(expression.Name(AttrPK)).And(liveCondition()))
	if err != nil {
		return fmt.Errorf("rebind: %w", err)
	}
	return s.transact(ctx, "rebind "+sandboxID, []types.TransactWriteItem{put, check})
}

// ClaimDuplicate applies c (as Claim does) only if key's binding still
// names canonical. ErrLeaseHeld, ErrNotFound or ErrConflict when it did not.
func (s *Store) ClaimDuplicate(ctx context.Context, c core.Claim, key core.ThreadKey, canonical string) (core.Record, error) {
	if len(c.From) == 0 || c.To == "" || c.LeaseUntil.IsZero() {
		return core.Record{}, errors.New("claim duplicate: need source states, a target state and a lease")
	}
	cond := claimCondition(c)
	upd := expression.Set(expression.Name("updated_at"), expression.Value(ms(c.Now))).
		Set(expression.Name("lease_owner"), expression.Value(c.Owner)).
		Set(expression.Name("lease_expires"), expression.Value(ms(c.LeaseUntil))).
		Set(expression.Name("state"), expression.Value(string(c.To))).
		Add(expression.Name("fence"), expression.Value(1)).
		Remove(expression.Name("parked_at"))
	upd = s.stateIndex(upd, c.To, c.Now, c.SandboxID, core.ThreadKey{})
	upd = markDestroying(upd, c.To, c.Now)
	upd = meter(upd, c.Now)
	recItem, err := s.recordTxnItem(c.SandboxID, cond, upd)
	if err != nil {
		return core.Record{}, fmt.Errorf("claim duplicate: %w", err)
	}
	check, err := s.conditionCheck(bindingPK(key), expression.Name("sandbox_id").Equal(expression.Value(canonical)))
	if err != nil {
		return core.Record{}, fmt.Errorf("claim duplicate: %w", err)
	}
	failed, err := s.writeTxn(ctx, "claim duplicate", []types.TransactWriteItem{recItem, check})
	if r, ok := failed[sandboxPK(c.SandboxID)]; ok {
		old, err := s.oldRecord(ctx, r.Item)
		if err != nil {
			return core.Record{}, err
		}
		if old.Tenant != c.Tenant {
			return core.Record{}, core.ErrNotFound
		}
		if slices.Contains(c.From, old.State) && old.Leased(c.Owner, c.Now) {
			return old, fmt.Errorf("sandbox %s: %w", c.SandboxID, core.ErrLeaseHeld)
		}
		return old, fmt.Errorf("sandbox %s is %s: %w", c.SandboxID, old.State, core.ErrConflict)
	}
	if has(failed, bindingPK(key)) {
		return core.Record{}, fmt.Errorf("thread %s no longer names %s: %w", key, canonical, core.ErrConflict)
	}
	if err != nil {
		return core.Record{}, err
	}
	return s.Get(ctx, c.SandboxID)
}

// FirstSeen records now as id's first sighting unless one exists (one
// conditional write; a refusal returns the stored one).
func (s *Store) FirstSeen(ctx context.Context, id string, now time.Time) (time.Time, error) {
	_, err := s.updateItem(ctx, "first seen", s.key(firstSeenPK(id)), expression.AttributeNotExists(expression.Name(AttrPK)),
		expression.Set(expression.Name("first_seen"), expression.Value(ms(now))).
			Set(expression.Name(AttrTTL), expression.Value(now.Add(firstSeenTTL).Unix())), "", true)
	if item, failed := conditionFailed(err); failed {
		var old struct {
			FirstSeen int64 `dynamodbav:"first_seen"`
		}
		if err := attributevalue.UnmarshalMap(item, &old); err != nil || old.FirstSeen == 0 {
			return now, nil
		}
		return fromMS(old.FirstSeen), nil
	}
	if err != nil {
		return time.Time{}, err
	}
	return now, nil
}

// reconcileCursorItem is the stored core.ReconcileCursor.
type reconcileCursorItem struct {
	Cycle      string `dynamodbav:"cycle"`
	CycleStart int64  `dynamodbav:"cycle_start"`
	Token      string `dynamodbav:"token"`
	Pass       int    `dynamodbav:"pass"`
	Version    int64  `dynamodbav:"version"`
	PoolUsed   int    `dynamodbav:"pool_used,omitempty"`
	PoolCount  int    `dynamodbav:"pool_count,omitempty"`
	PoolNoted  bool   `dynamodbav:"pool_noted,omitempty"`
	PoolRev    int64  `dynamodbav:"pool_revision,omitempty"`
}

// Cursor reads the inventory cursor (zero if none).
func (s *Store) Cursor(ctx context.Context) (core.ReconcileCursor, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.table, Key: s.key(reconcilePK(s.deployment)), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return core.ReconcileCursor{}, unavailable("get reconcile cursor", err)
	}
	var it reconcileCursorItem
	if out.Item != nil {
		if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
			return core.ReconcileCursor{}, fmt.Errorf("decode reconcile cursor: %w", err)
		}
	}
	return core.ReconcileCursor{Cycle: it.Cycle, CycleStart: fromMS(it.CycleStart), Token: it.Token, Pass: it.Pass,
		Version: it.Version,
		Pool:    core.NotedCount{Used: it.PoolUsed, Counted: it.PoolCount, Noted: it.PoolNoted, Revision: it.PoolRev}}, nil
}

// SaveCursor writes c if the stored version is c.Version (ErrConflict
// otherwise), with version c.Version+1.
func (s *Store) SaveCursor(ctx context.Context, c core.ReconcileCursor) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	av, err := attributevalue.MarshalMap(reconcileCursorItem{Cycle: c.Cycle, CycleStart: ms(c.CycleStart), Token: c.Token,
		Pass: c.Pass, Version: c.Version + 1,
		PoolUsed: c.Pool.Used, PoolCount: c.Pool.Counted, PoolNoted: c.Pool.Noted, PoolRev: c.Pool.Revision})
	if err != nil {
		return fmt.Errorf("save reconcile cursor: %w", err)
	}
	av[AttrPK] = &types.AttributeValueMemberS{Value: reconcilePK(s.deployment)}
	av[AttrSK] = &types.AttributeValueMemberS{Value: sortKey}
	cond := expression.AttributeNotExists(expression.Name(AttrPK))
	if c.Version > 0 {
		cond = expression.Name("version").Equal(expression.Value(c.Version))
	}
	put, err := s.txnPut(av, cond)
	if err != nil {
		return fmt.Errorf("save reconcile cursor: %w", err)
	}
	return s.transact(ctx, "save reconcile cursor", []types.TransactWriteItem{put})
}

// seenChunk bounds the ids stored per item (well under 400 KB).
const seenChunk = 2000

// SaveSeen stores a pass's part of a cycle's inventory.
func (s *Store) SaveSeen(ctx context.Context, cycle, part string, seen []core.SeenSandbox) error {
	for i := 0; i < len(seen); i += seenChunk {
		chunk := seen[i:min(i+seenChunk, len(seen))]
		ids := make([]string, len(chunk))
		for j, sb := range chunk {
			ids[j] = sb.ID
			if sb.Reservation != "" {
				ids[j] += "\t" + sb.Reservation
			}
		}
		idsAV, err := attributevalue.Marshal(ids)
		if err != nil {
			return fmt.Errorf("save seen: %w", err)
		}
		item := keySK(reconcilePK(s.deployment), fmt.Sprintf("SEEN#%s#%s#%04d", cycle, part, i/seenChunk))
		item["ids"] = idsAV
		item[AttrTTL] = &types.AttributeValueMemberN{Value: strconv.FormatInt(time.Now().Add(seenTTL).Unix(), 10)}
		if err := s.transact(ctx, "save seen", []types.TransactWriteItem{{Put: &types.Put{TableName: &s.table, Item: item}}}); err != nil {
			return err
		}
	}
	return nil
}

// Seen reads every stored part of a cycle's inventory.
func (s *Store) Seen(ctx context.Context, cycle string) ([]core.SeenSandbox, error) {
	var out []core.SeenSandbox
	err := s.queryReconcile(ctx, "seen", "SEEN#"+cycle+"#", func(av map[string]types.AttributeValue) error {
		var ids []string
		if err := attributevalue.Unmarshal(av["ids"], &ids); err != nil {
			return fmt.Errorf("decode seen: %w", err)
		}
		for _, v := range ids {
			id, tok, _ := strings.Cut(v, "\t")
			out = append(out, core.SeenSandbox{ID: id, Reservation: tok})
		}
		return nil
	})
	return out, err
}

// queryReconcile calls each for every item beside the reconcile cursor
// whose sort key starts with prefix (a strongly consistent query, every
// page), until each fails; what names the items in errors.
func (s *Store) queryReconcile(ctx context.Context, what, prefix string, each func(map[string]types.AttributeValue) error) error {
	expr, err := expression.NewBuilder().WithKeyCondition(
		expression.Key(AttrPK).Equal(expression.Value(reconcilePK(s.deployment))).
			And(expression.Key(AttrSK).BeginsWith(prefix))).Build()
	if err != nil {
		return err
	}
	p := dynamodb.NewQueryPaginator(s.db, &dynamodb.QueryInput{TableName: &s.table, ConsistentRead: aws.Bool(true),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()})
	for p.HasMorePages() {
		cctx, cancel := s.ctx(ctx)
		page, err := p.NextPage(cctx)
		cancel()
		if err != nil {
			return unavailable("query "+what, err)
		}
		for _, av := range page.Items {
			if err := each(av); err != nil {
				return err
			}
		}
	}
	return nil
}

// slotStates are the states whose records (and reservations) hold a
// running slot (a tombstone of a paused sandbox does not: see CountSlots).
var slotStates = []core.State{core.StateCreating, core.StateActive, core.StateReleasing, core.StateWarm,
	core.StatePausing, core.StateResuming, core.StateDestroying, core.StatePooled, core.StateClaiming}
