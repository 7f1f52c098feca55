package envd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"connectrpc.com/connect"
)

// Codec is Connect's "json" codec over encoding/json; pass it with
// connect.WithCodec on both clients and handlers. Unknown fields are
// ignored, as protojson peers expect.
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

// Enum is a proto3 JSON enum value: written as its name (its number when
// it has none), read as a name, a number or a number in a string.
type Enum struct {
	Name   string
	Number int64
}

// MarshalJSON writes the name when known, else the number.
func (e Enum) MarshalJSON() ([]byte, error) {
	if e.Name != "" {
		return json.Marshal(e.Name)
	}
	return json.Marshal(e.Number)
}

// UnmarshalJSON accepts "NAME", 12 or "12".
func (e *Enum) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			e.Number = n
			return nil
		}
		e.Name = s
		return nil
	}
	if string(b) == "null" {
		return nil
	}
	if err := json.Unmarshal(b, &e.Number); err != nil {
		return fmt.Errorf("enum: %w", err)
	}
	return nil
}

// Uint is a proto3 JSON integer: written as a number, read as a number or
// a string (protojson writes 64-bit integers as strings).
type Uint uint64

// UnmarshalJSON accepts 12 or "12".
func (u *Uint) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		b = []byte(s)
	}
	n, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("integer: %w", err)
	}
	*u = Uint(n)
	return nil
}
