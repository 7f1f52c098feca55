package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// faultDB answers every DynamoDB call with the error its fault function
// gives (nil: success). It is a fault injector, nothing more: what a real
// table does is tested against DynamoDB Local in store_test.go.
type faultDB struct {
	mu sync.Mutex
	// fault gets the attempt number (1-based, per call kind) and, for a
	// transaction, its items.
	fault func(attempt int, items []types.TransactWriteItem) error
	txns  int
	old   map[string]types.AttributeValue // the item a failed single-item condition returns
}

var _ API = (*faultDB)(nil)

func (f *faultDB) single() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.fault(1, nil)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		// A copy: parallel cases share the exception their fault returns.
		c := *ccf
		c.Item = f.old
		return &c
	}
	return err
}

func (f *faultDB) GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if err := f.single(); err != nil {
		return nil, err
	}
	return &dynamodb.GetItemOutput{Item: f.old}, nil
}

func (f *faultDB) UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if err := f.single(); err != nil {
		return nil, err
	}
	return &dynamodb.UpdateItemOutput{Attributes: f.old}, nil
}

func (f *faultDB) DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	return &dynamodb.DeleteItemOutput{}, nil
}

func (f *faultDB) TransactWriteItems(_ context.Context, in *dynamodb.TransactWriteItemsInput, _ ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.txns++
	if err := f.fault(f.txns, in.TransactItems); err != nil {
		return nil, err
	}
	return &dynamodb.TransactWriteItemsOutput{}, nil
}

// Query finds nothing (starting a drain reads the wait queue: empty).
func (f *faultDB) Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	return &dynamodb.QueryOutput{}, nil
}

// BatchGetItem finds nothing (a reservation refused for capacity reads
// the other buckets: empty, so it tries them).
func (f *faultDB) BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return &dynamodb.BatchGetItemOutput{}, nil
}

// Scan finds nothing.
func (f *faultDB) Scan(context.Context, *dynamodb.ScanInput, ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error) {
	return &dynamodb.ScanOutput{}, nil
}

// ExecuteStatement finds nothing (the wait queue: empty).
func (f *faultDB) ExecuteStatement(context.Context, *dynamodb.ExecuteStatementInput, ...func(*dynamodb.Options)) (*dynamodb.ExecuteStatementOutput, error) {
	return &dynamodb.ExecuteStatementOutput{}, nil
}

// cancel builds the TransactionCanceledException DynamoDB answers when
// the items whose partition key starts with one of failing fail their
// condition: one reason per item in request order, "None" for the others.
// A failed item carries old (ReturnValuesOnConditionCheckFailure).
func cancel(items []types.TransactWriteItem, code string, old map[string]types.AttributeValue, failing ...string) error {
	reasons := make([]types.CancellationReason, len(items))
	for i, it := range items {
		reasons[i].Code = aws.String(reasonNone)
		for _, p := range failing {
			if p == "*" || strings.HasPrefix(itemPK(it), p) {
				reasons[i] = types.CancellationReason{Code: aws.String(code), Item: old}
			}
		}
	}
	return &types.TransactionCanceledException{Message: aws.String("Transaction cancelled"), CancellationReasons: reasons}
}

// The outcomes of a call, as DynamoDB and the SDK report them.
var (
	errThrottled     = &types.ProvisionedThroughputExceededException{Message: aws.String("rate exceeded")}
	errThrottling    = &smithy.GenericAPIError{Code: "ThrottlingException", Message: "rate exceeded", Fault: smithy.FaultClient}
	errConflictExc   = &types.TransactionConflictException{Message: aws.String("conflicts with a transaction")}
	errInternal      = &types.InternalServerError{Message: aws.String("internal error")}
	errUnavailable   = &smithy.OperationError{ServiceID: "DynamoDB", OperationName: "UpdateItem", Err: &smithyhttp.ResponseError{Response: &smithyhttp.Response{}, Err: &smithy.GenericAPIError{Code: "ServiceUnavailable", Fault: smithy.FaultServer}}}
	errTimeout       = &smithy.OperationError{ServiceID: "DynamoDB", OperationName: "UpdateItem", Err: fmt.Errorf("operation error: %w", context.DeadlineExceeded)}
	errReset         = &smithy.OperationError{ServiceID: "DynamoDB", OperationName: "UpdateItem", Err: &smithyhttp.RequestSendError{Err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}}}
	errValidation    = &smithy.GenericAPIError{Code: "ValidationException", Message: "bad expression", Fault: smithy.FaultClient}
	errNoTable       = &types.ResourceNotFoundException{Message: aws.String("no table")}
	errMaybeApplied  = core.ErrStoreUnavailable       // want: the outcome is unknown
	errRefusedPlain  = errors.New("plain refusal")    // want: certainly not applied, no sentinel (a bug or configuration)
	errCapacity      = errors.New("capacity refusal") // want: a *core.CapacityError (reason checked apart)
	errDrainingRefus = errors.New("draining refusal") // want: a *core.CapacityError with reason draining
)

