package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Holds on a bucket's last room. A take that read a bucket with one slot
// left races every other take and grant that read it too, and all but one
// cancel their transaction: the record's, the user's and the tenant's
// items with the bucket's. The tenant's slot count is the hottest item of
// a deployment whose acquires mostly race (each lost race costs it as
// much as a take), so such a take first holds the room with one
// conditional UpdateItem of the bucket alone (one write unit, whoever
// wins): a take that loses the hold loses its race there, and only the
// holder sends the transaction. A bucket carries at most one hold:
//
//	hold_by    the holder (a random id of the take)
//	hold_until when the hold lapses (ms): a holder that died holds nothing
//	           after it
//	hold_lim   the bucket's limit less the held slot: while the hold is
//	           live, another take or grant may take a slot only below it
//
// Every take and grant honours a live hold (takeCondition); the holder's
// take clears it in its transaction, and a holder whose take fails for
// another reason than the room clears it at once (releaseHold).

// holdFor is how long a hold lasts: the holder's transaction follows its
// hold at once, so only a holder that died keeps a room from others this
// long.
const holdFor = 2 * time.Second

// roomHold is a take's view of the holds: now (the caller's clock, as
// every lease), and by, the take's holder id when it holds the room.
type roomHold struct {
	by  string
	now time.Time
}

// newHolder is a take's holder id.
func newHolder() string { return strconv.FormatUint(rand.Uint64(), 36) }

// holdFree is the condition that no live hold of another keeps the slot:
// no hold, a lapsed one, a slot left below the held one, or h's own.
func holdFree(h roomHold) expression.ConditionBuilder {
	free := expression.Or(expression.AttributeNotExists(expression.Name("hold_until")),
		expression.Name("hold_until").LessThanEqual(expression.Value(ms(h.now))),
		expression.Name("used").LessThan(expression.Name("hold_lim")))
	if h.by != "" {
		free = free.Or(expression.Name("hold_by").Equal(expression.Value(h.by)))
	}
	return free
}

// clearHold adds to u the removal of the bucket's hold (h's own).
func clearHold(u expression.UpdateBuilder) expression.UpdateBuilder {
	return u.Remove(expression.Name("hold_by")).Remove(expression.Name("hold_until")).Remove(expression.Name("hold_lim"))
}

// openTo is the room of the bucket (limits set for total) to a take or
// grant that does not hold it at now: a live hold keeps one slot.
func (b bucketItem) openTo(total int, now time.Time) int {
	r := b.room(total)
	if b.HoldUntil > ms(now) {
		r--
	}
	return r
}

// holdRoom holds a slot of bucket b (limits set for total) for h.by:
// errBucketFull when it has no room or carries another's live hold; an
// unavailable error when the write may have been made (the take goes on
// as the holder: its transaction clears the hold, or the hold lapses).
func (s *Store) holdRoom(ctx context.Context, b, total int, h roomHold) error {
	cond := takeCondition(total, roomHold{now: h.now}).And(expression.Or(
		expression.AttributeNotExists(expression.Name("hold_until")),
		expression.Name("hold_until").LessThanEqual(expression.Value(ms(h.now)))))
	upd := expression.Set(expression.Name("hold_by"), expression.Value(h.by)).
		Set(expression.Name("hold_until"), expression.Value(ms(h.now.Add(holdFor)))).
		Set(expression.Name("hold_lim"), expression.Name("lim").Minus(expression.Value(1))).
		Set(expression.Name("used"), expression.IfNotExists(expression.Name("used"), expression.Value(0))) // compared with hold_lim
	return s.holdWrite(ctx, "hold a slot", b, cond, upd)
}

// releaseHold clears h's hold of bucket b, if it is still there (best
// effort: a hold not cleared lapses).
func (s *Store) releaseHold(ctx context.Context, b int, h roomHold) error {
	return s.holdWrite(ctx, "release a hold", b, expression.Name("hold_by").Equal(expression.Value(h.by)),
		clearHold(expression.UpdateBuilder{}))
}

// holdWrite makes a conditional update of bucket b: a *fullBucket
// (errBucketFull) when its condition fails.
func (s *Store) holdWrite(ctx context.Context, op string, b int, cond expression.ConditionBuilder, upd expression.UpdateBuilder) error {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err = s.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{TableName: aws.String(s.table), Key: s.key(bucketPK(s.deployment, b)),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		// As a refused take: the bucket as found (a refusal reports it).
		return &fullBucket{bucket: decodeBucket(ccf.Item), seen: len(ccf.Item) > 0}
	case err != nil:
		return unavailable(op, err)
	}
	return nil
}
