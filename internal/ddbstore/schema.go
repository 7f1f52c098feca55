// Package ddbstore is the DynamoDB implementation of core.Store: one table,
// every transition a conditional write or a transaction, every condition
// failure translated once, here, into a core error.
//
// Items (partition key "pk", sort key "sk" = "R" unless said otherwise),
// each told in full where its code is:
//
//	SBX#<sandbox id>              the sandbox record (core.Record; item.go)
//	RES#<token>                   a reservation: a slot taken for an in-flight create
//	THR#<tenant>#<user>#<thread>  the thread's binding: sandbox_id or reservation
//	CAP#, PAU#, POOL#<deployment>[#<b>]  the buckets of the running slots', paused
//	                              slots' and pool places' ledgers (ledger.go)
//	USR#<deployment>#<tenant>#<user>  slots held by one user ("used", "revision"), for SANDBOX_MAX_PER_USER
//	TEN#<deployment>#<tenant>     slots held by one tenant ("used", "revision"), for SANDBOX_MAX_PER_TENANT
//	TPA#<deployment>#<tenant>     paused slots held by one tenant ("used", "revision"), for the paused slots' share
//	WTR#, WQ#<deployment>#...     the wait queue's waiter places and tickets (waiters.go)
//	OUT#, OUTSUM#<deployment>#... bytes the threads' and tenants' synced outputs take (storage.go)
//	REC#<deployment>, FST#<id>    reconcile's cursor, inventory and notes (reconcile.go)
//	WHK#<deployment>#<id>         a provider webhook event id seen (renew.go)
//
// GSI "gsi1" (gsi1pk, gsi1sk; projection ALL) indexes records and
// reservations by state, spread over 1 to IndexShards partition keys each
// (the store's count, WithLimit; shardOf, index.go): gsi1pk =
// "ST#<deployment>#<state>#<n>" with n = FNV-1a(sandbox id or reservation
// token) mod that count, gsi1sk = "<unix ms, 15 digits>#<id>"
// (park time for warm and paused records). A query over a state reads
// every shard and merges them by gsi1sk, so the index is still the
// LRU order of warm and paused records. Gone records leave the index and
// get a "ttl" (DynamoDB TTL, garbage collection only, never correctness).
//
// GSI "gsi2" (gsi2pk, gsi2sk; projection KEYS_ONLY), the owner index,
// files warm records only, by their tenant and user: gsi2pk =
// "OW#<deployment>#<tenant>#<n>" with n = FNV-1a(user) mod OwnerShards,
// gsi2sk = "<user>#<park time, unix ms, 15 digits>#<thread>#<id>" (see
// owner.go). A quota refusal reads it to find the caller's own warm
// sandboxes without reading the warm pool.
package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Attribute and index names of the table (also declared by template.yaml and the CDK stack).
const (
	AttrPK     = "pk"
	AttrSK     = "sk"
	AttrGSI1PK = "gsi1pk"
	AttrGSI1SK = "gsi1sk"
	AttrTTL    = "ttl"
	IndexGSI1  = "gsi1"
	AttrGSI2PK = "gsi2pk"
	AttrGSI2SK = "gsi2sk"
	IndexGSI2  = "gsi2"
)

// TableAdmin lists the DynamoDB calls CreateTable makes (*dynamodb.Client fits).
type TableAdmin interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// CreateTable creates the table (on-demand, with gsi1, gsi2 and TTL) if it does
// not exist and waits until it is ACTIVE (at most 2 minutes). It is for
// local runs and tests; in AWS the CDK stack or template.yaml creates it.
func CreateTable(ctx context.Context, c TableAdmin, table string) error {
	s := types.ScalarAttributeTypeS
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:   aws.String(table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(AttrPK), AttributeType: s},
			{AttributeName: aws.String(AttrSK), AttributeType: s},
			{AttributeName: aws.String(AttrGSI1PK), AttributeType: s},
			{AttributeName: aws.String(AttrGSI1SK), AttributeType: s},
			{AttributeName: aws.String(AttrGSI2PK), AttributeType: s},
			{AttributeName: aws.String(AttrGSI2SK), AttributeType: s},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(AttrPK), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(AttrSK), KeyType: types.KeyTypeRange},
		},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{{
			IndexName: aws.String(IndexGSI1),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(AttrGSI1PK), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(AttrGSI1SK), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		}, {
			IndexName: aws.String(IndexGSI2),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(AttrGSI2PK), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(AttrGSI2SK), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly},
		}},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("create table %s: %w", table, err)
	}
	w := dynamodb.NewTableExistsWaiter(c)
	if err := w.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, 2*time.Minute); err != nil {
		return fmt.Errorf("wait for table %s: %w", table, err)
	}
	if _, err := c.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(AttrTTL), Enabled: aws.Bool(true)},
	}); err != nil && errors.As(err, new(*types.ResourceNotFoundException)) {
		return fmt.Errorf("enable ttl on %s: %w", table, err)
	}
	return nil
}
