package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// maxLossPause bounds each pause of a dispatch walking behind a lost
// grant, and maxLossPauses all of them (see stillWaitingAfter): a slow
// round trip (a stalled table) or a long walk must not hold a dispatch,
// and a waiter's turn or a release with it, for long.
const (
	maxLossPause  = 100 * time.Millisecond
	maxLossPauses = 500 * time.Millisecond
)

// stillWaitingAfter reads t strongly and reports whether it still waits,
// after a pause of a random time up to twice w.lost (at most
// maxLossPause, and until w's pauses reach maxLossPauses), w.lost being
// the round trip of the grant this dispatch lost. The frees that end at
// once all lose the head ticket to one of them, then walk the same
// tickets; without the pause they would read and try each next ticket
// together again, so that every ticket costs all but one of them a
// cancelled grant. Spread over two round trips, a later one mostly reads
// the ticket already granted.
func (s *Store) stillWaitingAfter(ctx context.Context, t ticketItem, w *walk) (bool, error) {
	if w.lost > 0 && w.paused < maxLossPauses {
		d := rand.N(min(2*w.lost, maxLossPause, maxLossPauses-w.paused))
		w.paused += d
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("dispatch: %w", ctx.Err())
		case <-time.After(d):
		}
	}
	item, err := s.getTicket(ctx, t.PK, t.SK, true)
	if err != nil || len(item) == 0 {
		return false, err
	}
	var now ticketItem
	if err := attributevalue.UnmarshalMap(item, &now); err != nil {
		return false, fmt.Errorf("decode ticket: %w", err)
	}
	return !now.granted(), nil
}

// passOn ends grant g (the ticket stored as g, holding bucket g.Bucket's
// slot in trust) and hands its slot to next, the first live waiting
// ticket after it, or frees it when next is nil, in one transaction; with
// place set, g's place is given back too. It reports the failed items.
func (s *Store) passOn(ctx context.Context, g ticketItem, next *ticketItem, now time.Time, grantFor time.Duration, place bool) (map[string]types.CancellationReason, error) {
	del, err := s.ticketDelete(g.PK, g.SK, ticketGranted, g.Bucket, g.GrantUntil)
	if err != nil {
		return nil, fmt.Errorf("pass grant on: %w", err)
	}
	items := []types.TransactWriteItem{del}
	if place {
		items = append(items, s.placeDelete(g.ticket()))
	}
	var more []types.TransactWriteItem
	if next != nil {
		// The bucket's counts stay; its revision moves, as with every
		// change of the grants, so that the counter repair never counts
		// the grants from a read that straddled this one.
		grant, gerr := s.grantUpdate(*next, g.Bucket, ms(now.Add(grantFor)))
		bucket, berr := s.bucketUpdate(runningSlots, g.Bucket, nil, expression.Add(expression.Name("revision"), expression.Value(1)))
		more, err = []types.TransactWriteItem{grant, bucket}, errors.Join(gerr, berr)
	} else {
		var release types.TransactWriteItem
		release, err = s.trustRelease(g.Bucket)
		more = []types.TransactWriteItem{release}
	}
	if err != nil {
		return nil, fmt.Errorf("pass grant on: %w", err)
	}
	return s.writeTxn(ctx, "pass grant on", append(items, more...))
}

// grantIn takes a slot of bucket b into trust for the waiting ticket t,
// within b's limit for limit, in one transaction: errBucketFull (or
// errLimitsUnset, or a draining refusal) when b refuses, ErrConflict when
// t is no longer waiting (errGrantedElsewhere when a peer granted it).
func (s *Store) grantIn(ctx context.Context, t ticketItem, b, limit int, grantUntil int64) error {
	bucket, err := s.bucketUpdate(runningSlots, b, takeCondition(limit, true), slotTaken().Add(expression.Name("granted"), expression.Value(1)))
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	grant, err := s.grantUpdate(t, b, grantUntil)
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	failed, err := s.writeTxn(ctx, "grant", []types.TransactWriteItem{bucket, grant})
	switch {
	case has(failed, s.bucketPK(runningSlots, b)): // first: the slot is gone, whatever the ticket
		return bucketRefusal(failed[s.bucketPK(runningSlots, b)].Item, limit)
	case has(failed, ticketID(t.PK, t.SK)):
		var now ticketItem
		if av := failed[ticketID(t.PK, t.SK)].Item; av != nil && attributevalue.UnmarshalMap(av, &now) == nil && now.granted() {
			return fmt.Errorf("grant ticket %s: %w", t.Ticket, errGrantedElsewhere)
		}
		return fmt.Errorf("grant ticket %s: %w", t.Ticket, core.ErrConflict)
	}
	return err
}

