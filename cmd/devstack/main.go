// Command devstack runs the whole broker locally (`make run`): DynamoDB
// Local, versitygw, the sandbox host and the five Lambda functions under the
// Runtime Interface Emulator, behind the routes of template.yaml on
// BROKER_ADDR. See package devstack.
//
// Environment: BROKER_ADDR (default 127.0.0.1:8787), BROKER_DEV_TOKENS
// (tenant:token,..., default dev:dev-token), DEVSTACK_ROOT (default: the
// directory holding go.mod above the working directory),
// DEVSTACK_DYNAMODB_ADDR, DEVSTACK_S3_ADDR, DEVSTACK_SANDBOX_API_ADDR,
// DEVSTACK_ENVD_ADDR (default: free ports), DEVSTACK_SANDBOX_PROCESSES,
// DEVSTACK_SANDBOX_MEMORY_BYTES, DEVSTACK_SANDBOX_CPU_MILLIS (per-sandbox
// limits, sandboxhost.LimitsFromEnv), DEVSTACK_ISOLATION (auto, bwrap,
// none), DEVSTACK_BUILD_DIR (default <root>/.build, where `make build` puts
// <function>/bootstrap). SANDBOX_*, SYNC_*, RECONCILE_*, LOG_LEVEL and
// BROKER_ADMIN_TENANTS pass through to the functions; BROKER_ADMIN_TENANTS
// defaults to the first tenant of BROKER_DEV_TOKENS (devstack.MakeRunEnv).
// stack.json lists the tokens in BROKER_DEV_TOKENS order; the first is
// sbx's default tenant.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/devstack"
	"github.com/sandbox-broker/sandbox-broker/internal/sandboxhost"
)

func main() {
	if err := run(); err != nil {
		// Errors of package devstack already start with "devstack: ".
		fmt.Fprintln(os.Stderr, "devstack:", strings.TrimPrefix(err.Error(), "devstack: "))
		os.Exit(1)
	}
}

func run() error {
	t0 := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := os.Getenv("DEVSTACK_ROOT")
	if root == "" {
		var err error
		if root, err = findRoot(); err != nil {
			return err
		}
	}
	tokens := os.Getenv("BROKER_DEV_TOKENS")
	if tokens == "" {
		tokens = devstack.DefaultTokens
	}
	tokenList, err := devstack.ParseTokenList(tokens)
	if err != nil {
		return err
	}
	tokenMap := make(map[string]string, len(tokenList))
	for _, t := range tokenList {
		tokenMap[t.Token] = t.Tenant
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	limits, err := sandboxhost.LimitsFromEnv(os.Getenv, "DEVSTACK_SANDBOX_")
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "devstack: starting DynamoDB Local, versitygw, the sandbox host and the functions…")
	s, err := devstack.Start(ctx, devstack.Options{
		Root:           root,
		BuildDir:       os.Getenv("DEVSTACK_BUILD_DIR"),
		Addr:           os.Getenv("BROKER_ADDR"),
		DynamoDBAddr:   os.Getenv("DEVSTACK_DYNAMODB_ADDR"),
		S3Addr:         os.Getenv("DEVSTACK_S3_ADDR"),
		SandboxAPIAddr: os.Getenv("DEVSTACK_SANDBOX_API_ADDR"),
		EnvdAddr:       os.Getenv("DEVSTACK_ENVD_ADDR"),
		Isolation:      os.Getenv("DEVSTACK_ISOLATION"),
		SandboxLimits:  limits,
		Tokens:         tokenMap,
		TenantOrder:    devstack.Tenants(tokenList),
		FunctionEnv:    devstack.MakeRunEnv(os.Environ(), tokenList),
		Logger:         logger,
	})
	if err != nil {
		return err
	}
	fmt.Print(s.Banner(time.Since(t0)))
	select {
	case <-ctx.Done():
		fmt.Fprintln(os.Stderr, "devstack: shutting down…")
	case err = <-s.Failed():
		fmt.Fprintln(os.Stderr, "devstack: a part of the stack died, shutting down:", err)
	}
	stop()
	if cerr := s.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}

// findRoot walks up from the working directory to the one holding go.mod.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: set DEVSTACK_ROOT")
		}
		dir = parent
	}
}
