// Command sync is the sync Lambda function (HTTP API routes in template.yaml).
// Configuration: environment variables, see package config.
package main

import "github.com/sandbox-broker/sandbox-broker/internal/wiring"

func main() { wiring.StartHTTP("sync") }
