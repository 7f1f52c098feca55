package devstack

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/awslabs/goformation/v7"
	"github.com/awslabs/goformation/v7/cloudformation"
	"github.com/awslabs/goformation/v7/intrinsics"
)

// goformationMu serializes goformation's parsing: its YAML processing
// registers tag resolvers in a package-level map on every call, so two
// stacks started at once in one process would race on it.
var goformationMu sync.Mutex

// OpenTemplate parses a SAM template with goformation, as
// goformation.OpenWithOptions(file, nil) does, after removing the SAM
// properties goformation v7 cannot parse and the local stack does not use
// (unparsedSAM). goformation refuses an unknown property of an HttpApi,
// and reads a Schedule event with one as no Schedule at all. Safe for
// concurrent use.
func OpenTemplate(file string) (*cloudformation.Template, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	goformationMu.Lock()
	defer goformationMu.Unlock()
	js, err := intrinsics.ProcessYAML(raw, nil)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, err
	}
	stripUnparsed(doc)
	js, err = json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	tpl, err := goformation.ParseJSONWithOptions(js, &intrinsics.ProcessorOptions{NoProcess: true})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return tpl, nil
}

// unparsedSAM names the properties stripUnparsed removes, by resource
// type (an event type for a function's events): the HTTP API's access
// logs (goformation spells them AccessLogSetting), a function's log group
// (LoggingConfig) and a schedule's retry policy, which goformation's types
// lack.
var unparsedSAM = map[string][]string{
	"AWS::Serverless::HttpApi":  {"AccessLogSettings"},
	"AWS::Serverless::Function": {"LoggingConfig"},
	"Schedule":                  {"RetryPolicy"},
}

// stripUnparsed removes unparsedSAM's properties from doc's resources and
// from their functions' events.
func stripUnparsed(doc map[string]any) {
	resources, _ := doc["Resources"].(map[string]any)
	for _, r := range resources {
		props := stripProperties(r)
		evs, _ := props["Events"].(map[string]any)
		for _, e := range evs {
			stripProperties(e)
		}
	}
}

// stripProperties removes unparsedSAM's properties of its Type from
// node (a resource or an event) and returns its properties.
func stripProperties(node any) map[string]any {
	n, _ := node.(map[string]any)
	typ, _ := n["Type"].(string)
	props, _ := n["Properties"].(map[string]any)
	for _, p := range unparsedSAM[typ] {
		delete(props, p)
	}
	return props
}
