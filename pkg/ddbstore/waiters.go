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

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// The wait queue (fair waiting under the wait policy). Two kinds of items:
//
//	WTR#<deployment>#<tenant>#<n>  (sk "R") waiter place n of a tenant
//	    (SANDBOX_MAX_WAITERS_PER_TENANT): "ticket", "until" (Unix ms: the
//	    place lapses then, whoever holds it), "round" and "qkey" (the
//	    ticket's round and sort key in the queue)
//	WQ#<deployment>  (sk = the fair key) one ticket: "tenant", "ticket",
//	    "place", "until" (Unix ms: a waiting ticket lapses then),
//	    "state" waiting|granted and, once granted, "bucket" and
//	    "grant_until" (Unix ms: the grant lapses then)
//
// The fair key is "<round, 10 digits>#<arrival, Unix ms, 15 digits>#<ticket>",
// so one strongly consistent Query of the queue's partition reads it in
// service order. A granted ticket's slot is held in trust in its bucket
// ("used" and "granted" count it), so no other acquire takes it; the
// waiter's reservation (or resume claim) takes it over, deleting the
// ticket and its place, in one transaction. Queue items carry no TTL:
// deleting a granted ticket must free or pass on its slot, so only a
// dispatch or the waiter itself deletes them.

// waiterPK is one of a tenant's waiter places.
func waiterPK(deployment, tenant string, place int) string {
	return "WTR#" + deployment + "#" + tenant + "#" + strconv.Itoa(place)
}

// queuePK is the partition of the deployment's wait queue.
func queuePK(deployment string) string { return "WQ#" + deployment }

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

// queueScan is how many tickets one dispatch reads from the queue's head,
// dispatchAttempts how often it reads again after losing a race (a
// ticket that moved, a grant passed on by a peer).
const (
	queueScan        = 25
	dispatchAttempts = 3
)

// freeScan is how many tickets a free's dispatch reads first: few enough
// that the read stays within 4 KB (half a read unit, eventually
// consistent), enough to pass a few lapsed tickets.
const freeScan = 8

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

// ticketID names a ticket in a transaction's failed items (see itemPK).
func (s *Store) ticketID(key string) string { return queuePK(s.deployment) + "\x00" + key }

func (s *Store) ticketKey(key string) map[string]types.AttributeValue {
	return keySK(queuePK(s.deployment), key)
}

// queueHead reads up to limit tickets from the head of the queue, in
// service order (strongly consistent unless eventual).
func (s *Store) queueHead(ctx context.Context, limit int32, eventual bool) ([]ticketItem, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	cond := "pk = :pk"
	out, err := s.db.Query(ctx, &dynamodb.QueryInput{TableName: &s.table, KeyConditionExpression: &cond,
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: queuePK(s.deployment)}},
		ConsistentRead:            aws.Bool(!eventual), Limit: aws.Int32(limit)})
	if err != nil {
		return nil, unavailable("query wait queue", err)
	}
	q := make([]ticketItem, 0, len(out.Items))
	for _, av := range out.Items {
		var t ticketItem
		if err := attributevalue.UnmarshalMap(av, &t); err != nil {
			return nil, fmt.Errorf("decode ticket: %w", err)
		}
		q = append(q, t)
	}
	return q, nil
}

