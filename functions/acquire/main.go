// Command acquire is the acquire Lambda function (HTTP API routes in template.yaml).
// Configuration: environment variables, see package config.
package main

import "github.com/sandbox-broker/sandbox-broker/pkg/wiring"

func main() { wiring.StartHTTP("acquire") }
