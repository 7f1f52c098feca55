package ddbstore

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// CountHolders reads the paused slots held and the pool place count
// (with revisions: the paused buckets' summed), then counts their holders
// from every key of the state index; it repairs no counter (it files a
// stray entry under its key, as the repair's tally does).
func (s *Store) CountHolders(ctx context.Context) (paused, pool core.HolderCount, err error) {
	counts, pool, tally, err := s.countHolders(ctx, IndexShards)
	if err != nil {
		return paused, pool, err
	}
	paused.Used, paused.Revision = usedSum(counts)
	for _, n := range tally.paused {
		paused.Counted += n
	}
	return paused, pool, nil
}

// countHolders reads the paused buckets and the pool place count with
// their revisions (strongly consistent), then tallies the state index
// (tallySlots): their holders, and every other counter's.
func (s *Store) countHolders(ctx context.Context, shards int) (paused []bucketItem, pool core.HolderCount, tally *slotTally, err error) {
	if paused, err = s.readLedger(ctx, pausedSlots, 0, true); err != nil {
		return nil, pool, nil, err
	}
	places, err := s.readLedger(ctx, poolPlaces, 0, true)
	if err != nil {
		return nil, pool, nil, err
	}
	pool.Used, pool.Revision = usedSum(places)
	if tally, err = s.tallySlots(ctx, shards); err != nil {
		return nil, pool, nil, err
	}
	pool.Counted = tally.pool
	return paused, pool, tally, nil
}

// countItem is a user's or tenant's slot counter, as stored.
type countItem struct {
	Used     int   `dynamodbav:"used"`
	Revision int64 `dynamodbav:"revision"`
}

// readCounters reads the USR#/TEN# counters keys, strongly consistent
// (absent: 0 at revision 0).
func (s *Store) readCounters(ctx context.Context, keys []string) (map[string]countItem, error) {
	avs := make([]map[string]types.AttributeValue, 0, len(keys))
	for _, k := range keys {
		avs = append(avs, s.key(k))
	}
	items, err := s.batchGetAll(ctx, avs, true)
	if err != nil {
		return nil, err
	}
	out := map[string]countItem{}
	for _, av := range items {
		if pk := stringAttr(av, AttrPK); pk != "" {
			var c countItem
			_ = attributevalue.UnmarshalMap(av, &c) // absent attributes stay zero
			out[pk] = c
		}
	}
	return out, nil
}

// notedState is the counter repair's item: the differences the last pass
// noted, the segment of the table the next pass sweeps, and the holders of
// running slots by state that the pass counted (what Capacity reports).
type notedState struct {
	Noted     map[string]string `dynamodbav:"noted"`
	Sweep     int32             `dynamodbav:"sweep"`
	States    map[string]int    `dynamodbav:"states,omitempty"`
	CountedAt time.Time         `dynamodbav:"counted_at,omitempty"`
}

// stateCounts is t's count of running-slot holders by state, keyed as
// notedState keeps it.
func stateCounts(t *slotTally) map[string]int {
	out := make(map[string]int, len(t.states))
	for st, n := range t.states {
		out[string(st)] = n
	}
	return out
}

// notedCounts reads the counter repair's item (strongly consistent when
// consistent).
func (s *Store) notedCounts(ctx context.Context, consistent bool) (notedState, error) {
	var n notedState
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.GetItem(cctx, &dynamodb.GetItemInput{TableName: &s.table, Key: keySK(reconcilePK(s.deployment), countsSK),
		ConsistentRead: aws.Bool(consistent)})
	if err != nil {
		return n, unavailable("get noted counts", err)
	}
	if err := attributevalue.UnmarshalMap(out.Item, &n); err != nil {
		return n, fmt.Errorf("decode noted counts: %w", err)
	}
	return n, nil
}

func (s *Store) saveNotedCounts(ctx context.Context, n notedState) error {
	av, err := attributevalue.MarshalMap(n)
	if err != nil {
		return fmt.Errorf("save noted counts: %w", err)
	}
	maps.Copy(av, keySK(reconcilePK(s.deployment), countsSK))
	return s.transact(ctx, "save noted counts", []types.TransactWriteItem{{Put: &types.Put{TableName: &s.table, Item: av}}})
}

// sweepCounts returns the keys of the users' and tenants' slot counts
// (and tenants' paused counts) that are not zero in segment of the table's sweepSegments (a Scan of
// that part of the table). A count that no holder names is read only so:
// one raised above what is held, by a bug, would
// refuse its user or tenant for good once they hold nothing.
func (s *Store) sweepCounts(ctx context.Context, segment int32) ([]string, error) {
	filter := expression.And(
		expression.Or(expression.Name(AttrPK).BeginsWith("USR#"+s.deployment+"#"),
			expression.Name(AttrPK).BeginsWith("TEN#"+s.deployment+"#"),
			expression.Name(AttrPK).BeginsWith("TPA#"+s.deployment+"#")),
		expression.Name("used").NotEqual(expression.Value(0)))
	expr, err := expression.NewBuilder().WithFilter(filter).Build()
	if err != nil {
		return nil, fmt.Errorf("sweep slot counts: %w", err)
	}
	var keys []string
	err = s.scanEach(ctx, "sweep slot counts", &dynamodb.ScanInput{TableName: &s.table, FilterExpression: expr.Filter(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		Segment: aws.Int32(segment), TotalSegments: aws.Int32(s.sweep)}, func(av map[string]types.AttributeValue) error {
		if pk := stringAttr(av, AttrPK); pk != "" {
			keys = append(keys, pk)
		}
		return nil
	})
	return keys, err
}