// EnterWait reads the tenant's w.Max places (one BatchGetItem) and the
// queue's head (one Query), then takes a free or lapsed place and queues
// the ticket in one transaction, trying the next free place when a
// concurrent waiter took it first. The ticket's round is the round of the
// first live ticket at the head, or one more than the latest round the
// tenant's live places hold, whichever is later.
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
	head, err := s.queueHead(ctx, queueScan, false)
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
	return core.Ticket{}, &core.CapacityError{Reason: core.RefusalTooManyWaiters, RetryAfter: 5 * time.Second}
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
	ticket, err := attributevalue.MarshalMap(ticketItem{PK: queuePK(s.deployment), SK: t.Key, Tenant: t.Tenant, Ticket: t.ID,
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

// PollTicket reads the ticket (one strongly consistent GetItem).
func (s *Store) PollTicket(ctx context.Context, t core.Ticket) (core.TicketState, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.GetItem(cctx, &dynamodb.GetItemInput{TableName: &s.table, Key: s.ticketKey(t.Key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return core.TicketState{}, unavailable("poll ticket", err)
	}
	if len(out.Item) == 0 {
		return core.TicketState{Gone: true}, nil
	}
	var it ticketItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return core.TicketState{}, fmt.Errorf("decode ticket: %w", err)
	}
	if !it.granted() {
		return core.TicketState{Draining: it.Draining}, nil
	}
	return core.TicketState{Granted: true, Grant: core.Grant{Ticket: it.ticket(), Bucket: it.Bucket, Until: fromMS(it.GrantUntil)}}, nil
}

// placeDelete is the transaction item giving back ticket t's place (if t
// still holds it).
func (s *Store) placeDelete(t core.Ticket) types.TransactWriteItem {
	cond := "ticket = :ticket"
	return types.TransactWriteItem{Delete: &types.Delete{TableName: &s.table, Key: s.key(waiterPK(s.deployment, t.Tenant, t.Place)),
		ConditionExpression:       &cond,
		ExpressionAttributeValues: map[string]types.AttributeValue{":ticket": &types.AttributeValueMemberS{Value: t.ID}}}}
}

// ticketDelete is the transaction item deleting the ticket stored under
// key if it is in state (granted: to bucket, until grantUntil when not 0).
func (s *Store) ticketDelete(key, state string, bucket int, grantUntil int64) (types.TransactWriteItem, error) {
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
	return types.TransactWriteItem{Delete: &types.Delete{TableName: &s.table, Key: s.ticketKey(key),
		ConditionExpression: expr.Condition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld}}, nil
}

// grantUpdate is the transaction item granting bucket b's slot to the
// waiting ticket stored under key, until grantUntil.
func (s *Store) grantUpdate(key string, b int, grantUntil int64) (types.TransactWriteItem, error) {
	expr, err := expression.NewBuilder().
		WithCondition(expression.Name("state").Equal(expression.Value(ticketWaiting))).
		WithUpdate(expression.Set(expression.Name("state"), expression.Value(ticketGranted)).
			Set(expression.Name("bucket"), expression.Value(b)).
			Set(expression.Name("grant_until"), expression.Value(grantUntil))).Build()
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Update: &types.Update{TableName: &s.table, Key: s.ticketKey(key),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()}}, nil
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
	del, err := s.ticketDelete(g.SK, ticketGranted, g.Bucket, g.GrantUntil)
	if err != nil {
		return nil, fmt.Errorf("pass grant on: %w", err)
	}
	items := []types.TransactWriteItem{del}
	if place {
		items = append(items, s.placeDelete(g.ticket()))
	}
	var it types.TransactWriteItem
	if next != nil {
		it, err = s.grantUpdate(next.SK, g.Bucket, ms(now.Add(grantFor)))
	} else {
		it, err = s.trustRelease(g.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("pass grant on: %w", err)
	}
	return s.writeTxn(ctx, "pass grant on", append(items, it))
}

// grantIn takes a slot of bucket b into trust for the waiting ticket t,
// within b's limit for limit, in one transaction: errBucketFull (or
// errLimitsUnset, or a draining refusal) when b refuses, ErrConflict when
// t is no longer waiting.
func (s *Store) grantIn(ctx context.Context, t ticketItem, b, limit int, grantUntil int64) error {
	take := takeCondition(limit)
	bucket, err := s.bucketUpdate(b, &take, expression.Add(expression.Name("used"), expression.Value(1)).
		Add(expression.Name("granted"), expression.Value(1)).Add(expression.Name("revision"), expression.Value(1)))
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	grant, err := s.grantUpdate(t.SK, b, grantUntil)
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	failed, err := s.writeTxn(ctx, "grant", []types.TransactWriteItem{bucket, grant})
	switch {
	case has(failed, s.ticketID(t.SK)):
		return fmt.Errorf("grant ticket %s: %w", t.Ticket, core.ErrConflict)
	case has(failed, bucketPK(s.deployment, b)):
		return bucketRefusal(failed[bucketPK(s.deployment, b)].Item, limit)
	}
	return err
}

// dropTicket deletes a waiting ticket that lapsed (unless it changed
// since read); its place lapses by itself.
func (s *Store) dropTicket(ctx context.Context, t ticketItem) error {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	cond := "#state = :waiting AND #until = :until"
	_, err := s.db.DeleteItem(cctx, &dynamodb.DeleteItemInput{TableName: &s.table, Key: s.ticketKey(t.SK),
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

// Dispatch reads the queue's head (one strongly consistent Query) and
// serves it in order: lapsed waiting tickets are deleted, lapsed grants
// passed on to the first live waiting tickets (or their slots freed),
// then each live waiting ticket in turn is granted a slot of a bucket
// with room (d.Bucket first; every bucket read, eventually consistent,
// when d.Scan, or when d.Self is the first live waiting ticket). A race
// lost to a peer (a ticket or grant that moved) reads the head again, up
// to dispatchAttempts times. The first read of a free's dispatch (d.Bucket
// set) is eventually consistent and short (freeScan): every free reads
// the queue's one partition, at half a read unit; a ticket it misses is served by its
// own dispatch or the head's next turn, and every write is conditional on
// what it read, so a stale read only loses a race.
func (s *Store) Dispatch(ctx context.Context, d core.Dispatch) (core.DispatchResult, error) {
	var res core.DispatchResult
	for attempt := range dispatchAttempts {
		limit, eventual := int32(queueScan), attempt == 0 && d.Bucket >= 0
		if eventual {
			limit = freeScan
		}
		q, err := s.queueHead(ctx, limit, eventual)
		if err != nil {
			return res, err
		}
		again, err := s.dispatch(ctx, d, q, &res)
		if err != nil || !again {
			return res, err
		}
	}
	return res, nil
}

// dispatch is one Dispatch pass over q; again: a race was lost, read again.
func (s *Store) dispatch(ctx context.Context, d core.Dispatch, q []ticketItem, res *core.DispatchResult) (again bool, _ error) {
	var waiting, lapsed []ticketItem
	for _, t := range q {
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
	for _, g := range lapsed {
		var next *ticketItem
		if len(waiting) > 0 {
			next = &waiting[0]
		}
		failed, err := s.passOn(ctx, g, next, d.Now, d.GrantFor, false)
		if len(failed) > 0 {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		res.Cleaned++
		if next != nil {
			res.Granted = append(res.Granted, next.ticket())
			waiting = waiting[1:]
		}
	}
	if len(waiting) == 0 {
		return false, nil
	}
	res.Head = waiting[0].Ticket
	room := map[int]int{}
	if d.Bucket >= 0 {
		room[d.Bucket] = 1 // a slot was freed there; whether it still is, the take decides
	}
	read := false
	for len(waiting) > 0 {
		b, ok := roomIn(room)
		if !ok {
			if read || !(d.Scan || (d.Self != "" && waiting[0].Ticket == d.Self)) {
				break
			}
			read = true
			buckets, _, err := s.readBuckets(ctx, "", false)
			if err != nil {
				return false, err
			}
			res.Read = true
			res.Status, res.Tenants = bucketStatus(buckets)
			res.Status.Limit = d.Limit
			if res.Status.Draining {
				break
			}
			for _, bk := range buckets {
				if r := bk.room(d.Limit); r > 0 {
					room[bk.Index] = r
				}
			}
			continue
		}
		err := s.grantIn(ctx, waiting[0], b, d.Limit, ms(d.Now.Add(d.GrantFor)))
		var ce *core.CapacityError
		switch {
		case err == nil:
			room[b]--
			res.Granted = append(res.Granted, waiting[0].ticket())
			waiting = waiting[1:]
		case errors.Is(err, errBucketFull), errors.Is(err, errLimitsUnset):
			delete(room, b)
		case errors.As(err, &ce): // draining: nothing is granted
			room = nil
			read = true
		case errors.Is(err, core.ErrConflict):
			return true, nil
		default:
			return false, err
		}
	}
	if len(waiting) > 0 {
		res.Head = waiting[0].Ticket
	} else {
		res.Head = ""
	}
	return false, nil
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
// place given back, in one transaction (after one Query of the queue's
// head; the next ticket holds it for grantFor); a ticket already gone
// only gives back the place.
func (s *Store) LeaveWait(ctx context.Context, t core.Ticket, now time.Time, grantFor time.Duration) error {
	for attempt := 0; ; attempt++ {
		del, err := s.ticketDelete(t.Key, ticketWaiting, 0, 0)
		if err != nil {
			return fmt.Errorf("leave wait: %w", err)
		}
		failed, err := s.writeTxn(ctx, "leave wait", []types.TransactWriteItem{del, s.placeDelete(t)})
		r, ticketFailed := failed[s.ticketID(t.Key)]
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
		q, err := s.queueHead(ctx, queueScan, false)
		if err != nil {
			return err
		}
		var next *ticketItem
		for i := range q {
			if q[i].SK != it.SK && !q[i].granted() && q[i].live(now) {
				next = &q[i]
				break
			}
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

// dropOwnTicket deletes t's ticket if it is still waiting.
func (s *Store) dropOwnTicket(ctx context.Context, t core.Ticket) error {
	del, err := s.ticketDelete(t.Key, ticketWaiting, 0, 0)
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
func (s *Store) slotTake(b, limit int, state core.State, tenant string, g *core.Grant) ([]types.TransactWriteItem, error) {
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
	del, err := s.ticketDelete(g.Ticket.Key, ticketGranted, g.Bucket, 0)
	if err != nil {
		return nil, err
	}
	return []types.TransactWriteItem{bucket, del, s.placeDelete(g.Ticket)}, nil
}

// grantFailed reports whether a take with grant g failed because g's
// ticket no longer holds it (or its place was taken again).
func (s *Store) grantFailed(failed map[string]types.CancellationReason, g *core.Grant) bool {
	return g != nil && (has(failed, s.ticketID(g.Ticket.Key)) || has(failed, waiterPK(s.deployment, g.Ticket.Tenant, g.Ticket.Place)))
}

// takeSlotOrGrant is takeSlot, or with a grant one take in the grant's
// bucket: the slot is the one held there in trust (slotTake).
func (s *Store) takeSlotOrGrant(ctx context.Context, limit, home int, g *core.Grant, take func(b int) error) (int, error) {
	if g != nil {
		return g.Bucket, take(g.Bucket)
	}
	return s.takeSlot(ctx, limit, home, take)
}

// eachTicket calls fn with every ticket of the queue, in service order
// (strongly consistent), until fn returns an error.
func (s *Store) eachTicket(ctx context.Context, fn func(ticketItem) error) error {
	cond := "pk = :pk"
	p := dynamodb.NewQueryPaginator(s.db, &dynamodb.QueryInput{TableName: &s.table, KeyConditionExpression: &cond,
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: queuePK(s.deployment)}},
		ConsistentRead:            aws.Bool(true)})
	for p.HasMorePages() {
		cctx, cancel := s.ctx(ctx)
		page, err := p.NextPage(cctx)
		cancel()
		if err != nil {
			return unavailable("query wait queue", err)
		}
		for _, av := range page.Items {
			var t ticketItem
			if err := attributevalue.UnmarshalMap(av, &t); err != nil {
				return fmt.Errorf("decode ticket: %w", err)
			}
			if err := fn(t); err != nil {
				return err
			}
		}
	}
	return nil
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
		_, err := s.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{TableName: &s.table, Key: s.ticketKey(t.SK),
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
