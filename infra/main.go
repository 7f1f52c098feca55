// Command infra synthesizes the sandbox-broker CDK app (stack
// "SandboxBroker", see infra/stack). `make synth` runs it with
// CDK_OUTDIR=cdk.out; `make deploy` deploys that output with the cdk CLI.
// Settings come from CDK context (infra/stack.PropsFromContext) and from
// CloudFormation parameters at deploy time.
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/cxapi"
	"github.com/aws/jsii-runtime-go"

	"github.com/sandbox-broker/sandbox-broker/infra/stack"
)

func main() {
	defer jsii.Close()
	app := awscdk.NewApp(nil)
	props, err := stack.PropsFromContext(app.Node())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		jsii.Close()
		os.Exit(2)
	}
	props.Env = &awscdk.Environment{
		Account: envOrNil("CDK_DEFAULT_ACCOUNT"),
		Region:  envOrNil("CDK_DEFAULT_REGION"),
	}
	stack.New(app, "SandboxBroker", props)
	stack.ApplyNag(app)
	asm := app.Synth(nil)
	// Error annotations (unsuppressed cdk-nag findings among them) fail
	// `cdk deploy`; fail a plain `go run ./infra` (make synth) too.
	failed := false
	for _, st := range *asm.Stacks() {
		for _, m := range *st.Messages() {
			if m.Level == cxapi.SynthesisMessageLevel_ERROR {
				fmt.Fprintf(os.Stderr, "error: %s: %v\n", *m.Id, m.Entry.Data)
				failed = true
			}
		}
	}
	if failed {
		jsii.Close()
		os.Exit(1)
	}
}

func envOrNil(name string) *string {
	if v := os.Getenv(name); v != "" {
		return jsii.String(v)
	}
	return nil
}
