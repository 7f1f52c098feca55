package ddbstore

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// CapacityBuckets is how many items the capacity ledger is split into:
// "CAP#<deployment>" (bucket 0, the key the single ledger had, so its
// count and the records that hold no bucket attribute stay bucket 0's)
// and "CAP#<deployment>#<b>" for b = 1..63. A bucket holds:
//
//	used          slots held by the records and reservations that name it ("bucket"),
//	              and the slots it holds in trust for granted wait tickets
//	granted       of those, the slots held in trust (see waiters.go)
//	lim, lim_of   the bucket's limit, set for the deployment limit lim_of
//	draining      the deployment drains (written to every bucket at once)
//	tenants       tenants that reserved in it (fair share; reconcile drops idle ones)
//	revision      bumped by every write that moves "used" or "granted", and by a
//	              grant's hand-over to the next ticket (the counts stay)
//	shards        the most state-index keys a store that set the limits files
//	              entries under (a high-water mark: see tallyShards)
//
// The limits of the buckets always sum to the deployment limit: they are
// written together, in one transaction conditional on every bucket's
// revision (setLimits), by the first reservation that finds them set for
// another limit (a fresh deployment, SANDBOX_REPLICAS changed) and by
// reconcile when a bucket
// holds more than its limit (an adopted sandbox). A reservation takes a
// slot only in a bucket whose limit is set for the limit it enforces and
// within that limit, so the deployment never holds more than its limit
// (invariant 1). A reservation
// tries its home bucket (a hash of its token), and only when that is full
// reads every bucket (one BatchGetItem) and tries those with room: a
// refusal means every bucket is full, and its details are the buckets'
// sums. Creates and frees of the whole deployment spread over 64 items
// instead of one, each of which DynamoDB limits to about 1,000 write
// units a second (twice that per transactional write). Why 64: creates,
// frees and refused attempts write buckets; over 64 buckets no bucket is the
// key that bounds BenchmarkHotKeys' steady loads (its figures are in
// docs/benchmarks.md), while a refusal's read of every bucket is still
// one BatchGetItem (at most 100 keys).
//
// A bucket counts slots, not states: a record's state moves (park,
// reclaim, pause) write the record alone. Capacity counts the states from
// the state index when asked.
const CapacityBuckets = 64

// bucketPK is the key of capacity bucket b.
func bucketPK(deployment string, b int) string {
	if b == 0 {
		return capacityPK(deployment)
	}
	return capacityPK(deployment) + "#" + strconv.Itoa(b)
}

