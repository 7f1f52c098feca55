// Command preflight checks, before a deploy, that the AWS account's Lambda
// concurrency fits the broker's overflow policy and waiter limits, and says
// what quota to request when it does not. It only reads: Service Quotas
// GetServiceQuota (Lambda's concurrent executions) and Lambda
// GetAccountSettings, so read-only credentials are enough and nothing
// changes. `make preflight` runs it; flags default to the SANDBOX_*
// variables and then to the deployed defaults.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/servicequotas"

	"github.com/sandbox-broker/sandbox-broker/internal/preflight"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "preflight: aws config:", err)
		os.Exit(2)
	}
	os.Exit(preflight.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, servicequotas.NewFromConfig(cfg), lambda.NewFromConfig(cfg)))
}
