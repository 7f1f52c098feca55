package ddbstore

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// TenantSandboxes lists up to limit of tenant's records in
// core.TenantListed states, state by state, each in the state index's
// order (gsi1sk, the position in the cursor). It queries the state index
// (gsi1) filtered by tenant: the reads cover the deployment's records in
// those states, not only tenant's (no index files records by tenant),
// which a list of the deployment's few hundred sandboxes affords.
func (s *Store) TenantSandboxes(ctx context.Context, tenant, cursor string, limit int) ([]core.Record, string, error) {
	return core.PageTenant(cursor, limit, func(st core.State, after string, yield func(core.Record, string) bool) error {
		return s.eachTenantInState(ctx, tenant, st, after, yield)
	})
}

// eachTenantInState calls fn with tenant's records in state whose index
// sort key is after skFrom ("" = all), in sort-key order across the
// state's shards, until fn returns false.
func (s *Store) eachTenantInState(ctx context.Context, tenant string, state core.State, skFrom string, fn func(core.Record, string) bool) error {
	pks := s.statePKs(state)
	kqs := make([]keyQuery, len(pks))
	for i, pk := range pks {
		kc := expression.Key(AttrGSI1PK).Equal(expression.Value(pk))
		if skFrom != "" {
			kc = kc.And(expression.Key(AttrGSI1SK).GreaterThan(expression.Value(skFrom)))
		}
		expr, err := expression.NewBuilder().WithKeyCondition(kc).
			WithFilter(expression.Name("tenant").Equal(expression.Value(tenant))).Build()
		if err != nil {
			return err
		}
		kqs[i] = keyQuery{pk: pk, in: &dynamodb.QueryInput{TableName: &s.table, IndexName: aws.String(IndexGSI1),
			KeyConditionExpression: expr.KeyCondition(), FilterExpression: expr.Filter(),
			ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()}}
	}
	var derr error
	err := s.eachMerged(ctx, "query tenant "+string(state), kqs, AttrGSI1SK, func(av map[string]types.AttributeValue) bool {
		rec, err := s.decodeRecord(ctx, av)
		if err != nil {
			derr = fmt.Errorf("tenant sandboxes: %w", err)
			return false
		}
		return fn(rec, stringAttr(av, AttrGSI1SK))
	})
	if err != nil {
		return err
	}
	return derr
}
