package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// The wait queue (fair waiting under the wait policy). Two kinds of items:
//
//	WTR#<deployment>#<tenant>#<n>  (sk "R") waiter place n of a tenant
//	    (SANDBOX_MAX_WAITERS_PER_TENANT): "ticket", "until" (Unix ms: the
//	    place lapses then, whoever holds it), "round" and "qkey" (the
//	    ticket's round and sort key in the queue)
//	WQ#<deployment>#<n>  (sk = the fair key) one ticket, in queue shard n
//	    (a hash of the ticket): "tenant", "ticket",
//	    "place", "until" (Unix ms: a waiting ticket lapses then),
//	    "state" waiting|granted and, once granted, "bucket" and
//	    "grant_until" (Unix ms: the grant lapses then)
//
// The fair key is "<round, 10 digits>#<arrival, Unix ms, 15 digits>#<ticket>",
// so the shards, queried in parallel and merged by key, read the queue in
// service order. The queue is spread over queueShards partitions because
// every waited acquire writes its ticket three times (queued, granted,
// taken: six write units in transactions), which one partition takes
// about 160 times a second; the shards take queueShards times that, and
// cost a read of the head queueShards small Queries instead of one. A
// granted ticket's slot is held in trust in its bucket
// ("used" and "granted" count it), so no other acquire takes it; the
// waiter's reservation (or resume claim) takes it over, deleting the
// ticket and its place, in one transaction. Queue items carry no TTL:
// deleting a granted ticket must free or pass on its slot, so only a
// dispatch or the waiter itself deletes them.

// waiterPK is one of a tenant's waiter places.
func waiterPK(deployment, tenant string, place int) string {
	return "WTR#" + deployment + "#" + tenant + "#" + strconv.Itoa(place)
}

// queueShards is how many partitions the wait queue spreads over. Fixed:
// a ticket is found under the shard it was written to only while this is
// unchanged.
const queueShards = 8

// QueueShards is queueShards, for the tests outside the package that
// find the queue's tickets.
const QueueShards = queueShards

// queuePK is the partition of the wait queue's shard n.
func queuePK(deployment string, n int) string {
	return "WQ#" + deployment + "#" + strconv.Itoa(n)
}

// queueShardOf is ticket id's shard: FNV-1a of the id, modulo
// queueShards.
func queueShardOf(id string) int { return int(hashOf(id) % queueShards) }

// ticketPK is the partition of ticket t's shard.
func (s *Store) ticketPK(t core.Ticket) string {
	return queuePK(s.deployment, queueShardOf(t.ID))
}

// queuePKs lists the partitions of the queue's shards.
func (s *Store) queuePKs() []string {
	pks := make([]string, queueShards)
	for n := range queueShards {
		pks[n] = queuePK(s.deployment, n)
	}
	return pks
}

// fairKey is a ticket's sort key in the queue.
func fairKey(round int, arrived time.Time, ticket string) string {
	return fmt.Sprintf("%010d#%015d#%s", round, ms(arrived), ticket)
}

// roundOf is the round of a fair key (0 if it does not parse).
func roundOf(key string) int {
	if len(key) < 10 {
		return 0
	}
	n, _ := strconv.Atoi(key[:10])
	return n
}

// waiterTTL keeps a lapsed place's item a while for inspection (garbage
// collection only: a lapsed place is free whatever its item says).
const waiterTTL = time.Hour

// queueScan is how many tickets a read of the queue's head returns (the
// Store's scan; tests make it smaller), dispatchAttempts how many reads a
// dispatch makes at most (it reads again after losing a race, a ticket
// that moved or a grant passed on by a peer, or to look behind tickets
// that are all granted). A read asks each shard for
// queueScan/queueShards+2 = 10 tickets: a ticket is about 250 bytes (400
// with the longest tenant and deployment names), so each shard's page
// stays within the 4 KB of one read unit, and the read sees past the
// granted tickets at the head (a grant stays there until its waiter's next
// poll takes it, so they pile up as the rate grows).
const (
	queueScan        = 64
	dispatchAttempts = 3
)

// Ticket states.
const (
	ticketWaiting = "waiting"
	ticketGranted = "granted"
)

