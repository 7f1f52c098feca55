package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// A ledger counts the slots of one kind that a deployment holds, split
// over buckets so that no single item is written by every take:
//
//	runningSlots  CAP#<deployment>[#<b>]   CapacityBuckets buckets (bucket.go)
//	pausedSlots   PAU#<deployment>[#<b>]   PausedBuckets buckets (paused.go)
//	poolPlaces    POOL#<deployment>        one bucket (pool.go)
//
// Bucket 0's key has no "#<b>". A bucket holds
//
//	used          the slots held by the records and reservations naming it
//	lim, lim_of   the bucket's limit, set for the ledger's limit lim_of
//	draining      the deployment drains (running and paused slots; SetDraining)
//	revision      moved by every write that moves "used", so that a repair
//	              tells a count that moved and came back from one that held still
//	spread        how many leading buckets may hold slots or limits (readLedger)
//
// and the running slots' buckets keep more (bucket.go). The limits of a
// ledger's buckets always sum to its limit: setLimits writes them all in
// one transaction, conditional on every bucket's revision. A take that
// finds them set for another limit (a fresh deployment, a changed
// setting), or a bucket holding more than its limit (an adopted
// sandbox), sets them first. A take gets a slot only in a bucket whose
// limit is set for the limit it enforces, and within that limit, so a
// ledger never holds more than its limit. A take tries its home bucket
// (a hash of its thread, sandbox or token) first: takeIn.
type ledger struct {
	// name names the ledger in errors.
	name string
	// prefix starts its buckets' keys.
	prefix string
	// n is how many buckets it has.
	n int
}

var (
	runningSlots = ledger{name: "running slots", prefix: "CAP#", n: CapacityBuckets}
	pausedSlots  = ledger{name: "paused slots", prefix: "PAU#", n: PausedBuckets}
	poolPlaces   = ledger{name: "pool places", prefix: "POOL#", n: 1}
)

// takeTries bounds the transactions of one take (its home's, then those
// in the buckets its read showed with room, each a cancelled transaction
// when a peer took the room first), and limitAttempts the times it sets
// the ledger's limits for its limit (a concurrent take doing the same
// wins the race).
const (
	takeTries     = 4
	limitAttempts = 3
)

// errBucketFull: the bucket a take tried has no room; errLimitsUnset:
// its limit is not set for the take's limit.
var (
	errBucketFull  = errors.New("bucket full")
	errLimitsUnset = errors.New("bucket limits not set for this limit")
)

// bucketPK is the key of bucket b of ledger l.
func (s *Store) bucketPK(l ledger, b int) string {
	if b == 0 {
		return l.prefix + s.deployment
	}
	return l.prefix + s.deployment + "#" + strconv.Itoa(b)
}

// bucketOf parses the key of one of l's buckets (-1 if not one).
func (s *Store) bucketOf(l ledger, pk string) int {
	if pk == l.prefix+s.deployment {
		return 0
	}
	rest, ok := strings.CutPrefix(pk, l.prefix+s.deployment+"#")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n <= 0 || n >= l.n {
		return -1
	}
	return n
}

// bucketItem is a stored bucket of a ledger (Granted, Tenants and Shards:
// the running slots' only).
type bucketItem struct {
	Index    int      `dynamodbav:"-"`
	Used     int      `dynamodbav:"used"`
	Revision int64    `dynamodbav:"revision"`
	Draining bool     `dynamodbav:"draining"`
	Tenants  []string `dynamodbav:"tenants,stringset"`
	Granted  int      `dynamodbav:"granted"`
	Lim      int      `dynamodbav:"lim"`
	LimOf    int      `dynamodbav:"lim_of"`
	Spread   int      `dynamodbav:"spread"`
	Shards   int      `dynamodbav:"shards"`
}

func decodeBucket(av map[string]types.AttributeValue) bucketItem {
	var b bucketItem
	_ = attributevalue.UnmarshalMap(av, &b) // absent attributes stay zero
	return b
}

// room is how many slots the bucket can still give under total (none
// until its limit is set for total).
func (b bucketItem) room(total int) int {
	if b.LimOf != total {
		return 0
	}
	return b.Lim - b.Used
}

// usedSum is the slots the buckets hold together, and a revision that
// moves whenever one of theirs does.
func usedSum(buckets []bucketItem) (used int, revision int64) {
	for _, b := range buckets {
		used += b.Used
		revision += b.Revision
	}
	return used, revision
}

