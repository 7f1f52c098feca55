// Package cli implements `sbx`, the command-line client of sandbox-broker:
// acquire a sandbox for a (user, thread), run commands and move files in it
// through its connection (E2B envd or the AIO sandbox API, as the
// connection's protocol says), release and sync it, read its record, the
// capacity, the thread's outputs in S3, and drain or undrain the deployment
// (admin tenants). cmd/sbx only wires it to os.
//
// Configuration precedence, per setting: flags (--api-url, --token,
// --tenant, --stack) > environment (SBX_API_URL, SBX_TOKEN, SBX_TENANT,
// SBX_STACK) > .run/stack.json (written by `make run`; found in the working
// directory or a parent). Without --token or --tenant, the stack's
// default_tenant is used, else its first tenant (make run writes them in
// BROKER_DEV_TOKENS order, so that is the first one listed there).
//
// Exit codes: 0 ok, 1 error, 2 usage, 3 capacity refused (code
// SANDBOX_CAPACITY_EXCEEDED: HTTP 429, or 503 while the deployment drains);
// `sbx exec` exits with the command's own exit code once the command ran.
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// Exit codes of sbx.
const (
	ExitOK       = 0
	ExitError    = 1
	ExitUsage    = 2
	ExitCapacity = 3
)

// App is one sbx invocation's environment; tests fill it with fakes.
type App struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Getenv reads the environment (os.Getenv in cmd/sbx).
	Getenv func(string) string
	// Dir is the working directory (stack file search, relative paths).
	Dir string
	// HTTPClient is used for the API and envd (nil: a default client).
	HTTPClient *http.Client
}

// usageError marks a mistake on the command line (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// runError marks an error from a command's run (so anything else returned
// by cobra is a usage error).
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// exitCode asks Run to exit with code, printing nothing (exec's own code).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// globals are the persistent flags.
type globals struct {
	settings Settings
	json     bool
	timeout  time.Duration
}

// Run executes sbx with args (without the program name) and returns the
// process exit code. Errors are printed to a.Stderr as "sbx: …", with the
// API's error code and message; with --json they are also written to
// a.Stdout as {"error":{…}}.
func (a *App) Run(ctx context.Context, args []string) int {
	if a.Getenv == nil {
		a.Getenv = func(string) string { return "" }
	}
	if a.Stdin == nil {
		a.Stdin = strings.NewReader("")
	}
	if a.HTTPClient == nil {
		a.HTTPClient = &http.Client{}
	}
	g := &globals{}
	root := a.rootCommand(g)
	root.SetArgs(args)
	root.SetIn(a.Stdin)
	root.SetOut(a.Stdout)
	root.SetErr(a.Stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var code exitCode
	if errors.As(err, &code) {
		return int(code)
	}
	var re runError
	if !errors.As(err, &re) {
		// cobra's own errors: unknown command or flag, wrong arg count.
		fmt.Fprintf(a.Stderr, "sbx: %v\nRun 'sbx --help' for usage.\n", err)
		return ExitUsage
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(a.Stderr, "sbx: %v\nRun 'sbx --help' for usage.\n", ue.err)
		return ExitUsage
	}
	fmt.Fprintf(a.Stderr, "sbx: %v\n", re.err)
	var ae *client.APIError
	if errors.As(err, &ae) && len(ae.Details) > 0 {
		keys := make([]string, 0, len(ae.Details))
		for k := range ae.Details {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%s=%v", k, ae.Details[k])
		}
		fmt.Fprintf(a.Stderr, "sbx: details: %s\n", strings.Join(parts, " "))
	}
	if g.json && errors.As(err, &ae) {
		_ = writeJSON(a.Stdout, map[string]any{"error": map[string]any{
			"status": ae.Status, "code": ae.Code, "message": ae.Message, "reason": ae.Reason,
			"retryable": ae.Retryable, "retry_after_seconds": ae.RetryAfter.Seconds(), "details": ae.Details,
		}})
	}
	if client.IsCapacity(err) {
		return ExitCapacity
	}
	return ExitError
}

// run wraps a command body so its errors are told apart from cobra's.
func run(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := f(cmd, args)
		var code exitCode
		if err == nil || errors.As(err, &code) {
			return err
		}
		return runError{err}
	}
}