// always returns err for every attempt.
func always(err error) func(int, []types.TransactWriteItem) error {
	return func(int, []types.TransactWriteItem) error { return err }
}

// failing fails the condition of the transaction items whose key starts
// with one of prefixes (every attempt).
func failing(old map[string]types.AttributeValue, prefixes ...string) func(int, []types.TransactWriteItem) error {
	return func(_ int, items []types.TransactWriteItem) error {
		if items == nil {
			return nil // a single-item call (the read after a transaction)
		}
		return cancel(items, reasonConditionFailed, old, prefixes...)
	}
}

// cancelled cancels every attempt with code on every item.
func cancelled(code string) func(int, []types.TransactWriteItem) error {
	return func(_ int, items []types.TransactWriteItem) error {
		if items == nil {
			return nil
		}
		return cancel(items, code, nil, "*")
	}
}

// commonSingle is what every single-item write answers to an outage.
var commonSingle = []outcome{
	{"success", always(nil), nil},
	{"provisioned throughput exceeded", always(errThrottled), errMaybeApplied},
	{"throttling exception", always(errThrottling), errMaybeApplied},
	{"transaction conflict exception", always(errConflictExc), errMaybeApplied},
	{"internal server error", always(errInternal), errMaybeApplied},
	{"503 service unavailable", always(errUnavailable), errMaybeApplied},
	{"timeout", always(errTimeout), errMaybeApplied},
	{"context deadline", always(context.DeadlineExceeded), errMaybeApplied},
	{"connection reset", always(errReset), errMaybeApplied},
	{"validation", always(errValidation), errRefusedPlain},
	{"missing table", always(errNoTable), errRefusedPlain},
}

// commonTxn is what every transaction answers to an outage or contention.
var commonTxn = []outcome{
	{"success", always(nil), nil},
	{"provisioned throughput exceeded", always(errThrottled), errMaybeApplied},
	{"internal server error", always(errInternal), errMaybeApplied},
	{"timeout", always(errTimeout), errMaybeApplied},
	{"connection reset", always(errReset), errMaybeApplied},
	{"validation", always(errValidation), errRefusedPlain},
	{"cancelled: conflict, every attempt", cancelled("TransactionConflict"), errMaybeApplied},
	{"cancelled: throttling, every attempt", cancelled("ThrottlingError"), errMaybeApplied},
	{"cancelled: conflict once, then applied", func(n int, items []types.TransactWriteItem) error {
		if n == 1 && items != nil {
			return cancel(items, "TransactionConflict", nil, "*")
		}
		return nil
	}, nil},
	{"cancelled: validation reason", cancelled("ValidationError"), errRefusedPlain},
	{"cancelled: reasons do not match items", func(_ int, items []types.TransactWriteItem) error {
		if items == nil {
			return nil
		}
		reasons := make([]types.CancellationReason, len(items)+1) // one too many: nothing can be attributed
		for i := range reasons {
			reasons[i].Code = aws.String(reasonConditionFailed)
		}
		return &types.TransactionCanceledException{CancellationReasons: reasons}
	}, errMaybeApplied},
}

// now0 is the clock of every call.
var now0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

type outcome struct {
	name  string
	fault func(int, []types.TransactWriteItem) error
	want  error
}

