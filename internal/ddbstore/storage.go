package ddbstore

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// The output storage ledger (core.StorageStore), one item per thread and
// one per tenant, each holding "bytes":
//
//	OUT#<deployment>#<tenant>#<user>#<thread>  the bytes the thread stores
//	OUTSUM#<deployment>#<tenant>               the tenant's total: the sum of its threads'
var _ core.StorageStore = (*Store)(nil)

const attrBytes = "bytes"

func storedPK(deployment string, k core.ThreadKey) string {
	return "OUT#" + deployment + "#" + k.Tenant + "#" + k.User + "#" + k.Thread
}

func storedSumPK(deployment, tenant string) string { return "OUTSUM#" + deployment + "#" + tenant }

// StoredBytes implements core.StorageStore: one strongly consistent batch
// read of the thread's item and its tenant's.
func (s *Store) StoredBytes(ctx context.Context, key core.ThreadKey) (core.Stored, error) {
	thread, sum := storedPK(s.deployment, key), storedSumPK(s.deployment, key.Tenant)
	items, err := s.batchGet(ctx, []map[string]types.AttributeValue{s.key(thread), s.key(sum)}, true)
	if err != nil {
		return core.Stored{}, fmt.Errorf("stored bytes: %w", err)
	}
	var out core.Stored
	for _, av := range items {
		var it struct {
			PK    string `dynamodbav:"pk"`
			Bytes int64  `dynamodbav:"bytes"`
		}
		if err := attributevalue.UnmarshalMap(av, &it); err != nil {
			return core.Stored{}, fmt.Errorf("decode stored bytes: %w", err)
		}
		switch it.PK {
		case thread:
			out.Thread = it.Bytes
		case sum:
			out.Tenant = it.Bytes
		}
	}
	return out, nil
}

// RecordStored implements core.StorageStore: one transaction setting the
// thread's bytes (conditional on c.Prev) and moving its tenant's total
// (conditional on c.TenantLimit when the thread grows).
func (s *Store) RecordStored(ctx context.Context, c core.StoredChange) error {
	delta := c.Bytes - c.Prev
	capped := c.TenantLimit > 0 && delta > 0
	if capped && delta > c.TenantLimit {
		return fmt.Errorf("thread %s grows by %d bytes: %w", c.ThreadKey, delta, core.ErrStorageFull)
	}
	prev := expression.Name(attrBytes).Equal(expression.Value(c.Prev))
	if c.Prev == 0 {
		prev = expression.Or(expression.AttributeNotExists(expression.Name(attrBytes)), prev)
	}
	threadPK, sumPK := storedPK(s.deployment, c.ThreadKey), storedSumPK(s.deployment, c.Tenant)
	thread, err := s.txnUpdate(s.key(threadPK), &prev, expression.Set(expression.Name(attrBytes), expression.Value(c.Bytes)), false)
	if err != nil {
		return fmt.Errorf("record stored bytes: %w", err)
	}
	var within *expression.ConditionBuilder
	if capped {
		cond := expression.Or(expression.AttributeNotExists(expression.Name(attrBytes)),
			expression.Name(attrBytes).LessThanEqual(expression.Value(c.TenantLimit-delta)))
		within = &cond
	}
	sum, err := s.txnUpdate(s.key(sumPK), within, expression.Add(expression.Name(attrBytes), expression.Value(delta)), false)
	if err != nil {
		return fmt.Errorf("record stored bytes: %w", err)
	}
	failed, err := s.writeTxn(ctx, "record stored bytes", []types.TransactWriteItem{thread, sum})
	switch {
	case has(failed, threadPK):
		return fmt.Errorf("thread %s no longer stores %d bytes: %w", c.ThreadKey, c.Prev, core.ErrConflict)
	case has(failed, sumPK):
		return fmt.Errorf("tenant %s would store more than %d bytes: %w", c.Tenant, c.TenantLimit, core.ErrStorageFull)
	case len(failed) > 0:
		return fmt.Errorf("record stored bytes: condition failed on an unexpected item: %w", core.ErrConflict)
	}
	return err
}
