package core_test

import (
	"maps"
	"regexp"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// indexSpec is one global secondary index of the table: its key
// attributes, and whether it projects every attribute (then an update of
// any attribute rewrites the item's entry) or only the keys.
type indexSpec struct {
	pk, sk string
	all    bool
}

// tableIndexes are the table's indexes, as ddbstore.CreateTable declares
// them: the state index projects every attribute, the owner index keys only.
var tableIndexes = []indexSpec{
	{pk: ddbstore.AttrGSI1PK, sk: ddbstore.AttrGSI1SK, all: true},
	{pk: ddbstore.AttrGSI2PK, sk: ddbstore.AttrGSI2SK, all: false},
}

// indexShadow is what the benchmark knows of each item's index key
// attributes (by the item's table key), from the writes it saw applied.
// DynamoDB writes an index once when an item gains an entry, twice when
// an update changes the entry's key (a delete under the old key, a put
// under the new one), once under the old key when the item or its entry
// goes, and once when an update changes only attributes the index
// projects. applied charges those writes to the index partition keys
// ("gsi1pk=<value>"), so a state change is charged to the state it
// leaves as well as to the one it enters.
type indexShadow map[string]map[string]string

// setPair finds the "#name = :value" pairs of an update expression,
// removeClause its REMOVE clause (up to the next clause), nameRef a name
// placeholder in that.
var (
	setPair      = regexp.MustCompile(`(#\w+)\s*=\s*(:\w+)`)
	removeClause = regexp.MustCompile(`(?s)\bREMOVE\s+(.*?)(?:\b(?:SET|ADD|DELETE)\b|$)`)
	nameRef      = regexp.MustCompile(`#\w+`)
)

func itemID(key map[string]types.AttributeValue) string {
	str := func(attr string) string {
		v, _ := key[attr].(*types.AttributeValueMemberS)
		if v == nil {
			return ""
		}
		return v.Value
	}
	return str(ddbstore.AttrPK) + "\x00" + str(ddbstore.AttrSK)
}

// indexAttrs are the index key attributes an item (a put's) holds.
func indexAttrs(item map[string]types.AttributeValue) map[string]string {
	out := map[string]string{}
	for _, ix := range tableIndexes {
		for _, attr := range []string{ix.pk, ix.sk} {
			if v, ok := item[attr].(*types.AttributeValueMemberS); ok {
				out[attr] = v.Value
			}
		}
	}
	return out
}

// applied charges to write the index writes of a call DynamoDB applied.
func (sh indexShadow) applied(params any, write map[string]float64) {
	switch in := params.(type) {
	case *dynamodb.UpdateItemInput:
		sh.update(in.Key, in.UpdateExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, write)
	case *dynamodb.PutItemInput:
		sh.move(itemID(in.Item), indexAttrs(in.Item), write)
	case *dynamodb.DeleteItemInput:
		sh.move(itemID(in.Key), nil, write)
	case *dynamodb.TransactWriteItemsInput:
		for _, it := range in.TransactItems {
			switch {
			case it.Update != nil:
				sh.update(it.Update.Key, it.Update.UpdateExpression, it.Update.ExpressionAttributeNames, it.Update.ExpressionAttributeValues, write)
			case it.Put != nil:
				sh.move(itemID(it.Put.Item), indexAttrs(it.Put.Item), write)
			case it.Delete != nil:
				sh.move(itemID(it.Delete.Key), nil, write)
			}
		}
	}
}

// update applies an update expression's SET and REMOVE of index key
// attributes to what the item held.
func (sh indexShadow) update(key map[string]types.AttributeValue, expr *string, names map[string]string, values map[string]types.AttributeValue, write map[string]float64) {
	id := itemID(key)
	next := maps.Clone(sh[id])
	if next == nil {
		next = map[string]string{}
	}
	if expr != nil {
		for _, m := range setPair.FindAllStringSubmatch(*expr, -1) {
			if v, ok := values[m[2]].(*types.AttributeValueMemberS); ok && isIndexAttr(names[m[1]]) {
				next[names[m[1]]] = v.Value
			}
		}
		for _, clause := range removeClause.FindAllStringSubmatch(*expr, -1) {
			for _, ref := range nameRef.FindAllString(clause[1], -1) {
				delete(next, names[ref])
			}
		}
	}
	sh.move(id, next, write)
}

func isIndexAttr(attr string) bool {
	for _, ix := range tableIndexes {
		if attr == ix.pk || attr == ix.sk {
			return true
		}
	}
	return false
}

// move records that item now holds next (nil: the item is gone) and
// charges each index's writes for the change.
func (sh indexShadow) move(item string, next map[string]string, write map[string]float64) {
	prev := sh[item]
	for _, ix := range tableIndexes {
		old, cur := entryOf(prev, ix), entryOf(next, ix)
		switch {
		case old == cur:
			if cur != "" && ix.all && next != nil {
				write[ix.pk+"="+strings.SplitN(cur, "\x00", 2)[0]]++ // its projected attributes rewritten
			}
		default:
			if old != "" {
				write[ix.pk+"="+strings.SplitN(old, "\x00", 2)[0]]++ // the old entry deleted
			}
			if cur != "" {
				write[ix.pk+"="+strings.SplitN(cur, "\x00", 2)[0]]++ // the new entry put
			}
		}
	}
	if next == nil {
		delete(sh, item)
		return
	}
	sh[item] = next
}

// entryOf is an item's entry in ix ("<pk>\x00<sk>"), or "" when the item
// lacks either key attribute (DynamoDB then leaves it out of the index).
func entryOf(attrs map[string]string, ix indexSpec) string {
	pk, sk := attrs[ix.pk], attrs[ix.sk]
	if pk == "" || sk == "" {
		return ""
	}
	return pk + "\x00" + sk
}

// The index writes charged for each kind of applied write, with update
// expressions built as the store builds them.
func TestIndexShadowChargesIndexWrites(t *testing.T) {
	key := map[string]types.AttributeValue{ddbstore.AttrPK: str("SBX#a"), ddbstore.AttrSK: str("SBX#a")}
	item := func(attrs ...string) map[string]types.AttributeValue {
		out := maps.Clone(key)
		for i := 0; i+1 < len(attrs); i += 2 {
			out[attrs[i]] = str(attrs[i+1])
		}
		return out
	}
	update := func(u expression.UpdateBuilder) *dynamodb.UpdateItemInput {
		expr, err := expression.NewBuilder().WithUpdate(u).Build()
		if err != nil {
			t.Fatal(err)
		}
		return &dynamodb.UpdateItemInput{Key: key, UpdateExpression: expr.Update(),
			ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values()}
	}
	warm := item(ddbstore.AttrGSI1PK, "ST#d#warm#3", ddbstore.AttrGSI1SK, "t1", ddbstore.AttrGSI2PK, "OW#d#acme#1", ddbstore.AttrGSI2SK, "u#t1")
	cases := []struct {
		name  string
		held  map[string]types.AttributeValue // the item before the write (nil: none)
		write any
		want  map[string]float64
	}{
		{name: "put of a new item", write: &dynamodb.PutItemInput{Item: warm},
			want: map[string]float64{"gsi1pk=ST#d#warm#3": 1, "gsi2pk=OW#d#acme#1": 1}},
		{name: "state moved", held: warm,
			write: update(expression.Set(expression.Name(ddbstore.AttrGSI1PK), expression.Value("ST#d#active#3")).
				Set(expression.Name(ddbstore.AttrGSI1SK), expression.Value("t2")).
				Remove(expression.Name(ddbstore.AttrGSI2PK)).Remove(expression.Name(ddbstore.AttrGSI2SK))),
			want: map[string]float64{"gsi1pk=ST#d#warm#3": 1, "gsi1pk=ST#d#active#3": 1, "gsi2pk=OW#d#acme#1": 1}},
		{name: "other attributes updated", held: warm,
			write: update(expression.Set(expression.Name("lease"), expression.Value("x"))),
			want:  map[string]float64{"gsi1pk=ST#d#warm#3": 1}},
		{name: "index keys set to what they were", held: warm,
			write: update(expression.Set(expression.Name(ddbstore.AttrGSI2PK), expression.Value("OW#d#acme#1")).
				Set(expression.Name(ddbstore.AttrGSI2SK), expression.Value("u#t1"))),
			want: map[string]float64{"gsi1pk=ST#d#warm#3": 1}},
		{name: "removed from the state index", held: warm,
			write: update(expression.Remove(expression.Name(ddbstore.AttrGSI1PK)).Remove(expression.Name(ddbstore.AttrGSI1SK))),
			want:  map[string]float64{"gsi1pk=ST#d#warm#3": 1}},
		{name: "deleted", held: warm, write: &dynamodb.DeleteItemInput{Key: key},
			want: map[string]float64{"gsi1pk=ST#d#warm#3": 1, "gsi2pk=OW#d#acme#1": 1}},
		{name: "in a transaction", held: warm,
			write: &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
				{ConditionCheck: &types.ConditionCheck{Key: key}},
				{Delete: &types.Delete{Key: key}},
			}},
			want: map[string]float64{"gsi1pk=ST#d#warm#3": 1, "gsi2pk=OW#d#acme#1": 1}},
		{name: "an item in no index", held: item("x", "y"),
			write: update(expression.Set(expression.Name("lease"), expression.Value("x"))),
			want:  map[string]float64{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sh := indexShadow{}
			if c.held != nil {
				sh.applied(&dynamodb.PutItemInput{Item: c.held}, map[string]float64{})
			}
			got := map[string]float64{}
			sh.applied(c.write, got)
			if !maps.Equal(got, c.want) {
				t.Errorf("index writes = %v, want %v", got, c.want)
			}
		})
	}
}

func str(s string) *types.AttributeValueMemberS { return &types.AttributeValueMemberS{Value: s} }
