package ddbstore

import (
	"cmp"
	"context"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// IndexShards is the most partition keys the state index spreads each
// state over (the key layout is in schema.go; the store's count is
// shardsFor the deployment limit, WithLimit). A DynamoDB partition takes
// about 1,000 write units a second, and every change of a record writes
// the index under its state's key: a state change twice (the entry
// deleted under the state it leaves, put under the one it enters), any
// other update once (the index projects every attribute). Active,
// releasing and warm are each written about twice per acquire. Every
// state has the same count.
const IndexShards = 32

// slotsPerShard is how many slots of the deployment limit one index key
// serves (shardsFor): a slot is written about twice per acquire, so
// a key stays within a partition's rate while each slot serves fewer than
// about 60 acquires a second. Fewer keys make every fan-out (an eviction's
// sample, the dead-slot check) that many fewer queries.
const slotsPerShard = 8

// shardsFor is the state index's shard count for a deployment limit: one
// key per slotsPerShard slots, between 1 and IndexShards.
func shardsFor(limit int) int {
	return min(max((limit+slotsPerShard-1)/slotsPerShard, 1), IndexShards)
}

// WithLimit sizes the state index for a deployment limit (shardsFor;
// without it, IndexShards keys per state), and names the running-slot
// buckets that capacity reads and adoptions use (readLedger). A changed limit files entries
// under the new keys from their next write; reconcile moves the others
// (RepairCounters), and until then a read may miss them.
func WithLimit(limit int) Option {
	return func(s *Store) { s.shards, s.limit = shardsFor(limit), limit }
}

// queryParallel bounds the shard queries one fan-out runs at once: every
// index key of a state in one round, so a fan-out costs one query's
// latency, not three.
const queryParallel = IndexShards

// ConcurrentCalls is the most DynamoDB calls one store operation runs at
// once (a fan-out over a state's index keys). The HTTP transport of a
// store's client should keep at least that many idle connections per
// host: with fewer (the SDK's default keeps 10, net/http's 2) every
// fan-out opens, and in AWS handshakes TLS on, the connections beyond its
// pool, and closes them again.
const ConcurrentCalls = queryParallel

// shardOf is id's shard among n: FNV-1a of id, modulo n (stable across
// processes). It spreads index entries, ledger takes, queue tickets and
// owner entries over their keys.
func shardOf(id string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// stringAttr is av's string attribute name ("" when absent).
func stringAttr(av map[string]types.AttributeValue, name string) string {
	if v, ok := av[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// statePK is the index partition key of id's entry in state. Pool
// members are all filed under the first shard (poolShard).
func (s *Store) statePK(st core.State, id string) string {
	if st == core.StatePooled {
		return stateShardPK(s.deployment, st, poolShard)
	}
	return stateShardPK(s.deployment, st, shardOf(id, s.shards))
}

// poolShard is the one index shard pool members are filed under, so that
// an acquire finds some in one query however few there are. A pool is
// small, and every write that files or unfiles a member also writes the
// pool's one count item (POOL#), so the one key bounds nothing further.
const poolShard = 0

// stateShardPK is the index partition key of shard n of state.
func stateShardPK(deployment string, s core.State, n int) string {
	return "ST#" + deployment + "#" + string(s) + "#" + strconv.Itoa(n)
}

// statePKs lists every partition key a query over state reads: the
// store's shards.
func (s *Store) statePKs(st core.State) []string {
	return shardPKs(s.deployment, st, s.shards)
}

// shardPKs lists the first n index keys of state.
func shardPKs(deployment string, st core.State, n int) []string {
	pks := make([]string, n)
	for i := range pks {
		pks[i] = stateShardPK(deployment, st, i)
	}
	return pks
}

// keyQuery is a query over one partition key, pk.
type keyQuery struct {
	pk string
	in *dynamodb.QueryInput
}

// shardQuery pages one partition key's items in sort-key order.
type shardQuery struct {
	pk  string
	p   *dynamodb.QueryPaginator
	buf []map[string]types.AttributeValue
}

func (q *shardQuery) fill(ctx context.Context, s *Store, what string) error {
	for len(q.buf) == 0 && q.p.HasMorePages() {
		cctx, cancel := s.ctx(ctx)
		out, err := q.p.NextPage(cctx)
		cancel()
		if err != nil {
			return unavailable(what, err)
		}
		q.buf = out.Items
	}
	return nil
}

// eachMerged runs the queries kqs (each over one partition key, in
// sort-key order) and calls fn with their items merged in the order of
// their string attribute sortAttr, until fn returns false or every query
// is done. Every query's first page is read in parallel; later pages as
// the merge reaches them.
func (s *Store) eachMerged(ctx context.Context, what string, kqs []keyQuery, sortAttr string, fn func(map[string]types.AttributeValue) bool) error {
	qs := make([]*shardQuery, 0, len(kqs))
	for _, kq := range kqs {
		qs = append(qs, &shardQuery{pk: kq.pk, p: dynamodb.NewQueryPaginator(s.db, kq.in)})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(queryParallel)
	for _, q := range qs {
		g.Go(func() error {
			return q.fill(gctx, s, what)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for {
		var next *shardQuery
		for _, q := range qs {
			if len(q.buf) > 0 && (next == nil || cmp.Less(stringAttr(q.buf[0], sortAttr), stringAttr(next.buf[0], sortAttr))) {
				next = q
			}
		}
		if next == nil {
			return nil
		}
		av := next.buf[0]
		next.buf = next.buf[1:]
		if !fn(av) {
			return nil
		}
		if err := next.fill(ctx, s, what); err != nil {
			return err
		}
	}
}

// eachInState calls fn with every index entry in state (sk, when not nil,
// narrows the sort key) in sort-key order across the shards (oldest first:
// the warm pool's LRU order), until fn returns false. Every shard's first
// page is read in parallel; later pages as the merge reaches them. page,
// when > 0, bounds the entries a page reads (a caller wanting few).
func (s *Store) eachInState(ctx context.Context, state core.State, sk *expression.KeyConditionBuilder, page int32, fn func(map[string]types.AttributeValue) bool) error {
	return s.eachInKeys(ctx, s.statePKs(state), state, sk, page, fn)
}

// eachInKeys is eachInState over the index partition keys pks (of state)
// only.
func (s *Store) eachInKeys(ctx context.Context, pks []string, state core.State, sk *expression.KeyConditionBuilder, page int32, fn func(map[string]types.AttributeValue) bool) error {
	kqs := make([]keyQuery, len(pks))
	for i, pk := range pks {
		kc := expression.Key(AttrGSI1PK).Equal(expression.Value(pk))
		if sk != nil {
			kc = kc.And(*sk)
		}
		expr, err := expression.NewBuilder().WithKeyCondition(kc).Build()
		if err != nil {
			return err
		}
		in := &dynamodb.QueryInput{TableName: &s.table, IndexName: aws.String(IndexGSI1),
			KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(),
			ExpressionAttributeValues: expr.Values()}
		if page > 0 {
			in.Limit = aws.Int32(page)
		}
		kqs[i] = keyQuery{pk: pk, in: in}
	}
	return s.eachMerged(ctx, "query "+string(state), kqs, AttrGSI1SK, fn)
}

// recordsInState lists up to limit records in state (sk narrowing the
// sort key), oldest first.
func (s *Store) recordsInState(ctx context.Context, state core.State, sk *expression.KeyConditionBuilder, limit int) ([]core.Record, error) {
	avs, err := s.entriesIn(ctx, s.statePKs(state), state, sk, limit)
	if err != nil {
		return nil, err
	}
	return s.decodeRecords(ctx, avs)
}

// entriesIn lists up to limit index entries of state under the keys pks
// (sk narrowing the sort key), oldest first.
func (s *Store) entriesIn(ctx context.Context, pks []string, state core.State, sk *expression.KeyConditionBuilder, limit int) ([]map[string]types.AttributeValue, error) {
	var avs []map[string]types.AttributeValue
	err := s.eachInKeys(ctx, pks, state, sk, int32(limit), func(av map[string]types.AttributeValue) bool {
		avs = append(avs, av)
		return len(avs) < limit
	})
	return avs, err
}

// decodeRecords decodes the records avs.
func (s *Store) decodeRecords(ctx context.Context, avs []map[string]types.AttributeValue) ([]core.Record, error) {
	recs := make([]core.Record, 0, len(avs))
	for _, av := range avs {
		rec, err := s.decodeRecord(ctx, av)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// sampleShards is how many index shards of a state, picked at random, a
// sampled query reads first (a quarter of them); sampleEnough is how many
// entries it must find there, else it reads the other shards too.
const (
	sampleShards = IndexShards / 4 // of IndexShards; of n keys, max(1, n/4)
	sampleEnough = 4
)

// sampleInState lists up to limit records in state (sk narrowing the sort
// key), oldest first, of sampleShards random index shards: a random
// quarter of the state's entries, since an entry's shard is a hash of its
// id. When those hold fewer than sampleEnough entries (or than limit, if
// smaller) it reads every other key too and merges, so the answer is then
// exactly recordsInState's (and it is empty only when the state has no
// entry).
func (s *Store) sampleInState(ctx context.Context, state core.State, sk *expression.KeyConditionBuilder, limit int) ([]core.Record, error) {
	pks := s.statePKs(state)
	rand.Shuffle(len(pks), func(i, j int) { pks[i], pks[j] = pks[j], pks[i] })
	n := max(1, len(pks)*sampleShards/IndexShards)
	avs, err := s.entriesIn(ctx, pks[:n], state, sk, limit)
	if err != nil {
		return nil, err
	}
	if len(avs) < min(sampleEnough, limit) && n < len(pks) {
		rest, err := s.entriesIn(ctx, pks[n:], state, sk, limit)
		if err != nil {
			return nil, err
		}
		avs = append(avs, rest...)
		slices.SortFunc(avs, func(a, b map[string]types.AttributeValue) int {
			return cmp.Compare(stringAttr(a, AttrGSI1SK), stringAttr(b, AttrGSI1SK))
		})
		avs = avs[:min(len(avs), limit)]
	}
	return s.decodeRecords(ctx, avs)
}

// inKey lists up to limit records of one index key (one query), the
// oldest first, or the newest first when newest.
func (s *Store) inKey(ctx context.Context, state core.State, pk string, limit int, newest bool) ([]core.Record, error) {
	expr, err := expression.NewBuilder().WithKeyCondition(expression.Key(AttrGSI1PK).Equal(expression.Value(pk))).Build()
	if err != nil {
		return nil, err
	}
	cctx, cancel := s.ctx(ctx)
	out, err := s.db.Query(cctx, &dynamodb.QueryInput{TableName: &s.table, IndexName: aws.String(IndexGSI1),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(),
		ExpressionAttributeValues: expr.Values(), Limit: aws.Int32(int32(limit)), ScanIndexForward: aws.Bool(!newest)})
	cancel()
	if err != nil {
		return nil, unavailable("query "+string(state), err)
	}
	return s.decodeRecords(ctx, out.Items)
}

// ScanState calls fn for each record (or reservation) in state, oldest
// first, until fn returns false.
func (s *Store) ScanState(ctx context.Context, state core.State, fn func(core.Record) bool) error {
	var derr error
	err := s.eachInState(ctx, state, nil, 0, func(av map[string]types.AttributeValue) bool {
		rec, err := s.decodeRecord(ctx, av)
		if err != nil {
			derr = err
			return false
		}
		return fn(rec)
	})
	if err != nil {
		return err
	}
	return derr
}
