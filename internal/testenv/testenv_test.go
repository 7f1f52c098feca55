package testenv_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"regexp"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sandbox-broker/sandbox-broker/internal/testenv"
)

func TestDynamoDBConditionalWrite(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := testenv.DynamoClient(t)
	table := testenv.UniqueName(t, "t")
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          ddbtypes.BillingModePayPerRequest,
		AttributeDefinitions: []ddbtypes.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: ddbtypes.ScalarAttributeTypeS}},
		KeySchema:            []ddbtypes.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: ddbtypes.KeyTypeHash}},
	})
	if err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	put := func() error {
		_, err := client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:           aws.String(table),
			Item:                map[string]ddbtypes.AttributeValue{"pk": &ddbtypes.AttributeValueMemberS{Value: "k"}},
			ConditionExpression: aws.String("attribute_not_exists(pk)"),
		})
		return err
	}
	if err := put(); err != nil {
		t.Fatalf("first PutItem: got %v, want nil", err)
	}
	var ccf *ddbtypes.ConditionalCheckFailedException
	if err := put(); !errors.As(err, &ccf) {
		t.Fatalf("second PutItem: got %v, want ConditionalCheckFailedException", err)
	}
	// The same process shares one server: a second client sees the table.
	if got, want := testenv.DynamoDB(t), testenv.DynamoDB(t); got != want {
		t.Fatalf("DynamoDB endpoints differ within a process: %v vs %v", got, want)
	}
}

func TestS3RoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := testenv.S3Client(t)
	bucket := testenv.Bucket(t, client)
	body := []byte("hello testenv")
	if _, err := client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String("a/b.txt"), Body: bytes.NewReader(body),
	}); err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("a/b.txt")})
	if err != nil {
		t.Fatalf("GetObject: %v", err)
	}
	defer out.Body.Close()
	got, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("GetObject body: got %q, want %q", got, body)
	}
	// SigV4 is checked: a wrong secret is refused.
	ep := testenv.S3(t)
	bad := s3.New(s3.Options{
		Region: ep.Region, BaseEndpoint: aws.String(ep.Endpoint), UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: ep.AccessKey, SecretAccessKey: "wrong"}, nil
		}),
	})
	if _, err := bad.ListBuckets(ctx, &s3.ListBucketsInput{}); err == nil {
		t.Fatal("ListBuckets with a wrong secret: got nil error, want a signature error")
	}
}

func TestUniqueName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$`)
	tests := []struct{ prefix string }{
		{""}, {"t"}, {"Sandbox_Leases"}, {"a-very-long-prefix-that-goes-on-and-on-and-on-and-on-and-on-and-on"},
	}
	for _, tc := range tests {
		a, b := testenv.UniqueName(t, tc.prefix), testenv.UniqueName(t, tc.prefix)
		if a == b {
			t.Errorf("UniqueName(%q) twice: got %q both times, want different names", tc.prefix, a)
		}
		if !valid.MatchString(a) {
			t.Errorf("UniqueName(%q) = %q: not a valid bucket/table name", tc.prefix, a)
		}
	}
}
