// Package standin says how to run the local stand-ins of the AWS services
// the broker uses: DynamoDB Local and the versitygw S3 gateway (both
// installed into .tools/ by scripts/install-deps.sh). internal/testenv (the
// tests) and internal/devstack (`make run`) start them from here: the
// command lines, the data directories, the readiness checks and the
// clients are written once. Each caller runs the processes its own way
// (the tests keep their output in memory, the dev stack in log files).
package standin

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Region is the AWS region the stand-ins are addressed with.
const Region = "us-east-1"

// DynamoDBArgs are the java arguments that run DynamoDB Local from dir
// (.tools/dynamodb) on 127.0.0.1:port: in memory, one database for every
// access key and region (-sharedDb), gone when the process exits. It is
// tuned for a small machine shared with the tests: the JIT stays on its
// fast-start tier (alone, a test package ran faster with the optimizing
// tier, but with make test's packages sharing two cores its compiler
// threads cost more than they saved). The serial collector, whose pauses
// a 512 MB heap keeps short, saves about a tenth of the JVM's CPU time
// (the default collector runs background threads), and -UsePerfData
// skips the performance counters' shared-memory file.
func DynamoDBArgs(dir string, port int) []string {
	return []string{
		"-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:-UsePerfData",
		"-Djava.library.path=" + filepath.Join(dir, "DynamoDBLocal_lib"),
		"-jar", filepath.Join(dir, "DynamoDBLocal.jar"),
		"-inMemory", "-sharedDb", "-disableTelemetry",
		"-port", strconv.Itoa(port),
	}
}

// DynamoDBClient is a client of the DynamoDB at endpoint (a base URL) in
// region with static credentials (DynamoDB Local accepts any).
func DynamoDBClient(endpoint, region, accessKey string, timeout time.Duration) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(accessKey, accessKey, ""),
		HTTPClient:   &http.Client{Timeout: timeout, Transport: Loopback},
	})
}

// Loopback is the transport of every stand-in client, and for the
// clients tests build around one (a fault layer's next hop): http's
// default keeps 2 idle connections per host, so many concurrent calls to
// one local server (a store's fan-out of 33 queries, dozens of test
// workers) would dial a new connection for nearly every call.
var Loopback = func() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 0, 256
	return tr
}()

// DynamoDBReady reports whether the DynamoDB behind c answers a call.
func DynamoDBReady(ctx context.Context, c *dynamodb.Client) error {
	_, err := c.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
	return err
}

// S3Keys are the credentials an S3 server accepts (SigV4 is checked).
type S3Keys struct {
	AccessKey string
	SecretKey string
}

// VersityGWData creates base/data (and base/meta) and returns versitygw's
// posix backend arguments over them: metadata in user xattrs, or in the
// meta sidecar directory where the file system has no user xattrs (tmpfs).
func VersityGWData(base string) ([]string, error) {
	data, meta := filepath.Join(base, "data"), filepath.Join(base, "meta")
	for _, d := range []string{data, meta} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("s3 data dir: %w", err)
		}
	}
	posix := []string{"posix"}
	if err := syscall.Setxattr(data, "user.standin", []byte("1"), 0); err != nil {
		posix = append(posix, "--sidecar", meta)
	}
	return append(posix, data), nil
}

// VersityGWArgs are versitygw's arguments: listen on addr (host:port,
// loopback), accept keys, serve the backend posix (VersityGWData).
func VersityGWArgs(addr string, keys S3Keys, posix []string) []string {
	return append([]string{"--access", keys.AccessKey, "--secret", keys.SecretKey, "--region", Region, "--port", addr}, posix...)
}

// S3Client is a path-style client of the S3 at endpoint (a base URL) in
// region.
func S3Client(endpoint, region string, keys S3Keys, timeout time.Duration) *s3.Client {
	return s3.New(s3.Options{
		Region:       region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(keys.AccessKey, keys.SecretKey, ""),
		UsePathStyle: true,
		HTTPClient:   &http.Client{Timeout: timeout, Transport: Loopback},
	})
}

// S3Ready reports whether the S3 behind c answers a call.
func S3Ready(ctx context.Context, c *s3.Client) error {
	_, err := c.ListBuckets(ctx, &s3.ListBucketsInput{})
	return err
}
