// Package guide reads the shell blocks of the deploy guide
// (docs/deploy.md), so that a test can run them the way a reader pastes
// them into a shell.
package guide

import "strings"

// ShellBlocks returns the bodies of md's fenced blocks marked sh, bash
// or shell, in order. A block that is never closed runs to the end.
func ShellBlocks(md string) []string {
	var blocks []string
	var cur []string
	in := false
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case !in && isShellFence(trimmed):
			in, cur = true, nil
		case in && trimmed == "```":
			blocks = append(blocks, strings.Join(cur, "\n")+"\n")
			in = false
		case in:
			cur = append(cur, line)
		}
	}
	if in {
		blocks = append(blocks, strings.Join(cur, "\n")+"\n")
	}
	return blocks
}

// isShellFence reports whether line opens a shell code block.
func isShellFence(line string) bool {
	switch strings.TrimPrefix(line, "```") {
	case "sh", "bash", "shell":
		return strings.HasPrefix(line, "```")
	}
	return false
}
