// Command sbx is the command-line client of sandbox-broker. All logic is in
// internal/cli; this file wires it to the process (args, stdio, env, signals).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sandbox-broker/sandbox-broker/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	dir, err := os.Getwd()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sbx: %v\n", err)
		os.Exit(cli.ExitError)
	}
	app := &cli.App{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, Dir: dir}
	code := app.Run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
