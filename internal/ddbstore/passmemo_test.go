package ddbstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// keyReadsDB passes every call to DynamoDB Local and counts the queries
// of each state index key.
type keyReadsDB struct {
	ddbstore.API
	mu    sync.Mutex
	reads map[string]int
}

func (d *keyReadsDB) Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	if aws.ToString(in.IndexName) == ddbstore.IndexGSI1 {
		for _, v := range in.ExpressionAttributeValues {
			if s, ok := v.(*types.AttributeValueMemberS); ok && strings.HasPrefix(s.Value, "ST#") {
				d.mu.Lock()
				d.reads[s.Value]++
				d.mu.Unlock()
			}
		}
	}
	return d.API.Query(ctx, in, opts...)
}

// take returns the reads counted since the last take and starts over.
func (d *keyReadsDB) take() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.reads
	d.reads = map[string]int{}
	return r
}

// idInShard is a sandbox id whose active index entry is filed under shard
// n, other than the ids in not.
func idInShard(t *testing.T, n int, not ...string) string {
	t.Helper()
	for i := range 10000 {
		id := fmt.Sprintf("sbx-%d", i)
		if ddbstore.ShardOf(core.StateActive, id) == n && !slices.Contains(not, id) {
			return id
		}
	}
	t.Fatalf("no id in shard %d", n)
	return ""
}

func activeKey(n int) string {
	return fmt.Sprintf("ST#test#%s#%d", core.StateActive, n)
}

// Within one reconcile pass (WithPass) a state index key a whole-key read
// found empty is not queried again, while a key that held entries is, and
// sees entries filed since; a read narrowed by sort key skips the keys
// found empty but marks none; outside a pass, and in the next pass, every
// key is read.
func TestPassReadsAKeyFoundEmptyOnce(t *testing.T) {
	client, table := newTable(t)
	plain := ddbstore.New(client, table, "test")
	db := &keyReadsDB{API: client, reads: map[string]int{}}
	s := ddbstore.New(db, table, "test")
	first := idInShard(t, 3)
	activeRecord(t, plain, thread(1), first)
	keys := ddbstore.ShardsOf(core.StateActive) + 1 // the shards and the legacy key
	ids := func(ctx context.Context) []string {
		t.Helper()
		var got []string
		if err := s.ScanState(ctx, core.StateActive, func(r core.Record) bool {
			got = append(got, r.SandboxID)
			return true
		}); err != nil {
			t.Fatalf("ScanState: %v", err)
		}
		return got
	}

	ctx := s.WithPass(context.Background())
	if got := ids(ctx); len(got) != 1 {
		t.Fatalf("first read of the pass found %v, want [%s]", got, first)
	}
	if got := len(db.take()); got != keys {
		t.Errorf("first read of the pass queried %d keys, want all %d", got, keys)
	}
	sameShard := idInShard(t, 3, first)
	activeRecord(t, plain, thread(2), sameShard)
	if got := ids(ctx); len(got) != 2 {
		t.Errorf("second read of the pass found %v, want %s and %s (filed under a key that held an entry)", got, first, sameShard)
	}
	if got, want := db.take(), map[string]int{activeKey(3): 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("second read of the pass queried %v, want %v (only the key that was not empty)", got, want)
	}

	// An entry filed during the pass under a key found empty is left to
	// the next pass.
	other := idInShard(t, 7)
	activeRecord(t, plain, thread(3), other)
	if got := ids(ctx); len(got) != 2 {
		t.Errorf("third read of the pass found %v, want the two filed before the key found empty", got)
	}
	db.take()
	if got := ids(context.Background()); len(got) != 3 {
		t.Errorf("a read outside the pass found %v, want all three", got)
	}
	if got := len(db.take()); got != keys {
		t.Errorf("a read outside the pass queried %d keys, want all %d", got, keys)
	}
	next := s.WithPass(context.Background())
	if got := ids(next); len(got) != 3 {
		t.Errorf("the next pass found %v, want all three", got)
	}
	if got := len(db.take()); got != keys {
		t.Errorf("the next pass queried %d keys, want all %d", got, keys)
	}
}

// A read narrowed by sort key (the warm pool's expiry) marks no key: an
// empty answer may only mean no entry matched. It skips the keys a
// whole-key read of the pass found empty.
func TestPassNarrowedReadMarksNoKey(t *testing.T) {
	client, table := newTable(t)
	db := &keyReadsDB{API: client, reads: map[string]int{}}
	s := ddbstore.New(db, table, "test")
	keys := ddbstore.ShardsOf(core.StateWarm) + 1
	ctx := s.WithPass(context.Background())
	for i, tc := range []struct {
		name string
		read func() error
		want int
	}{
		{"narrowed", func() error { _, err := s.WarmParkedBefore(ctx, t0, 10); return err }, keys},
		{"narrowed again", func() error { _, err := s.WarmParkedBefore(ctx, t0, 10); return err }, keys},
		{"whole", func() error {
			return s.ScanState(ctx, core.StateWarm, func(core.Record) bool { return true })
		}, keys},
		{"narrowed after the whole read", func() error { _, err := s.WarmParkedBefore(ctx, t0, 10); return err }, 0},
	} {
		if err := tc.read(); err != nil {
			t.Fatalf("read %d (%s): %v", i, tc.name, err)
		}
		if got := len(db.take()); got != tc.want {
			t.Errorf("read %d (%s) queried %d keys, want %d", i, tc.name, got, tc.want)
		}
	}
}