// TestStoreClassifiesEveryOutcome pins, for every write of the store and
// every DynamoDB outcome, whether the store reports "certainly not
// applied" (nil error for success; a sentinel naming why; a plain error
// for a bug) or "maybe applied" (core.ErrStoreUnavailable). Transaction
// cancellations are decoded by the failed item's key: the fault function
// builds the reasons from the request's own item order, as DynamoDB does.
func TestStoreClassifiesEveryOutcome(t *testing.T) {
	t.Parallel()
	key := core.ThreadKey{Tenant: "acme", User: "u1", Thread: "t1"}
	rec := func(tenant string, st core.State, leaseOwner string) map[string]types.AttributeValue {
		av, err := attributevalue.MarshalMap(item{PK: sandboxPK("sbx1"), SK: sortKey, SandboxID: "sbx1", Tenant: tenant,
			User: "u1", Thread: "t1", State: string(st), Fence: 7, LeaseOwner: leaseOwner,
			LeaseExpires: ms(now0.Add(time.Minute))})
		if err != nil {
			t.Fatal(err)
		}
		return av
	}
	ledger := func(draining bool) map[string]types.AttributeValue {
		av, _ := attributevalue.MarshalMap(bucketItem{Used: 3, Draining: draining})
		return av
	}
	claim := core.Claim{SandboxID: "sbx1", Tenant: "acme", From: []core.State{core.StateWarm}, To: core.StateActive,
		Owner: "me", Now: now0, LeaseUntil: now0.Add(time.Minute)}
	reservation := core.Reservation{Token: "res-1", ThreadKey: key, Limit: 3, MaxPerUser: 1, Now: now0, ExpiresAt: now0.Add(time.Minute)}
	ccf := &types.ConditionalCheckFailedException{Message: aws.String("condition failed")}

	type op struct {
		name     string
		old      map[string]types.AttributeValue // the item a failed condition returns
		call     func(*Store) error
		outcomes []outcome
	}
	ops := []op{
		{"apply", rec("acme", core.StateActive, ""), func(s *Store) error {
			_, err := s.Apply(context.Background(), core.Update{SandboxID: "sbx1", Fence: 6, State: core.StateWarm, Now: now0, ParkedAt: now0})
			return err
		}, append([]outcome{{"condition failed", always(ccf), core.ErrStaleFence}}, commonSingle...)},
		{"apply to a missing record", nil, func(s *Store) error {
			_, err := s.Apply(context.Background(), core.Update{SandboxID: "sbx1", Fence: 6, State: core.StateWarm, Now: now0})
			return err
		}, []outcome{{"condition failed", always(ccf), core.ErrNotFound}}},
		{"claim: another tenant's record", rec("other", core.StateWarm, ""), func(s *Store) error {
			_, err := s.Claim(context.Background(), claim)
			return err
		}, append([]outcome{{"condition failed", always(ccf), core.ErrNotFound}}, commonSingle...)},
		{"claim: wrong state", rec("acme", core.StateActive, ""), func(s *Store) error {
			_, err := s.Claim(context.Background(), claim)
			return err
		}, []outcome{{"condition failed", always(ccf), core.ErrConflict}}},
		{"claim: leased", rec("acme", core.StateWarm, "peer"), func(s *Store) error {
			_, err := s.Claim(context.Background(), claim)
			return err
		}, []outcome{{"condition failed", always(ccf), core.ErrLeaseHeld}}},
		{"set draining", nil, func(s *Store) error { return s.SetDraining(context.Background(), true) }, commonSingle},
		{"reserve", ledger(false), func(s *Store) error { return s.Reserve(context.Background(), reservation) }, append([]outcome{
			{"ledger full", failing(ledger(false), "CAP#"), errCapacity},
			{"ledger draining", failing(ledger(true), "CAP#"), errDrainingRefus},
			{"reservation exists", failing(nil, "RES#"), core.ErrConflict},
			{"thread bound", failing(nil, "THR#"), core.ErrThreadBound},
			{"user quota", failing(nil, "USR#"), errCapacity},
			{"thread bound and ledger full: the race first", failing(ledger(false), "THR#", "CAP#"), core.ErrThreadBound},
			{"quota and ledger full: the quota first", failing(ledger(false), "USR#", "CAP#"), errCapacity},
			{"tenant quota", failing(nil, "TEN#"), errCapacity},
			{"tenant quota and ledger full: the tenant quota first", failing(ledger(false), "TEN#", "CAP#"), errCapacity},
			{"user and tenant quota: the user's first", failing(nil, "USR#", "TEN#"), errCapacity},
		}, commonTxn...)},
		{"finalize", nil, func(s *Store) error {
			_, err := s.Finalize(context.Background(), "res-1", core.Record{SandboxID: "sbx1", ThreadKey: key, State: core.StateActive})
			return err
		}, append([]outcome{
			{"reservation gone", failing(nil, "RES#"), core.ErrConflict},
			{"record exists", failing(nil, "SBX#"), core.ErrConflict},
			{"binding moved", failing(nil, "THR#"), core.ErrConflict},
		}, commonTxn...)},
		{"free reservation", nil, func(s *Store) error { return s.FreeReservation(context.Background(), "res-1", key) },
			append([]outcome{{"reservation gone", failing(nil, "RES#"), core.ErrNotFound}}, commonTxn...)},
		{"free", nil, func(s *Store) error {
			return s.Free(context.Background(), core.Record{SandboxID: "sbx1", ThreadKey: key, Fence: 7}, now0)
		}, append([]outcome{{"fence moved", failing(nil, "SBX#"), core.ErrStaleFence}}, commonTxn...)},
		{"rebind", nil, func(s *Store) error {
			return s.Rebind(context.Background(), key, "sbx1", core.Binding{}, false)
		}, append([]outcome{
			{"binding moved", failing(nil, "THR#"), core.ErrConflict},
			{"record not live", failing(nil, "SBX#"), core.ErrConflict},
		}, commonTxn...)},
		{"adopt", nil, func(s *Store) error {
			_, err := s.Adopt(context.Background(), core.Adoption{Record: core.Record{SandboxID: "sbx1", ThreadKey: key}, Reservation: "res-1"})
			return err
		}, append([]outcome{
			{"record exists", failing(nil, "SBX#"), core.ErrConflict},
			{"reservation gone", failing(nil, "RES#"), core.ErrConflict},
		}, commonTxn...)},
		{"claim duplicate", rec("acme", core.StateWarm, ""), func(s *Store) error {
			_, err := s.ClaimDuplicate(context.Background(), claim, key, "sbx0")
			return err
		}, append([]outcome{
			{"record leased", failing(rec("acme", core.StateWarm, "peer"), "SBX#"), core.ErrLeaseHeld},
			{"record in another state", failing(rec("acme", core.StateActive, ""), "SBX#"), core.ErrConflict},
			{"record of another tenant", failing(rec("other", core.StateWarm, ""), "SBX#"), core.ErrNotFound},
			{"binding moved", failing(nil, "THR#"), core.ErrConflict},
		}, commonTxn...)},
		{"save cursor", nil, func(s *Store) error {
			return s.SaveCursor(context.Background(), core.ReconcileCursor{Version: 2})
		}, append([]outcome{{"version moved", failing(nil, "REC#"), core.ErrConflict}}, commonTxn...)},
	}
	for _, o := range ops {
		for _, oc := range o.outcomes {
			t.Run(o.name+"/"+oc.name, func(t *testing.T) {
				t.Parallel() // the contention cases wait out writeTxn's back-off
				db := &faultDB{fault: oc.fault, old: o.old}
				err := o.call(New(db, "table", "test"))
				maybe := errors.Is(err, core.ErrStoreUnavailable)
				var ce *core.CapacityError
				switch oc.want {
				case nil:
					if err != nil {
						t.Errorf("err = %v, want nil (applied)", err)
					}
				case errMaybeApplied:
					if !maybe {
						t.Errorf("err = %v, want maybe applied (core.ErrStoreUnavailable)", err)
					}
				case errRefusedPlain:
					if err == nil || maybe || errors.As(err, &ce) {
						t.Errorf("err = %v, want a plain error, certainly not applied", err)
					}
				case errCapacity, errDrainingRefus:
					wantReason := api.RefusalCapacity
					if oc.want == errDrainingRefus {
						wantReason = api.RefusalDraining
					}
					if strings.Contains(oc.name, "tenant quota") && !strings.Contains(oc.name, "user and tenant") {
						wantReason = api.RefusalTenantQuota
					} else if strings.Contains(oc.name, "quota") {
						wantReason = api.RefusalUserQuota
					}
					if !errors.As(err, &ce) || ce.Reason != wantReason || maybe {
						t.Errorf("err = %v, want a *core.CapacityError with reason %s", err, wantReason)
					}
				default:
					if !errors.Is(err, oc.want) || maybe {
						t.Errorf("err = %v, want %v (certainly not applied)", err, oc.want)
					}
				}
			})
		}
	}
}

