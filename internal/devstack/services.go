package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/sandbox-broker/sandbox-broker/internal/ddbstore"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
	"github.com/sandbox-broker/sandbox-broker/internal/standin"
)

// loopbackService is one stand-in process served on a loopback port.
type loopbackService struct {
	name, dir, bin, logFile string
	addr                    string // as configured: "" or port 0 picks a free port
	args                    func(addr string) []string
	ready                   func(ctx context.Context, addr string) error
	timeout                 time.Duration
}

// startLoopback starts svc and waits until it holds its port itself and
// answers ready. A picked port another process took meanwhile is retried on
// a fresh one (three tries); a configured port is not. It returns the
// address served.
func (s *Stack) startLoopback(ctx context.Context, svc loopbackService) (string, error) {
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		a, picked, err := loopbackAddr(svc.addr)
		if err != nil {
			return "", fmt.Errorf("%s address: %w", svc.name, err)
		}
		c, err := startChild(svc.name, svc.dir, svc.bin, svc.args(a),
			[]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, svc.logFile)
		if err != nil {
			return "", err
		}
		s.addChild(c)
		err = c.waitReady(ctx, svc.timeout, func(ctx context.Context) error {
			if err := dialable(ctx, a); err != nil {
				return err
			}
			if !ownsListener(c.cmd.Process.Pid, a) {
				return fmt.Errorf("%s is served by another process", a)
			}
			return svc.ready(ctx, a)
		})
		if err == nil {
			return a, nil
		}
		c.stop(time.Second)
		last = err
		if !picked {
			return "", err
		}
	}
	return "", last
}

func (s *Stack) startDynamoDB(ctx context.Context, java, dir, addr, logDir string) error {
	client := func(a string) *dynamodb.Client {
		return standin.DynamoDBClient("http://"+a, DefaultRegion, "devstack", 10*time.Second)
	}
	a, err := s.startLoopback(ctx, loopbackService{name: "DynamoDB Local", dir: dir, bin: java,
		logFile: filepath.Join(logDir, "dynamodb.log"), addr: addr, timeout: 90 * time.Second,
		args: func(a string) []string {
			_, port, _ := net.SplitHostPort(a)
			n, _ := strconv.Atoi(port)
			return standin.DynamoDBArgs(dir, n)
		},
		ready: func(ctx context.Context, a string) error { return standin.DynamoDBReady(ctx, client(a)) },
	})
	if err != nil {
		return err
	}
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := ddbstore.CreateTable(tctx, client(a), DefaultTable); err != nil {
		return fmt.Errorf("dynamodb: %w", err)
	}
	s.Info.DynamoDB = DynamoDBInfo{Endpoint: "http://" + a, Region: DefaultRegion, Table: DefaultTable}
	return nil
}

// useDynamoDB creates the stack's table, uniquely named, on the DynamoDB
// Local at endpoint, and has Close delete it (also when the creation
// failed part way: a table that was never made is no error).
func (s *Stack) useDynamoDB(ctx context.Context, endpoint string) error {
	client := standin.DynamoDBClient(endpoint, DefaultRegion, "devstack", 10*time.Second)
	table := DefaultTable + "-" + randomHex(6)
	s.dropTable = func(ctx context.Context) error {
		_, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
		if err != nil && !errors.As(err, new(*types.ResourceNotFoundException)) {
			return fmt.Errorf("delete table %s: %w", table, err)
		}
		return nil
	}
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := ddbstore.CreateTable(tctx, client, table); err != nil {
		return fmt.Errorf("dynamodb: %w", err)
	}
	s.Info.DynamoDB = DynamoDBInfo{Endpoint: endpoint, Region: DefaultRegion, Table: table}
	return nil
}

func (s *Stack) startS3(ctx context.Context, bin, addr, logDir string) error {
	base, err := os.MkdirTemp("", "devstack-s3-")
	if err != nil {
		return fmt.Errorf("s3 temp dir: %w", err)
	}
	s.addTmpDir(base)
	posix, err := standin.VersityGWData(base)
	if err != nil {
		return err
	}
	info := S3Info{Region: DefaultRegion, AccessKey: "devstack" + randomHex(4), SecretKey: randomHex(16), Bucket: DefaultBucket, Prefix: DefaultPrefix}
	keys := standin.S3Keys{AccessKey: info.AccessKey, SecretKey: info.SecretKey}
	a, err := s.startLoopback(ctx, loopbackService{name: "versitygw", dir: base, bin: bin,
		logFile: filepath.Join(logDir, "versitygw.log"), addr: addr, timeout: 60 * time.Second,
		args: func(a string) []string { return standin.VersityGWArgs(a, keys, posix) },
		ready: func(ctx context.Context, a string) error {
			probe := info
			probe.Endpoint = "http://" + a
			return standin.S3Ready(ctx, S3Client(probe))
		},
	})
	if err != nil {
		return err
	}
	info.Endpoint = "http://" + a
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := S3Client(info).CreateBucket(bctx, &s3.CreateBucketInput{Bucket: aws.String(info.Bucket)}); err != nil {
		return fmt.Errorf("s3: create bucket %s: %w", info.Bucket, err)
	}
	s.Info.S3 = info
	return nil
}

// S3Client returns a path-style S3 client for the stack's S3.
func S3Client(info S3Info) *s3.Client {
	return standin.S3Client(info.Endpoint, info.Region, standin.S3Keys{AccessKey: info.AccessKey, SecretKey: info.SecretKey}, 60*time.Second)
}

func (s *Stack) startSandboxHost(ctx context.Context, o Options, logDir string) error {
	root, err := os.MkdirTemp("", "devstack-sandboxes-")
	if err != nil {
		return fmt.Errorf("sandbox host dir: %w", err)
	}
	s.addTmpDir(root)
	lf, err := os.OpenFile(filepath.Join(logDir, "sandbox-host.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("sandbox host log: %w", err)
	}
	key := "e2b_devstack_" + randomHex(16)
	// The host lives until Close, not until ctx (Start's) ends.
	srv, err := sandboxhost.Start(context.WithoutCancel(ctx), sandboxhost.Options{
		APIKey:    key,
		RootDir:   root,
		Isolation: o.Isolation,
		Limits:    o.SandboxLimits,
		Logger:    slog.New(slog.NewJSONHandler(lf, nil)),
		Webhook:   s.webhook,
	}, o.SandboxAPIAddr, o.EnvdAddr)
	if err != nil {
		lf.Close()
		return fmt.Errorf("sandbox host: %w", err)
	}
	s.host = srv
	s.hostLog = lf
	s.Info.SandboxHost = SandboxHostInfo{APIURL: srv.APIURL, EnvdURL: srv.EnvdURL, APIKey: key}
	return nil
}

// startProvisioner serves the sandbox host's provisioner face on addr
// with a fresh API key.
func (s *Stack) startProvisioner(addr string) error {
	key := "prov_devstack_" + randomHex(16)
	u, err := s.host.StartProvisioner(addr, sandboxhost.ProvisionerOptions{APIKey: key})
	if err != nil {
		return fmt.Errorf("provisioner face: %w", err)
	}
	s.Info.Provisioner = ProvisionerInfo{APIURL: u, APIKey: key}
	return nil
}
