package ddbstore_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/tokenseal"
)

// TestAccessTokensAreSealedAtRest: with a sealer, no attribute of a stored
// record holds the sandbox's access token, while every read returns it; a
// record stored in plaintext before still reads; a store without the key
// cannot read a sealed token (an error, not an empty token).
func TestAccessTokensAreSealedAtRest(t *testing.T) {
	t.Parallel()
	client, table := newTable(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sealer, err := tokenseal.NewLocal(bytes.Repeat([]byte{7}, tokenseal.KeyBytes))
	if err != nil {
		t.Fatal(err)
	}
	sealed := ddbstore.New(client, table, "test", ddbstore.WithSealer(sealer))
	plain := ddbstore.New(client, table, "test")
	const secret = "envd-secret-0123456789abcdef"
	ep := core.Endpoint{Protocol: core.ProtocolEnvd, URL: "http://envd.invalid", AccessToken: secret}

	finalize := func(s *ddbstore.Store, key core.ThreadKey, id string) {
		t.Helper()
		if err := s.Reserve(ctx, core.Reservation{Token: "res-" + id, ThreadKey: key, Limit: 100, Now: t0, ExpiresAt: t0.Add(time.Minute)}); err != nil {
			t.Fatalf("Reserve: %v", err)
		}
		rec, err := s.Finalize(ctx, "res-"+id, core.Record{SandboxID: id, ThreadKey: key, State: core.StateActive, Backend: "e2b",
			Endpoint: ep, CreatedAt: t0, UpdatedAt: t0})
		if err != nil || rec.Endpoint != ep {
			t.Fatalf("Finalize = %+v, %v; want the endpoint back", rec.Endpoint, err)
		}
	}
	finalize(sealed, thread(1), "sealed1")
	finalize(plain, thread(2), "legacy1")

	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: &table, Key: map[string]types.AttributeValue{
		ddbstore.AttrPK: &types.AttributeValueMemberS{Value: "SBX#sealed1"}, ddbstore.AttrSK: &types.AttributeValueMemberS{Value: "R"}}})
	if err != nil || out.Item == nil {
		t.Fatalf("GetItem: %v", err)
	}
	for name, av := range out.Item {
		var raw []byte
		switch v := av.(type) {
		case *types.AttributeValueMemberS:
			raw = []byte(v.Value)
		case *types.AttributeValueMemberB:
			raw = v.Value
		}
		if bytes.Contains(raw, []byte(secret)) {
			t.Errorf("attribute %s holds the access token in plaintext", name)
		}
	}
	if _, ok := out.Item["token_sealed"]; !ok {
		t.Errorf("stored item has no token_sealed attribute: %v", out.Item)
	}

	for _, tc := range []struct {
		name string
		read func() (core.Record, error)
	}{
		{"get sealed", func() (core.Record, error) { return sealed.Get(ctx, "sealed1") }},
		{"claim sealed", func() (core.Record, error) {
			return sealed.Claim(ctx, core.Claim{SandboxID: "sealed1", Tenant: "acme", From: []core.State{core.StateActive}, To: core.StateActive, Owner: "o", Now: t0})
		}},
		{"get legacy plaintext", func() (core.Record, error) { return sealed.Get(ctx, "legacy1") }},
	} {
		rec, err := tc.read()
		if err != nil || rec.Endpoint.AccessToken != secret {
			t.Errorf("%s: token %q, %v; want the access token", tc.name, rec.Endpoint.AccessToken, err)
		}
	}
	if rec, err := plain.Get(ctx, "sealed1"); err == nil || !strings.Contains(err.Error(), "sealed") {
		t.Errorf("store without the key read a sealed record: token %q, err %v; want an error", rec.Endpoint.AccessToken, err)
	}
}