func (a *App) rootCommand(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "sbx",
		Short: "Command-line client of sandbox-broker",
		Long: `sbx acquires sandboxes from a sandbox-broker, runs commands and moves files in them,
and releases them (outputs/ and workspace/ are copied to S3 on release).

Configuration, per setting: flags > environment (SBX_API_URL, SBX_TOKEN, SBX_TENANT,
SBX_STACK) > .run/stack.json (written by ` + "`make run`" + `, searched in this directory and its parents).
Without --token/--tenant, sbx uses the stack's default tenant: the first one of BROKER_DEV_TOKENS.

Exit codes: 0 ok, 1 error, 2 usage, 3 capacity refused (HTTP 429, or 503
while the deployment drains); sbx exec exits with the command's exit code.`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.settings.APIURL, "api-url", "", "broker API base URL (env "+EnvAPIURL+")")
	pf.StringVar(&g.settings.Token, "token", "", "bearer token (env "+EnvToken+")")
	pf.StringVar(&g.settings.Tenant, "tenant", "", "pick this tenant's token from the stack file (env "+EnvTenant+")")
	pf.StringVar(&g.settings.Stack, "stack", "", "stack file (env "+EnvStack+"; default: "+StackFile+" here or in a parent)")
	pf.BoolVar(&g.json, "json", false, "print JSON for scripts")
	pf.DurationVar(&g.timeout, "timeout", client.DefaultTimeout, "limit for each API call")

	root.AddCommand(
		a.acquireCmd(g), a.execCmd(g), a.putCmd(g), a.getCmd(g), a.releaseCmd(g),
		a.syncCmd(g), a.renewCmd(g), a.statusCmd(g), a.capacityCmd(g), a.lsOutputsCmd(g), a.s3EnvCmd(g), a.configCmd(g),
		a.reconcileCmd(g), a.drainCmd(g, true), a.drainCmd(g, false),
	)
	return root
}

// args validators that report usage errors.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("want %s, got %d argument(s)", names, len(args))}
		}
		return nil
	}
}

func (a *App) config(g *globals, needAPI bool) (Config, error) {
	return Resolve(g.settings, a.Getenv, a.Dir, needAPI)
}

func (a *App) api(g *globals) (*client.Client, Config, error) {
	cfg, err := a.config(g, true)
	if err != nil {
		return nil, cfg, err
	}
	c, err := client.New(cfg.APIURL, cfg.Token, client.WithHTTPClient(a.HTTPClient), client.WithTimeout(g.timeout), client.WithUserAgent("sbx"))
	return c, cfg, err
}

func (a *App) acquireCmd(g *globals) *cobra.Command {
	var user, thread string
	cmd := &cobra.Command{
		Use:   "acquire --user U --thread T",
		Short: "Acquire the thread's sandbox (reused, reclaimed, resumed, claimed from the pool or created); prints its id",
		Long: `Acquire the thread's sandbox and print its id on stdout (details on stderr, or all of
it as JSON with --json). The connection (envd URL and access token) is stored in
.run/sbx/<id>.json (mode 0600) so exec, put and get can reach the sandbox.`,
		Args: exactArgs(0, "no arguments"),
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if user == "" || thread == "" {
				return usageError{errors.New("acquire needs --user and --thread")}
			}
			c, cfg, err := a.api(g)
			if err != nil {
				return err
			}
			sb, err := a.acquire(cmd.Context(), c, cfg, user, thread)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(a.Stdout, sb)
			}
			fmt.Fprintln(a.Stdout, sb.SandboxID)
			fmt.Fprintf(a.Stderr, "acquired %s for %s/%s: %s, source %s, backend %s, expires %s\n",
				sb.SandboxID, user, thread, sb.State, sb.Source, sb.Backend, fmtTime(sb.ExpiresAt))
			return nil
		}),
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user id (^[A-Za-z0-9_-]{1,64}$)")
	cmd.Flags().StringVarP(&thread, "thread", "t", "", "thread id (^[A-Za-z0-9_-]{1,64}$)")
	return cmd
}

// acquire calls the API and stores the connection.
func (a *App) acquire(ctx context.Context, c *client.Client, cfg Config, user, thread string) (client.Sandbox, error) {
	sb, err := c.Acquire(ctx, user, thread)
	if err != nil {
		return sb, fmt.Errorf("acquire: %w", err)
	}
	err = connStore{cfg.StateDir}.Save(StoredConnection{
		SandboxID: sb.SandboxID, Tenant: cfg.Tenant, UserID: user, ThreadID: thread, Backend: sb.Backend,
		APIURL: c.BaseURL(), Connection: sb.Connection, ExpiresAt: sb.ExpiresAt, SavedAt: time.Now().UTC(),
	})
	if err != nil {
		return sb, fmt.Errorf("acquired %s but could not store its connection: %w", sb.SandboxID, err)
	}
	return sb, nil
}

