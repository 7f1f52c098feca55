package doccheck

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
)

// root is the repository, two levels up.
var root = filepath.Join("..", "..")

// pages returns README.md and every docs/*.md, by path relative to root.
func pages(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		out[filepath.ToSlash(rel)] = string(b)
	}
	return out
}

// prose returns md without its fenced code blocks and HTML comments; each
// removed line is kept as an empty line, so line numbers stay.
func prose(md string) []string {
	var out []string
	fence := ""
	inComment := false
	for _, line := range strings.Split(md, "\n") {
		trim := strings.TrimSpace(line)
		switch {
		case fence != "":
			if strings.HasPrefix(trim, fence) {
				fence = ""
			}
			line = ""
		case strings.HasPrefix(trim, "```") || strings.HasPrefix(trim, "~~~"):
			fence = trim[:3]
			line = ""
		case inComment:
			if strings.Contains(trim, "-->") {
				inComment = false
			}
			line = ""
		case strings.HasPrefix(trim, "<!--"):
			inComment = !strings.Contains(trim, "-->")
			line = ""
		}
		out = append(out, line)
	}
	return out
}

// slug is GitHub's anchor for a heading: lower case, inline markup and
// punctuation dropped (letters, digits, spaces, '-' and '_' kept), spaces
// made '-'.
func slug(heading string) string {
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && isLetter(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isLetter(r rune) bool { return strings.ToLower(string(r)) != strings.ToUpper(string(r)) }

// anchors returns md's heading anchors, GitHub-style (a repeated heading's
// later anchors get -1, -2, ...).
func anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(md) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(h, " ") {
			continue
		}
		s := slug(h)
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)
var codeSpanRE = regexp.MustCompile("`[^`]*`")

// TestLinksResolve: every relative link of README.md and docs/*.md names a
// file or directory of the repository, and every #anchor (on its own, or
// after a Markdown file) is a heading of the page it names.
func TestLinksResolve(t *testing.T) {
	all := pages(t)
	for name, md := range all {
		for i, line := range prose(md) {
			line = codeSpanRE.ReplaceAllString(line, "")
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				page := name
				if path != "" {
					page = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(name), path)))
					if strings.HasPrefix(page, "..") {
						t.Errorf("%s:%d: link %s leaves the repository", name, i+1, target)
						continue
					}
					if _, err := os.Stat(filepath.Join(root, page)); err != nil {
						t.Errorf("%s:%d: link %s: no file %s", name, i+1, target, page)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				md, ok := all[page]
				if !ok {
					if !strings.HasSuffix(page, ".md") {
						t.Errorf("%s:%d: link %s: an anchor into a file that is not a page", name, i+1, target)
						continue
					}
					b, err := os.ReadFile(filepath.Join(root, page))
					if err != nil {
						t.Errorf("%s:%d: link %s: %v", name, i+1, target, err)
						continue
					}
					md = string(b)
				}
				if !anchors(md)[anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading #%s", name, i+1, target, page, anchor)
				}
			}
		}
	}
}

// maxWords is the longest sentence README.md and docs/ may hold.
const maxWords = 40

// units splits md's prose into the texts whose sentences are counted:
// paragraphs (lines joined up to a blank line, a heading or a list item),
// list items, and table cells, each on its own. Code blocks and HTML
// comments are left out; tables are not exempt, each cell counts alone.
func units(md string) []struct {
	line int
	text string
} {
	var out []struct {
		line int
		text string
	}
	var cur []string
	start := 0
	flush := func() {
		if len(cur) > 0 {
			out = append(out, struct {
				line int
				text string
			}{start, strings.Join(cur, " ")})
		}
		cur = nil
	}
	item := regexp.MustCompile(`^\s*([-*+]|\d+\.)\s+`)
	for i, line := range prose(md) {
		trim := strings.TrimSpace(line)
		switch {
		case trim == "" || strings.HasPrefix(trim, "#"):
			flush()
			if trim != "" {
				out = append(out, struct {
					line int
					text string
				}{i + 1, trim})
			}
		case strings.HasPrefix(trim, "|"):
			flush()
			for _, cell := range strings.Split(strings.Trim(trim, "|"), "|") {
				out = append(out, struct {
					line int
					text string
				}{i + 1, cell})
			}
		case item.MatchString(line):
			flush()
			start = i + 1
			cur = []string{item.ReplaceAllString(line, "")}
		default:
			if len(cur) == 0 {
				start = i + 1
			}
			cur = append(cur, trim)
		}
	}
	flush()
	return out
}

// sentenceEnd is the end of a sentence: '.', '!' or '?' (after an optional
// closing quote or bracket) followed by a space.
var sentenceEnd = regexp.MustCompile(`[.!?]["')\]]*\s+`)