func hashOf(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// bucketShare is capacity bucket b's part of limit (evenShare).
func bucketShare(limit, b int) int { return evenShare(limit, CapacityBuckets, b) }

// evenShare is item b's part of limit split among n items: the limit
// split evenly, the remainder going to the lowest items.
func evenShare(limit, n, b int) int {
	s := limit / n
	if b < limit%n {
		s++
	}
	return s
}

// homeBucket is the first bucket a reservation with token tries: one of
// those with a share of limit, by a hash of the token.
func homeBucket(token string, limit int) int { return homeOf(token, max(limit, 1), CapacityBuckets) }

// homeOf is the first of n items a take by token tries: one of those with
// an even share of limit (any of them when limit is 0: no limit), by a
// hash of the token.
func homeOf(token string, limit, n int) int {
	if limit > 0 {
		n = min(n, limit)
	}
	return int(hashOf(token) % uint32(n))
}

// threadHome is the first bucket the running-slot takes of thread k try
// under limit (its reservations, resume claims and paused pool members'
// claims): one of those with a share of limit, by a hash of the thread.
// Lookup reads it, for the draining flag; a thread's takes spread over
// the buckets as the threads do, and no one bucket is read by every
// acquire.
func threadHome(k core.ThreadKey, limit int) int {
	return homeOf(k.Tenant+"\x00"+k.User+"\x00"+k.Thread, max(limit, 1), CapacityBuckets)
}

// bucketItem is a stored capacity bucket.
type bucketItem struct {
	Index    int      `dynamodbav:"-"`
	Used     int      `dynamodbav:"used"`
	Revision int64    `dynamodbav:"revision"`
	Draining bool     `dynamodbav:"draining"`
	Tenants  []string `dynamodbav:"tenants,stringset"`
	Granted  int      `dynamodbav:"granted"`
	Lim      int      `dynamodbav:"lim"`
	LimOf    int      `dynamodbav:"lim_of"`
	Shards   int      `dynamodbav:"shards"`
}

func decodeBucket(av map[string]types.AttributeValue) bucketItem {
	var b bucketItem
	_ = attributevalue.UnmarshalMap(av, &b) // absent attributes stay zero
	return b
}

// room is how many slots the bucket can still give under total (none
// until its limit is set for total).
func (b bucketItem) room(total int) int {
	if b.LimOf != total {
		return 0
	}
	return b.Lim - b.Used
}

// bucketIndex parses a bucket key of the deployment (-1 if not one).
func bucketIndex(deployment, pk string) int {
	if pk == capacityPK(deployment) {
		return 0
	}
	rest, ok := strings.CutPrefix(pk, capacityPK(deployment)+"#")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n <= 0 || n >= CapacityBuckets {
		return -1
	}
	return n
}

// readBuckets reads every bucket (one BatchGetItem; strongly consistent
// only when consistent: an eventually consistent read costs half the
// read units, and picking a bucket or reporting counts needs no more, the
// take's own condition deciding).
// A bucket never written reads as empty.
func (s *Store) readBuckets(ctx context.Context, consistent bool) ([]bucketItem, error) {
	idx := make([]int, CapacityBuckets)
	for b := range idx {
		idx[b] = b
	}
	keys := make([]map[string]types.AttributeValue, 0, len(idx))
	for _, b := range idx {
		keys = append(keys, s.key(bucketPK(s.deployment, b)))
	}
	items, err := s.batchGet(ctx, keys, consistent)
	if err != nil {
		return nil, err
	}
	out := make([]bucketItem, len(idx))
	at := make(map[int]int, len(idx))
	for i, b := range idx {
		out[i] = bucketItem{Index: b}
		at[b] = i
	}
	for _, av := range items {
		pk, _ := av[AttrPK].(*types.AttributeValueMemberS)
		if pk == nil {
			continue
		}
		if i, ok := at[bucketIndex(s.deployment, pk.Value)]; ok {
			it := decodeBucket(av)
			it.Index = idx[i]
			out[i] = it
		}
	}
	return out, nil
}

// bucketStatus sums the buckets into the deployment's capacity status and
// the tenants holding slots.
func bucketStatus(buckets []bucketItem) (core.CapacityStatus, []string) {
	var st core.CapacityStatus
	var tenants []string
	for _, b := range buckets {
		st.Used += b.Used
		st.Draining = st.Draining || b.Draining
		st.Granted += b.Granted
		for _, t := range b.Tenants {
			if !slices.Contains(tenants, t) {
				tenants = append(tenants, t)
			}
		}
	}
	slices.Sort(tenants)
	return st, tenants
}

// Capacity sums the capacity buckets and the paused buckets (two
// BatchGetItems), and reads the counts by state that the last counter
// repair kept (one GetItem): three reads, whatever the fleet.
func (s *Store) Capacity(ctx context.Context) (core.CapacityStatus, error) {
	buckets, err := s.readBuckets(ctx, false)
	if err != nil {
		return core.CapacityStatus{}, err
	}
	st, _ := bucketStatus(buckets)
	paused, err := s.readPaused(ctx, false)
	if err != nil {
		return core.CapacityStatus{}, err
	}
	st.Paused = pausedSum(paused).Used
	noted, err := s.notedCounts(ctx, false)
	if err != nil {
		return core.CapacityStatus{}, err
	}
	for state, n := range noted.States {
		st.AddState(core.State(state), n)
	}
	st.CountedAt = noted.CountedAt
	return st, nil
}

// TenantsHolding implements core.CapacityStore: the buckets' tenant sets,
// in one eventually consistent read of the buckets.
func (s *Store) TenantsHolding(ctx context.Context) ([]string, error) {
	buckets, err := s.readBuckets(ctx, false)
	if err != nil {
		return nil, err
	}
	_, tenants := bucketStatus(buckets)
	return tenants, nil
}

// bucketUpdate is the transaction item applying u (under cond, if any) to
// bucket b.
func (s *Store) bucketUpdate(b int, cond *expression.ConditionBuilder, u expression.UpdateBuilder) (types.TransactWriteItem, error) {
	eb := expression.NewBuilder().WithUpdate(u)
	if cond != nil {
		eb = eb.WithCondition(*cond)
	}
	expr, err := eb.Build()
	if err != nil {
		return types.TransactWriteItem{}, fmt.Errorf("bucket update: %w", err)
	}
	return types.TransactWriteItem{Update: &types.Update{TableName: &s.table, Key: s.key(bucketPK(s.deployment, b)),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld}}, nil
}

// takeCondition is the condition that a bucket has room under limits set
// for the deployment limit total, and the deployment is not draining.
func takeCondition(total int) expression.ConditionBuilder {
	return expression.Name("lim_of").Equal(expression.Value(total)).
		And(expression.Or(
			expression.Name("used").LessThan(expression.Name("lim")),
			expression.AttributeNotExists(expression.Name("used")).And(expression.Name("lim").GreaterThan(expression.Value(0))))).
		And(notDraining())
}

// tallyShards is how many state-index keys of each state can hold
// entries, so that the counter repair reads only those: the most that the
// stores which set the buckets' limits file entries under (each records
// its own; the mark never goes down), or every key when limits were set
// before any was recorded. It relies on every store of a deployment
// filing entries under the keys of the limit it enforces (WithLimit, as
// the functions are wired): a store of a new limit sets the limits before
// its first slot. An entry outside the mark is missed by the tally, which
// then only notes a difference that the exact count must confirm before
// any counter moves (see RepairCounters). 0 when no limit was ever set.
func tallyShards(buckets []bucketItem) int {
	n := 0
	for _, b := range buckets {
		if b.LimOf != 0 && b.Shards == 0 {
			return IndexShards
		}
		n = max(n, b.Shards)
	}
	return n
}

// bucketLimits divides total among the buckets: each keeps what it holds
// (the excess, when they hold more than total, taken from the fullest),
// and the spare goes where the limit is least above the bucket's even
// share, so that a fresh deployment's buckets get their shares.
func bucketLimits(buckets []bucketItem, total int) []int {
	lims := make([]int, len(buckets))
	sum := 0
	for i, b := range buckets {
		lims[i] = max(b.Used, 0)
		sum += lims[i]
	}
	for ; sum > total; sum-- {
		i := 0
		for j := range lims {
			if lims[j] > lims[i] {
				i = j
			}
		}
		lims[i]--
	}
	for ; sum < total; sum++ {
		i := 0
		for j := range lims {
			if lims[j]-bucketShare(total, j) < lims[i]-bucketShare(total, i) {
				i = j
			}
		}
		lims[i]++
	}
	return lims
}

// needsLimits reports whether the buckets' limits must be (re)written for
// total: not all set for it, or a bucket holding more than its limit (an
// adopted sandbox).
func needsLimits(buckets []bucketItem, total int) bool {
	for _, b := range buckets {
		if b.LimOf != total || b.Used > b.Lim {
			return true
		}
	}
	return false
}

// setLimits writes every bucket's limit for total (bucketLimits) in one
// transaction, each bucket conditional on its revision as read: the limits
// always sum to total, and no bucket took a slot since they were computed.
// ErrConflict when a bucket moved (the caller reads again).
func (s *Store) setLimits(ctx context.Context, buckets []bucketItem, total int) error {
	lims := bucketLimits(buckets, total)
	shards := max(s.shards, tallyShards(buckets))
	items := make([]types.TransactWriteItem, 0, len(buckets))
	for i, b := range buckets {
		cond := valueIs("revision", b.Revision)
		it, err := s.bucketUpdate(b.Index, &cond, expression.Set(expression.Name("lim"), expression.Value(lims[i])).
			Set(expression.Name("lim_of"), expression.Value(total)).Set(expression.Name("shards"), expression.Value(shards)).
			Add(expression.Name("revision"), expression.Value(1)))
		if err != nil {
			return fmt.Errorf("set bucket limits: %w", err)
		}
		items = append(items, it)
	}
	return s.transact(ctx, "set bucket limits", items)
}
