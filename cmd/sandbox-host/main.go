// Command sandbox-host runs the local E2B-compatible sandbox host
// (internal/sandboxhost) on loopback until SIGINT or SIGTERM, then kills every
// sandbox. When ready it prints one JSON line on stdout:
// {"api_url":…,"envd_url":…,"root_dir":…,"isolated":…} (plus
// "provisioner_url" when the provisioner face is on).
//
// Flags (environment fallbacks in brackets): -api-addr [SANDBOX_HOST_API_ADDR]
// (default 127.0.0.1:0), -envd-addr [SANDBOX_HOST_ENVD_ADDR] (default
// 127.0.0.1:0), -root-dir [SANDBOX_HOST_ROOT_DIR] (default a new temp dir,
// removed on exit), -isolation [SANDBOX_HOST_ISOLATION] (auto|bwrap|none),
// -default-timeout [SANDBOX_HOST_DEFAULT_TIMEOUT] (default 300s). Per-sandbox
// limits under bubblewrap: SANDBOX_HOST_PROCESSES (512), SANDBOX_HOST_MEMORY_BYTES
// (1 GiB), SANDBOX_HOST_CPU_MILLIS (1000 = one core); -1 = no limit. The API
// key is read from SANDBOX_HOST_API_KEY only (never a flag, so it does not
// show in process listings) and is required.
//
// -provisioner-addr [SANDBOX_HOST_PROVISIONER_ADDR] (default off; e.g.
// 127.0.0.1:0) also serves the provisioner face: the Kubernetes
// provisioner API with AIO sandbox URLs. Its X-API-Key is
// SANDBOX_HOST_PROVISIONER_API_KEY, default SANDBOX_HOST_API_KEY.
//
// Each sandbox runs this same binary inside it as its agent (started with
// a hidden argument, handled by internal/sandboxhost before main runs), so
// the binary must stay executable by the sandboxes' uids.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-host:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run() error {
	apiAddr := flag.String("api-addr", envOr("SANDBOX_HOST_API_ADDR", "127.0.0.1:0"), "control-plane listen address (loopback)")
	envdAddr := flag.String("envd-addr", envOr("SANDBOX_HOST_ENVD_ADDR", "127.0.0.1:0"), "envd listen address (loopback)")
	rootDir := flag.String("root-dir", os.Getenv("SANDBOX_HOST_ROOT_DIR"), "directory for sandbox homes (default: a temp dir removed on exit)")
	isolation := flag.String("isolation", envOr("SANDBOX_HOST_ISOLATION", sandboxhost.IsolationAuto), "auto, bwrap or none")
	defTimeout := flag.Duration("default-timeout", 300*time.Second, "sandbox life when create does not say (env SANDBOX_HOST_DEFAULT_TIMEOUT)")
	provAddr := flag.String("provisioner-addr", os.Getenv("SANDBOX_HOST_PROVISIONER_ADDR"), "provisioner API listen address (loopback); empty = off")
	logLevel := flag.String("log-level", envOr("SANDBOX_HOST_LOG_LEVEL", "info"), "debug, info, warn or error")
	flag.Parse()

	if s := os.Getenv("SANDBOX_HOST_DEFAULT_TIMEOUT"); s != "" && !isFlagSet("default-timeout") {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("SANDBOX_HOST_DEFAULT_TIMEOUT: %w", err)
		}
		*defTimeout = d
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	apiKey := os.Getenv("SANDBOX_HOST_API_KEY")
	if apiKey == "" {
		return fmt.Errorf("SANDBOX_HOST_API_KEY must be set")
	}
	root := *rootDir
	if root == "" {
		tmp, err := os.MkdirTemp("", "sandbox-host-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		root = tmp
	}

	limits, err := sandboxhost.LimitsFromEnv(os.Getenv, "SANDBOX_HOST_")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := sandboxhost.Start(ctx, sandboxhost.Options{
		APIKey:         apiKey,
		RootDir:        root,
		DefaultTimeout: *defTimeout,
		Isolation:      *isolation,
		Limits:         limits,
		Logger:         log,
	}, *apiAddr, *envdAddr)
	if err != nil {
		return err
	}
	info := map[string]any{
		"api_url":  srv.APIURL,
		"envd_url": srv.EnvdURL,
		"root_dir": root,
		"isolated": srv.Host.Isolated(),
	}
	if *provAddr != "" {
		u, err := srv.StartProvisioner(*provAddr, sandboxhost.ProvisionerOptions{
			APIKey: envOr("SANDBOX_HOST_PROVISIONER_API_KEY", apiKey)})
		if err != nil {
			_ = srv.Close()
			return fmt.Errorf("provisioner face: %w", err)
		}
		info["provisioner_url"] = u
	}
	ready, err := json.Marshal(info)
	if err != nil {
		return err
	}
	fmt.Println(string(ready))
	<-ctx.Done()
	log.Info("shutting down; killing every sandbox")
	return srv.Close()
}

func isFlagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
