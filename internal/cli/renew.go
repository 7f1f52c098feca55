package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
)

// renewCmd is `sbx renew ID [--seconds N]`: POST /v1/sandboxes/{id}/renew.
func (a *App) renewCmd(g *globals) *cobra.Command {
	var seconds int
	cmd := &cobra.Command{
		Use:   "renew ID",
		Short: "Keep an active sandbox longer (its provider timer with it)",
		Long: `Keep an active sandbox for --seconds from now (default: the deployment's
SANDBOX_ACTIVE_TIMEOUT_SECONDS), never past SANDBOX_MAX_LIFETIME_SECONDS after
its creation. A renewal never moves the end earlier; prints the end it has.`,
		Args: exactArgs(1, "ID"),
		RunE: run(func(cmd *cobra.Command, args []string) error {
			if seconds < 0 {
				return usageError{fmt.Errorf("--seconds must be at least 1, got %d", seconds)}
			}
			c, _, err := a.api(g)
			if err != nil {
				return err
			}
			res, err := c.Renew(cmd.Context(), args[0], seconds)
			if err != nil {
				return fmt.Errorf("renew %s: %w", args[0], err)
			}
			if g.json {
				b, err := json.Marshal(res)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.Stdout, "%s\n", b)
				return err
			}
			_, err = fmt.Fprintf(a.Stdout, "%s active until %s\n", res.SandboxID, res.ExpiresAt)
			return err
		}),
	}
	cmd.Flags().IntVar(&seconds, "seconds", 0, "how long from now the sandbox stays the thread's (0: the deployment's default)")
	return cmd
}
