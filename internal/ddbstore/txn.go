package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// How the store classifies a DynamoDB outcome. A write either certainly
// did not apply, and the store says why with a core sentinel (or a
// *core.CapacityError), or its outcome is unknown ("maybe applied") and
// the error wraps core.ErrStoreUnavailable:
//
//   - ConditionalCheckFailedException, and a TransactionCanceledException
//     with a ConditionalCheckFailed reason: not applied; the failed item
//     (found by its key, see failedItems) says which sentinel.
//   - A cancellation for contention or throttling only (TransactionConflict,
//     ThrottlingError, ProvisionedThroughputExceeded reasons): not applied,
//     retried by writeTxn; contention that outlasts txnAttempts is
//     reported as ErrStoreUnavailable (the caller retries later, as for an
//     outage).
//   - A cancellation for any other reason (ValidationError, item too large):
//     not applied, a bug, returned as a plain error.
//   - Client faults that are bugs or configuration (ValidationException,
//     ResourceNotFoundException, AccessDeniedException,
//     UnrecognizedClientException): not applied, a plain error.
//   - Everything else: throttling and TransactionConflictException after
//     the SDK's own retries (an earlier attempt may have timed out after
//     applying), timeouts and context deadlines, 5xx, transport errors
//     such as a reset connection: maybe applied, ErrStoreUnavailable.

// unavailable classifies a failed call that is not a condition failure:
// client faults that certainly did not apply (validation, missing table,
// permissions) are returned as they are; anything else may have applied
// and wraps core.ErrStoreUnavailable.
func unavailable(op string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorFault() == smithy.FaultClient {
		switch ae.ErrorCode() {
		case "ValidationException", "ResourceNotFoundException", "AccessDeniedException", "UnrecognizedClientException":
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	return fmt.Errorf("%s: %w: %w", op, core.ErrStoreUnavailable, err)
}

// txnAttempts bounds retries of transactions cancelled for contention or
// throttling only: certainly not applied, so safe to retry. The SDK does
// not retry TransactionCanceledException.
const txnAttempts = 5

// Cancellation reason codes of a TransactionCanceledException.
const (
	reasonNone            = "None"
	reasonConditionFailed = "ConditionalCheckFailed"
)

// retryableReason reports whether a cancellation reason is contention or
// throttling: the transaction may succeed if sent again.
func retryableReason(code string) bool {
	switch code {
	case "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded":
		return true
	}
	return false
}

// writeTxn runs the transaction items under the call timeout, retrying
// cancellations for contention with jittered back-off. It returns:
//   - nil, nil: applied;
//   - the items whose condition failed (by partition key, see
//     failedItems) and the cancellation: certainly not applied;
//   - nil and an error classified as unavailable does: a plain error when
//     certainly not applied, one wrapping core.ErrStoreUnavailable when it
//     may have.
func (s *Store) writeTxn(ctx context.Context, op string, items []types.TransactWriteItem) (map[string]types.CancellationReason, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	in := &dynamodb.TransactWriteItemsInput{TransactItems: items}
	for attempt := 1; ; attempt++ {
		_, err := s.db.TransactWriteItems(ctx, in)
		var tce *types.TransactionCanceledException
		if !errors.As(err, &tce) {
			if err != nil {
				return nil, unavailable(op, err)
			}
			return nil, nil
		}
		failed, ok := failedItems(tce.CancellationReasons, items)
		if !ok {
			return nil, fmt.Errorf("%s: %w: cancellation with %d reasons for %d items (%v)",
				op, core.ErrStoreUnavailable, len(tce.CancellationReasons), len(items), err)
		}
		if len(failed) > 0 {
			return failed, err
		}
		for _, r := range tce.CancellationReasons {
			if c := aws.ToString(r.Code); c != reasonNone && c != "" && !retryableReason(c) {
				return nil, fmt.Errorf("%s: transaction refused: %w", op, err)
			}
		}
		if attempt == txnAttempts {
			// %v, not %w: callers must not mistake contention for a failed condition.
			return nil, fmt.Errorf("%s: %w: cancelled %d times without a failed condition (%v)", op, core.ErrStoreUnavailable, attempt, err)
		}
		d := time.Duration(10<<attempt) * time.Millisecond
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w: %w", op, core.ErrStoreUnavailable, ctx.Err())
		case <-time.After(d/2 + time.Duration(rand.Int64N(int64(d/2)))):
		}
	}
}

// failedItems decodes a cancellation by item identity: it returns the
// reasons of the items whose condition failed, keyed by each item's
// partition key (a transaction touches an item at most once, so the key
// names the item). DynamoDB lists one reason per item in request order;
// ok is false when the counts differ and nothing can be attributed.
func failedItems(reasons []types.CancellationReason, items []types.TransactWriteItem) (map[string]types.CancellationReason, bool) {
	if len(reasons) != len(items) {
		return nil, false
	}
	var failed map[string]types.CancellationReason
	for i, r := range reasons {
		if aws.ToString(r.Code) != reasonConditionFailed {
			continue
		}
		if failed == nil {
			failed = map[string]types.CancellationReason{}
		}
		failed[itemPK(items[i])] = r
	}
	return failed, true
}

// itemPK is the partition key of the item a transaction item writes or
// checks, followed by "\x00" and its sort key when that is not sortKey
// (the wait queue's tickets share their shard's partition).
func itemPK(it types.TransactWriteItem) string {
	var key map[string]types.AttributeValue
	switch {
	case it.Put != nil:
		key = it.Put.Item
	case it.Update != nil:
		key = it.Update.Key
	case it.Delete != nil:
		key = it.Delete.Key
	case it.ConditionCheck != nil:
		key = it.ConditionCheck.Key
	}
	pk, ok := key[AttrPK].(*types.AttributeValueMemberS)
	if !ok {
		return ""
	}
	if sk, ok := key[AttrSK].(*types.AttributeValueMemberS); ok && sk.Value != sortKey {
		return pk.Value + "\x00" + sk.Value
	}
	return pk.Value
}

// has reports whether the item with partition key pk failed its condition.
func has(failed map[string]types.CancellationReason, pk string) bool {
	_, ok := failed[pk]
	return ok
}

// onFail asks a write for the item as it was when its condition fails
// (old), or leaves the default: nothing.
func onFail(old bool) types.ReturnValuesOnConditionCheckFailure {
	if old {
		return types.ReturnValuesOnConditionCheckFailureAllOld
	}
	return ""
}

// txnUpdate is the transaction item applying upd to the item at key,
// under cond when not nil; with old, a failed condition returns the item
// as it was.
func (s *Store) txnUpdate(key map[string]types.AttributeValue, cond *expression.ConditionBuilder, upd expression.UpdateBuilder, old bool) (types.TransactWriteItem, error) {
	b := expression.NewBuilder().WithUpdate(upd)
	if cond != nil {
		b = b.WithCondition(*cond)
	}
	expr, err := b.Build()
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Update: &types.Update{TableName: &s.table, Key: key,
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValuesOnConditionCheckFailure: onFail(old)}}, nil
}