// TestFailedItemsByIdentity decodes the same cancellation for the same
// items in two orders: the failed item is found by its key either way.
func TestFailedItemsByIdentity(t *testing.T) {
	t.Parallel()
	s := New(&faultDB{}, "table", "test")
	key := core.ThreadKey{Tenant: "acme", User: "u1", Thread: "t1"}
	bind := types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{Key: s.key(bindingPK(key))}}
	ledger := types.TransactWriteItem{Update: &types.Update{Key: s.key(capacityPK("test"))}}
	resv := types.TransactWriteItem{Put: &types.Put{Item: s.key(reservationPK("res-1"))}}
	gone := types.TransactWriteItem{Delete: &types.Delete{Key: s.key(sandboxPK("sbx1"))}}
	for _, items := range [][]types.TransactWriteItem{{ledger, resv, bind, gone}, {gone, bind, resv, ledger}} {
		var tce *types.TransactionCanceledException
		if !errors.As(cancel(items, reasonConditionFailed, nil, "THR#", "SBX#"), &tce) {
			t.Fatal("cancel built no cancellation")
		}
		failed, ok := failedItems(tce.CancellationReasons, items)
		if !ok || len(failed) != 2 || !has(failed, bindingPK(key)) || !has(failed, sandboxPK("sbx1")) {
			var order []string
			for _, it := range items {
				order = append(order, itemPK(it))
			}
			t.Errorf("items %v: failed = %v (ok %v), want the binding and the record", order, failed, ok)
		}
	}
}

