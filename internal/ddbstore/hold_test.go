package ddbstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// TestAHoldKeepsABucketsLastSlot: while a hold on a bucket's last slot is
// live, another take finds the bucket full (and goes elsewhere), and a
// second hold is refused; once it lapses, the slot is anyone's. A bucket
// of two slots keeps only the held one.
func TestAHoldKeepsABucketsLastSlot(t *testing.T) {
	const target = 3
	tests := []struct {
		name    string
		limit   int           // 8: buckets of one slot; 128: of two
		after   time.Duration // from the hold to the take
		wantHit bool          // the take got a slot in the held bucket
	}{
		{"live hold, last slot", 8, time.Second, false},
		{"lapsed hold", 8, 3 * time.Second, true},
		{"live hold, a slot besides it", 128, time.Second, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			reserve := func(token string, k core.ThreadKey, now time.Time) (core.Record, error) {
				if err := s.Reserve(ctx, core.Reservation{Token: token, ThreadKey: k, Limit: tc.limit, Now: now, ExpiresAt: now.Add(time.Minute)}); err != nil {
					return core.Record{}, err
				}
				return s.Finalize(ctx, token, core.Record{SandboxID: "sbx-" + token, ThreadKey: k, State: core.StateActive,
					Backend: "e2b", CreatedAt: now, UpdatedAt: now})
			}
			// Another bucket's take sets the buckets' limits.
			if _, err := reserve("setup", threadIn(t, "setup", target+1, tc.limit), t0); err != nil {
				t.Fatalf("setup Reserve: %v", err)
			}
			if err := ddbstore.HoldRoom(ctx, s, target, tc.limit, "holder", t0); err != nil {
				t.Fatalf("HoldRoom: %v", err)
			}
			if err := ddbstore.HoldRoom(ctx, s, target, tc.limit, "rival", t0); !errors.Is(err, ddbstore.ErrBucketFull) {
				t.Errorf("a second hold = %v, want the bucket full", err)
			}
			rec, err := reserve("take", threadIn(t, "u1", target, tc.limit), t0.Add(tc.after))
			if err != nil {
				t.Fatalf("Reserve: %v", err)
			}
			if got := rec.Slot.Bucket == target; got != tc.wantHit {
				t.Errorf("the take's slot is in bucket %d; in the held bucket %d = %v, want %v", rec.Slot.Bucket, target, got, tc.wantHit)
			}
		})
	}
}

// TestATakeRefusedForAQuotaClearsItsHold: a take that held a bucket's
// last slot and is then refused for its user's quota clears its hold at
// once, so the slot is not kept from others until the hold lapses.
func TestATakeRefusedForAQuotaClearsItsHold(t *testing.T) {
	const limit, open = 8, 5 // eight buckets of one slot, one open
	s := newStore(t)
	ctx := context.Background()
	reserve := func(token string, k core.ThreadKey, maxPerUser int, homeFull bool) error {
		return s.Reserve(ctx, core.Reservation{Token: token, ThreadKey: k, Limit: limit, Now: t0, ExpiresAt: t0.Add(time.Minute),
			MaxPerUser: maxPerUser, HomeFull: homeFull})
	}
	for b := range limit {
		if b == open {
			continue
		}
		user := fmt.Sprint("filler", b)
		if b == 0 {
			user = "u1" // u1 holds one slot: at its quota of one
		}
		if err := reserve(fmt.Sprint("res-", b), threadIn(t, user, b, limit), 0, false); err != nil {
			t.Fatalf("fill bucket %d: %v", b, err)
		}
	}
	// Its home full, the take reads the buckets, holds the open one's
	// last slot, and is refused for the quota.
	err := reserve("res-new", threadIn(t, "u1", 2, limit), 1, true)
	var ce *core.CapacityError
	if !errors.As(err, &ce) || ce.Reason != api.RefusalUserQuota {
		t.Fatalf("Reserve = %v, want a user_quota refusal", err)
	}
	if err := ddbstore.HoldRoom(ctx, s, open, limit, "next", t0); err != nil {
		t.Errorf("a hold of the open slot after the refusal = %v, want it free of the refused take's hold", err)
	}
}

// TestAGrantHonoursAHold: a free's dispatch does not grant a waiter the
// slot a take holds (the holder takes it); once the hold lapses, the
// slot goes to the waiter.
func TestAGrantHonoursAHold(t *testing.T) {
	f := newQueueFixture(t, 2) // two buckets of one slot
	recs := f.fill(2)
	a1 := f.enter("a", "a1", t0)
	now := t0.Add(time.Second)
	b := f.free(recs[0])
	if err := ddbstore.HoldRoom(context.Background(), f.s, b, f.limit, "holder", now); err != nil {
		t.Fatalf("HoldRoom: %v", err)
	}
	if res := f.dispatch(core.Dispatch{Now: now, Bucket: b}); len(res.Granted) != 0 {
		t.Errorf("dispatch under a live hold granted %v, want none", ids(res.Granted))
	}
	if ts := f.poll(a1); ts.Granted {
		t.Fatalf("a1 = %+v, want still waiting", ts)
	}
	if res := f.dispatch(core.Dispatch{Now: now.Add(3 * time.Second), Bucket: b}); !slices.Equal(ids(res.Granted), []string{"a1"}) {
		t.Errorf("dispatch after the hold lapsed granted %v, want [a1]", ids(res.Granted))
	}
}
