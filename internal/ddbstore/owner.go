package ddbstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// OwnerShards is how many partition keys of the owner index (gsi2) one
// tenant's warm records are spread over, by a hash of their user: one
// user's are all under one key, in park order (one query finds its least
// recently parked), and one tenant's parks and take-backs write sixteen
// index partitions, not one. Fixed: a user's entries are looked for
// only under the one key its hash names, so another count would miss the
// entries filed under the old one.
const OwnerShards = 16

// Reads of the owner index: ownerPage entries per page of a tenant's
// fan-out, at most ownerPages pages per shard. A tenant holds at most its
// quota of slots (its warm records among them), so the bound only cuts a
// tenant that holds thousands of warm sandboxes; the least recently
// parked is then the oldest of those read.
const (
	ownerPage  = 100
	ownerPages = 4
)

// ownerPK is the owner index key of tenant's warm records in shard n.
func ownerPK(deployment, tenant string, n int) string {
	return "OW#" + deployment + "#" + tenant + "#" + strconv.Itoa(n)
}

// ownerShard is the owner index shard of user's warm records.
func ownerShard(user string) int { return shardOf(user, OwnerShards) }

// ownerSK is the owner index sort key of a warm record of k's thread
// parked at parked: its user first (the key holds several users), then
// the park time (the LRU order), then what the eviction needs (ids never
// contain '#').
func ownerSK(k core.ThreadKey, parked time.Time, id string) string {
	return fmt.Sprintf("%s#%015d#%s#%s", k.User, ms(parked), k.Thread, id)
}

// ownerIndex adds to u the clauses that file a record in the owner index
// when it becomes warm (its thread, owner, known), and that take it out
// of it otherwise: only warm records are listed there.
func ownerIndex(u expression.UpdateBuilder, deployment string, st core.State, parked time.Time, id string, owner core.ThreadKey) expression.UpdateBuilder {
	if st != core.StateWarm || owner.Tenant == "" || owner.User == "" {
		return u.Remove(expression.Name(AttrGSI2PK)).Remove(expression.Name(AttrGSI2SK))
	}
	return u.Set(expression.Name(AttrGSI2PK), expression.Value(ownerPK(deployment, owner.Tenant, ownerShard(owner.User)))).
		Set(expression.Name(AttrGSI2SK), expression.Value(ownerSK(owner, parked, id)))
}

// OwnWarm implements core.Store: one query of user's owner index key
// (its entries only), or, for a whole tenant (user ""), one per shard of
// the tenant's keys, in parallel, merged by park time. The index is
// eventually consistent and projects its keys only: the records carry
// what the keys say (id, thread, state warm, park time).
func (s *Store) OwnWarm(ctx context.Context, tenant, user string, limit int) ([]core.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	if user != "" {
		pk := ownerPK(s.deployment, tenant, ownerShard(user))
		return s.ownerEntries(ctx, pk, tenant, user, int32(limit), 1)
	}
	shards := make([][]core.Record, OwnerShards)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(queryParallel)
	for n := range OwnerShards {
		g.Go(func() (err error) {
			shards[n], err = s.ownerEntries(gctx, ownerPK(s.deployment, tenant, n), tenant, "", ownerPage, ownerPages)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	all := slices.Concat(shards...)
	slices.SortFunc(all, func(a, b core.Record) int {
		return cmp.Or(a.ParkedAt.Compare(b.ParkedAt), cmp.Compare(a.SandboxID, b.SandboxID))
	})
	return all[:min(len(all), limit)], nil
}

// ownerEntries reads up to pages pages of page entries of owner index key
// pk (only user's when user is not empty), in sort-key order.
func (s *Store) ownerEntries(ctx context.Context, pk, tenant, user string, page int32, pages int) ([]core.Record, error) {
	kc := expression.Key(AttrGSI2PK).Equal(expression.Value(pk))
	if user != "" {
		kc = kc.And(expression.Key(AttrGSI2SK).BeginsWith(user + "#"))
	}
	expr, err := expression.NewBuilder().WithKeyCondition(kc).Build()
	if err != nil {
		return nil, fmt.Errorf("own warm: %w", err)
	}
	p := dynamodb.NewQueryPaginator(s.db, &dynamodb.QueryInput{TableName: &s.table, IndexName: aws.String(IndexGSI2),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(),
		ExpressionAttributeValues: expr.Values(), Limit: aws.Int32(page)})
	var recs []core.Record
	for range pages {
		if !p.HasMorePages() {
			break
		}
		cctx, cancel := s.ctx(ctx)
		out, err := p.NextPage(cctx)
		cancel()
		if err != nil {
			return nil, unavailable("query own warm", err)
		}
		for _, av := range out.Items {
			if rec, ok := ownerEntry(av, tenant); ok {
				recs = append(recs, rec)
			}
		}
	}
	return recs, nil
}

// ownerEntry is the record an owner index entry describes (false when
// its keys do not parse).
func ownerEntry(av map[string]types.AttributeValue, tenant string) (core.Record, bool) {
	id, ok := strings.CutPrefix(stringAttr(av, AttrPK), "SBX#")
	parts := strings.SplitN(stringAttr(av, AttrGSI2SK), "#", 4)
	if !ok || len(parts) != 4 {
		return core.Record{}, false
	}
	parked, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return core.Record{}, false
	}
	return core.Record{SandboxID: id, ThreadKey: core.ThreadKey{Tenant: tenant, User: parts[0], Thread: parts[2]},
		State: core.StateWarm, ParkedAt: fromMS(parked)}, true
}
