// Package providers builds the sandbox provider a deployment selects with
// SANDBOX_PROVIDER (internal/config): the E2B client (internal/e2b, the default) or
// the Kubernetes provisioner client (internal/provisioner).
package providers

import (
	"fmt"
	"log/slog"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
	"github.com/sandbox-broker/sandbox-broker/internal/provisioner"
	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

// New returns the provider cfg.Provider names ("" means e2b), configured
// from cfg.E2B or cfg.Provisioner; commands of the provisioner provider run
// in cfg.Settings.Home unless they say otherwise. The E2B API key must
// already be resolved (internal/wiring reads it from Secrets Manager).
//
// Errors: an unknown provider name, or the client's own validation error.
func New(cfg config.Config, logger *slog.Logger) (core.Provider, error) {
	if logger == nil {
		logger = slog.Default()
	}
	switch cfg.Provider {
	case config.ProviderE2B, "":
		c, err := e2b.New(e2b.Options{
			APIURL:     cfg.E2B.APIURL,
			SandboxURL: cfg.E2B.SandboxURL,
			APIKey:     cfg.E2B.APIKey,
			Logger:     logger,
		})
		if err != nil {
			return nil, fmt.Errorf("e2b client: %w", err)
		}
		return c, nil
	case config.ProviderProvisioner:
		c, err := provisioner.New(provisioner.Options{
			BaseURL:    cfg.Provisioner.URL,
			APIKey:     cfg.Provisioner.APIKey,
			Home:       cfg.Settings.Home,
			Deployment: cfg.Settings.Deployment,
			Logger:     logger,
		})
		if err != nil {
			return nil, fmt.Errorf("provisioner client: %w", err)
		}
		return c, nil
	default:
		return nil, fmt.Errorf("unknown sandbox provider %q", cfg.Provider)
	}
}