// sentences returns text's sentences, inline code and link targets
// removed (a code span counts as one word).
func sentences(text string) []string {
	text = codeSpanRE.ReplaceAllString(text, "code")
	text = regexp.MustCompile(`\]\([^)]*\)`).ReplaceAllString(text, "]")
	return sentenceEnd.Split(text+" ", -1)
}

// TestSentencesAreShort: no sentence of README.md or docs/*.md runs past
// maxWords words.
func TestSentencesAreShort(t *testing.T) {
	for name, md := range pages(t) {
		for _, u := range units(md) {
			for _, s := range sentences(u.text) {
				if n := len(strings.Fields(s)); n > maxWords {
					t.Errorf("%s:%d: a sentence of %d words (at most %d): %q", name, u.line, n, maxWords, s)
				}
			}
		}
	}
}

func TestSentenceSplitter(t *testing.T) {
	long := strings.Repeat("word ", maxWords+1)
	if got := sentences("Short one. " + long + "end."); len(strings.Fields(got[1])) <= maxWords {
		t.Errorf("a long sentence was split: %q", got)
	}
	if got := sentences("One `a. b` two. Three."); len(got) != 3 || strings.TrimSpace(got[0]) != "One code two" {
		t.Errorf("sentences: %q", got)
	}
}

// configVariables returns every environment variable the code reads that a
// user may set, by this rule:
//   - the functions' variables: config.VariableNames() (internal/config);
//   - the local stack's, sbx's and the preflight's: every string constant or
//     literal of the form NAME passed to a call named Getenv, LookupEnv,
//     getenv, envOr or envInt in the Go files (tests excepted) of cmd/,
//     internal/cli, internal/devstack, internal/preflight and
//     internal/wiring, and every constant of those files named Env…
//     that holds such a NAME (sbx picks its variables from a table of
//     them), except the general PATH, HOME and TMPDIR;
//   - the sandbox limits: the names sandboxhost.LimitsFromEnv reads under
//     each prefix those files pass it.
func configVariables(t *testing.T) map[string]bool {
	t.Helper()
	vars := map[string]bool{}
	for _, v := range config.VariableNames() {
		vars[v] = true
	}
	name := regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	readers := map[string]bool{"Getenv": true, "LookupEnv": true, "getenv": true, "envOr": true, "envInt": true}
	var prefixes []string
	for _, dir := range []string{"cmd", "internal/cli", "internal/devstack", "internal/preflight", "internal/wiring"} {
		pkgs := map[string][]*ast.File{}
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
			if err != nil {
				return err
			}
			pkgs[filepath.Dir(p)] = append(pkgs[filepath.Dir(p)], f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, files := range pkgs {
			consts := map[string]string{}
			for _, f := range files {
				ast.Inspect(f, func(n ast.Node) bool {
					if vs, ok := n.(*ast.ValueSpec); ok {
						for i, id := range vs.Names {
							if i < len(vs.Values) {
								if s, ok := stringLit(vs.Values[i]); ok {
									consts[id.Name] = s
									if strings.HasPrefix(id.Name, "Env") && name.MatchString(s) {
										vars[s] = true
									}
								}
							}
						}
					}
					return true
				})
			}
			value := func(e ast.Expr) (string, bool) {
				if s, ok := stringLit(e); ok {
					return s, true
				}
				if id, ok := e.(*ast.Ident); ok {
					s, ok := consts[id.Name]
					return s, ok
				}
				return "", false
			}
			for _, f := range files {
				ast.Inspect(f, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					fn := ""
					switch c := call.Fun.(type) {
					case *ast.Ident:
						fn = c.Name
					case *ast.SelectorExpr:
						fn = c.Sel.Name
					}
					if fn == "LimitsFromEnv" && len(call.Args) == 2 {
						if s, ok := value(call.Args[1]); ok {
							prefixes = append(prefixes, s)
						}
					}
					if !readers[fn] {
						return true
					}
					for _, a := range call.Args {
						if s, ok := value(a); ok && name.MatchString(s) {
							vars[s] = true
						}
					}
					return true
				})
			}
		}
	}
	if len(prefixes) == 0 {
		t.Fatal("no call of sandboxhost.LimitsFromEnv found: the rule needs updating")
	}
	for _, p := range prefixes {
		if _, err := sandboxhost.LimitsFromEnv(func(k string) string { vars[k] = true; return "" }, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, general := range []string{"PATH", "HOME", "TMPDIR"} {
		delete(vars, general)
	}
	return vars
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// documentedVariables returns the variables docs/configuration.md's tables
// list: the backquoted names in the first cell of every row of a table
// whose header's first cell is "variable".
func documentedVariables(t *testing.T, md string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	in := false
	tick := regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")
	for _, line := range prose(md) {
		if !strings.HasPrefix(line, "|") {
			in = false
			continue
		}
		first := strings.Split(strings.Trim(line, "|"), "|")[0]
		if strings.TrimSpace(first) == "variable" {
			in = true
			continue
		}
		if !in || strings.HasPrefix(line, "|--") {
			continue
		}
		for _, m := range tick.FindAllStringSubmatch(first, -1) {
			out[m[1]] = true
		}
	}
	return out
}

// TestConfigurationListsEveryVariable: docs/configuration.md lists every
// variable configVariables finds, and no other.
func TestConfigurationListsEveryVariable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	want, got := configVariables(t), documentedVariables(t, string(b))
	for _, v := range sorted(want) {
		if !got[v] {
			t.Errorf("the code reads %s; docs/configuration.md does not list it", v)
		}
	}
	for _, v := range sorted(got) {
		if !want[v] {
			t.Errorf("docs/configuration.md lists %s; the code does not read it", v)
		}
	}
}

func sorted(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// templateRoutes returns template.yaml's HTTP API routes as "METHOD /path"
// (each HttpApi event's Method and Path properties).
func templateRoutes(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	method, inAPI := "", false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "Type:"):
			inAPI, method = strings.TrimSpace(strings.TrimPrefix(line, "Type:")) == "HttpApi", ""
		case inAPI && strings.HasPrefix(line, "Method:"):
			method = strings.TrimSpace(strings.TrimPrefix(line, "Method:"))
		case inAPI && strings.HasPrefix(line, "Path:") && method != "":
			out = append(out, method+" "+strings.TrimSpace(strings.TrimPrefix(line, "Path:")))
			inAPI = false
		}
	}
	if len(out) < 5 {
		t.Fatalf("template.yaml: found only the routes %v", out)
	}
	return out
}

