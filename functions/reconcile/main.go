// Command reconcile is the reconcile Lambda function, run on the EventBridge
// schedule in template.yaml. Configuration: environment variables, see
// package config.
package main

import "github.com/sandbox-broker/sandbox-broker/internal/wiring"

func main() { wiring.StartReconcile() }