// readLedger reads the buckets of l that may hold slots under limit
// (every bucket when limit is 0), in one BatchGetItem (strongly consistent
// only when consistent: an eventually consistent read costs half, and
// picking a bucket or reporting counts needs no more, the take's own
// condition deciding). Those are the buckets with a share of limit and,
// when the limits were last set with a wider spread (a lowered limit, an
// adopted sandbox), the rest of that spread, read with a second call. A
// bucket never written reads as empty. Reading fewer buckets never lets a
// take past a limit: that is the takes' conditions' job, and the limits
// always sum to the ledger's.
func (s *Store) readLedger(ctx context.Context, l ledger, limit int, consistent bool) ([]bucketItem, error) {
	k := l.n
	if limit > 0 {
		k = min(l.n, limit)
	}
	out, err := s.readBuckets(ctx, l, 0, k, consistent)
	if err != nil {
		return nil, err
	}
	if spread := spreadOf(out, l.n); spread > k {
		rest, err := s.readBuckets(ctx, l, k, spread, consistent)
		if err != nil {
			return nil, err
		}
		out = append(out, rest...)
	}
	return out, nil
}

// spreadOf is how many leading buckets may hold slots or limits, as the
// last setting of the limits recorded it in buckets: every bucket (n)
// when none of them was ever set, or was set before the spread was
// recorded.
func spreadOf(buckets []bucketItem, n int) int {
	spread := 0
	for _, b := range buckets {
		if b.LimOf != 0 && b.Spread == 0 {
			return n
		}
		spread = max(spread, b.Spread)
	}
	if spread == 0 {
		return n
	}
	return min(spread, n)
}

// readBuckets reads l's buckets from up to to (one BatchGetItem).
func (s *Store) readBuckets(ctx context.Context, l ledger, from, to int, consistent bool) ([]bucketItem, error) {
	keys := make([]map[string]types.AttributeValue, 0, to-from)
	out := make([]bucketItem, to-from)
	for b := from; b < to; b++ {
		keys = append(keys, s.key(s.bucketPK(l, b)))
		out[b-from].Index = b
	}
	items, err := s.batchGet(ctx, keys, consistent)
	if err != nil {
		return nil, err
	}
	for _, av := range items {
		if b := s.bucketOf(l, stringAttr(av, AttrPK)); b >= from && b < to {
			out[b-from] = decodeBucket(av)
			out[b-from].Index = b
		}
	}
	return out, nil
}

// bucketUpdate is the transaction item applying u (under cond, if any) to
// bucket b of l; a refusal returns the bucket.
func (s *Store) bucketUpdate(l ledger, b int, cond *expression.ConditionBuilder, u expression.UpdateBuilder) (types.TransactWriteItem, error) {
	return s.txnUpdate(s.key(s.bucketPK(l, b)), cond, u, true)
}

// slotTaken and slotFreed move a bucket's used count by one, and its
// revision.
func slotTaken() expression.UpdateBuilder {
	return expression.Add(expression.Name("used"), expression.Value(1)).Add(expression.Name("revision"), expression.Value(1))
}

func slotFreed() expression.UpdateBuilder {
	return expression.Add(expression.Name("used"), expression.Value(-1)).Add(expression.Name("revision"), expression.Value(1))
}

// takeCondition is the condition of a take under limit (none when limit
// is 0: the slot exists whatever the count says): the bucket's limit is
// set for limit and it has room; and, when drains, the deployment is not
// draining. nil when there is nothing to check.
func takeCondition(limit int, drains bool) *expression.ConditionBuilder {
	var cond expression.ConditionBuilder
	switch {
	case limit > 0:
		cond = expression.Name("lim_of").Equal(expression.Value(limit)).
			And(expression.Or(
				expression.Name("used").LessThan(expression.Name("lim")),
				expression.AttributeNotExists(expression.Name("used")).And(expression.Name("lim").GreaterThan(expression.Value(0)))))
		if drains {
			cond = cond.And(notDraining())
		}
	case drains:
		cond = notDraining()
	default:
		return nil
	}
	return &cond
}

// limitRefusal says why a bucket (av, as a refused take returned it)
// refused a slot under limit, draining aside: limits unset for limit, or
// full (a *fullBucket).
func limitRefusal(av map[string]types.AttributeValue, limit int) error {
	bk := decodeBucket(av)
	if limit > 0 && bk.LimOf != limit {
		return errLimitsUnset
	}
	return &fullBucket{bucket: bk, seen: len(av) > 0}
}

