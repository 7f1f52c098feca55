package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/spf13/cobra"
)

// OutputObject is one S3 object of a thread's outputs.
type OutputObject struct {
	Key          string    `json:"key"`
	Path         string    `json:"path"` // relative to the thread's prefix, e.g. outputs/report.md
	Size         int64     `json:"size"`
	LastModified time.Time `json:"last_modified"`
}

// threadPrefix is "<prefix>/<tenant>/<user>/<thread>/" (docs/configuration.md,
// OUTPUT_PREFIX; internal/outputsync writes there), without a leading slash when prefix is empty.
func threadPrefix(prefix, tenant, user, thread string) string {
	p := strings.Trim(prefix, "/")
	if p != "" {
		p += "/"
	}
	return p + tenant + "/" + user + "/" + thread + "/"
}

// s3Lister is the part of the S3 client ls-outputs uses.
type s3Lister interface {
	ListObjectsV2(ctx context.Context, in *s3.ListObjectsV2Input, opts ...func(*s3.Options)) (*s3.ListObjectsV2Output, error)
}

var _ s3Lister = (*s3.Client)(nil)

// listOutputs lists every object under the thread's prefix, all pages.
func listOutputs(ctx context.Context, cl s3Lister, bucket, prefix string) ([]OutputObject, error) {
	var out []OutputObject
	p := s3.NewListObjectsV2Paginator(cl, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list s3://%s/%s: %w", bucket, prefix, err)
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			out = append(out, OutputObject{
				Key: key, Path: strings.TrimPrefix(key, prefix),
				Size: aws.ToInt64(o.Size), LastModified: aws.ToTime(o.LastModified).UTC(),
			})
		}
	}
	return out, nil
}

func (a *App) lsOutputsCmd(g *globals) *cobra.Command {
	var user, thread, bucket, s3Prefix string
	cmd := &cobra.Command{
		Use:   "ls-outputs --user U --thread T [--bucket B [--prefix P]]",
		Short: "List the thread's files in S3 (the local stack's, or a deployed bucket with --bucket)",
		Long: `List the objects release and sync copied to S3 for a thread:
s3://<bucket>/<prefix>/<tenant>/<user>/<thread>/{outputs,workspace}/...
Without --bucket the endpoint, credentials, bucket and prefix come from the stack file's "s3"
section (local stack). With --bucket (a deployed stack's OutputBucketName) the AWS SDK's own
configuration applies (AWS_PROFILE, AWS_REGION, credentials, AWS_ENDPOINT_URL_S3), and --prefix
is the stack's OutputPrefix (default outputs). The tenant comes from --tenant, SBX_TENANT or the
token picked from the stack.`,
		Args: exactArgs(0, "no arguments"),
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if user == "" || thread == "" {
				return usageError{errors.New("ls-outputs needs --user and --thread")}
			}
			cfg, err := a.config(g, false)
			if err != nil {
				return err
			}
			if cfg.Tenant == "" {
				return usageError{errors.New("ls-outputs cannot tell the tenant: pass --tenant")}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
			defer cancel()
			cl, s, err := a.outputsClient(ctx, cfg, bucket, s3Prefix)
			if err != nil {
				return err
			}
			prefix := threadPrefix(s.Prefix, cfg.Tenant, user, thread)
			objs, err := listOutputs(ctx, cl, s.Bucket, prefix)
			if err != nil {
				return err
			}
			if g.json {
				if objs == nil {
					objs = []OutputObject{}
				}
				return writeJSON(a.Stdout, objs)
			}
			if len(objs) == 0 {
				fmt.Fprintf(a.Stderr, "no objects under s3://%s/%s\n", s.Bucket, prefix)
				return nil
			}
			fmt.Fprintf(a.Stderr, "s3://%s/%s\n", s.Bucket, prefix)
			width := 1
			for _, o := range objs {
				width = max(width, len(strconv.FormatInt(o.Size, 10)))
			}
			for _, o := range objs {
				fmt.Fprintf(a.Stdout, "%*d  %s  %s\n", width, o.Size, o.LastModified.Format(time.RFC3339), o.Path)
			}
			return nil
		}),
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user id")
	cmd.Flags().StringVarP(&thread, "thread", "t", "", "thread id")
	cmd.Flags().StringVar(&bucket, "bucket", "", "a deployed stack's output bucket (AWS SDK configuration); default: the stack file's")
	cmd.Flags().StringVar(&s3Prefix, "prefix", "outputs", "with --bucket: the stack's OutputPrefix")
	return cmd
}

