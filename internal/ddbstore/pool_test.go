package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// pooledMember reserves a pool place and finalizes it as member id.
func pooledMember(t *testing.T, s *ddbstore.Store, id string, size int) core.Record {
	t.Helper()
	ctx := context.Background()
	token := "res-" + id
	if err := s.ReservePool(ctx, core.PoolReservation{Token: token, Limit: 100, Size: size, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
		t.Fatalf("ReservePool: %v", err)
	}
	rec, err := s.FinalizePool(ctx, token, core.Record{SandboxID: id, Backend: "e2b", ReservationToken: token,
		Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: "tok"}, CreatedAt: t0, UpdatedAt: t0})
	if err != nil {
		t.Fatalf("FinalizePool: %v", err)
	}
	return rec
}

func poolCount(t *testing.T, s *ddbstore.Store) int {
	t.Helper()
	n, err := s.PoolCount(context.Background())
	if err != nil {
		t.Fatalf("PoolCount: %v", err)
	}
	return n
}

func TestReservePoolStopsAtSizeAndLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		limit, size int
		want        func(error) bool
	}{
		{"pool full", 10, 2, func(err error) bool { return errors.Is(err, core.ErrPoolFull) }},
		{"deployment full", 2, 10, func(err error) bool {
			var ce *core.CapacityError
			return errors.As(err, &ce) && ce.Reason == api.RefusalCapacity
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			for i := range 2 {
				if err := s.ReservePool(ctx, core.PoolReservation{Token: fmt.Sprint("r", i), Limit: tc.limit, Size: tc.size, Now: t0, ExpiresAt: t0}); err != nil {
					t.Fatalf("ReservePool %d: %v", i, err)
				}
			}
			err := s.ReservePool(ctx, core.PoolReservation{Token: "r-last", Limit: tc.limit, Size: tc.size, Now: t0, ExpiresAt: t0})
			if !tc.want(err) {
				t.Errorf("third ReservePool = %v", err)
			}
			if n := poolCount(t, s); n != 2 {
				t.Errorf("pool count = %d, want 2 (the refused reservation wrote nothing)", n)
			}
			if err := s.FreeReservation(ctx, "r0", core.ThreadKey{}); err != nil {
				t.Fatalf("FreeReservation: %v", err)
			}
			if n, l := poolCount(t, s), runningUsed(t, s); n != 1 || l != 1 {
				t.Errorf("after freeing a pool reservation: pool count %d used %d, want 1 and 1", n, l)
			}
		})
	}
}

// runningUsed is the running slots s holds.
func runningUsed(t *testing.T, s *ddbstore.Store) int {
	t.Helper()
	st, err := s.Capacity(context.Background())
	if err != nil {
		t.Fatalf("Capacity: %v", err)
	}
	return st.Used
}

func TestClaimPoolMemberOnceAndItsConditions(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	m := pooledMember(t, s, "m1", 5)
	claim := core.PoolClaim{Member: m, ThreadKey: thread(1), Owner: "inv-a", Now: t0, LeaseUntil: t0.Add(time.Minute)}
	rec, err := s.ClaimPoolMember(ctx, claim)
	if err != nil {
		t.Fatalf("ClaimPoolMember: %v", err)
	}
	stored, err := s.Get(ctx, "m1")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if stored.State != core.StateClaiming || stored.ThreadKey != thread(1) || stored.Fence != rec.Fence || stored.LeaseOwner != "inv-a" ||
		stored.Endpoint.AccessToken != "tok" {
		t.Errorf("stored = %+v, returned %+v; want claiming for t1 under inv-a's lease", stored, rec)
	}
	look, err := s.Lookup(ctx, thread(1), 5)
	if err != nil || look.Binding.SandboxID != "m1" || look.TenantUsed != 1 {
		t.Errorf("lookup = %+v, %v; want bound to m1 with the tenant's slot", look, err)
	}
	if n := poolCount(t, s); n != 0 {
		t.Errorf("pool count = %d, want 0", n)
	}
	// The same claim sent again (the SDK's retry of a transaction whose
	// reply was lost) is the claim, applied once.
	again, err := s.ClaimPoolMember(ctx, claim)
	if err != nil || again.Fence != rec.Fence || again.State != core.StateClaiming {
		t.Errorf("repeated claim = %+v, %v; want the applied claim (fence %d)", again, err, rec.Fence)
	}
	if look, _ := s.Lookup(ctx, thread(1), 5); look.TenantUsed != 1 {
		t.Errorf("tenant slots after a repeated claim = %d, want 1", look.TenantUsed)
	}
	claim2 := claim
	claim2.ThreadKey, claim2.Owner = thread(2), "inv-b"
	if _, err := s.ClaimPoolMember(ctx, claim2); !errors.Is(err, core.ErrConflict) {
		t.Errorf("second claim of m1 = %v, want ErrConflict", err)
	}
	m2 := pooledMember(t, s, "m2", 5)
	claim3 := core.PoolClaim{Member: m2, ThreadKey: thread(1), Owner: "inv-c", Now: t0, LeaseUntil: t0.Add(time.Minute)}
	if _, err := s.ClaimPoolMember(ctx, claim3); !errors.Is(err, core.ErrThreadBound) {
		t.Errorf("claim for a bound thread = %v, want ErrThreadBound", err)
	}
	claim4 := core.PoolClaim{Member: m2, ThreadKey: thread(3), Owner: "inv-d", Now: t0, LeaseUntil: t0.Add(time.Minute), MaxPerTenant: 1}
	var ce *core.CapacityError
	if _, err := s.ClaimPoolMember(ctx, claim4); !errors.As(err, &ce) || ce.Reason != api.RefusalTenantQuota {
		t.Errorf("claim past the tenant's quota = %v, want tenant_quota", err)
	}
	if got, _ := s.Get(ctx, "m2"); got.State != core.StatePooled {
		t.Errorf("m2 after refused claims = %s, want pooled", got.State)
	}
}

