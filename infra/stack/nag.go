package stack

import (
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// ApplyNag adds cdk-nag's AwsSolutions rule pack to scope (the app): every
// finding that is not suppressed below becomes an error annotation, which
// fails `cdk synth`/`cdk deploy` and the tests in this package.
func ApplyNag(scope constructs.IConstruct) {
	awscdk.Aspects_Of(scope).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
}

// Suppression is one accepted cdk-nag finding and why.
type Suppression struct {
	Rule      string
	AppliesTo []string // finding details it covers ("" = the whole rule)
	Reason    string
}

// suppressions records every accepted finding on the construct it
// concerns, with its reason.
func (s *Stack) suppressions() {
	add := func(c constructs.IConstruct, sup ...Suppression) {
		var list []*cdknag.NagPackSuppression
		for _, x := range sup {
			p := &cdknag.NagPackSuppression{Id: jsii.String(x.Rule), Reason: jsii.String(x.Reason)}
			if len(x.AppliesTo) > 0 {
				var at []any
				for _, a := range x.AppliesTo {
					at = append(at, a)
				}
				p.AppliesTo = &at
			}
			list = append(list, p)
		}
		cdknag.NagSuppressions_AddResourceSuppressions(c, &list, jsii.Bool(true))
	}
	for _, f := range Functions {
		add(s.Stack.Node().FindChild(jsii.String(f.LogicalID+"Policy")), Suppression{
			Rule:      "AwsSolutions-IAM5",
			AppliesTo: []string{"Resource::<" + LogicalBucket + ".Arn>/<OutputPrefix>/*"},
			Reason: "Objects are written under <prefix>/<tenant>/<user>/<thread>/ with keys chosen at run time; " +
				"a trailing wildcard under the configured output prefix is the only way IAM can name them, " +
				"and it keeps the functions out of the rest of the bucket.",
		})
	}
	for _, f := range Functions {
		for _, r := range f.Routes {
			if !r.Public() {
				continue
			}
			add(s.API.Node().FindChild(jsii.String(r.Method+strings.ReplaceAll(r.Path, "/", "--"))), Suppression{
				Rule: "AwsSolutions-APIG4",
				Reason: "A provider webhook: E2B cannot present the tenants' JWTs. The handler verifies each delivery's signature " +
					"(SHA-256 of a shared secret and the body), refuses stale and replayed ones, and changes nothing otherwise.",
			})
		}
	}
	add(s.WebhookSecret, Suppression{
		Rule: "AwsSolutions-SMG4",
		Reason: "The secret is shared with E2B, which signs webhooks with it; a rotation must re-register the webhook at E2B, " +
			"which no rotation function can do. Rotate by putting a new value and updating the registration (docs/operations.md).",
	})
	if sec := s.Stack.Node().TryFindChild(jsii.String(LogicalSecret)); sec != nil {
		add(sec, Suppression{
			Rule: "AwsSolutions-SMG4",
			Reason: "The secret holds an E2B API key, issued in E2B's dashboard; E2B has no API to create or revoke keys, " +
				"so no rotation function can exist. Rotate by putting a new value; functions read it within 5 minutes, or at once when E2B refuses the old one.",
		})
	}
}