// ticketItem is a stored ticket.
type ticketItem struct {
	PK         string `dynamodbav:"pk"`
	SK         string `dynamodbav:"sk"`
	Tenant     string `dynamodbav:"tenant"`
	Ticket     string `dynamodbav:"ticket"`
	Place      int    `dynamodbav:"place"`
	Arrived    int64  `dynamodbav:"arrived"`
	Until      int64  `dynamodbav:"until"`
	State      string `dynamodbav:"state"`
	Bucket     int    `dynamodbav:"bucket"`
	GrantUntil int64  `dynamodbav:"grant_until,omitempty"`
	Draining   bool   `dynamodbav:"draining,omitempty"`
}

func (t ticketItem) ticket() core.Ticket {
	return core.Ticket{ID: t.Ticket, Tenant: t.Tenant, Place: t.Place, Round: roundOf(t.SK), Key: t.SK,
		Arrived: fromMS(t.Arrived), Until: fromMS(t.Until)}
}

func (t ticketItem) granted() bool { return t.State == ticketGranted }

// live reports whether the ticket still counts at now: a waiting one
// until its waiter's wait ends, a granted one until its grant lapses.
func (t ticketItem) live(now time.Time) bool {
	if t.granted() {
		return ms(now) < t.GrantUntil
	}
	return ms(now) < t.Until
}

// ticketID names the ticket stored as (pk, key) in a transaction's
// failed items (see itemPK).
func ticketID(pk, key string) string { return pk + "\x00" + key }

// headRead is what a read of the queue's head reads.
type headRead struct {
	// limit bounds the tickets read (0: the whole queue).
	limit int
	// eventual reads eventually consistent (half the units; may miss the
	// latest writes, which every write's condition then finds).
	eventual bool
	// after reads only the tickets behind this fair key ("": from the
	// head).
	after string
}

// queueHead reads the first r.limit tickets of the queue in service
// order: every shard's head in parallel (each read a page of about its
// share), merged by fair key.
func (s *Store) queueHead(ctx context.Context, r headRead) ([]ticketItem, error) {
	var q []ticketItem
	var derr error
	err := s.eachTicketIn(ctx, r, func(t ticketItem, err error) bool {
		if err != nil {
			derr = err
			return false
		}
		q = append(q, t)
		return r.limit == 0 || len(q) < r.limit
	})
	if err == nil {
		err = derr
	}
	return q, err
}

// eachTicketIn calls fn with the tickets r reads, in service order, until
// fn returns false.
func (s *Store) eachTicketIn(ctx context.Context, r headRead, fn func(ticketItem, error) bool) error {
	pks := s.queuePKs()
	kqs := make([]keyQuery, len(pks))
	cond := "pk = :pk"
	if r.after != "" {
		cond += " AND sk > :after"
	}
	for i, pk := range pks {
		values := map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: pk}}
		if r.after != "" {
			values[":after"] = &types.AttributeValueMemberS{Value: r.after}
		}
		in := &dynamodb.QueryInput{TableName: &s.table, KeyConditionExpression: &cond,
			ExpressionAttributeValues: values, ConsistentRead: aws.Bool(!r.eventual)}
		if r.limit > 0 {
			// A shard's share of the head, and a little more: the merge
			// reads a further page of a shard only when it gets that far.
			in.Limit = aws.Int32(int32(r.limit/queueShards + 2))
		}
		kqs[i] = keyQuery{pk: pk, in: in}
	}
	return s.eachMerged(ctx, "query wait queue", kqs, itemSK, func(av map[string]types.AttributeValue) bool {
		var t ticketItem
		if err := attributevalue.UnmarshalMap(av, &t); err != nil {
			return fn(t, fmt.Errorf("decode ticket: %w", err))
		}
		return fn(t, nil)
	})
}

// itemSK is an item's sort key.
func itemSK(av map[string]types.AttributeValue) string {
	if sk, ok := av[AttrSK].(*types.AttributeValueMemberS); ok {
		return sk.Value
	}
	return ""
}