// fullBucket is errBucketFull with the bucket as the refused take found it
// (seen: the take returned it), fresher than a read made before the take.
type fullBucket struct {
	bucket bucketItem
	seen   bool
}

func (e *fullBucket) Error() string { return errBucketFull.Error() }
func (e *fullBucket) Unwrap() error { return errBucketFull }

// ledgerFull is a take's refusal when no bucket of its ledger had room
// (or, draining, the deployment drains): buckets is the last read of
// them, the tried ones as their refused takes found them.
type ledgerFull struct {
	buckets  []bucketItem
	draining bool
}

func (e *ledgerFull) Error() string {
	if e.draining {
		return "the deployment is draining"
	}
	return "every bucket is full"
}

// takeIn runs take (a transaction taking one of l's slots in bucket b,
// which answers errBucketFull or errLimitsUnset when b refuses it) in
// bucket home and, when that one is full, reads every bucket once (one
// BatchGetItem) and tries the emptiest of them with room; a take that
// finds its bucket taken by peers since the read (a lost race) tries the
// next emptiest, up to takeTries transactions in all. It returns the
// bucket that gave the slot, or a *ledgerFull when none read has room
// left to try. Buckets whose limits are not set for limit get them first
// (setLimits), and are read again.
func (s *Store) takeIn(ctx context.Context, l ledger, limit, home int, take func(b int) error) (int, error) {
	b := home
	var tried []int
	var buckets []bucketItem // the read of the buckets, once a take failed
	for limits := 0; ; {
		err := take(b)
		if !errors.Is(err, errBucketFull) && !errors.Is(err, errLimitsUnset) {
			return b, err
		}
		if errors.Is(err, errBucketFull) {
			tried = append(tried, b)
			updateTried(buckets, b, err)
		} else {
			buckets = nil // read them again
		}
		if buckets == nil {
			if buckets, err = s.readForTake(ctx, l, limit); err != nil {
				return b, fmt.Errorf("reading the %s: %w", l.name, err)
			}
		}
		if slices.ContainsFunc(buckets, func(bk bucketItem) bool { return bk.Draining }) {
			return b, &ledgerFull{buckets: buckets, draining: true}
		}
		if needsLimits(buckets, limit) && limits < limitAttempts {
			limits++
			if lerr := s.setLimits(ctx, l, buckets, limit); lerr != nil && !errors.Is(lerr, core.ErrConflict) {
				return b, lerr
			}
			tried, buckets = nil, nil
			continue // read again: set by us or by a peer
		}
		next, ok := emptiest(buckets, limit, tried)
		if !ok || len(tried) >= takeTries {
			return b, &ledgerFull{buckets: buckets}
		}
		b = next
	}
}

// emptiest picks the bucket with the most room (limits set for limit)
// among those not tried, at random among equals, so that concurrent takes
// spread; false when none has room.
func emptiest(buckets []bucketItem, limit int, tried []int) (int, bool) {
	best, most, ties := 0, 0, 0
	for _, bk := range buckets {
		r := bk.room(limit)
		switch {
		case r <= 0 || slices.Contains(tried, bk.Index), r < most:
		case r > most:
			best, most, ties = bk.Index, r, 1
		default: // r == most: keep one of the ties at random
			if ties++; rand.IntN(ties) == 0 {
				best = bk.Index
			}
		}
	}
	return best, most > 0
}

// readForTake reads l's buckets for a take to pick from: every one,
// strongly consistent, when they have limits to set for limit (setLimits
// conditions on what it read, and writes every bucket).
func (s *Store) readForTake(ctx context.Context, l ledger, limit int) ([]bucketItem, error) {
	buckets, err := s.readLedger(ctx, l, limit, false)
	if err == nil && needsLimits(buckets, limit) {
		buckets, err = s.readLedger(ctx, l, 0, true)
	}
	return buckets, err
}

// updateTried replaces bucket b in buckets with what its refused take
// (err) found, if it returned the bucket: a refusal then reports the
// slots peers took since the read.
func updateTried(buckets []bucketItem, b int, err error) {
	var fb *fullBucket
	if !errors.As(err, &fb) || !fb.seen {
		return
	}
	for i := range buckets {
		if buckets[i].Index == b {
			fb.bucket.Index = b
			buckets[i] = fb.bucket
		}
	}
}

