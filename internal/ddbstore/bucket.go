package ddbstore

import (
	"context"
	"slices"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// CapacityBuckets is how many buckets the running slots' ledger
// (runningSlots, see ledger) has. Its buckets also keep
//
//	granted       of "used", the slots held in trust for waiting tickets (see waiters.go)
//	tenants       tenants that reserved in it (fair share; reconcile drops idle ones)
//	shards        the most state-index keys a store that set the limits files
//	              entries under (a high-water mark: see tallyShards)
//
// and their revision also moves with a grant's hand-over to the next
// ticket. A refusal's details are the buckets' sums. Creates and frees of
// the whole deployment spread over 64 items instead of one, each of which
// DynamoDB limits to about 1,000 write units a second (twice that per
// transactional write): enough that no bucket is the key that bounds
// BenchmarkHotKeys' steady loads (docs/benchmarks.md), few enough that a
// refusal's read of every bucket is one BatchGetItem (at most 100 keys).
//
// A bucket counts slots, not states: a record's state moves (park,
// reclaim, pause) write the record alone. Capacity counts the states from
// the state index when asked.
const CapacityBuckets = 64

// homeBucket is the first running-slot bucket a reservation with token
// tries: one of those with a share of limit, by a hash of the token.
func homeBucket(token string, limit int) int { return runningSlots.homeOf(token, max(limit, 1)) }

// threadHome is the first bucket the running-slot takes of thread k try
// under limit (its reservations, resume claims and paused pool members'
// claims): one of those with a share of limit, by a hash of the thread.
// Lookup reads it, for the draining flag; a thread's takes spread over
// the buckets as the threads do, and no one bucket is read by every
// acquire.
func threadHome(k core.ThreadKey, limit int) int {
	return runningSlots.homeOf(k.Tenant+"\x00"+k.User+"\x00"+k.Thread, max(limit, 1))
}

// bucketStatus sums the buckets into the deployment's capacity status and
// the tenants holding slots.
func bucketStatus(buckets []bucketItem) (core.CapacityStatus, []string) {
	var st core.CapacityStatus
	var tenants []string
	for _, b := range buckets {
		st.Used += b.Used
		st.Draining = st.Draining || b.Draining
		st.Granted += b.Granted
		for _, t := range b.Tenants {
			if !slices.Contains(tenants, t) {
				tenants = append(tenants, t)
			}
		}
	}
	slices.Sort(tenants)
	return st, tenants
}

// Capacity sums the running and paused slots' buckets (two
// BatchGetItems), and reads the counts by state that the last counter
// repair kept (one GetItem): three reads, whatever the fleet.
func (s *Store) Capacity(ctx context.Context) (core.CapacityStatus, error) {
	buckets, err := s.readLedger(ctx, runningSlots, s.limit, false)
	if err != nil {
		return core.CapacityStatus{}, err
	}
	st, _ := bucketStatus(buckets)
	paused, err := s.readLedger(ctx, pausedSlots, 0, false)
	if err != nil {
		return core.CapacityStatus{}, err
	}
	st.Paused, _ = usedSum(paused)
	noted, err := s.notedCounts(ctx, false)
	if err != nil {
		return core.CapacityStatus{}, err
	}
	for state, n := range noted.States {
		st.AddState(core.State(state), n)
	}
	st.CountedAt = noted.CountedAt
	return st, nil
}

// TenantsHolding implements core.CapacityStore: the buckets' tenant sets,
// in one eventually consistent read of the buckets.
func (s *Store) TenantsHolding(ctx context.Context) ([]string, error) {
	buckets, err := s.readLedger(ctx, runningSlots, s.limit, false)
	if err != nil {
		return nil, err
	}
	_, tenants := bucketStatus(buckets)
	return tenants, nil
}

// tallyShards is how many state-index keys of each state can hold
// entries, so that the counter repair reads only those: the most that the
// stores which set the buckets' limits file entries under (each records
// its own; the mark never goes down), or every key when limits were set
// before any was recorded. It relies on every store of a deployment
// filing entries under the keys of the limit it enforces (WithLimit, as
// the functions are wired): a store of a new limit sets the limits before
// its first slot. An entry outside the mark is missed by the tally only,
// not by the exact count (see RepairCounters). 0 when no limit was ever
// set.
func tallyShards(buckets []bucketItem) int {
	n := 0
	for _, b := range buckets {
		if b.LimOf != 0 && b.Shards == 0 {
			return IndexShards
		}
		n = max(n, b.Shards)
	}
	return n
}