// txnPut is the transaction item putting av under cond.
func (s *Store) txnPut(av map[string]types.AttributeValue, cond expression.ConditionBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Put: &types.Put{TableName: &s.table, Item: av, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()}}, nil
}

// putNew is the transaction item putting av if no item has its key.
func (s *Store) putNew(av map[string]types.AttributeValue) types.TransactWriteItem {
	return types.TransactWriteItem{Put: &types.Put{TableName: &s.table, Item: av, ConditionExpression: aws.String("attribute_not_exists(pk)")}}
}

// txnDelete is the transaction item deleting the item at key under cond;
// a failed condition returns the item as it was.
func (s *Store) txnDelete(key map[string]types.AttributeValue, cond expression.ConditionBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Delete: &types.Delete{TableName: &s.table, Key: key,
		ConditionExpression: expr.Condition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValuesOnConditionCheckFailure: onFail(true)}}, nil
}

// conditionCheck is the transaction item checking cond on the item pk.
func (s *Store) conditionCheck(pk string, cond expression.ConditionBuilder) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{TableName: &s.table, Key: s.key(pk),
		ConditionExpression: expr.Condition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()}}, nil
}

// must is the transaction item of a constant expression, which cannot
// fail to build.
func must(it types.TransactWriteItem, err error) types.TransactWriteItem {
	if err != nil {
		panic(err)
	}
	return it
}

// updateItem runs one UpdateItem of the item at key (upd under cond)
// under the call timeout, returning the attributes ret names; with old, a
// failed condition returns the item as it was. A failed condition is
// returned as the *types.ConditionalCheckFailedException (see
// conditionFailed); any other failure as unavailable classifies it.
func (s *Store) updateItem(ctx context.Context, op string, key map[string]types.AttributeValue, cond expression.ConditionBuilder, upd expression.UpdateBuilder, ret types.ReturnValue, old bool) (map[string]types.AttributeValue, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return nil, fmt.Errorf("%s: build expression: %w", op, err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: &s.table, Key: key,
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValues: ret, ReturnValuesOnConditionCheckFailure: onFail(old)})
	if _, failed := conditionFailed(err); failed {
		return nil, err
	}
	if err != nil {
		return nil, unavailable(op, err)
	}
	return out.Attributes, nil
}

// conditionFailed reports whether err is a failed condition of a single
// write, and the item as it was when the write asked for it.
func conditionFailed(err error) (old map[string]types.AttributeValue, failed bool) {
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return ccf.Item, true
	}
	return nil, false
}
