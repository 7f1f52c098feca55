package ddbstore

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// A sandbox whose outputs are not all stored is noted by one item beside
// the reconcile cursor (see reconcile.go), holding noted_at (ms) and a
// ttl. One item per sandbox: releases noting different sandboxes never
// write the same item, and reconcile reads them all with one query.

// owedPrefix starts the sort key of an owed-outputs note.
const owedPrefix = "OWED#"

// owedTTL bounds a note that reconcile never forgot (garbage collection
// only: the sandbox it names is long gone by then).
const owedTTL = 7 * 24 * time.Hour

// owedItem is one owed-outputs note.
type owedItem struct {
	SK       string `dynamodbav:"sk"`
	NotedAt  int64  `dynamodbav:"noted_at"`
	TTLEpoch int64  `dynamodbav:"ttl"`
}

// NoteOutputsOwed notes that id's outputs are not all stored (one
// conditional put; a note already there keeps its time).
func (s *Store) NoteOutputsOwed(ctx context.Context, id string, now time.Time) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: &s.table, Key: keySK(reconcilePK(s.deployment), owedPrefix+id),
		UpdateExpression:         aws.String("SET noted_at = if_not_exists(noted_at, :t), #ttl = :ttl"),
		ExpressionAttributeNames: map[string]string{"#ttl": AttrTTL},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":t":   &types.AttributeValueMemberN{Value: strconv.FormatInt(ms(now), 10)},
			":ttl": &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(owedTTL).Unix(), 10)},
		}})
	if err != nil {
		return unavailable("note owed outputs", err)
	}
	return nil
}

// OutputsOwed lists up to limit noted sandboxes, oldest note first: one
// strongly consistent query of the notes (all of them: there are at most
// as many as warm sandboxes), sorted here.
func (s *Store) OutputsOwed(ctx context.Context, limit int) ([]string, error) {
	var notes []owedItem
	err := s.queryReconcile(ctx, "owed outputs", owedPrefix, func(av map[string]types.AttributeValue) error {
		var it owedItem
		if err := attributevalue.UnmarshalMap(av, &it); err != nil {
			return fmt.Errorf("decode owed outputs: %w", err)
		}
		notes = append(notes, it)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(notes, func(i, j int) bool {
		if notes[i].NotedAt != notes[j].NotedAt {
			return notes[i].NotedAt < notes[j].NotedAt
		}
		return notes[i].SK < notes[j].SK
	})
	ids := make([]string, 0, min(limit, len(notes)))
	for _, n := range notes[:min(limit, len(notes))] {
		ids = append(ids, strings.TrimPrefix(n.SK, owedPrefix))
	}
	return ids, nil
}

// ForgetOutputsOwed deletes id's note (a delete of none succeeds).
func (s *Store) ForgetOutputsOwed(ctx context.Context, id string) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if _, err := s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: &s.table,
		Key: keySK(reconcilePK(s.deployment), owedPrefix+id)}); err != nil {
		return unavailable("forget owed outputs", err)
	}
	return nil
}