// EnterWait reads the tenant's w.Max places (one BatchGetItem) and the
// head of the queue (one Query a shard), then takes a free or lapsed place
// and queues the ticket in one transaction, trying the next free place
// when a concurrent waiter took it first. The ticket's round is the round
// of the first live ticket at the queue's head, or one more than
// the latest round the tenant's live places hold, whichever is later.
func (s *Store) EnterWait(ctx context.Context, w core.Waiter) (core.Ticket, error) {
	if w.Max <= 0 {
		return core.Ticket{}, errors.New("enter wait: no places")
	}
	keys := make([]map[string]types.AttributeValue, w.Max)
	for i := range keys {
		keys[i] = s.key(waiterPK(s.deployment, w.Tenant, i))
	}
	items, err := s.batchGetAll(ctx, keys)
	if err != nil {
		return core.Ticket{}, err
	}
	held := map[string]bool{}
	latest := -1
	for _, av := range items {
		var p struct {
			PK    string `dynamodbav:"pk"`
			Until int64  `dynamodbav:"until"`
			Round *int   `dynamodbav:"round"`
		}
		if attributevalue.UnmarshalMap(av, &p) != nil || p.Until <= ms(w.Now) {
			continue
		}
		held[p.PK] = true
		if p.Round != nil {
			latest = max(latest, *p.Round)
		}
	}
	head, err := s.queueHead(ctx, headRead{limit: s.scan})
	if err != nil {
		return core.Ticket{}, err
	}
	round := 0
	for i, t := range head {
		if t.live(w.Now) || i == len(head)-1 {
			round = roundOf(t.SK)
			break
		}
	}
	if latest >= 0 {
		round = max(round, latest+1)
	}
	t := core.Ticket{ID: w.Ticket, Tenant: w.Tenant, Round: round, Key: fairKey(round, w.Now, w.Ticket),
		Arrived: w.Now.Truncate(time.Millisecond), Until: w.Until.Truncate(time.Millisecond)}
	// Start at a random place so that concurrent waiters rarely race for
	// the same one.
	start := rand.IntN(w.Max)
	for n := range w.Max {
		t.Place = (start + n) % w.Max
		if held[waiterPK(s.deployment, w.Tenant, t.Place)] {
			continue
		}
		failed, err := s.enqueue(ctx, w, t)
		switch {
		case has(failed, waiterPK(s.deployment, w.Tenant, t.Place)): // a concurrent waiter took it
		case len(failed) > 0:
			return core.Ticket{}, fmt.Errorf("enter wait: ticket %s: %w", w.Ticket, core.ErrConflict)
		case err != nil:
			return core.Ticket{}, err
		default:
			return t, nil
		}
	}
	return core.Ticket{}, &core.CapacityError{Reason: api.RefusalTooManyWaiters, RetryAfter: 5 * time.Second}
}

// enqueue takes place t.Place for w (if free or lapsed) and puts the
// ticket, in one transaction.
func (s *Store) enqueue(ctx context.Context, w core.Waiter, t core.Ticket) (map[string]types.CancellationReason, error) {
	place, err := expression.NewBuilder().
		WithCondition(expression.Or(expression.AttributeNotExists(expression.Name(AttrPK)),
			expression.Name("until").LessThanEqual(expression.Value(ms(w.Now))))).
		WithUpdate(expression.Set(expression.Name("ticket"), expression.Value(t.ID)).
			Set(expression.Name("until"), expression.Value(ms(w.Until))).
			Set(expression.Name("round"), expression.Value(t.Round)).
			Set(expression.Name("qkey"), expression.Value(t.Key)).
			Set(expression.Name(AttrTTL), expression.Value(w.Until.Add(waiterTTL).Unix()))).Build()
	if err != nil {
		return nil, fmt.Errorf("enter wait: %w", err)
	}
	ticket, err := attributevalue.MarshalMap(ticketItem{PK: s.ticketPK(t), SK: t.Key, Tenant: t.Tenant, Ticket: t.ID,
		Place: t.Place, Arrived: ms(w.Now), Until: ms(w.Until), State: ticketWaiting})
	if err != nil {
		return nil, fmt.Errorf("enter wait: %w", err)
	}
	notExists := "attribute_not_exists(pk)"
	return s.writeTxn(ctx, "enter wait", []types.TransactWriteItem{
		{Update: &types.Update{TableName: &s.table, Key: s.key(waiterPK(s.deployment, w.Tenant, t.Place)),
			ConditionExpression: place.Condition(), UpdateExpression: place.Update(),
			ExpressionAttributeNames: place.Names(), ExpressionAttributeValues: place.Values()}},
		{Put: &types.Put{TableName: &s.table, Item: ticket, ConditionExpression: &notExists}},
	})
}

