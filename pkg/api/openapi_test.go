package api_test

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

func load(t *testing.T, data []byte) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(data)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the document is not valid OpenAPI: %v", err)
	}
	return doc
}

// TestDocumentIsValid: the YAML and the JSON served at /v1/openapi.json
// are valid OpenAPI 3.1 and the same document.
func TestDocumentIsValid(t *testing.T) {
	doc := load(t, api.OpenAPIYAML)
	if !doc.IsOpenAPI31OrLater() {
		t.Errorf("openapi %q, want 3.1", doc.OpenAPI)
	}
	js, err := api.OpenAPIJSON()
	if err != nil {
		t.Fatal(err)
	}
	fromJSON := load(t, js)
	a, _ := json.Marshal(doc)
	b, _ := json.Marshal(fromJSON)
	if string(a) != string(b) {
		t.Errorf("the JSON form differs from the YAML document")
	}
}

func enum(t *testing.T, doc *openapi3.T, name string) []string {
	t.Helper()
	ref := doc.Components.Schemas[name]
	if ref == nil || ref.Value == nil {
		t.Fatalf("no schema %s", name)
	}
	var out []string
	for _, v := range ref.Value.Enum {
		out = append(out, v.(string))
	}
	sort.Strings(out)
	return out
}

func sorted[S ~string](vs ...S) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// TestEnumsMatchConstants: the error codes, reasons and acquire sources
// the document lists are exactly the broker's constants, plus the fields a
// VALIDATION_ERROR names and the empty reason of errors that carry none.
func TestEnumsMatchConstants(t *testing.T) {
	doc := load(t, api.OpenAPIYAML)
	if got, want := enum(t, doc, "ErrorCode"), sorted(api.ErrorCodes()...); !slices.Equal(got, want) {
		t.Errorf("ErrorCode enum %q\nconstants        %q", got, want)
	}
	validationFields := []string{"user_id", "thread_id", "sandbox_id", "tenant"}
	reasons := append(append(append([]string{""}, api.ErrorReasons()...), sorted(api.RefusalReasons()...)...), validationFields...)
	if got, want := enum(t, doc, "ErrorReason"), sorted(reasons...); !slices.Equal(got, want) {
		t.Errorf("ErrorReason enum %q\nconstants          %q", got, want)
	}
	if got, want := enum(t, doc, "AcquireSource"), sorted(core.Sources()...); !slices.Equal(got, want) {
		t.Errorf("AcquireSource enum %q\nconstants            %q", got, want)
	}
}

// TestRepliesAreClosed: every object schema a reply can carry forbids
// unknown properties, so a reply field the document does not list fails
// the end-to-end tests that check replies against it.
func TestRepliesAreClosed(t *testing.T) {
	doc := load(t, api.OpenAPIYAML)
	seen := map[*openapi3.Schema]bool{}
	var walk func(where string, s *openapi3.SchemaRef)
	walk = func(where string, s *openapi3.SchemaRef) {
		if s == nil || s.Value == nil || seen[s.Value] {
			return
		}
		v := s.Value
		seen[v] = true
		open := v.Type.Is("object") && len(v.Properties) > 0 && (v.AdditionalProperties.Has == nil || *v.AdditionalProperties.Has)
		if open {
			t.Errorf("%s: object with properties that allows others (set additionalProperties: false)", where)
		}
		for name, p := range v.Properties {
			walk(where+"."+name, p)
		}
		for i, sub := range slices.Concat(v.OneOf, v.AnyOf, v.AllOf) {
			walk(where+"|"+string(rune('0'+i)), sub)
		}
		walk(where+"[]", v.Items)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for status, resp := range op.Responses.Map() {
				for ct, mt := range resp.Value.Content {
					walk(method+" "+path+" "+status+" "+ct, mt.Schema)
				}
			}
		}
	}
	if len(seen) < 10 {
		t.Fatalf("walked %d schemas: the walk is broken", len(seen))
	}
}
