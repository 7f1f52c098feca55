package ddbstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// Renew moves an active record's end later (see core.Store.Renew): one
// conditional update returning the item as it was; when only the
// lifetime bound refused it, a second one with the end cut to it.
func (s *Store) Renew(ctx context.Context, r core.Renewal) (core.Renewed, error) {
	until, lifetime := r.Until, r.MaxLifetime
	for range 2 {
		done, old, err := s.renewTo(ctx, r, until, lifetime)
		if err != nil || old == nil {
			return done, err
		}
		switch {
		case old.Tenant != r.Tenant:
			return core.Renewed{}, core.ErrNotFound
		case old.State != core.StateActive:
			return core.Renewed{Record: *old, Prev: old.ExpiresAt}, fmt.Errorf("sandbox %s is %s: %w", r.SandboxID, old.State, core.ErrConflict)
		}
		if lifetime > 0 && !old.CreatedAt.IsZero() && old.CreatedAt.Add(lifetime).Before(until) {
			until = old.CreatedAt.Add(lifetime)
		}
		if ms(until) <= ms(old.ExpiresAt) || lifetime == 0 {
			return core.Renewed{Record: *old, Prev: old.ExpiresAt}, nil
		}
		lifetime = 0
	}
	return core.Renewed{}, errors.New("renew: unreachable")
}

// renewTo is one conditional update of Renew: the record's end becomes
// until if it is the tenant's, active, ends earlier and (lifetime > 0)
// was created at most lifetime before until. It returns the renewal made,
// or the record as found when the condition failed (old).
func (s *Store) renewTo(ctx context.Context, r core.Renewal, until time.Time, lifetime time.Duration) (core.Renewed, *core.Record, error) {
	cond := expression.AttributeExists(expression.Name(AttrPK)).
		And(expression.Name("tenant").Equal(expression.Value(r.Tenant))).
		And(expression.Name("state").Equal(expression.Value(string(core.StateActive)))).
		And(expression.Or(expression.AttributeNotExists(expression.Name("expires_at")),
			expression.Name("expires_at").LessThan(expression.Value(ms(until)))))
	if lifetime > 0 {
		cond = cond.And(expression.Name("created_at").GreaterThanEqual(expression.Value(ms(until.Add(-lifetime)))))
	}
	upd := expression.Set(expression.Name("expires_at"), expression.Value(ms(until))).
		Set(expression.Name("updated_at"), expression.Value(ms(r.Now))).
		Add(expression.Name("fence"), expression.Value(1))
	av, err := s.updateItem(ctx, "renew", s.key(sandboxPK(r.SandboxID)), cond, upd, types.ReturnValueAllOld, true)
	if item, failed := conditionFailed(err); failed {
		old, err := s.oldRecord(ctx, item)
		if err != nil {
			return core.Renewed{}, nil, err
		}
		return core.Renewed{}, &old, nil
	}
	if err != nil {
		return core.Renewed{}, nil, err
	}
	rec, err := s.decodeRecord(ctx, av)
	if err != nil {
		return core.Renewed{}, nil, err
	}
	prev := rec.ExpiresAt
	rec.ExpiresAt, rec.UpdatedAt = time.UnixMilli(ms(until)).UTC(), time.UnixMilli(ms(r.Now)).UTC()
	rec.Fence++
	return core.Renewed{Record: rec, Prev: prev}, nil, nil
}

// MarkExpiring notes the sandbox.expiring event of an active record's end
// (see core.Store.MarkExpiring): one conditional update.
func (s *Store) MarkExpiring(ctx context.Context, sandboxID string, end time.Time) error {
	cond := expression.AttributeExists(expression.Name(AttrPK)).
		And(expression.Name("state").Equal(expression.Value(string(core.StateActive)))).
		And(expression.Name("expires_at").Equal(expression.Value(ms(end)))).
		And(expression.Or(expression.AttributeNotExists(expression.Name("expiring_sent")),
			expression.Name("expiring_sent").NotEqual(expression.Value(ms(end)))))
	_, err := s.updateItem(ctx, "mark expiring", s.key(sandboxPK(sandboxID)), cond,
		expression.Set(expression.Name("expiring_sent"), expression.Value(ms(end))), "", true)
	switch old, failed := conditionFailed(err); {
	case failed && len(old) == 0:
		return core.ErrNotFound
	case failed:
		return fmt.Errorf("mark sandbox %s expiring: %w", sandboxID, core.ErrConflict)
	}
	return err
}

// webhookPK is the item remembering a provider webhook event id.
func webhookPK(deployment, id string) string { return "WHK#" + deployment + "#" + id }

// SeenWebhook records a webhook event id (see core.WebhookStore): one
// conditional update creating an item that DynamoDB's TTL deletes after
// until.
func (s *Store) SeenWebhook(ctx context.Context, id string, now, until time.Time) error {
	cond := expression.AttributeNotExists(expression.Name(AttrPK)).
		Or(expression.Name("until").LessThanEqual(expression.Value(ms(now))))
	upd := expression.Set(expression.Name("until"), expression.Value(ms(until))).
		Set(expression.Name(AttrTTL), expression.Value(until.Add(time.Hour).Unix()))
	_, err := s.updateItem(ctx, "seen webhook", s.key(webhookPK(s.deployment, id)), cond, upd, "", false)
	if _, failed := conditionFailed(err); failed {
		return fmt.Errorf("webhook %s seen before: %w", id, core.ErrConflict)
	}
	return err
}
