// Package e2bapi is the wire format of E2B's control-plane API (the
// subset this project speaks), shared by the E2B provider client
// (internal/e2b), the local sandbox host that serves it
// (internal/sandboxhost) and the broker's E2B-compatible connect route
// (internal/httpapi): request and reply bodies, the error body, and how a
// sandbox's envd address is derived from its id and domain.
//
// Field names follow E2B's OpenAPI spec; only the fields this project
// reads or writes are declared.
package e2bapi

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/envd"
)

// Error is E2B's error body (schema Error). The SDKs read Message and
// recognise a missing sandbox only from status 404 with Code 404.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// NewSandbox is the body of POST /sandboxes and /v2/sandboxes (schema
// NewSandbox).
type NewSandbox struct {
	TemplateID string            `json:"templateID"`
	Timeout    *float64          `json:"timeout,omitempty"` // seconds
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
}

// Sandbox is the reply to create and connect (schema Sandbox): what the
// SDKs need to reach the sandbox's envd.
type Sandbox struct {
	SandboxID       string `json:"sandboxID"`
	TemplateID      string `json:"templateID"`
	Alias           string `json:"alias,omitempty"`
	ClientID        string `json:"clientID,omitempty"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	// Domain is the sandbox domain the envd address is derived from (see
	// EnvdURL); null: the SDK's default, or its configured sandbox URL.
	Domain *string `json:"domain"`
}

// ListedSandbox is an item of GET /sandboxes and /v2/sandboxes (schema
// ListedSandbox).
type ListedSandbox struct {
	TemplateID   string            `json:"templateID"`
	Alias        string            `json:"alias,omitempty"`
	SandboxID    string            `json:"sandboxID"`
	ClientID     string            `json:"clientID"`
	StartedAt    time.Time         `json:"startedAt"`
	EndAt        time.Time         `json:"endAt"`
	CPUCount     int               `json:"cpuCount"`
	MemoryMB     int               `json:"memoryMB"`
	DiskSizeMB   int               `json:"diskSizeMB"`
	Metadata     map[string]string `json:"metadata"`
	State        string            `json:"state"` // "running" or "paused"
	EnvdVersion  string            `json:"envdVersion"`
	VolumeMounts []any             `json:"volumeMounts"`
}

// SandboxDetail is the reply to GET /sandboxes/{id} (schema
// SandboxDetail).
type SandboxDetail struct {
	ListedSandbox
	EnvdAccessToken string  `json:"envdAccessToken"`
	Domain          *string `json:"domain"`
}

// SandboxMetric is an item of GET /sandboxes/{id}/metrics (schema
// SandboxMetric): CPU, memory and disk use of the sandbox at Timestamp.
type SandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// EnvdURL is the envd base URL the SDKs derive for sandbox id in domain:
// https://<envd.Port>-<id>.<domain>.
func EnvdURL(id, domain string) string {
	return fmt.Sprintf("https://%d-%s.%s", envd.Port, id, domain)
}

// DomainOf is the sandbox domain of envdURL when it has EnvdURL's form for
// sandbox id; nil otherwise (one envd URL serving every sandbox, as the
// local stack's: the SDK then needs its sandbox URL configured).
func DomainOf(id, envdURL string) *string {
	u, err := url.Parse(envdURL)
	if err != nil {
		return nil
	}
	prefix := strconv.Itoa(envd.Port) + "-" + id + "."
	host := u.Hostname()
	if !strings.HasPrefix(host, prefix) || len(host) == len(prefix) {
		return nil
	}
	d := host[len(prefix):]
	return &d
}
