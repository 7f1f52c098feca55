// Command status is the status Lambda function (HTTP API routes in
// template.yaml): the short reads and admin writes (GET /v1/capacity, GET
// /v1/sandboxes/{id}, the /v1/admin routes, GET /v1/openapi.json), kept
// off the acquire function so acquires waiting for a slot never queue them.
// Configuration: environment variables, see package config.
package main

import "github.com/sandbox-broker/sandbox-broker/internal/wiring"

func main() { wiring.StartHTTP("status") }
