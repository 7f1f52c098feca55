// Package providers is the registry of sandbox backends: the providers a
// deployment selects with SANDBOX_PROVIDER (internal/config). It is the
// only place that names a backend; the engine, the HTTP adapter, the Go
// client and the CLI know a backend only through what its provider
// returns (core.Endpoint) and declares (core.Capabilities).
//
// Adding a backend means: its package (a core.Provider), its
// configuration variables (internal/config: its name in ProviderNames and
// its fields), and one entry in builtin below.
package providers

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/sandbox-broker/sandbox-broker/internal/config"
	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/e2b"
	"github.com/sandbox-broker/sandbox-broker/internal/provisioner"
)

// Constructor builds a backend's provider from the configuration. The
// logger is never nil.
type Constructor func(cfg config.Config, logger *slog.Logger) (core.Provider, error)

// Registry maps backend names (SANDBOX_PROVIDER values) to constructors.
type Registry map[string]Constructor

// builtin is every backend a deployment can select.
var builtin = Registry{
	config.ProviderE2B:         newE2B,
	config.ProviderProvisioner: newProvisioner,
}

// Builtin returns a copy of the registry of deployable backends (tests add
// their own backends to the copy).
func Builtin() Registry { return maps.Clone(builtin) }

// Names lists the registered backend names, sorted.
func (r Registry) Names() []string { return slices.Sorted(maps.Keys(r)) }

// New returns the provider cfg.Provider names ("" means e2b), built by its
// constructor; logger nil means slog.Default().
//
// Errors: an unknown provider name, or the constructor's own error.
func (r Registry) New(cfg config.Config, logger *slog.Logger) (core.Provider, error) {
	if logger == nil {
		logger = slog.Default()
	}
	name := cfg.Provider
	if name == "" {
		name = config.ProviderE2B
	}
	build, ok := r[name]
	if !ok {
		return nil, fmt.Errorf("unknown sandbox provider %q (known: %v)", name, r.Names())
	}
	p, err := build(cfg, logger)
	if err != nil {
		return nil, fmt.Errorf("%s provider: %w", name, err)
	}
	return p, nil
}

// New builds the deployment's provider from the builtin registry, with
// the E2B API key cfg.E2B.APIKey (see E2BWithKeys for a refreshed one).
func New(cfg config.Config, logger *slog.Logger) (core.Provider, error) {
	return builtin.New(cfg, logger)
}

// newE2B is the E2B client (internal/e2b), configured from cfg.E2B.
func newE2B(cfg config.Config, logger *slog.Logger) (core.Provider, error) {
	return E2BWithKeys(nil)(cfg, logger)
}

// E2BWithKeys is the E2B constructor with the API key taken from keys
// (internal/wiring's Secrets Manager source, refreshed when E2B refuses
// it) instead of cfg.E2B.APIKey; nil keys means cfg.E2B.APIKey.
func E2BWithKeys(keys e2b.KeySource) Constructor {
	return func(cfg config.Config, logger *slog.Logger) (core.Provider, error) {
		return e2b.New(e2b.Options{
			APIURL:     cfg.E2B.APIURL,
			SandboxURL: cfg.E2B.SandboxURL,
			APIKey:     cfg.E2B.APIKey,
			Keys:       keys,
			Logger:     logger,
		})
	}
}

// newProvisioner is the Kubernetes provisioner client
// (internal/provisioner), configured from cfg.Provisioner; its commands
// run in cfg.Settings.Home unless they say otherwise.
func newProvisioner(cfg config.Config, logger *slog.Logger) (core.Provider, error) {
	return provisioner.New(provisioner.Options{
		BaseURL:    cfg.Provisioner.URL,
		APIKey:     cfg.Provisioner.APIKey,
		Home:       cfg.Settings.Home,
		Deployment: cfg.Settings.Deployment,
		Logger:     logger,
	})
}
