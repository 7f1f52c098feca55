package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// sessionMarker is the HTML comment of README.md that precedes the sbx
// session a reader runs after `make run`.
const sessionMarker = "<!-- sbx-session:"

// readmeSession returns the first ```sh block after sessionMarker.
func readmeSession(t *testing.T, md string) string {
	t.Helper()
	return blockAfter(t, md, sessionMarker, "sh")
}

// blockAfter returns the first fenced block of language lang after the
// first occurrence of marker in md.
func blockAfter(t *testing.T, md, marker, lang string) string {
	t.Helper()
	_, after, ok := strings.Cut(md, marker)
	if !ok {
		t.Fatalf("README.md has no %q", marker)
	}
	_, block, ok := strings.Cut(after, "\n```"+lang+"\n")
	if !ok {
		t.Fatalf("README.md: no ```%s block after %q", lang, marker)
	}
	block, _, ok = strings.Cut(block, "\n```")
	if !ok {
		t.Fatalf("README.md: the block after %q does not end", marker)
	}
	return block + "\n"
}

// TestReadmeSession runs README.md's sbx session as a reader pastes it
// from the repository while `make run` is going: in a directory whose
// .build/bin holds sbx built from this source, with the stack file of a
// local stack as SBX_STACK (what `make run` writes to .run/stack.json).
// Every command must succeed, and the stored output must be listed. Then
// it runs the README's Python example against the same stack.
func TestReadmeSession(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	session := readmeSession(t, string(md))
	s := startStackWith(t, stackOptions{provider: "e2b"})
	dir := t.TempDir()
	buildSbx(t, root, filepath.Join(dir, ".build", "bin", "sbx"))
	cmd := exec.Command("bash", "-c", "set -euo pipefail\nset -x\n"+session)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SBX_STACK="+s.StackFile, "SBX_TOKEN=", "SBX_API_URL=", "SBX_TENANT=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's session failed: %v\n%s", err, out)
	}
	for _, want := range []string{"42", "# Report", "outputs/report.md"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the session's output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("%s", out)

	// The README's Python example, on the same stack: its URL and token
	// are make run's, which this stack's replace.
	py := blockAfter(t, string(md), "## The same from Python", "python")
	py = strings.NewReplacer(`"http://127.0.0.1:8787"`, `"`+s.Info.APIURL+`"`, `"dev-token"`, `"`+tokenA+`"`).Replace(py)
	run := exec.Command(python3(t), "-c", py)
	run.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "clients", "python"))
	pyOut, err := run.CombinedOutput()
	if err != nil || !strings.Contains(string(pyOut), "42") || !strings.Contains(string(pyOut), "warm") {
		t.Fatalf("the README's Python example: %v\n%s", err, pyOut)
	}
}

// TestReadmeSessionFound: the session block is found and holds the steps
// the README promises (acquire, exec, release, the stored outputs).
func TestReadmeSessionFound(t *testing.T) {
	md, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	session := readmeSession(t, string(md))
	for _, step := range []string{"sbx acquire", "sbx exec", "sbx release", "sbx ls-outputs"} {
		if !strings.Contains(session, step) {
			t.Errorf("the README's session lacks %q", step)
		}
	}
	if n := strings.Count(strings.TrimSpace(session), "\n") + 1; n > 12 {
		t.Errorf("the README's session has %d lines; keep it about ten", n)
	}
}