// PollTicket reads the ticket (gone unless it is t's own, of t's tenant):
// one eventually consistent GetItem (half a
// read unit: waiters poll often, and a grant lasts long enough for the
// next poll to see it), and a strongly consistent one when the first finds
// no ticket (it may have missed one queued a moment before: gone must be
// certain, since the waiter then queues anew). A stale read can show a
// grant since passed on; the take, conditional on the grant, then fails
// with ErrGrantLost.
func (s *Store) PollTicket(ctx context.Context, t core.Ticket) (core.TicketState, error) {
	pk := s.ticketPK(t)
	item, err := s.getTicket(ctx, pk, t.Key, false)
	if err == nil && len(item) == 0 {
		item, err = s.getTicket(ctx, pk, t.Key, true)
	}
	if err != nil {
		return core.TicketState{}, err
	}
	if len(item) == 0 {
		return core.TicketState{Gone: true}, nil
	}
	var it ticketItem
	if err := attributevalue.UnmarshalMap(item, &it); err != nil {
		return core.TicketState{}, fmt.Errorf("decode ticket: %w", err)
	}
	if it.Tenant != t.Tenant || it.Ticket != t.ID {
		return core.TicketState{Gone: true}, nil // not the caller's ticket
	}
	if !it.granted() {
		return core.TicketState{Draining: it.Draining}, nil
	}
	return core.TicketState{Granted: true, Grant: core.Grant{Ticket: it.ticket(), Bucket: it.Bucket, Until: fromMS(it.GrantUntil)}}, nil
}

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

// getTicket reads the ticket stored at pk, key (nil when there is none).
func (s *Store) getTicket(ctx context.Context, pk, key string, consistent bool) (map[string]types.AttributeValue, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.GetItem(cctx, &dynamodb.GetItemInput{TableName: &s.table, Key: keySK(pk, key),
		ConsistentRead: aws.Bool(consistent)})
	if err != nil {
		return nil, unavailable("poll ticket", err)
	}
	return out.Item, nil
}

// placeDelete is the transaction item giving back ticket t's place (if t
// still holds it).
func (s *Store) placeDelete(t core.Ticket) types.TransactWriteItem {
	cond := "ticket = :ticket"
	return types.TransactWriteItem{Delete: &types.Delete{TableName: &s.table, Key: s.key(waiterPK(s.deployment, t.Tenant, t.Place)),
		ConditionExpression:       &cond,
		ExpressionAttributeValues: map[string]types.AttributeValue{":ticket": &types.AttributeValueMemberS{Value: t.ID}}}}
}

// ticketDelete is the transaction item deleting the ticket stored as (pk,
// key) if it is in state (granted: to bucket, until grantUntil when not 0).
func (s *Store) ticketDelete(pk, key, state string, bucket int, grantUntil int64) (types.TransactWriteItem, error) {
	cond := expression.Name("state").Equal(expression.Value(state))
	if state == ticketGranted {
		cond = cond.And(expression.Name("bucket").Equal(expression.Value(bucket)))
		if grantUntil != 0 {
			cond = cond.And(expression.Name("grant_until").Equal(expression.Value(grantUntil)))
		}
	}
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Delete: &types.Delete{TableName: &s.table, Key: keySK(pk, key),
		ConditionExpression: expr.Condition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld}}, nil
}

// grantUpdate is the transaction item granting bucket b's slot to the
// waiting ticket t, until grantUntil.
func (s *Store) grantUpdate(t ticketItem, b int, grantUntil int64) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().
		WithCondition(expression.Name("state").Equal(expression.Value(ticketWaiting))).
		WithUpdate(expression.Set(expression.Name("state"), expression.Value(ticketGranted)).
			Set(expression.Name("bucket"), expression.Value(b)).
			Set(expression.Name("grant_until"), expression.Value(grantUntil))).Build()
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Update: &types.Update{TableName: &s.table, Key: keySK(t.PK, t.SK),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld}}, nil
}