// connFlags are the flags of commands that work inside a sandbox.
type connFlags struct{ user, thread string }

func (f *connFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.user, "user", "u", "", "re-acquire with this user id if no connection is stored")
	cmd.Flags().StringVarP(&f.thread, "thread", "t", "", "re-acquire with this thread id if no connection is stored")
}

// checkID reports a usage error when id cannot be a sandbox id.
func checkID(id string) error {
	if !sandboxIDPattern.MatchString(id) {
		return usageError{fmt.Errorf("sandbox id %q: must match %s", id, sandboxIDPattern)}
	}
	return nil
}

// sandboxIO is what exec, put and get need of a sandbox; client.Envd
// (protocol envd) and client.AIO (protocol aio) provide it.
type sandboxIO interface {
	Exec(ctx context.Context, req client.ExecRequest) (int, error)
	PutFile(ctx context.Context, p string, r io.Reader) error
	GetFile(ctx context.Context, p string, w io.Writer) (int64, error)
}

var (
	_ sandboxIO = (*client.Envd)(nil)
	_ sandboxIO = (*client.AIO)(nil)
)

// ErrUnsupportedConnection means the acquire response's connection speaks
// a protocol sbx does not know.
var ErrUnsupportedConnection = errors.New("no connection sbx can use")

// openSandbox picks the helper for conn's protocol; backend only names
// the sandbox's backend in the error.
func (a *App) openSandbox(id, backend string, conn client.Connection) (sandboxIO, error) {
	switch conn.Kind() {
	case client.KindEnvd:
		return client.NewEnvd(id, conn, a.HTTPClient)
	case client.KindAIO:
		return client.NewAIO(id, conn, a.HTTPClient)
	}
	if backend == "" {
		backend = "unknown"
	}
	return nil, fmt.Errorf("sandbox %s (backend %s): %w: its connection's protocol is %q; exec, put and get speak %s or %s",
		id, backend, ErrUnsupportedConnection, conn.Kind(), client.KindEnvd, client.KindAIO)
}

// envd returns the helper of sandbox id: from its stored connection, else
// by acquiring again for --user/--thread (which must return the same id).
func (a *App) envd(ctx context.Context, g *globals, f connFlags, id string) (sandboxIO, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	cfg, err := a.config(g, false)
	if err != nil {
		return nil, err
	}
	sc, err := connStore{cfg.StateDir}.Load(id)
	if errors.Is(err, ErrNoConnection) && f.user != "" && f.thread != "" {
		c, cfg, err := a.api(g)
		if err != nil {
			return nil, err
		}
		sb, err := a.acquire(ctx, c, cfg, f.user, f.thread)
		if err != nil {
			return nil, err
		}
		if sb.SandboxID != id {
			return nil, fmt.Errorf("thread %s/%s has sandbox %s, not %s", f.user, f.thread, sb.SandboxID, id)
		}
		return a.openSandbox(id, sb.Backend, sb.Connection)
	}
	if errors.Is(err, ErrNoConnection) {
		return nil, fmt.Errorf("%w: run `sbx acquire --user U --thread T` first, or pass --user and --thread", err)
	}
	if err != nil {
		return nil, err
	}
	return a.openSandbox(id, sc.Backend, sc.Connection)
}

func (a *App) releaseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "release ID",
		Short: "Release the sandbox: copy outputs/ and workspace/ to S3, park it warm for its thread",
		Args:  exactArgs(1, "ID"),
		RunE: run(func(cmd *cobra.Command, args []string) error {
			c, cfg, err := a.api(g)
			if err != nil {
				return err
			}
			res, err := c.Release(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("release %s: %w", args[0], err)
			}
			// The connection is for an active sandbox; acquire stores it again.
			if err := (connStore{cfg.StateDir}).Delete(args[0]); err != nil {
				fmt.Fprintf(a.Stderr, "sbx: warning: %v\n", err)
			}
			if g.json {
				return writeJSON(a.Stdout, res)
			}
			fmt.Fprintf(a.Stdout, "released %s: %s\n", res.SandboxID, res.State)
			if res.Sync != nil {
				fmt.Fprintf(a.Stdout, "outputs: %s\n", syncLine(*res.Sync))
				printDeferred(a.Stdout, *res.Sync)
			}
			if res.SyncError != "" {
				fmt.Fprintf(a.Stdout, "sync error: %s\n", res.SyncError)
			}
			return nil
		}),
	}
}