// Dispatch reads the head of the queue (readHead) and serves what it
// read in order: lapsed waiting tickets are deleted, lapsed grants passed
// on to the first live waiting tickets (or their slots freed: passLapsed),
// then each live waiting ticket in turn is granted a slot of a bucket with
// room (grantWaiting: d.Bucket first; every bucket read, eventually
// consistent, when d.Scan, or when d.Self is the first live waiting
// ticket). A grant that finds its ticket granted by a peer goes on to the
// next ticket read, keeping the slot (stillWaitingAfter); when every
// ticket read ends granted, it reads the tickets behind them (dispatch,
// walk), at most dispatchAttempts reads. Any other race lost to a peer
// reads the head again. A free's first read (d.Freed set) is eventually
// consistent: a ticket it misses is served by its own dispatch or the
// head's next turn, and every write is conditional on what it read. A
// waiter's turn (d.Self set, no bucket, no scan) first reads only its own
// shard (aheadInShard).
func (s *Store) Dispatch(ctx context.Context, d core.Dispatch) (core.DispatchResult, error) {
	var res core.DispatchResult
	if d.Self != "" && d.Freed < 0 && !d.Scan {
		ahead, err := s.aheadInShard(ctx, d, &res)
		if err != nil || ahead != "" {
			res.Head = ahead
			return res, err
		}
	}
	w := walk{room: map[int]int{}}
	if d.Freed >= 0 {
		w.room[int(d.Freed)] = 1 // a slot was freed there; whether it still is, the take decides
	}
	for attempt := range dispatchAttempts {
		r := headRead{limit: s.scan, eventual: attempt == 0 && d.Freed >= 0, after: w.after}
		view, err := s.readHead(ctx, d, attempt, r)
		if err != nil {
			return res, err
		}
		again, err := s.dispatch(ctx, d, view, &w, &res)
		if err != nil || !again {
			return res, err
		}
	}
	return res, nil
}

// readHead makes read r of a dispatch. The first read of a free's or
// reconcile's dispatch (not a waiter's turn) reads the whole queue in one
// statement (wholeQueue) when it is short: one call when nobody waits. A
// longer queue, or a failed statement, is then read shard by shard
// (queueHead), one call more.
func (s *Store) readHead(ctx context.Context, d core.Dispatch, attempt int, r headRead) (headView, error) {
	if attempt == 0 && d.Self == "" {
		q, whole, err := s.wholeQueue(ctx, !r.eventual)
		if err == nil && whole {
			return headView{tickets: q}, nil
		}
		if err != nil && ctx.Err() == nil { // an ended ctx fails the next read too, which returns it
			s.log.WarnContext(ctx, "reading the wait queue in one statement failed; reading it shard by shard", "err", err)
		}
	}
	q, err := s.queueHead(ctx, r)
	if err != nil {
		return headView{}, err
	}
	return headView{tickets: q, partial: r.limit > 0 && len(q) >= r.limit}, nil
}

