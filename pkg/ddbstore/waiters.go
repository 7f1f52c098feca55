package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// waiterPK is one of a tenant's waiter places (SANDBOX_MAX_WAITERS_PER_TENANT):
// "ticket" names the waiting acquire, "until" (Unix ms) when the place
// lapses whether or not the acquire gave it back.
func waiterPK(deployment, tenant string, place int) string {
	return "WTR#" + deployment + "#" + tenant + "#" + strconv.Itoa(place)
}

// waiterTTL keeps a lapsed place's item a while for inspection (garbage
// collection only: a lapsed place is free whatever its item says).
const waiterTTL = time.Hour

// EnterWait reads the tenant's w.Max places (one BatchGetItem), then takes
// a free or lapsed one with a conditional write, trying the next free one
// when a concurrent waiter took it first.
func (s *Store) EnterWait(ctx context.Context, w core.Waiter) (int, error) {
	if w.Max <= 0 {
		return 0, errors.New("enter wait: no places")
	}
	keys := make([]map[string]types.AttributeValue, w.Max)
	for i := range keys {
		keys[i] = s.key(waiterPK(s.deployment, w.Tenant, i))
	}
	items, err := s.batchGetAll(ctx, keys)
	if err != nil {
		return 0, err
	}
	held := map[string]bool{}
	for _, av := range items {
		pk, _ := av[AttrPK].(*types.AttributeValueMemberS)
		until, _ := av["until"].(*types.AttributeValueMemberN)
		if pk == nil || until == nil {
			continue
		}
		if ms, err := strconv.ParseInt(until.Value, 10, 64); err == nil && ms > w.Now.UnixMilli() {
			held[pk.Value] = true
		}
	}
	// Start at a random place so that concurrent waiters rarely race for
	// the same one.
	start := rand.IntN(w.Max)
	for n := range w.Max {
		place := (start + n) % w.Max
		if held[waiterPK(s.deployment, w.Tenant, place)] {
			continue
		}
		err := s.takePlace(ctx, w, place)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			return place, nil
		case errors.As(err, &ccf): // a concurrent waiter took it
		default:
			return 0, unavailable("enter wait", err)
		}
	}
	return 0, &core.CapacityError{Reason: core.RefusalTooManyWaiters, RetryAfter: 5 * time.Second}
}

func (s *Store) takePlace(ctx context.Context, w core.Waiter, place int) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	cond := "attribute_not_exists(pk) OR #until <= :now"
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: &s.table, Key: s.key(waiterPK(s.deployment, w.Tenant, place)),
		ConditionExpression: &cond, UpdateExpression: aws.String("SET ticket = :ticket, #until = :until, #ttl = :ttl"),
		ExpressionAttributeNames: map[string]string{"#until": "until", "#ttl": AttrTTL},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":ticket": &types.AttributeValueMemberS{Value: w.Ticket},
			":until":  &types.AttributeValueMemberN{Value: strconv.FormatInt(ms(w.Until), 10)},
			":now":    &types.AttributeValueMemberN{Value: strconv.FormatInt(ms(w.Now), 10)},
			":ttl":    &types.AttributeValueMemberN{Value: strconv.FormatInt(w.Until.Add(waiterTTL).Unix(), 10)},
		}})
	return err
}

// LeaveWait deletes the place's item if w.Ticket still holds it.
func (s *Store) LeaveWait(ctx context.Context, w core.Waiter, place int) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	cond := "ticket = :ticket"
	_, err := s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: &s.table, Key: s.key(waiterPK(s.deployment, w.Tenant, place)),
		ConditionExpression:       &cond,
		ExpressionAttributeValues: map[string]types.AttributeValue{":ticket": &types.AttributeValueMemberS{Value: w.Ticket}}})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil // lapsed and taken by another waiter: nothing of ours to give back
	}
	if err != nil {
		return unavailable(fmt.Sprintf("leave wait place %d", place), err)
	}
	return nil
}
