package sandboxhost

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// protoEnum is a proto3 JSON enum value: accepted as its name or number.
type protoEnum struct {
	Name   string
	Number int64
}

// UnmarshalJSON accepts "NAME", 12 or "12".
func (e *protoEnum) UnmarshalJSON(b []byte) error {
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

// protoUint is a proto3 JSON integer: accepted as a number or a string.
type protoUint uint64

// UnmarshalJSON accepts 12 or "12".
func (u *protoUint) UnmarshalJSON(b []byte) error {
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
	*u = protoUint(n)
	return nil
}

// MarshalJSON writes the name when known, else the number.
func (e protoEnum) MarshalJSON() ([]byte, error) {
	if e.Name != "" {
		return json.Marshal(e.Name)
	}
	return json.Marshal(e.Number)
}