// aheadInShard reads the head of d.Self's shard and returns the first
// live waiting ticket there when it is not d.Self ("" when it is, or when
// the read cannot tell: d.Self further than the page, or a lapsed grant
// ahead, which only a read of the whole head can pass on in order). The
// lapsed waiting tickets ahead are removed. So the turns of W waiters read
// each shard about W/queueShards times plus once per shard head, not W
// times (more when grants fill a shard's page: that read cannot tell).
func (s *Store) aheadInShard(ctx context.Context, d core.Dispatch, res *core.DispatchResult) (string, error) {
	pk := s.ticketPK(core.Ticket{ID: d.Self})
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	cond := "pk = :pk"
	out, err := s.db.Query(ctx, &dynamodb.QueryInput{TableName: &s.table, KeyConditionExpression: &cond,
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: pk}},
		ConsistentRead:            aws.Bool(true), Limit: aws.Int32(int32(s.scan/queueShards + 2))})
	if err != nil {
		return "", unavailable("query wait queue shard", err)
	}
	for _, av := range out.Items {
		var t ticketItem
		if err := attributevalue.UnmarshalMap(av, &t); err != nil {
			return "", fmt.Errorf("decode ticket: %w", err)
		}
		switch {
		case t.Ticket == d.Self, t.granted() && !t.live(d.Now):
			return "", nil
		case t.granted():
		case t.live(d.Now):
			return t.Ticket, nil
		default:
			if err := s.dropTicket(ctx, t); err != nil {
				return "", err
			}
			res.Cleaned++
		}
	}
	return "", nil
}

// walk is what a Dispatch carries from one read of the queue to the next.
type walk struct {
	// after: the next read returns only the tickets behind this fair key
	// ("": from the head).
	after string
	// lapsed are lapsed grants read but not passed on yet: their read was
	// cut at its limit and held no waiting ticket, so the next read's
	// tickets (behind them) get them.
	lapsed []ticketItem
	// room is the slots left to give, by bucket (d.Bucket's freed slot;
	// every bucket's room once they were read).
	room map[int]int
	// read: the buckets were read.
	read bool
	// lost is the round trip of the last grant this dispatch tried that
	// a peer had granted first (0: none yet); paused the pauses so far.
	lost, paused time.Duration
}

// dispatch is one Dispatch pass over q; again: read the queue again,
// from w.after (a race was lost: from the head; peers took every ticket
// of a partial read, or it held no waiting ticket: behind it).
func (s *Store) dispatch(ctx context.Context, d core.Dispatch, q headView, w *walk, res *core.DispatchResult) (again bool, _ error) {
	var waiting, lapsed []ticketItem
	for _, t := range q.tickets {
		switch {
		case t.live(d.Now) && t.granted():
		case t.live(d.Now):
			waiting = append(waiting, t)
		case t.granted():
			lapsed = append(lapsed, t)
		default:
			if err := s.dropTicket(ctx, t); err != nil {
				return false, err
			}
			res.Cleaned++
		}
	}
	res.Head = ""
	waiting, again, err := s.passLapsed(ctx, d, append(w.lapsed, lapsed...), waiting, q.partial, w, res)
	if err != nil || again {
		return again, err
	}
	if len(waiting) > 0 {
		res.Head = waiting[0].Ticket
		if again, err = s.grantWaiting(ctx, d, w, &waiting, res); err != nil || again {
			return again, err
		}
	}
	if len(waiting) > 0 {
		res.Head = waiting[0].Ticket
		return false, nil
	}
	res.Head = ""
	// Every ticket read is granted (by this dispatch or its peers, or
	// before): more may wait behind them, unless the read had it all. Read
	// them if this dispatch still has a slot or a lapsed grant to give, or
	// may read the buckets for the first of them.
	_, left := roomIn(w.room)
	if !q.partial || !(left || len(w.lapsed) > 0 || (!w.read && (d.Scan || d.Self != ""))) {
		return false, nil
	}
	w.after = q.tickets[len(q.tickets)-1].SK
	return true, nil
}

// passLapsed passes the lapsed grants on to the first of the waiting
// tickets, in order, and returns the tickets still waiting. A grant with
// no ticket left to take it frees its slot, unless the read was partial:
// it is then kept in w.lapsed for the tickets behind. again: a race was
// lost, read the head again.
func (s *Store) passLapsed(ctx context.Context, d core.Dispatch, lapsed, waiting []ticketItem, partial bool, w *walk, res *core.DispatchResult) ([]ticketItem, bool, error) {
	w.lapsed = nil
	for i, g := range lapsed {
		var next *ticketItem
		if len(waiting) > 0 {
			next = &waiting[0]
		} else if partial {
			w.lapsed = lapsed[i:]
			return nil, false, nil
		}
		failed, err := s.passOn(ctx, g, next, d.Now, d.GrantFor, false)
		if len(failed) > 0 {
			w.after = ""
			return nil, true, nil
		}
		if err != nil {
			return nil, false, err
		}
		res.Cleaned++
		if next == nil {
			w.room[g.Bucket]++ // freed: still this dispatch's to give
			continue
		}
		res.Granted = append(res.Granted, next.ticket())
		waiting = waiting[1:]
	}
	return waiting, false, nil
}

