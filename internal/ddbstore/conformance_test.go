package ddbstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/storetest"
)

// TestConformance holds the DynamoDB store, on DynamoDB Local, to the
// store contract.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		client, table := newTable(t)
		api := &faultyAPI{API: client}
		return storetest.Subject{Store: ddbstore.New(api, table, "test"), FailNext: api.failNext}
	})
}

// errInjected is the faults' error.
var errInjected = errors.New("injected fault")

// faultyAPI is a DynamoDB client whose next write can fail: before it is
// sent, or after it applied (its reply lost).
type faultyAPI struct {
	ddbstore.API
	mu      sync.Mutex
	armed   bool
	applied bool
}

// failNext arms the fault for the next write (with applied, the next
// write that applies).
func (a *faultyAPI) failNext(applied bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.armed, a.applied = true, applied
}

// fault runs send, a write, under the armed fault.
func (a *faultyAPI) fault(send func() error) error {
	a.mu.Lock()
	armed, applied := a.armed, a.applied
	if armed && !applied {
		a.armed = false
	}
	a.mu.Unlock()
	if armed && !applied {
		return errInjected
	}
	err := send()
	if !armed || err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.armed {
		return nil
	}
	a.armed = false
	return errInjected
}

func (a *faultyAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	var out *dynamodb.UpdateItemOutput
	err := a.fault(func() (err error) { out, err = a.API.UpdateItem(ctx, in, opts...); return err })
	return out, err
}

func (a *faultyAPI) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	var out *dynamodb.DeleteItemOutput
	err := a.fault(func() (err error) { out, err = a.API.DeleteItem(ctx, in, opts...); return err })
	return out, err
}

func (a *faultyAPI) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	var out *dynamodb.TransactWriteItemsOutput
	err := a.fault(func() (err error) { out, err = a.API.TransactWriteItems(ctx, in, opts...); return err })
	return out, err
}
