package config

import (
	"go/ast"
	goparser "go/parser"
	"go/token"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// envConstants parses this package's non-test sources and returns the
// values of every string constant whose name starts with "Env".
func envConstants(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var values []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := goparser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, "Env") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Errorf("%s: want a string literal", id.Name)
						continue
					}
					v, _ := strconv.Unquote(lit.Value)
					values = append(values, v)
				}
			}
		}
	}
	sort.Strings(values)
	return values
}

func TestVariableNamesListsEveryEnvConstant(t *testing.T) {
	got, want := VariableNames(), envConstants(t)
	if len(want) < 10 {
		t.Fatalf("found only %d Env* constants: parser broken?", len(want))
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("VariableNames() = %v\nEnv* constants = %v\n(add new Env* constants to names.go)", got, want)
	}
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("VariableNames() = %v, want sorted and unique", got)
	}
}

func TestParseAPIKeySecretARN(t *testing.T) {
	const arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:e2b-AbCdEf"
	env := func(extra ...string) []string {
		return append([]string{"TABLE_NAME=t", "OUTPUT_BUCKET=b", "SANDBOX_DEPLOYMENT_ID=staging", "TOKEN_LOCAL_KEY=" + testLocalKey}, extra...)
	}
	c, _, err := Parse(env("E2B_API_KEY_SECRET_ARN=" + arn))
	if err != nil {
		t.Fatalf("Parse with only the secret ARN: %v", err)
	}
	if c.E2B.APIKeySecretARN != arn || c.E2B.APIKey != "" {
		t.Errorf("E2B = %+v, want the ARN and no key", c.E2B)
	}
	tests := []struct {
		name string
		env  []string
		want string // variable the error must name
	}{
		{"neither", env(), "E2B_API_KEY"},
		{"both", env("E2B_API_KEY=k", "E2B_API_KEY_SECRET_ARN="+arn), "E2B_API_KEY"},
		{"not an arn", env("E2B_API_KEY_SECRET_ARN=my-secret"), "E2B_API_KEY_SECRET_ARN"},
		{"other service", env("E2B_API_KEY_SECRET_ARN=arn:aws:ssm:eu-west-1:1:parameter/x"), "E2B_API_KEY_SECRET_ARN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Parse(tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want+":") {
				t.Errorf("Parse(%v) error = %v, want one naming %s", tt.env, err, tt.want)
			}
		})
	}
}