// grantWaiting grants each of the waiting tickets in turn a slot of a
// bucket with room (reading every bucket when d.Scan, or when d.Self is
// the first), until the room or the tickets run out; each ticket granted
// leaves *waiting. again: a race was lost, read the head again.
func (s *Store) grantWaiting(ctx context.Context, d core.Dispatch, w *walk, waiting *[]ticketItem, res *core.DispatchResult) (again bool, _ error) {
	for len(*waiting) > 0 {
		t := (*waiting)[0]
		b, ok := roomIn(w.room)
		if !ok {
			if w.read || !(d.Scan || (d.Self != "" && t.Ticket == d.Self)) {
				return false, nil
			}
			if err := s.readRoom(ctx, d, w, res); err != nil || res.Status.Draining {
				return false, err
			}
			continue
		}
		// A turn granting room it read in the buckets reads each ticket
		// first too (pausing only once it lost a race): the frees grant
		// the same tickets during its reads, and a grant that finds its
		// ticket granted costs a cancelled transaction. A turn that finds
		// its own ticket granted by a peer stops there.
		turn := w.read && d.Self != ""
		if w.lost > 0 || turn {
			// Peers are granting the tickets read: read the next one
			// (a read unit) before trying it (a transaction's write units).
			still, err := s.stillWaitingAfter(ctx, t, w)
			if err != nil {
				return false, err
			}
			if !still {
				*waiting = (*waiting)[1:]
				if turn && t.Ticket == d.Self {
					clear(w.room) // served by a peer: the turn is done
					return false, nil
				}
				continue
			}
		}
		sent := time.Now()
		err := s.grantIn(ctx, t, b, d.Limit, ms(d.Now.Add(d.GrantFor)))
		var ce *core.CapacityError
		switch {
		case err == nil:
			w.room[b]--
			res.Granted = append(res.Granted, t.ticket())
			*waiting = (*waiting)[1:]
		case errors.Is(err, errBucketFull), errors.Is(err, errLimitsUnset):
			delete(w.room, b)
		case errors.As(err, &ce): // draining: nothing is granted
			w.room, w.read = nil, true
		case errors.Is(err, errGrantedElsewhere):
			// A peer granted it since the read: the slot is still this
			// dispatch's to give, to the next ticket it read.
			*waiting = (*waiting)[1:]
			w.lost = max(time.Since(sent), time.Nanosecond)
		case errors.Is(err, core.ErrConflict):
			w.after = ""
			return true, nil
		default:
			return false, err
		}
	}
	return false, nil
}

// readRoom reads every bucket (once per Dispatch) into w.room and res.
func (s *Store) readRoom(ctx context.Context, d core.Dispatch, w *walk, res *core.DispatchResult) error {
	w.read = true
	buckets, err := s.readLedger(ctx, runningSlots, d.Limit, false)
	if err != nil {
		return err
	}
	res.Read = true
	res.Status, res.Tenants = bucketStatus(buckets)
	res.Status.Limit = d.Limit
	if res.Status.Draining {
		return nil
	}
	for _, bk := range buckets {
		if r := bk.room(d.Limit); r > 0 {
			w.room[bk.Index] = r
		}
	}
	return nil
}

// headView is what a read of the queue's head returned: its tickets in
// service order; partial when the read stopped at its limit, so that more
// may wait behind them.
type headView struct {
	tickets []ticketItem
	partial bool
}

// roomIn picks a bucket with room left (at random, so that concurrent
// dispatchers spread), if any.
func roomIn(room map[int]int) (int, bool) {
	var open []int
	for b, r := range room {
		if r > 0 {
			open = append(open, b)
		}
	}
	if len(open) == 0 {
		return 0, false
	}
	return open[rand.IntN(len(open))], true
}