// outputsClient is the S3 client and location ls-outputs lists: a
// deployed bucket through the AWS SDK's own configuration when bucket is
// set, else the local stack's from the stack file.
func (a *App) outputsClient(ctx context.Context, cfg Config, bucket, s3Prefix string) (*s3.Client, *S3Info, error) {
	var cl *s3.Client
	s := &S3Info{Bucket: bucket, Prefix: s3Prefix}
	if bucket != "" {
		awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("aws config: %w", err)
		}
		endpoint := os.Getenv("AWS_ENDPOINT_URL_S3") != "" || os.Getenv("AWS_ENDPOINT_URL") != ""
		cl = s3.NewFromConfig(awsCfg, func(o *s3.Options) {
			o.UsePathStyle = endpoint // local S3 stand-ins
			if a.HTTPClient != nil {
				o.HTTPClient = a.HTTPClient
			}
		})
	} else {
		if cfg.Stack == nil || cfg.Stack.S3 == nil || cfg.Stack.S3.Bucket == "" {
			return nil, nil, errors.New("ls-outputs needs --bucket, or the s3 section of " + StackFile + " (start the local stack with `make run`, or pass --stack)")
		}
		s = cfg.Stack.S3
		region := s.Region
		if region == "" {
			region = "us-east-1"
		}
		cl = s3.New(s3.Options{
			Region:       region,
			BaseEndpoint: nilIfEmpty(s.Endpoint),
			UsePathStyle: true,
			Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
			HTTPClient:   a.HTTPClient,
		})
	}
	return cl, s, nil
}

func (a *App) s3EnvCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "s3-env",
		Short: "Print shell exports for the local stack's S3 (for the aws CLI): eval \"$(sbx s3-env)\"",
		Long: `Print export lines for the S3 stand-in of the local stack, read from the "s3" section of
.run/stack.json: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, and
S3_ENDPOINT, S3_BUCKET, S3_PREFIX for use as
  aws --endpoint-url "$S3_ENDPOINT" s3 ls --recursive "s3://$S3_BUCKET/$S3_PREFIX/"
With --json the section is printed as JSON instead.`,
		Args: exactArgs(0, "no arguments"),
		RunE: run(func(_ *cobra.Command, _ []string) error {
			cfg, err := a.config(g, false)
			if err != nil {
				return err
			}
			if cfg.Stack == nil || cfg.Stack.S3 == nil {
				return errors.New("no s3 section: start the local stack with `make run` (it writes " + StackFile + "), or pass --stack")
			}
			s := cfg.Stack.S3
			if g.json {
				return writeJSON(a.Stdout, s)
			}
			for _, kv := range [][2]string{
				{"AWS_ACCESS_KEY_ID", s.AccessKey}, {"AWS_SECRET_ACCESS_KEY", s.SecretKey},
				{"AWS_DEFAULT_REGION", s.Region}, {"S3_ENDPOINT", s.Endpoint},
				{"S3_BUCKET", s.Bucket}, {"S3_PREFIX", strings.Trim(s.Prefix, "/")},
			} {
				fmt.Fprintf(a.Stdout, "export %s=%s\n", kv[0], shellJoin([]string{kv[1]}))
			}
			return nil
		}),
	}
}

func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
