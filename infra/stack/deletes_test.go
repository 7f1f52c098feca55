package stack

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// guideRetained reads the logical IDs the deploy guide's deletion table
// names (backquoted, in the first cell of each row of the section
// "Deleting the stack").
func guideRetained(t *testing.T, md string) map[string]bool {
	t.Helper()
	_, section, ok := strings.Cut(md, ". Deleting the stack\n")
	if !ok {
		t.Fatal("docs/deploy.md has no section Deleting the stack")
	}
	ids := map[string]bool{}
	tick := regexp.MustCompile("`([A-Za-z0-9<>]+)`")
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		first := strings.Split(line, "|")[1]
		for _, m := range tick.FindAllStringSubmatch(first, -1) {
			ids[m[1]] = true
		}
	}
	return ids
}

// retainedMissing lists the resources tpl keeps on deletion (DeletionPolicy
// Retain) that the guide's table does not name; "<Function>Logs" names
// every function's log group.
func retainedMissing(tpl map[string]any, guide map[string]bool) []string {
	var out []string
	for id, r := range tpl["Resources"].(map[string]any) {
		if r.(map[string]any)["DeletionPolicy"] != "Retain" {
			continue
		}
		id = samID(id)
		if !guide[id] && !(strings.HasSuffix(id, "FunctionLogs") && guide["<Function>Logs"]) {
			out = append(out, id)
		}
	}
	return out
}

// TestGuideListsRetained: docs/deploy.md's deletion table names every
// resource either template keeps when its stack is deleted.
func TestGuideListsRetained(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	guide := guideRetained(t, string(raw))
	for name, tpl := range map[string]map[string]any{"template.yaml": samRaw(t), "CDK stack": defaultSynth(t).tpl} {
		if missing := retainedMissing(tpl, guide); len(missing) > 0 {
			t.Errorf("%s keeps %v on deletion; the guide's table does not list them", name, missing)
		}
	}
	// Without the key's row, the key is reported.
	without := strings.Replace(string(raw), "(`TokenKey`, KMS", "(KMS", 1)
	if missing := retainedMissing(samRaw(t), guideRetained(t, without)); len(missing) != 1 || missing[0] != LogicalTokenKey {
		t.Errorf("a table without the key's row: missing %v, want [%s]", missing, LogicalTokenKey)
	}
}
