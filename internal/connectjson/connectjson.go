// Package connectjson is Connect's "json" codec over encoding/json, so
// envd's messages can be plain Go structs instead of generated protobuf
// code. Both sides use it: the E2B client (internal/e2b), the CLI's envd client
// (pkg/client) and the local sandbox host (internal/sandboxhost). Field names
// follow the proto3 JSON mapping (lowerCamelCase); unknown fields are
// ignored, as protojson peers expect.
package connectjson

import (
	"bytes"
	"encoding/json"
	"fmt"

	"connectrpc.com/connect"
)

// Codec is the codec; pass it with connect.WithCodec.
type Codec struct{}

var _ connect.Codec = Codec{}

// Name is "json": Connect speaks it as application/json (unary) and
// application/connect+json (streaming).
func (Codec) Name() string { return "json" }

// Marshal encodes v as JSON.
func (Codec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes JSON into v; an empty body is an empty message. A
// decode error says how many bytes the message had.
func (Codec) Unmarshal(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode connect message (%d bytes): %w", len(data), err)
	}
	return nil
}
