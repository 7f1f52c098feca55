package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sandbox-broker/sandbox-broker/pkg/client"
)

// drainCmd is `sbx drain` (drain=true) or `sbx undrain`: POST
// /v1/admin/drain or /v1/admin/undrain. A 403 (the tenant is not in the
// functions' BROKER_ADMIN_TENANTS) is reported with the API's code and a
// hint naming the tenant.
func (a *App) drainCmd(g *globals, drain bool) *cobra.Command {
	name, short := "drain", "Drain the deployment: refuse acquires (503, reason draining), destroy sandboxes on release"
	if !drain {
		name, short = "undrain", "End draining: acquires are served and releases park sandboxes warm again"
	}
	return &cobra.Command{
		Use:   name,
		Short: short + " (admin tenants)",
		Long: short + `.

Only tenants listed in the functions' BROKER_ADMIN_TENANTS may call it (make run: the first
tenant of BROKER_DEV_TOKENS unless BROKER_ADMIN_TENANTS is set); others get 403 FORBIDDEN.`,
		Args: exactArgs(0, "no arguments"),
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			c, cfg, err := a.api(g)
			if err != nil {
				return err
			}
			call := c.Drain
			if !drain {
				call = c.Undrain
			}
			st, err := call(cmd.Context())
			if err != nil {
				if client.IsForbidden(err) {
					who := "this token's tenant"
					if cfg.Tenant != "" {
						who = "tenant " + cfg.Tenant
					}
					return fmt.Errorf("%s: %w\n(%s is not in the functions' BROKER_ADMIN_TENANTS)", name, err, who)
				}
				return fmt.Errorf("%s: %w", name, err)
			}
			if g.json {
				return writeJSON(a.Stdout, st)
			}
			if st.Draining {
				fmt.Fprintln(a.Stdout, "draining: acquires are refused (503, reason draining); releases destroy their sandbox")
			} else {
				fmt.Fprintln(a.Stdout, "not draining: acquires are served; releases park sandboxes warm")
			}
			return nil
		}),
	}
}