func syncLine(s client.SyncResult) string {
	state := "complete"
	if !s.Complete {
		state = "INCOMPLETE"
	}
	line := fmt.Sprintf("%d uploaded (%d bytes), %d unchanged, %d deferred, %s", s.Uploaded, s.Bytes, s.Skipped, len(s.Deferred), state)
	if len(s.Excluded) > 0 {
		line += fmt.Sprintf(" (%d excluded)", len(s.Excluded))
	}
	return line
}

// printDeferred lists the files a pass did not copy: deferred, then excluded.
func printDeferred(w io.Writer, s client.SyncResult) {
	for _, f := range s.Deferred {
		fmt.Fprintf(w, "  deferred %s: %s\n", f.Path, f.Reason)
	}
	for _, f := range s.Excluded {
		fmt.Fprintf(w, "  excluded %s: %s\n", f.Path, f.Reason)
	}
}

func (a *App) syncCmd(g *globals) *cobra.Command {
	var untilComplete bool
	var maxPasses int
	var progress string
	cmd := &cobra.Command{
		Use:   "sync ID",
		Short: "Copy the sandbox's outputs/ and workspace/ to S3 now (it stays active)",
		Long: `Copy the sandbox's outputs/ and workspace/ to S3 now; the sandbox stays active.

One pass is bounded by the broker's caps (files, bytes, wall time) and says
what it deferred and why; the next pass continues with the deferred files.
With --until-complete, sbx runs passes until one is complete, one uploads
nothing (what is left cannot be copied: unsafe names, oversize files), or
--max-passes is reached, and reports the totals.

Progress goes to stderr: a spinner with the elapsed time while a pass runs
and a line per finished pass (--progress auto: only when stderr is a
terminal and --json is not set). With --until-complete a line per pass is
printed in any case.`,
		Args: exactArgs(1, "ID"),
		RunE: run(func(cmd *cobra.Command, args []string) error {
			if progress != progressAuto && progress != progressAlways && progress != progressNever {
				return usageError{fmt.Errorf("--progress must be auto, always or never, got %q", progress)}
			}
			if maxPasses < 1 {
				return usageError{fmt.Errorf("--max-passes must be at least 1, got %d", maxPasses)}
			}
			c, _, err := a.api(g)
			if err != nil {
				return err
			}
			id := args[0]
			show := progress == progressAlways || (progress == progressAuto && !g.json && isTerminal(a.Stderr))
			var total client.SyncResult
			passes := 0
			for {
				passes++
				var sp *spinner
				if show {
					label := "syncing " + id
					if untilComplete {
						label += fmt.Sprintf(" (pass %d)", passes)
					}
					sp = startSpinner(a.Stderr, label, spinnerTick)
				}
				start := time.Now()
				res, err := c.Sync(cmd.Context(), id)
				sp.Stop()
				if err != nil {
					return fmt.Errorf("sync %s (pass %d): %w", id, passes, err)
				}
				total.Uploaded += res.Uploaded
				total.Bytes += res.Bytes
				total.Skipped, total.Deferred, total.Excluded, total.Complete = res.Skipped, res.Deferred, res.Excluded, res.Complete
				if show || untilComplete {
					fmt.Fprintf(a.Stderr, "pass %d: %s in %s\n", passes, syncLine(res), elapsed(time.Since(start)))
				}
				if !untilComplete || res.Complete || res.Uploaded == 0 || passes >= maxPasses {
					break
				}
			}
			if g.json {
				return writeJSON(a.Stdout, total)
			}
			if passes > 1 {
				fmt.Fprintf(a.Stdout, "synced %s in %d passes: %s\n", id, passes, syncLine(total))
			} else {
				fmt.Fprintf(a.Stdout, "synced %s: %s\n", id, syncLine(total))
			}
			printDeferred(a.Stdout, total)
			return nil
		}),
	}
	cmd.Flags().BoolVar(&untilComplete, "until-complete", false, "repeat passes while they make progress, until one is complete")
	cmd.Flags().IntVar(&maxPasses, "max-passes", 20, "with --until-complete, the most passes to run")
	cmd.Flags().StringVar(&progress, "progress", progressAuto, "progress on stderr: auto, always or never")
	return cmd
}

