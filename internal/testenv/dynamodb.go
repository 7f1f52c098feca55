package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/standin"
)

// DynamoEndpoint addresses a DynamoDB-compatible server.
type DynamoEndpoint struct {
	Endpoint string // base URL, e.g. http://127.0.0.1:41234
	Region   string
}

var (
	dynamoOnce sync.Once
	dynamoEP   DynamoEndpoint
	dynamoErr  error
)

// DynamoDB returns the endpoint of a running DynamoDB Local: TEST_DYNAMODB_ENDPOINT (and optionally
// TEST_DYNAMODB_REGION) when set, else one DynamoDB Local per test process started from
// .tools/dynamodb with -inMemory -sharedDb (tables are shared by every access key and region, and
// gone when the process exits). Use UniqueName for table names. Fails the test when DynamoDB Local
// is missing (run make deps) or does not start.
func DynamoDB(t testing.TB) DynamoEndpoint {
	t.Helper()
	NeedsStandIns(t)
	if ep := os.Getenv("TEST_DYNAMODB_ENDPOINT"); ep != "" {
		region := os.Getenv("TEST_DYNAMODB_REGION")
		if region == "" {
			region = Region
		}
		return DynamoEndpoint{Endpoint: ep, Region: region}
	}
	dir := ToolPath(t, "dynamodb")
	ToolPath(t, filepath.Join("dynamodb", "DynamoDBLocal.jar")) // fails with a make deps hint
	java, err := lookJava()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	dynamoOnce.Do(func() {
		dynamoEP, dynamoErr = startDynamo(dir, java)
	})
	if dynamoErr != nil {
		t.Fatalf("testenv: DynamoDB Local: %v", dynamoErr)
	}
	return dynamoEP
}

func lookJava() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		p := filepath.Join(home, "bin", "java")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := execLookPath("java")
	if err != nil {
		return "", fmt.Errorf("java missing (DynamoDB Local needs Java 17+): %w", err)
	}
	return p, nil
}

func startDynamo(dir, java string) (DynamoEndpoint, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a port picked as free may be taken meanwhile
		port, err := freePort()
		if err != nil {
			return DynamoEndpoint{}, err
		}
		ep := DynamoEndpoint{Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), Region: Region}
		client := newDynamoClient(ep)
		_, err = start(dir, java, standin.DynamoDBArgs(dir, port), func() error {
			if err := waitTCP("127.0.0.1:" + strconv.Itoa(port)); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return standin.DynamoDBReady(ctx, client)
		})
		if err == nil {
			return ep, nil
		}
		lastErr = err
	}
	return DynamoEndpoint{}, lastErr
}

// DynamoClient returns a DynamoDB client for DynamoDB(t) with static dummy credentials.
func DynamoClient(t testing.TB) *dynamodb.Client {
	t.Helper()
	return newDynamoClient(DynamoDB(t))
}

// DynamoTable creates a uniquely named broker table (ddbstore.CreateTable)
// on DynamoDB(t) and returns a client and the table's name.
func DynamoTable(t testing.TB, prefix string) (*dynamodb.Client, string) {
	t.Helper()
	client := DynamoClient(t)
	table := UniqueName(t, prefix)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ddbstore.CreateTable(ctx, client, table); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	return client, table
}

func newDynamoClient(ep DynamoEndpoint) *dynamodb.Client {
	return standin.DynamoDBClient(ep.Endpoint, ep.Region, "testenv", 30*time.Second)
}