// TestAPIListsEveryRoute: docs/api.md names every route of template.yaml,
// written `METHOD /path`.
func TestAPIListsEveryRoute(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range templateRoutes(t) {
		if !strings.Contains(string(b), "`"+r+"`") {
			t.Errorf("template.yaml routes %s; docs/api.md does not name it (as `%s`)", r, r)
		}
	}
}

// TestAPIListsEveryEventKind: docs/api.md names every lifecycle event
// kind the broker publishes, written `kind` or `sandbox.kind`.
func TestAPIListsEveryEventKind(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range core.EventKinds() {
		if !strings.Contains(string(b), "`"+string(k)+"`") && !strings.Contains(string(b), "`sandbox."+string(k)+"`") {
			t.Errorf("the broker publishes sandbox.%s; docs/api.md does not name it", k)
		}
	}
}

// TestReadmeFrontDoor: the README stays a front door (at most 200 lines)
// whose first screen gives the two commands that work on a fresh machine.
func TestReadmeFrontDoor(t *testing.T) {
	md := pages(t)["README.md"]
	lines := strings.Split(strings.TrimRight(md, "\n"), "\n")
	if len(lines) > 200 {
		t.Errorf("README.md has %d lines; at most 200", len(lines))
	}
	screen := strings.Join(lines[:min(len(lines), 40)], "\n")
	for _, cmd := range []string{"make run", "make test"} {
		if !strings.Contains(screen, cmd) {
			t.Errorf("README.md's first 40 lines do not give %q", cmd)
		}
	}
}

// TestSlugIsGitHubs: headings get the anchors GitHub gives them.
func TestSlugIsGitHubs(t *testing.T) {
	for heading, want := range map[string]string{
		"2. Check the account's concurrency": "2-check-the-accounts-concurrency",
		"`.run/stack.json`":                  "runstackjson",
		"Capacity at scale (no hot keys)":    "capacity-at-scale-no-hot-keys",
		"The same with an E2B SDK":           "the-same-with-an-e2b-sdk",
		"Build and test times":               "build-and-test-times",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
	if a := anchors("# A\n## A\n```\n# not a heading\n```\n"); !a["a"] || !a["a-1"] || a["not-a-heading"] {
		t.Errorf("anchors: %v", a)
	}
}

// TestDocumentedVariablesReadsTheTable: the parser reads every name of a
// row's first cell, and only in tables headed "variable".
func TestDocumentedVariablesReadsTheTable(t *testing.T) {
	md := "| variable | default |\n|---|---|\n| `A_B`, `C` | `D_E` |\n| – | `F` |\n\n| flag | environment |\n|---|---|\n| `--x` | `G` |\n"
	got := documentedVariables(t, md)
	if len(got) != 2 || !got["A_B"] || !got["C"] {
		t.Errorf("documentedVariables = %v, want A_B and C", got)
	}
}
