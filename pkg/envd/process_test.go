package envd

import (
	"encoding/json"
	"testing"
)

func TestEndEventExitCode(t *testing.T) {
	tests := []struct {
		body string
		want int32
	}{
		{`{"exitCode":3,"exited":true}`, 3},
		{`{"exit_code":4,"exited":true}`, 4},
		{`{"exited":true}`, 0}, // proto3 omits a zero exit code
		{`{"exitCode":-1,"exited":false,"status":"signal: killed"}`, -1},
	}
	for _, tt := range tests {
		var e EndEvent
		if err := json.Unmarshal([]byte(tt.body), &e); err != nil || e.ExitCode != tt.want {
			t.Errorf("Unmarshal(%s) = %+v, %v; want exit code %d", tt.body, e, err, tt.want)
		}
	}
	b, err := json.Marshal(EndEvent{ExitCode: 2, Exited: true, Status: "exit status 2"})
	if got, want := string(b), `{"exitCode":2,"exited":true,"status":"exit status 2"}`; err != nil || got != want {
		t.Errorf("Marshal = %s, %v; want %s", got, err, want)
	}
}

func TestSelectorAndSignalWireForms(t *testing.T) {
	b, err := json.Marshal(SendSignalRequest{Process: ProcessSelector{Pid: 42}, Signal: Enum{Name: SignalKill}})
	if got, want := string(b), `{"process":{"pid":42},"signal":"SIGNAL_SIGKILL"}`; err != nil || got != want {
		t.Errorf("Marshal = %s, %v; want %s", got, err, want)
	}
	for _, body := range []string{`{"process":{"pid":"42"},"signal":9}`, `{"process":{"pid":42},"signal":"9"}`} {
		var r SendSignalRequest
		if err := json.Unmarshal([]byte(body), &r); err != nil || r.Process.Pid != 42 || r.Signal.Number != 9 {
			t.Errorf("Unmarshal(%s) = %+v, %v; want pid 42, signal 9", body, r, err)
		}
	}
}

func TestFileURL(t *testing.T) {
	if got, want := FileURL("http://h:1/", "/home/user/a b&c.txt"), "http://h:1/files?path=%2Fhome%2Fuser%2Fa+b%26c.txt"; got != want {
		t.Errorf("FileURL = %s, want %s", got, want)
	}
}
