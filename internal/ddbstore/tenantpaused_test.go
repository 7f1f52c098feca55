package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// pauseFor parks a fresh sandbox of tenant's thread n paused and returns
// its record.
func pauseFor(t *testing.T, s *ddbstore.Store, tenant string, n int) core.Record {
	t.Helper()
	ctx := context.Background()
	key := core.ThreadKey{Tenant: tenant, User: "u1", Thread: fmt.Sprintf("t%d", n)}
	id := fmt.Sprintf("%s-%d", tenant, n)
	warmAt(t, s, key, id)
	rec, err := s.ClaimPause(ctx, core.Claim{SandboxID: id, Tenant: tenant, Owner: "p", Now: t0, LeaseUntil: t0.Add(time.Minute)}, 100)
	if err != nil {
		t.Fatalf("ClaimPause %s: %v", id, err)
	}
	if rec, err = s.SettlePause(ctx, rec, t0); err != nil {
		t.Fatalf("SettlePause %s: %v", id, err)
	}
	return rec
}

func tenantsPaused(t *testing.T, s *ddbstore.Store, tenants ...string) map[string]int {
	t.Helper()
	held, err := s.TenantsPaused(context.Background(), tenants)
	if err != nil {
		t.Fatalf("TenantsPaused: %v", err)
	}
	return held
}

// An eviction of another tenant's paused sandbox applies only while the
// evicting tenant holds at most the paused slots it read and the victim's
// tenant at least two more: the counts are checked by the claim itself.
func TestPausedBelowIsCheckedByTheClaim(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		victim, evictr int // paused slots held by the victim's and the evicting tenant
		held           int // what the evicting tenant read of its own count
		want           error
	}{
		{"two more", 2, 0, 0, nil},
		{"only one more", 1, 0, 0, core.ErrAtFairShare},
		{"evicting tenant paused more since its read", 2, 1, 0, core.ErrAtFairShare},
		{"three more than an evicting tenant holding one", 4, 1, 1, nil},
		{"the victim's count fell since the read", 2, 1, 1, core.ErrAtFairShare},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			var victim core.Record
			for i := range tc.victim {
				victim = pauseFor(t, s, "acme", i)
			}
			for i := range tc.evictr {
				pauseFor(t, s, "beta", i)
			}
			c := core.Claim{SandboxID: victim.SandboxID, Tenant: "acme", From: []core.State{core.StatePaused}, To: core.StateDestroying,
				Owner: "e", Now: t0, LeaseUntil: t0.Add(time.Minute), PausedBelow: &core.PausedBelow{Tenant: "beta", Held: tc.held}}
			got, err := s.Claim(ctx, c)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Claim = %v, want %v", err, tc.want)
			}
			stored, gerr := s.Get(ctx, victim.SandboxID)
			if gerr != nil {
				t.Fatal(gerr)
			}
			wantState := core.StatePaused
			if tc.want == nil {
				wantState = core.StateDestroying
				if got.State != wantState || got.LeaseOwner != "e" {
					t.Errorf("claimed = %s lease %q, want destroying leased by e", got.State, got.LeaseOwner)
				}
			}
			if stored.State != wantState {
				t.Errorf("stored state = %s, want %s", stored.State, wantState)
			}
			if held := tenantsPaused(t, s, "acme", "beta"); held["acme"] != tc.victim || held["beta"] != tc.evictr {
				t.Errorf("paused counts = %v, want acme %d beta %d (a claim moves none)", held, tc.victim, tc.evictr)
			}
		})
	}
}

// Every way a paused slot ends returns it to its tenant's paused count:
// a pause given up, a resume, and the free of a tombstone holding both
// slots (a failed resume: one write of the tenant's count for both).
func TestTenantPausedCountFollowsEveryFree(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	a := pauseFor(t, s, "acme", 1)
	pauseFor(t, s, "acme", 2)
	warmAt(t, s, core.ThreadKey{Tenant: "acme", User: "u1", Thread: "t3"}, "acme-3")
	pausing, err := s.ClaimPause(ctx, core.Claim{SandboxID: "acme-3", Tenant: "acme", Owner: "p", Now: t0, LeaseUntil: t0.Add(time.Minute)}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if got := tenantsPaused(t, s, "acme")["acme"]; got != 3 {
		t.Fatalf("paused count with two paused and one pausing = %d, want 3", got)
	}
	if _, err := s.AbortPause(ctx, pausing, t0); err != nil {
		t.Fatal(err)
	}
	if got := tenantsPaused(t, s, "acme")["acme"]; got != 2 {
		t.Errorf("after a pause given up = %d, want 2", got)
	}
	key := a.ThreadKey
	resuming, err := s.ClaimResume(ctx, core.ResumeClaim{Claim: core.Claim{SandboxID: a.SandboxID, Owner: "r", Now: t0, LeaseUntil: t0.Add(time.Minute)},
		Key: key, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	tomb, err := s.Claim(ctx, core.Claim{SandboxID: a.SandboxID, Tenant: "acme", From: []core.State{core.StateResuming}, To: core.StateDestroying,
		Owner: "r", Now: t0, LeaseUntil: t0.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if tomb.Slots != resuming.Slots || !tomb.Slots.TenantPaused || !tomb.Slot.Quota {
		t.Fatalf("tombstone slots = %+v %+v, want the resuming record's: both slots, both counted", tomb.Slots, tomb.Slot)
	}
	if err := s.Free(ctx, tomb, t0); err != nil {
		t.Fatalf("Free: %v", err)
	}
	if c := countSlots(t, s, key); c.tenantPaused != 1 || c.tenant != 1 || c.paused != 1 || c.ledger != 1 {
		t.Errorf("after freeing a resuming tombstone: %+v, want the tenant's count and paused count 1 (acme-3 warm, acme-2 paused), one paused slot, one running", c)
	}
	b, err := s.Get(ctx, "acme-2")
	if err != nil {
		t.Fatal(err)
	}
	b, err = s.ClaimResume(ctx, core.ResumeClaim{Claim: core.Claim{SandboxID: b.SandboxID, Owner: "r", Now: t0, LeaseUntil: t0.Add(time.Minute)},
		Key: b.ThreadKey, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SettleResume(ctx, b, t0, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := tenantsPaused(t, s, "acme")["acme"]; got != 0 {
		t.Errorf("after a resume = %d, want 0", got)
	}
}

// A tenant's paused count that drifted is corrected by the counter
// repair, as its slot count is: on the second pass that sees the same
// difference.
func TestTenantPausedCountIsRepaired(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	ctx := context.Background()
	pauseFor(t, s, "acme", 1)
	if _, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "TPA#test#acme"}, "sk": &types.AttributeValueMemberS{Value: "R"}},
		UpdateExpression:          aws.String("SET used = :n"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "4"}}}); err != nil {
		t.Fatal(err) // drift, as a bug would leave it
	}
	for i, want := range []int{4, 1} {
		if _, err := s.RepairCounters(ctx, 100); err != nil {
			t.Fatalf("pass %d: RepairCounters: %v", i+1, err)
		}
		if got := tenantsPaused(t, s, "acme")["acme"]; got != want {
			t.Errorf("after pass %d: paused count %d, want %d", i+1, got, want)
		}
	}
}
