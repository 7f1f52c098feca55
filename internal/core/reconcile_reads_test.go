package core_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// keyQueries records the partition key of every Query of the state index
// or the wait queue, split into whole-key reads of the state index (no
// sort-key condition) and the others (narrowed, COUNT, or of the queue).
type keyQueries struct {
	mu     sync.Mutex
	whole  map[string]int
	others int
}

func (k *keyQueries) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("keyQueries",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if q, ok := in.Parameters.(*dynamodb.QueryInput); ok {
				k.add(q)
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
}

func (k *keyQueries) add(q *dynamodb.QueryInput) {
	pk := ""
	for _, v := range q.ExpressionAttributeValues {
		if s, ok := v.(*types.AttributeValueMemberS); ok && (strings.HasPrefix(s.Value, "ST#") || strings.HasPrefix(s.Value, "WQ#")) {
			pk = s.Value
		}
	}
	if pk == "" {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if strings.Contains(aws.ToString(q.KeyConditionExpression), " AND ") || q.Select == types.SelectCount || strings.HasPrefix(pk, "WQ#") {
		k.others++
		return
	}
	k.whole[pk]++
}

// take returns the queries recorded since the last take and starts over.
func (k *keyQueries) take() (whole map[string]int, others int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	whole, others = k.whole, k.others
	k.whole, k.others = map[string]int{}, 0
	return whole, others
}

// unscoped is a store whose reads a reconcile pass cannot scope: every
// read of the pass reads every key.
type unscoped struct{ *ddbstore.Store }

func (unscoped) WithPass(ctx context.Context) context.Context { return ctx }

// A reconcile pass over an idle deployment (nothing held, nothing queued)
// reads each empty state index key with at most one whole-key query,
// however many of its steps read the key's state, and so makes fewer
// queries than the same pass over a store that cannot scope its reads to
// the pass.
func TestIdleReconcilePassReadsEachEmptyKeyOnce(t *testing.T) {
	reads := &keyQueries{whole: map[string]int{}}
	scoped, _, _ := costEngine(t, "idlepass", 16, reads.middleware, nil)
	plain, _, _ := costEngine(t, "idlepassplain", 16, reads.middleware, func(s core.Store) core.Store { return unscoped{s.(*ddbstore.Store)} })
	ctx := context.Background()
	total := func(eng *core.Engine) (int, map[string]int) {
		t.Helper()
		if _, err := eng.Reconcile(ctx); err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
		reads.take()
		if _, err := eng.Reconcile(ctx); err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
		whole, others := reads.take()
		n := others
		for _, c := range whole {
			n += c
		}
		return n, whole
	}
	got, whole := total(scoped)
	for pk, c := range whole {
		if c > 1 {
			t.Errorf("the pass read empty key %s with %d whole-key queries, want at most 1", pk, c)
		}
	}
	without, _ := total(plain)
	if got >= without {
		t.Errorf("the pass made %d queries, want fewer than the %d of a pass that reads every key each time", got, without)
	}
	t.Logf("an idle pass made %d queries (%d keys); %d without its memo of empty keys", got, len(whole), without)
}