// trustRelease is the bucket update freeing a slot held in trust.
func (s *Store) trustRelease(b int) (types.TransactWriteItem, error) {
	return s.bucketUpdate(b, nil, expression.Add(expression.Name("used"), expression.Value(-1)).
		Add(expression.Name("granted"), expression.Value(-1)).Add(expression.Name("revision"), expression.Value(1)))
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
		bucket, berr := s.bucketUpdate(g.Bucket, nil, expression.Add(expression.Name("revision"), expression.Value(1)))
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
	take := takeCondition(limit)
	bucket, err := s.bucketUpdate(b, &take, expression.Add(expression.Name("used"), expression.Value(1)).
		Add(expression.Name("granted"), expression.Value(1)).Add(expression.Name("revision"), expression.Value(1)))
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	grant, err := s.grantUpdate(t, b, grantUntil)
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	failed, err := s.writeTxn(ctx, "grant", []types.TransactWriteItem{bucket, grant})
	switch {
	case has(failed, bucketPK(s.deployment, b)): // first: the slot is gone, whatever the ticket
		return bucketRefusal(failed[bucketPK(s.deployment, b)].Item, limit)
	case has(failed, ticketID(t.PK, t.SK)):
		var now ticketItem
		if av := failed[ticketID(t.PK, t.SK)].Item; av != nil && attributevalue.UnmarshalMap(av, &now) == nil && now.granted() {
			return fmt.Errorf("grant ticket %s: %w", t.Ticket, errGrantedElsewhere)
		}
		return fmt.Errorf("grant ticket %s: %w", t.Ticket, core.ErrConflict)
	}
	return err
}

// dropTicket deletes a waiting ticket that lapsed (unless it changed
// since read); its place lapses by itself.
func (s *Store) dropTicket(ctx context.Context, t ticketItem) error {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	cond := "#state = :waiting AND #until = :until"
	_, err := s.db.DeleteItem(cctx, &dynamodb.DeleteItemInput{TableName: &s.table, Key: keySK(t.PK, t.SK),
		ConditionExpression:      &cond,
		ExpressionAttributeNames: map[string]string{"#state": "state", "#until": "until"},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":waiting": &types.AttributeValueMemberS{Value: ticketWaiting},
			":until":   &types.AttributeValueMemberN{Value: strconv.FormatInt(t.Until, 10)}}})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return unavailable("drop lapsed ticket", err)
	}
	return nil
}

// Dispatch reads the head of the queue (its shards' heads, strongly
// consistent, merged) and serves what it read in order: lapsed waiting tickets are deleted, lapsed grants
// passed on to the first live waiting tickets (or their slots freed),
// then each live waiting ticket in turn is granted a slot of a bucket
// with room (d.Bucket first; every bucket read, eventually consistent,
// when d.Scan, or when d.Self is the first live waiting ticket).
//
// A grant that finds its ticket granted by a peer since the read (the
// frees that end at once all try the same head ticket first) goes on to
// the next ticket read, keeping the slot: it reads each strongly first (a
// read unit), after a random pause that spreads the peers that lost with
// it (see stillWaitingAfter), and tries it only if it still waits (a
// grant a peer beat costs a cancelled transaction's write units). When
// every ticket of a read cut at its limit ends granted (by peers, or
// before: a grant stays at the head until its waiter's next poll takes
// it) and the dispatch still has a slot or a lapsed grant to give, or may
// read the buckets for the first waiting ticket, it reads the tickets
// behind the last one it read, keeping what it carried (see walk). So each
// freed slot, and each lapsed grant, goes to the queue while the tickets
// of dispatchAttempts reads hold one still waiting. Any other race lost to
// a peer (a ticket or grant that moved) reads the head again.
//
// The first read of a free's dispatch (d.Bucket set) is eventually
// consistent: every free reads every shard, at half a read unit each; a
// ticket it misses is served by its own dispatch or the head's next turn,
// and every write is conditional on what it read, so a stale read only
// loses a race.
//
// A waiter's turn that read the buckets reads each ticket strongly before
// it grants it room, as a dispatch that lost a race does (pausing only
// once it lost one): the turn's reads take a few calls, during which the
// frees grant the same tickets, and a grant that finds its ticket
// granted costs a cancelled transaction on a bucket and the ticket. A
// turn that finds its own ticket granted by a peer stops there: the
// tickets behind it are the frees' (and their own turns', once heads).
//
// A waiter's turn (d.Self set, no bucket, no scan) first reads only its
// own shard: when a live waiting ticket is ahead of it there, it is not
// the queue's head, and the turn only removes the lapsed tickets it saw
// (Head is then that ticket). So the turns of W waiters read each shard
// about W/queueShards times plus once per shard head, not W times (more
// when grants fill a shard's page: that read cannot tell).
func (s *Store) Dispatch(ctx context.Context, d core.Dispatch) (core.DispatchResult, error) {
	var res core.DispatchResult
	if d.Self != "" && d.Bucket < 0 && !d.Scan {
		ahead, err := s.aheadInShard(ctx, d, &res)
		if err != nil || ahead != "" {
			res.Head = ahead
			return res, err
		}
	}
	w := walk{room: map[int]int{}}
	if d.Bucket >= 0 {
		w.room[d.Bucket] = 1 // a slot was freed there; whether it still is, the take decides
	}
	for attempt := range dispatchAttempts {
		r := headRead{limit: s.scan, eventual: attempt == 0 && d.Bucket >= 0, after: w.after}
		q, err := s.queueHead(ctx, r)
		if err != nil {
			return res, err
		}
		again, err := s.dispatch(ctx, d, headView{tickets: q, partial: r.limit > 0 && len(q) >= r.limit}, &w, &res)
		if err != nil || !again {
			return res, err
		}
	}
	return res, nil
}