// TestFreeOfThreadlessRecordsKeepsThePoolCountRight: a pool member's Free
// gives back its place; a thread-less record that holds none (an orphan
// adopted for its kill) is freed as any record, leaving the pool's count
// alone.
func TestFreeOfThreadlessRecordsKeepsThePoolCountRight(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	m := pooledMember(t, s, "m1", 5)
	orphan, err := s.Adopt(ctx, core.Adoption{Record: core.Record{SandboxID: "o1", State: core.StateDestroying, CreatedAt: t0, UpdatedAt: t0}})
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if n, used := poolCount(t, s), runningUsed(t, s); n != 1 || used != 2 {
		t.Fatalf("pool count %d used %d, want 1 and 2", n, used)
	}
	if err := s.Free(ctx, orphan, t0); err != nil {
		t.Fatalf("Free orphan: %v", err)
	}
	if n, used := poolCount(t, s), runningUsed(t, s); n != 1 || used != 1 {
		t.Errorf("after the orphan's free: pool count %d used %d, want 1 and 1", n, used)
	}
	claimed, err := s.Claim(ctx, core.Claim{SandboxID: m.SandboxID, Tenant: "", From: []core.State{core.StatePooled}, To: core.StateDestroying,
		Owner: "inv", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	if err != nil {
		t.Fatalf("Claim member for destruction: %v", err)
	}
	if err := s.Free(ctx, claimed, t0); err != nil {
		t.Fatalf("Free member: %v", err)
	}
	if n, used := poolCount(t, s), runningUsed(t, s); n != 0 || used != 0 {
		t.Errorf("after the member's free: pool count %d used %d, want 0 and 0", n, used)
	}
	if err := s.Free(ctx, claimed, t0); !errors.Is(err, core.ErrStaleFence) {
		t.Errorf("second Free = %v, want ErrStaleFence", err)
	}
}

// sizeFlipper is a DynamoDB client whose pool place limit a peer sets
// for another size before every refill's transaction, as peers of a
// deploy that changes SANDBOX_POOL_SIZE would.
type sizeFlipper struct {
	*dynamodb.Client
	table string
}

func (f *sizeFlipper) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	for _, it := range in.TransactItems {
		if it.Put != nil && strings.HasPrefix(it.Put.Item["pk"].(*types.AttributeValueMemberS).Value, "RES#") {
			if _, err := f.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(f.table),
				Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "POOL#test"}, "sk": &types.AttributeValueMemberS{Value: "R"}},
				UpdateExpression:          aws.String("SET lim = :n, lim_of = :n ADD revision :one"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "99"}, ":one": &types.AttributeValueMemberN{Value: "1"}}}); err != nil {
				return nil, err
			}
		}
	}
	return f.Client.TransactWriteItems(ctx, in, o...)
}

// A refill that keeps finding the pool's place limit set for another
// size is refused as a full pool (certainly not applied, so the refill
// does not back off as after a failed create), and takes nothing.
func TestReservePoolRefusedWhilePeersSetAnotherSize(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	s := ddbstore.New(&sizeFlipper{Client: client, table: table}, table, "test")
	err := s.ReservePool(context.Background(), core.PoolReservation{Token: "pool-1", Limit: 4, Size: 2, Now: t0, ExpiresAt: t0.Add(time.Minute)})
	if !errors.Is(err, core.ErrPoolFull) {
		t.Fatalf("ReservePool = %v, want ErrPoolFull", err)
	}
	if n := poolCount(t, s); n != 0 {
		t.Errorf("pool places taken = %d, want 0", n)
	}
	if n := runningUsed(t, s); n != 0 {
		t.Errorf("running slots taken = %d, want 0", n)
	}
}
