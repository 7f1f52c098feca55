package api

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"sync"

	"gopkg.in/yaml.v3"
)

// OpenAPIYAML is the OpenAPI 3.1 document of the HTTP API, as written.
//
//go:embed openapi.yaml
var OpenAPIYAML []byte

var openapiJSON = sync.OnceValues(func() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(OpenAPIYAML, &doc); err != nil {
		return nil, fmt.Errorf("openapi.yaml: %w", err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("openapi.yaml to JSON: %w", err)
	}
	return b, nil
})

// OpenAPIJSON is the document as JSON (what GET /v1/openapi.json answers).
// It fails only if the embedded YAML does not parse, which the package's
// tests rule out.
func OpenAPIJSON() ([]byte, error) { return openapiJSON() }