// aheadInShard reads the head of d.Self's shard and returns the first
// live waiting ticket there when it is not d.Self ("" when it is, or when
// the read cannot tell: d.Self further than the page, or a lapsed grant
// ahead, which only a read of the whole head can pass on in order). The
// lapsed waiting tickets ahead are removed.
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
		// first too (see Dispatch).
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
	buckets, err := s.readBuckets(ctx, false)
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

// LeaveWait deletes the ticket if it is still waiting and gives back its
// place, in one transaction. A ticket found granted passes its grant on
// to the first live waiting ticket after it (or frees the slot), with the
// place given back, in one transaction (after a read of the queue's head,
// see firstWaiting; the next ticket holds it for grantFor); a ticket
// already gone only gives back the place.
func (s *Store) LeaveWait(ctx context.Context, t core.Ticket, now time.Time, grantFor time.Duration) error {
	pk := s.ticketPK(t)
	for attempt := 0; ; attempt++ {
		del, err := s.ticketDelete(pk, t.Key, ticketWaiting, 0, 0)
		if err != nil {
			return fmt.Errorf("leave wait: %w", err)
		}
		failed, err := s.writeTxn(ctx, "leave wait", []types.TransactWriteItem{del, s.placeDelete(t)})
		r, ticketFailed := failed[ticketID(pk, t.Key)]
		switch {
		case len(failed) == 0:
			return err
		case !ticketFailed: // the place lapsed and was taken again: the ticket alone
			return s.dropOwnTicket(ctx, t)
		case len(r.Item) == 0: // gone: the place alone
			return s.dropPlace(ctx, t)
		}
		var it ticketItem
		if err := attributevalue.UnmarshalMap(r.Item, &it); err != nil {
			return fmt.Errorf("leave wait: decode ticket: %w", err)
		}
		if !it.granted() || attempt >= dispatchAttempts {
			return fmt.Errorf("leave wait: ticket %s: %w", t.ID, core.ErrConflict)
		}
		next, err := s.firstWaiting(ctx, now)
		if err != nil {
			return err
		}
		failed, err = s.passOn(ctx, it, next, now, grantFor, true)
		if has(failed, waiterPK(s.deployment, t.Tenant, t.Place)) {
			failed, err = s.passOn(ctx, it, next, now, grantFor, false)
		}
		if len(failed) == 0 {
			return err
		}
		// The next ticket moved (or the grant lapsed and a dispatch passed
		// it on): look again.
	}
}

// firstWaiting returns the first live waiting ticket of the queue (nil
// when there is none), reading behind the granted tickets when they fill
// a read, at most dispatchAttempts reads.
func (s *Store) firstWaiting(ctx context.Context, now time.Time) (*ticketItem, error) {
	r := headRead{limit: s.scan}
	for range dispatchAttempts {
		q, err := s.queueHead(ctx, r)
		if err != nil {
			return nil, err
		}
		for i := range q {
			if !q[i].granted() && q[i].live(now) {
				return &q[i], nil
			}
		}
		if len(q) < r.limit {
			return nil, nil
		}
		r.after = q[len(q)-1].SK
	}
	return nil, nil
}

// dropOwnTicket deletes t's ticket if it is still waiting.
func (s *Store) dropOwnTicket(ctx context.Context, t core.Ticket) error {
	del, err := s.ticketDelete(s.ticketPK(t), t.Key, ticketWaiting, 0, 0)
	if err != nil {
		return fmt.Errorf("leave wait: %w", err)
	}
	if failed, err := s.writeTxn(ctx, "leave wait", []types.TransactWriteItem{del}); len(failed) == 0 && err != nil {
		return err
	}
	return nil // left, or no longer waiting
}