// pagedQueueDB answers the wait queue's read with out.
type pagedQueueDB struct {
	faultDB
	out dynamodb.ExecuteStatementOutput
}

func (p *pagedQueueDB) ExecuteStatement(context.Context, *dynamodb.ExecuteStatementInput, ...func(*dynamodb.Options)) (*dynamodb.ExecuteStatementOutput, error) {
	out := p.out
	return &out, nil
}

// TestAnyWaitingWhenTheReadIsCutShort: a read of the queue holding only a
// live grant answers that nobody waits when whole, and that someone may
// wait when DynamoDB cut it short (a NextToken, or the LastEvaluatedKey
// of a read its limit stopped).
func TestAnyWaitingWhenTheReadIsCutShort(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_000_000)
	grant, err := attributevalue.MarshalMap(ticketItem{PK: "Q#d#0", SK: "k1", Tenant: "a", Ticket: "w1",
		Until: ms(now.Add(time.Minute)), State: ticketGranted, GrantUntil: ms(now.Add(time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	items := []map[string]types.AttributeValue{grant}
	for _, c := range []struct {
		name string
		out  dynamodb.ExecuteStatementOutput
		want bool
	}{
		{"whole", dynamodb.ExecuteStatementOutput{Items: items}, false},
		{"next token", dynamodb.ExecuteStatementOutput{Items: items, NextToken: aws.String("more")}, true},
		{"last evaluated key", dynamodb.ExecuteStatementOutput{Items: items, LastEvaluatedKey: map[string]types.AttributeValue{
			AttrPK: grant[AttrPK], AttrSK: grant[AttrSK]}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := New(&pagedQueueDB{out: c.out}, "table", "d")
			got, err := s.AnyWaiting(context.Background(), now)
			if err != nil || got != c.want {
				t.Errorf("AnyWaiting = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}
