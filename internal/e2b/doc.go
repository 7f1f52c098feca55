// Package e2b is a core.Provider for E2B sandboxes: a client of E2B's REST
// control plane (create, list, get, kill, set timeout, pause, and connect
// to resume) and of envd, the
// daemon inside each sandbox (process start over Connect RPC with the JSON
// codec, file bytes over plain HTTP).
//
// Sources of the wire facts: E2B's public OpenAPI spec (spec/openapi.yml and
// spec/envd/envd.yaml in github.com/e2b-dev/E2B), envd's process.proto, and
// what the official JS SDK (npm e2b 2.51.0) was observed to send
// (captured on loopback against internal/sandboxhost, which TestOfficialE2BSDK
// drives with the same SDK). The same client drives the local sandbox host of
// this repository (internal/sandboxhost), which speaks the same API on loopback.
//
// Authentication: control-plane calls carry the API key in X-API-Key; envd
// calls carry only the sandbox's envd access token in X-Access-Token, never
// the API key.
package e2b
