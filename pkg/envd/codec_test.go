package envd

import (
	"strings"
	"testing"
)

func TestCodecRoundTripAndEmptyBody(t *testing.T) {
	type msg struct {
		ExitCode int32  `json:"exitCode"`
		Stdout   []byte `json:"stdout,omitempty"`
	}
	c := Codec{}
	b, err := c.Marshal(msg{ExitCode: 3, Stdout: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"exitCode":3,"stdout":"aGk="}`; got != want {
		t.Errorf("Marshal = %s, want %s", got, want)
	}
	var m msg
	if err := c.Unmarshal([]byte(`{"exitCode":7,"unknown":1}`), &m); err != nil || m.ExitCode != 7 {
		t.Errorf("Unmarshal = %+v, %v; want exitCode 7, unknown fields ignored", m, err)
	}
	m = msg{ExitCode: 9}
	if err := c.Unmarshal([]byte("  "), &m); err != nil || m.ExitCode != 9 {
		t.Errorf("empty body = %+v, %v; want the message untouched", m, err)
	}
	if err := c.Unmarshal([]byte("{"), &m); err == nil || !strings.Contains(err.Error(), "1 bytes") {
		t.Errorf("bad body error = %v, want one naming its size", err)
	}
}