func (a *App) statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status ID",
		Short: "Show the broker's record of a sandbox",
		Args:  exactArgs(1, "ID"),
		RunE: run(func(cmd *cobra.Command, args []string) error {
			c, _, err := a.api(g)
			if err != nil {
				return err
			}
			rec, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("status %s: %w", args[0], err)
			}
			if g.json {
				_, err := fmt.Fprintf(a.Stdout, "%s\n", compactJSON(rec))
				return err
			}
			return printRecord(a.Stdout, rec)
		}),
	}
}

func compactJSON(raw []byte) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// printRecord prints a record's fields as aligned "key value" lines, sorted
// by key, nested objects flattened with dots; values of keys naming a token
// or secret are hidden.
func printRecord(w io.Writer, raw []byte) error {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		_, err := fmt.Fprintf(w, "%s\n", raw)
		return err
	}
	flat := map[string]string{}
	flatten("", m, flat)
	keys := make([]string, 0, len(flat))
	for k := range flat {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\n", k, flat[k])
	}
	return tw.Flush()
}

func flatten(prefix string, v any, out map[string]string) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			flatten(key, x, out)
		}
	default:
		lk := strings.ToLower(prefix)
		if strings.Contains(lk, "token") || strings.Contains(lk, "secret") {
			if s, ok := v.(string); ok && s != "" {
				out[prefix] = "(hidden)"
				return
			}
		}
		if s, ok := v.(string); ok {
			out[prefix] = s
			return
		}
		b, _ := json.Marshal(v)
		out[prefix] = string(b)
	}
}

func (a *App) capacityCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "capacity",
		Short: "Show the deployment's sandbox slots",
		Args:  exactArgs(0, "no arguments"),
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			c, _, err := a.api(g)
			if err != nil {
				return err
			}
			capa, err := c.Capacity(cmd.Context())
			if err != nil {
				return fmt.Errorf("capacity: %w", err)
			}
			if g.json {
				return writeJSON(a.Stdout, capa)
			}
			more := ""
			if capa.Tombstones > 0 {
				more += fmt.Sprintf(", %d tombstones", capa.Tombstones)
			}
			if capa.Pool > 0 {
				more += fmt.Sprintf(", %d pre-warmed in the pool", capa.Pool)
			}
			if capa.Granted > 0 {
				more += fmt.Sprintf(", %d held for waiting acquires", capa.Granted)
			}
			if capa.Paused > 0 {
				more += fmt.Sprintf(", %d of %d paused", capa.Paused, capa.PausedLimit)
			}
			if capa.Draining {
				more += "; draining: acquires refused"
			}
			if !capa.CountedAt.IsZero() {
				more += "; states counted at " + capa.CountedAt.UTC().Format(time.TimeOnly)
			}
			fmt.Fprintf(a.Stdout, "%d of %d slots used (active %d, warm %d, reserved %d, transitioning %d), overflow policy %s%s\n",
				capa.Used, capa.Limit, capa.Active, capa.Warm, capa.Reserved, capa.Transitioning, capa.Policy, more)
			return nil
		}),
	}
}

func (a *App) configCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "config",
		Short: "Show the resolved configuration and where each setting came from (token hidden)",
		Args:  exactArgs(0, "no arguments"),
		RunE: run(func(_ *cobra.Command, _ []string) error {
			cfg, err := a.config(g, false)
			if err != nil {
				return err
			}
			stack := ""
			if cfg.Stack != nil {
				stack = cfg.Stack.Path
			}
			tok := ""
			if cfg.Token != "" {
				tok = "(set)"
			}
			out := map[string]any{
				"api_url": cfg.APIURL, "tenant": cfg.Tenant, "token": tok, "stack": stack,
				"state_dir": cfg.StateDir, "sources": cfg.Sources,
			}
			if g.json {
				return writeJSON(a.Stdout, out)
			}
			tw := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
			for _, k := range []string{"api_url", "token", "tenant", "stack"} {
				src := cfg.Sources[k]
				if src == "" {
					src = "unset"
				}
				fmt.Fprintf(tw, "%s\t%v\t(%s)\n", k, out[k], src)
			}
			fmt.Fprintf(tw, "state_dir\t%s\t\n", cfg.StateDir)
			return tw.Flush()
		}),
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return t.UTC().Format(time.RFC3339)
}