// dropPlace gives back t's place if t still holds it.
func (s *Store) dropPlace(ctx context.Context, t core.Ticket) error {
	if failed, err := s.writeTxn(ctx, "leave wait place", []types.TransactWriteItem{s.placeDelete(t)}); len(failed) == 0 && err != nil {
		return err
	}
	return nil // given back, or lapsed and taken again
}

// slotTake returns the transaction items that take a running slot in
// bucket b for a record or reservation counted in state (tenant, when not
// empty, joins the bucket's tenant set): a free one within b's limit for
// limit, or with g the one b holds in trust for g's ticket, whose ticket
// and place leave the queue in the same transaction (the bucket's used
// count is unchanged: the slot only changes holder).
func (s *Store) slotTake(b int, limit int, state core.State, tenant string, g *core.Grant) ([]types.TransactWriteItem, error) {
	if g == nil {
		it, err := s.takeUpdate(b, limit, state, tenant)
		return []types.TransactWriteItem{it}, err
	}
	cond := notDraining()
	u := expression.Add(expression.Name("granted"), expression.Value(-1)).Add(expression.Name("revision"), expression.Value(1))
	if tenant != "" {
		u = u.Add(expression.Name("tenants"), expression.Value(tenantSet(tenant)))
	}
	bucket, err := s.bucketUpdate(g.Bucket, &cond, countMove(u, "", state))
	if err != nil {
		return nil, err
	}
	del, err := s.ticketDelete(s.ticketPK(g.Ticket), g.Ticket.Key, ticketGranted, g.Bucket, 0)
	if err != nil {
		return nil, err
	}
	return []types.TransactWriteItem{bucket, del, s.placeDelete(g.Ticket)}, nil
}

// grantFailed reports whether a take with grant g failed because g's
// ticket no longer holds it (or its place was taken again).
func (s *Store) grantFailed(failed map[string]types.CancellationReason, g *core.Grant) bool {
	return g != nil && (has(failed, ticketID(s.ticketPK(g.Ticket), g.Ticket.Key)) || has(failed, waiterPK(s.deployment, g.Ticket.Tenant, g.Ticket.Place)))
}

// takeSlotOrGrant is takeSlot, or with a grant one take in the grant's
// bucket: the slot is the one held there in trust (slotTake).
func (s *Store) takeSlotOrGrant(ctx context.Context, p slotPlan, g *core.Grant, take func(int) error) (int, error) {
	if g != nil {
		return g.Bucket, take(g.Bucket)
	}
	return s.takeSlot(ctx, p, take)
}

// eachTicket calls fn with every ticket of the queue, in service order (strongly consistent), until fn
// returns an error.
func (s *Store) eachTicket(ctx context.Context, fn func(ticketItem) error) error {
	var ferr error
	err := s.eachTicketIn(ctx, headRead{}, func(t ticketItem, err error) bool {
		if err == nil {
			err = fn(t)
		}
		ferr = err
		return err == nil
	})
	if err != nil {
		return err
	}
	return ferr
}

// markDraining marks every waiting ticket draining (SetDraining): their
// waiters stop waiting with the draining refusal.
func (s *Store) markDraining(ctx context.Context) error {
	return s.eachTicket(ctx, func(t ticketItem) error {
		if t.granted() {
			return nil // its take finds the bucket draining
		}
		cctx, cancel := s.ctx(ctx)
		defer cancel()
		cond, upd := "#state = :waiting", "SET draining = :true"
		_, err := s.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{TableName: &s.table, Key: keySK(t.PK, t.SK),
			ConditionExpression: &cond, UpdateExpression: &upd, ExpressionAttributeNames: map[string]string{"#state": "state"},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":waiting": &types.AttributeValueMemberS{Value: ticketWaiting}, ":true": &types.AttributeValueMemberBOOL{Value: true}}})
		var ccf *types.ConditionalCheckFailedException
		if err != nil && !errors.As(err, &ccf) {
			return unavailable("mark ticket draining", err)
		}
		return nil
	})
}

// queueGrants counts the granted tickets of the whole queue by bucket
// (live or lapsed: a lapsed grant holds its slot until passed on or
// freed), for the counter repair.
func (s *Store) queueGrants(ctx context.Context) (map[int]int, error) {
	out := map[int]int{}
	err := s.eachTicket(ctx, func(t ticketItem) error {
		if t.granted() && t.Bucket >= 0 && t.Bucket < CapacityBuckets {
			out[t.Bucket]++
		}
		return nil
	})
	return out, err
}
