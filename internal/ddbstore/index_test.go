package ddbstore_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
)

// TestStateIndexIsShardedAndMergedInParkOrder parks records out of id
// order across the shards, and checks that the warm pool lists every
// record in park order (the LRU order eviction relies on), that counts
// and scans see every entry, and that the entries use more than one key.
func TestStateIndexIsShardedAndMergedInParkOrder(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	s := ddbstore.New(client, table, "test")
	ctx := context.Background()
	const n = 40
	var want []string
	for i := range n {
		id := fmt.Sprintf("sbx%02d", i)
		rec := activeRecord(t, s, thread(i), id)
		// Park times run backwards with the ids, so merge order is not id order.
		parked := t0.Add(time.Duration(n-i) * time.Second)
		if _, err := s.Apply(ctx, core.Update{SandboxID: id, Fence: rec.Fence, State: core.StateWarm, Now: parked, ParkedAt: parked}); err != nil {
			t.Fatalf("Apply warm %s: %v", id, err)
		}
		want = append([]string{id}, want...)
	}
	got, err := s.WarmParkedBefore(ctx, t0.Add(time.Hour), 100)
	if err != nil {
		t.Fatalf("WarmParkedBefore: %v", err)
	}
	var ids []string
	for _, r := range got {
		ids = append(ids, r.SandboxID)
	}
	if !slices.Equal(ids, want) {
		t.Errorf("warm pool order = %v, want %v", ids, want)
	}
	first, err := s.WarmParkedBefore(ctx, t0.Add(time.Hour), 3)
	if err != nil || len(first) != 3 || first[0].SandboxID != want[0] || first[2].SandboxID != want[2] {
		t.Errorf("WarmParkedBefore(limit 3) = %v, %v; want the 3 least recently parked %v", first, err, want[:3])
	}
	counts, err := s.CountStates(ctx, core.StateWarm)
	if err != nil || counts[core.StateWarm] != n {
		t.Errorf("CountStates(warm) = %v, %v; want %d", counts, err, n)
	}
	var scanned int
	if err := s.ScanState(ctx, core.StateWarm, func(core.Record) bool { scanned++; return true }); err != nil || scanned != n {
		t.Errorf("ScanState(warm) saw %d, %v; want %d", scanned, err, n)
	}

	keys := map[string]bool{}
	out, err := client.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table), IndexName: aws.String(ddbstore.IndexGSI1)})
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	for _, it := range out.Items {
		keys[it["gsi1pk"].(*types.AttributeValueMemberS).Value] = true
	}
	if len(keys) < ddbstore.IndexShards/2 {
		t.Errorf("%d records filed under %d index keys %v, want them spread over most of the %d shards", n, len(keys), keys, ddbstore.IndexShards)
	}
}

// TestIndexShardsPerState: every state spreads over IndexShards keys, by
// FNV-1a of the id, and a state's entries use every one of its keys.
func TestIndexShardsPerState(t *testing.T) {
	t.Parallel()
	used := map[int]bool{}
	for i := range 2000 {
		id := fmt.Sprintf("sbx-%d", i)
		got := ddbstore.ShardOf(id, ddbstore.IndexShards)
		h := fnv.New32a()
		_, _ = h.Write([]byte(id))
		if want := int(h.Sum32() % ddbstore.IndexShards); got != want {
			t.Fatalf("ShardOf(%s) = %d, want FNV-1a mod %d = %d", id, got, ddbstore.IndexShards, want)
		}
		used[got] = true
	}
	if len(used) != ddbstore.IndexShards {
		t.Errorf("entries used %d keys, want all %d", len(used), ddbstore.IndexShards)
	}
}

// TestIndexSizedForTheLimitAndRefiled: a store sized for 8 slots files
// every entry of a state under one key, so a sample of the warm pool is
// one query; entries a store of more keys filed are moved under that key
// by the counter repair, and are then found.
func TestIndexSizedForTheLimitAndRefiled(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	api := &countingAPI{Client: client}
	wide := ddbstore.New(client, table, "test")
	narrow := ddbstore.New(api, table, "test", ddbstore.WithLimit(8))
	ctx := context.Background()
	park := func(s *ddbstore.Store, i int) {
		t.Helper()
		id := fmt.Sprintf("sbx%02d", i)
		rec := activeRecord(t, s, thread(i), id)
		at := t0.Add(time.Duration(i) * time.Second)
		if _, err := s.Apply(ctx, core.Update{SandboxID: id, Fence: rec.Fence, State: core.StateWarm, Now: at, ParkedAt: at}); err != nil {
			t.Fatalf("Apply warm %s: %v", id, err)
		}
	}
	for i := range 6 {
		park(wide, i)
	}
	park(narrow, 6)
	warm := func() int {
		t.Helper()
		api.calls.Store(0)
		got, err := narrow.Sample(ctx, core.StateWarm, 20)
		if err != nil {
			t.Fatalf("Sample: %v", err)
		}
		if n := api.calls.Load(); n != 1 {
			t.Errorf("Sample made %d queries, want 1 (one index key)", n)
		}
		return len(got)
	}
	if n := warm(); n != 1 {
		t.Errorf("before the repair the sample found %d, want the 1 filed under the narrow key", n)
	}
	if _, err := narrow.RepairCounters(ctx, 8); err != nil {
		t.Fatalf("RepairCounters: %v", err)
	}
	if n := warm(); n != 7 {
		t.Errorf("after the repair the sample found %d, want all 7", n)
	}
}

// TestRepairReadsTheKeysInUse: a deployment whose limits were only ever
// set by stores of few index keys has its slot holders counted from
// those keys alone, not from every key a state may have; once a store of
// more keys set them, the repair reads those too and finds its entries.
func TestRepairReadsTheKeysInUse(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	api := &countingAPI{Client: client}
	narrow := ddbstore.New(api, table, "test", ddbstore.WithLimit(8))
	ctx := context.Background()
	repair := func(want int) int64 {
		t.Helper()
		api.calls.Store(0)
		if _, err := narrow.RepairCounters(ctx, 100); err != nil {
			t.Fatalf("RepairCounters: %v", err)
		}
		st, err := narrow.Capacity(ctx)
		if err != nil {
			t.Fatalf("Capacity: %v", err)
		}
		if st.Active != want {
			t.Errorf("active counted by the repair = %d, want %d", st.Active, want)
		}
		return api.calls.Load()
	}
	activeRecord(t, narrow, thread(1), "sbx01")
	if calls := repair(1); calls >= ddbstore.IndexShards {
		t.Errorf("the repair made %d calls, want fewer than the %d keys of one state", calls, ddbstore.IndexShards)
	}
	// A store of every key, reserving for another limit, sets the limits
	// (and records its keys) before its first slot, as a store of a new
	// limit does.
	wide := ddbstore.New(client, table, "test")
	for i := 2; i < 10; i++ {
		if err := wide.Reserve(ctx, core.Reservation{Token: fmt.Sprintf("res-w%d", i), ThreadKey: thread(i), Limit: 200,
			Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
			t.Fatalf("Reserve: %v", err)
		}
		if _, err := wide.Finalize(ctx, fmt.Sprintf("res-w%d", i), core.Record{SandboxID: fmt.Sprintf("sbx%02d", i), ThreadKey: thread(i),
			State: core.StateActive, Backend: "e2b", CreatedAt: t0, UpdatedAt: t0,
			Endpoint: core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: "tok"}}); err != nil {
			t.Fatalf("Finalize: %v", err)
		}
	}
	repair(9)
}
