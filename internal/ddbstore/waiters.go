package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
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

// queuePK is the partition of the wait queue's shard n.
func queuePK(deployment string, n int) string {
	return "WQ#" + deployment + "#" + strconv.Itoa(n)
}

// queueShardOf is ticket id's shard: FNV-1a of the id, modulo
// queueShards.
func queueShardOf(id string) int { return shardOf(id, queueShards) }

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
	return s.eachMerged(ctx, "query wait queue", kqs, AttrSK, func(av map[string]types.AttributeValue) bool {
		var t ticketItem
		if err := attributevalue.UnmarshalMap(av, &t); err != nil {
			return fn(t, fmt.Errorf("decode ticket: %w", err))
		}
		return fn(t, nil)
	})
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
	items, err := s.batchGetAll(ctx, keys, true)
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
	free := expression.Or(expression.AttributeNotExists(expression.Name(AttrPK)),
		expression.Name("until").LessThanEqual(expression.Value(ms(w.Now))))
	place, err := s.txnUpdate(s.key(waiterPK(s.deployment, w.Tenant, t.Place)), &free,
		expression.Set(expression.Name("ticket"), expression.Value(t.ID)).
			Set(expression.Name("until"), expression.Value(ms(w.Until))).
			Set(expression.Name("round"), expression.Value(t.Round)).
			Set(expression.Name("qkey"), expression.Value(t.Key)).
			Set(expression.Name(AttrTTL), expression.Value(w.Until.Add(waiterTTL).Unix())), false)
	if err != nil {
		return nil, fmt.Errorf("enter wait: %w", err)
	}
	ticket, err := attributevalue.MarshalMap(ticketItem{PK: s.ticketPK(t), SK: t.Key, Tenant: t.Tenant, Ticket: t.ID,
		Place: t.Place, Arrived: ms(w.Now), Until: ms(w.Until), State: ticketWaiting})
	if err != nil {
		return nil, fmt.Errorf("enter wait: %w", err)
	}
	return s.writeTxn(ctx, "enter wait", []types.TransactWriteItem{place, s.putNew(ticket)})
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
	return core.TicketState{Granted: true, Grant: core.Grant{Ticket: it.ticket(), Slot: core.SlotRef(it.Bucket), Until: fromMS(it.GrantUntil)}}, nil
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
	return s.txnDelete(keySK(pk, key), cond)
}

// grantUpdate is the transaction item granting bucket b's slot to the
// waiting ticket t, until grantUntil.
func (s *Store) grantUpdate(t ticketItem, b int, grantUntil int64) (types.TransactWriteItem, error) {
	waiting := expression.Name("state").Equal(expression.Value(ticketWaiting))
	return s.txnUpdate(keySK(t.PK, t.SK), &waiting, expression.Set(expression.Name("state"), expression.Value(ticketGranted)).
		Set(expression.Name("bucket"), expression.Value(b)).
		Set(expression.Name("grant_until"), expression.Value(grantUntil)), true)
}

// trustRelease is the bucket update freeing a slot held in trust.
func (s *Store) trustRelease(b int) (types.TransactWriteItem, error) {
	return s.bucketUpdate(runningSlots, b, nil, expression.Add(expression.Name("used"), expression.Value(-1)).
		Add(expression.Name("granted"), expression.Value(-1)).Add(expression.Name("revision"), expression.Value(1)))
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

// wholeQueueRead bounds the tickets wholeQueue reads, two a shard (or the
// store's scan, when smaller): a long queue is told after one small read.
const wholeQueueRead = 2 * queueShards

// wholeQueue reads every shard of the queue in one statement (a SELECT
// on their partition keys, at most wholeQueueRead tickets) and returns
// the tickets in service order. whole is false when the read was cut
// short (a NextToken, or a LastEvaluatedKey when the limit stopped it):
// tickets it did not return may be ahead of those it did. DynamoDB
// answers a read that reached its limit with a token even when nothing
// is left, so the limit is one more than the tickets a whole read holds.
func (s *Store) wholeQueue(ctx context.Context, consistent bool) (q []ticketItem, whole bool, err error) {
	pks := s.queuePKs()
	params := make([]types.AttributeValue, len(pks))
	for i, pk := range pks {
		params[i] = &types.AttributeValueMemberS{Value: pk}
	}
	stmt := fmt.Sprintf(`SELECT * FROM "%s" WHERE %s IN [%s]`, s.table, AttrPK, strings.TrimSuffix(strings.Repeat("?,", len(pks)), ","))
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	out, err := s.db.ExecuteStatement(ctx, &dynamodb.ExecuteStatementInput{Statement: &stmt, Parameters: params,
		ConsistentRead: aws.Bool(consistent), Limit: aws.Int32(int32(min(wholeQueueRead, s.scan) + 1))})
	if err != nil {
		return nil, false, unavailable("read wait queue", err)
	}
	for _, av := range out.Items {
		var t ticketItem
		if err := attributevalue.UnmarshalMap(av, &t); err != nil {
			return nil, false, fmt.Errorf("decode ticket: %w", err)
		}
		q = append(q, t)
	}
	slices.SortFunc(q, func(a, b ticketItem) int { return strings.Compare(a.SK, b.SK) })
	return q, out.NextToken == nil && len(out.LastEvaluatedKey) == 0, nil
}

// AnyWaiting reads the whole queue in one statement (wholeQueue, strongly
// consistent) and reports whether it holds a live waiting ticket; a read
// cut short answers true.
func (s *Store) AnyWaiting(ctx context.Context, now time.Time) (bool, error) {
	q, whole, err := s.wholeQueue(ctx, true)
	if err != nil {
		return true, err
	}
	for _, t := range q {
		if !t.granted() && t.live(now) {
			return true, nil
		}
	}
	return !whole, nil
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
// bucket b for a record or reservation (tenant, when not
// empty, joins the bucket's tenant set): a free one within b's limit for
// limit, or with g the one b holds in trust for g's ticket, whose ticket
// and place leave the queue in the same transaction (the bucket's used
// count is unchanged: the slot only changes holder).
func (s *Store) slotTake(b int, limit int, tenant string, g *core.Grant) ([]types.TransactWriteItem, error) {
	if g == nil {
		it, err := s.takeUpdate(b, limit, tenant)
		return []types.TransactWriteItem{it}, err
	}
	cond := notDraining()
	u := expression.Add(expression.Name("granted"), expression.Value(-1)).Add(expression.Name("revision"), expression.Value(1))
	if tenant != "" {
		u = u.Add(expression.Name("tenants"), expression.Value(tenantSet(tenant)))
	}
	bucket, err := s.bucketUpdate(runningSlots, int(g.Slot), &cond, u)
	if err != nil {
		return nil, err
	}
	del, err := s.ticketDelete(s.ticketPK(g.Ticket), g.Ticket.Key, ticketGranted, int(g.Slot), 0)
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
func (s *Store) takeSlotOrGrant(ctx context.Context, limit, home int, g *core.Grant, take func(int) error) (int, error) {
	if g != nil {
		return int(g.Slot), take(int(g.Slot))
	}
	return s.takeSlot(ctx, limit, home, take)
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
		_, err := s.updateItem(ctx, "mark ticket draining", keySK(t.PK, t.SK), expression.Name("state").Equal(expression.Value(ticketWaiting)),
			expression.Set(expression.Name("draining"), expression.Value(true)), "", false)
		if _, failed := conditionFailed(err); failed {
			return nil // granted or gone since the read
		}
		return err
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