// homeOf is the first of l's buckets a take by key tries: one of those
// with an even share of limit (any when limit is 0: no limit), by a hash
// of key.
func (l ledger) homeOf(key string, limit int) int {
	n := l.n
	if limit > 0 {
		n = min(n, limit)
	}
	return shardOf(key, n)
}

// evenShare is bucket b's part of limit split among n buckets: the limit
// split evenly, the remainder going to the lowest buckets.
func evenShare(limit, n, b int) int {
	s := limit / n
	if b < limit%n {
		s++
	}
	return s
}

// bucketLimits divides total among the buckets: each keeps what it holds
// (the excess, when they hold more than total, taken from the fullest),
// and the spare goes where the limit is least above the bucket's even
// share, so that a fresh ledger's buckets get their shares.
func bucketLimits(buckets []bucketItem, total int) []int {
	lims := make([]int, len(buckets))
	sum := 0
	for i, b := range buckets {
		lims[i] = max(b.Used, 0)
		sum += lims[i]
	}
	for ; sum > total; sum-- {
		i := 0
		for j := range lims {
			if lims[j] > lims[i] {
				i = j
			}
		}
		lims[i]--
	}
	share := func(j int) int { return evenShare(total, len(lims), j) }
	for ; sum < total; sum++ {
		i := 0
		for j := range lims {
			if lims[j]-share(j) < lims[i]-share(i) {
				i = j
			}
		}
		lims[i]++
	}
	return lims
}

// needsLimits reports whether the buckets' limits must be (re)written for
// total: not all set for it, or set otherwise than bucketLimits would now
// set them (a bucket holding more than its limit: an adopted sandbox).
// Limits already as bucketLimits would set them are left alone, even with
// the buckets over total (a count a repair is yet to correct): a rewrite
// would change nothing but the revisions the repair compares. Never when
// total is 0 (no limit).
func needsLimits(buckets []bucketItem, total int) bool {
	if total <= 0 {
		return false
	}
	over := false
	for _, b := range buckets {
		if b.LimOf != total {
			return true
		}
		over = over || b.Used > b.Lim
	}
	if !over {
		return false
	}
	lims := bucketLimits(buckets, total)
	for i, b := range buckets {
		if b.Lim != lims[i] {
			return true
		}
	}
	return false
}

// setLimits writes the limit of every bucket of l for total
// (bucketLimits, from a read of every bucket) in one transaction, each
// bucket conditional on its revision as read: the limits always sum to
// total, and no bucket took a slot since they were computed. Each bucket
// also records the spread (limitSpread). The running slots' buckets
// record the state-index keys in use too (tallyShards). ErrConflict when
// a bucket moved (the caller reads again).
func (s *Store) setLimits(ctx context.Context, l ledger, buckets []bucketItem, total int) error {
	if len(buckets) != l.n {
		return fmt.Errorf("set %s limits from %d of %d buckets", l.name, len(buckets), l.n)
	}
	lims := bucketLimits(buckets, total)
	spread := limitSpread(buckets, lims, total)
	shards := max(s.shards, tallyShards(buckets))
	items := make([]types.TransactWriteItem, 0, len(buckets))
	for i, b := range buckets {
		cond := valueIs("revision", b.Revision)
		u := expression.Set(expression.Name("lim"), expression.Value(lims[i])).
			Set(expression.Name("lim_of"), expression.Value(total)).Set(expression.Name("spread"), expression.Value(spread)).
			Add(expression.Name("revision"), expression.Value(1))
		if l == runningSlots {
			u = u.Set(expression.Name("shards"), expression.Value(shards))
		}
		it, err := s.bucketUpdate(l, b.Index, &cond, u)
		if err != nil {
			return fmt.Errorf("set %s limits: %w", l.name, err)
		}
		items = append(items, it)
	}
	return s.transact(ctx, "set "+l.name+" limits", items)
}

// limitSpread is how many leading buckets may hold slots or limits once
// lims are set for total: those with a share of total, and up to the last
// that holds slots or gets a limit. A take needs a limit above what its
// bucket holds, so until the limits are set again no bucket past the
// spread takes a slot (reconcile's adoption writes a bucket with a share).
func limitSpread(buckets []bucketItem, lims []int, total int) int {
	spread := min(len(buckets), max(total, 1))
	for i, b := range buckets {
		if b.Used > 0 || lims[i] > 0 {
			spread = max(spread, b.Index+1)
		}
	}
	return spread
}
