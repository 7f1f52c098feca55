package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/client"
	"github.com/spf13/cobra"
)

func (a *App) execCmd(g *globals) *cobra.Command {
	var (
		cf      connFlags
		script  string
		envs    []string
		cwd     string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec ID [-c SCRIPT | -- CMD [ARGS...]]",
		Short: "Run a command in the sandbox, streaming its output; exits with its exit code",
		Long: `Run a command in the sandbox through its connection (no provider API key needed):
envd (output streamed) or the AIO sandbox API (output written when the command ends), as the
connection's protocol says.
CMD and ARGS are quoted for the shell, so they arrive as given; -c runs a bash script instead.
Values passed with -e KEY=VALUE go to the process environment, never into the command line.
sbx exits with the command's exit code.`,
		Example: `  sbx exec $ID -- python3 analyse.py uploads/data.csv
  sbx exec $ID -c 'ls -l outputs/ && wc -l uploads/*.csv'
  sbx exec $ID -e NAME=value -c 'echo "$NAME"'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 {
				return usageError{errors.New("exec needs a sandbox id")}
			}
			rest := args[1:]
			if (script == "") == (len(rest) == 0) {
				return usageError{errors.New("exec needs either -c SCRIPT or -- CMD [ARGS...] (not both)")}
			}
			return nil
		},
		RunE: run(func(cmd *cobra.Command, args []string) error {
			env := map[string]string{}
			for _, kv := range envs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return usageError{fmt.Errorf("-e %q: want KEY=VALUE", kv)}
				}
				env[k] = v
			}
			s := script
			if s == "" {
				s = shellJoin(args[1:])
			}
			e, err := a.envd(cmd.Context(), g, cf, args[0])
			if err != nil {
				return err
			}
			code, err := e.Exec(cmd.Context(), client.ExecRequest{
				Script: s, Env: env, Cwd: cwd, Timeout: timeout, Stdout: a.Stdout, Stderr: a.Stderr,
			})
			if err != nil {
				if errors.Is(err, client.ErrSandboxUnreachable) {
					return fmt.Errorf("%w (is it released or gone? `sbx status %s`)", err, args[0])
				}
				return err
			}
			if code != 0 {
				return exitCode(code)
			}
			return nil
		}),
	}
	cf.add(cmd)
	cmd.Flags().StringVarP(&script, "script", "c", "", "bash script to run instead of CMD ARGS")
	cmd.Flags().StringArrayVarP(&envs, "env", "e", nil, "KEY=VALUE for the process environment (repeatable)")
	cmd.Flags().StringVarP(&cwd, "cwd", "w", "", "working directory (default: the sandbox home, "+client.SandboxHome+")")
	cmd.Flags().DurationVar(&timeout, "cmd-timeout", client.DefaultExecTimeout, "kill the command after this long")
	return cmd
}

// shellJoin quotes each word for bash so it arrives unchanged.
func shellJoin(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		if w != "" && strings.IndexFunc(w, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) < 0 {
			q[i] = w
			continue
		}
		q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

func (a *App) putCmd(g *globals) *cobra.Command {
	var cf connFlags
	cmd := &cobra.Command{
		Use:   "put ID LOCAL REMOTE",
		Short: "Upload a local file (or - for stdin) to REMOTE in the sandbox",
		Long: `Upload LOCAL (or - for stdin) to REMOTE in the sandbox; parent directories are created.
A relative REMOTE is taken from the sandbox home (` + client.SandboxHome + `).`,
		Example: `  sbx put $ID sales.csv uploads/sales.csv`,
		Args:    exactArgs(3, "ID LOCAL REMOTE"),
		RunE: run(func(cmd *cobra.Command, args []string) error {
			id, local, remote := args[0], args[1], args[2]
			if err := checkID(id); err != nil {
				return err
			}
			var r io.Reader = a.Stdin
			var size int64 = -1
			if local != "-" {
				f, err := os.Open(a.abs(local))
				if err != nil {
					return err
				}
				defer f.Close()
				if st, err := f.Stat(); err == nil {
					size = st.Size()
				}
				r = f
			}
			e, err := a.envd(cmd.Context(), g, cf, id)
			if err != nil {
				return err
			}
			cr := &countingReader{r: r}
			if err := e.PutFile(cmd.Context(), remote, cr); err != nil {
				return err
			}
			if size >= 0 && cr.n != size {
				return fmt.Errorf("put %s: sent %d of %d bytes", local, cr.n, size)
			}
			dst := client.ResolvePath(remote)
			if g.json {
				return writeJSON(a.Stdout, map[string]any{"sandbox_id": id, "path": dst, "bytes": cr.n})
			}
			fmt.Fprintf(a.Stdout, "uploaded %d bytes to %s:%s\n", cr.n, id, dst)
			return nil
		}),
	}
	cf.add(cmd)
	return cmd
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (a *App) abs(p string) string {
	if filepath.IsAbs(p) || a.Dir == "" {
		return p
	}
	return filepath.Join(a.Dir, p)
}

func (a *App) getCmd(g *globals) *cobra.Command {
	var cf connFlags
	cmd := &cobra.Command{
		Use:   "get ID REMOTE [LOCAL|-]",
		Short: "Download REMOTE from the sandbox to LOCAL (default: its base name here; - for stdout)",
		Example: `  sbx get $ID outputs/report.md
  sbx get $ID outputs/report.md -`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 2 || len(args) > 3 {
				return usageError{fmt.Errorf("want ID REMOTE [LOCAL|-], got %d argument(s)", len(args))}
			}
			return nil
		},
		RunE: run(func(cmd *cobra.Command, args []string) error {
			id, remote := args[0], args[1]
			local := path.Base(client.ResolvePath(remote))
			if len(args) == 3 {
				local = args[2]
			}
			e, err := a.envd(cmd.Context(), g, cf, id)
			if err != nil {
				return err
			}
			if local == "-" {
				_, err := e.GetFile(cmd.Context(), remote, a.Stdout)
				return err
			}
			dst := a.abs(local)
			if st, err := os.Stat(dst); err == nil && st.IsDir() {
				dst = filepath.Join(dst, path.Base(client.ResolvePath(remote)))
			}
			// Write to a temp file first so a failed download leaves no partial file.
			f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*.part")
			if err != nil {
				return err
			}
			defer os.Remove(f.Name())
			n, err := e.GetFile(cmd.Context(), remote, f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Chmod(f.Name(), 0o644); err != nil {
				return err
			}
			if err := os.Rename(f.Name(), dst); err != nil {
				return err
			}
			if g.json {
				return writeJSON(a.Stdout, map[string]any{"sandbox_id": id, "path": client.ResolvePath(remote), "local": dst, "bytes": n})
			}
			fmt.Fprintf(a.Stdout, "downloaded %d bytes to %s\n", n, dst)
			return nil
		}),
	}
	cf.add(cmd)
	return cmd
}
