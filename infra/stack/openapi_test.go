package stack

import (
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// TestRoutesMatchOpenAPI: the deployed routes (which TestRoutesMatchHandler
// holds to the handler and TestParity to template.yaml) are exactly the
// operations of the API's OpenAPI document, so a route added without the
// document fails.
func TestRoutesMatchOpenAPI(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPIYAML)
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
		// API Gateway's extension for an ANY route (OpenAPI has no such
		// method).
		if _, ok := item.Extensions["x-amazon-apigateway-any-method"]; ok {
			documented = append(documented, "ANY "+path)
		}
	}
	sort.Strings(documented)
	deployed := deployedRoutes()
	if len(deployed) == 0 || !reflect.DeepEqual(documented, deployed) {
		t.Errorf("pkg/api/openapi.yaml documents %q\ninfra/stack deploys          %q", documented, deployed)
	}
}

// deployedRoutes are the route keys of Functions, sorted.
func deployedRoutes() []string {
	var keys []string
	for _, f := range Functions {
		for _, r := range f.Routes {
			keys = append(keys, r.Key())
		}
	}
	sort.Strings(keys)
	return keys
}
