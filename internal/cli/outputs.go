package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
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

// threadPrefix is "<prefix>/<tenant>/<user>/<thread>/" (README.md,
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
	var user, thread string
	cmd := &cobra.Command{
		Use:   "ls-outputs --user U --thread T",
		Short: "List the thread's files in S3 (from the s3 section of .run/stack.json)",
		Long: `List the objects release and sync copied to S3 for a thread:
s3://<bucket>/<prefix>/<tenant>/<user>/<thread>/{outputs,workspace}/...
The endpoint, credentials, bucket and prefix come from the stack file's "s3" section
(local stack only); the tenant from --tenant, SBX_TENANT or the token picked from the stack.`,
		Args: exactArgs(0, "no arguments"),
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if user == "" || thread == "" {
				return usageError{errors.New("ls-outputs needs --user and --thread")}
			}
			cfg, err := a.config(g, false)
			if err != nil {
				return err
			}
			if cfg.Stack == nil || cfg.Stack.S3 == nil || cfg.Stack.S3.Bucket == "" {
				return errors.New("ls-outputs needs the s3 section of " + StackFile + " (start the local stack with `make run`, or pass --stack)")
			}
			if cfg.Tenant == "" {
				return usageError{errors.New("ls-outputs cannot tell the tenant: pass --tenant")}
			}
			s := cfg.Stack.S3
			region := s.Region
			if region == "" {
				region = "us-east-1"
			}
			cl := s3.New(s3.Options{
				Region:       region,
				BaseEndpoint: nilIfEmpty(s.Endpoint),
				UsePathStyle: true,
				Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
				HTTPClient:   a.HTTPClient,
			})
			ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
			defer cancel()
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
	return cmd
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
