package envd

import "encoding/json"

// SignalKill is the SendSignal signal that ends a process.
const SignalKill = "SIGNAL_SIGKILL"

// Messages of envd's process service (process.proto).
type (
	// ProcessConfig is the command to start: Cmd with Args, extra
	// environment Envs, working directory Cwd ("" = the user's home).
	ProcessConfig struct {
		Cmd  string            `json:"cmd"`
		Args []string          `json:"args"`
		Envs map[string]string `json:"envs,omitempty"`
		Cwd  string            `json:"cwd,omitempty"`
	}
	// StartRequest is ProcedureStart's request.
	StartRequest struct {
		Process ProcessConfig `json:"process"`
		// Pty, when set, asks for a pseudo-terminal (its shape is not
		// read here).
		Pty   json.RawMessage `json:"pty,omitempty"`
		Tag   *string         `json:"tag,omitempty"`
		Stdin bool            `json:"stdin"`
	}
	// StartResponse is one message of ProcedureStart's stream.
	StartResponse struct {
		Event ProcessEvent `json:"event"`
	}
	// ProcessEvent is one of start, data, end or keepalive.
	ProcessEvent struct {
		Start     *StartEvent `json:"start,omitempty"`
		Data      *DataEvent  `json:"data,omitempty"`
		End       *EndEvent   `json:"end,omitempty"`
		Keepalive *struct{}   `json:"keepalive,omitempty"`
	}
	// StartEvent is the first event: the process id.
	StartEvent struct {
		Pid uint32 `json:"pid"`
	}
	// DataEvent is a chunk of output.
	DataEvent struct {
		Stdout []byte `json:"stdout,omitempty"`
		Stderr []byte `json:"stderr,omitempty"`
		Pty    []byte `json:"pty,omitempty"`
	}
	// ProcessSelector names a process by Pid (0 = none) or Tag.
	ProcessSelector struct {
		Pid Uint    `json:"pid,omitempty"`
		Tag *string `json:"tag,omitempty"`
	}
	// SendSignalRequest is ProcedureSendSignal's request (Signal:
	// SignalKill).
	SendSignalRequest struct {
		Process ProcessSelector `json:"process"`
		Signal  Enum            `json:"signal"`
	}
	// Empty is a reply (or request) without fields.
	Empty struct{}
	// ProcessInfo is one running process in ListResponse.
	ProcessInfo struct {
		Config ProcessConfig `json:"config"`
		Pid    uint32        `json:"pid"`
		Tag    *string       `json:"tag,omitempty"`
	}
	// ListResponse is ProcedureList's reply (its request is Empty).
	ListResponse struct {
		Processes []ProcessInfo `json:"processes"`
	}
)

// EndEvent is the last event: how the process ended. ExitCode is what the
// process exited with (0 when envd omits it, as proto3 does for 0);
// Exited is false when it was killed by a signal; Error is envd's message
// when the process could not run or was ended.
type EndEvent struct {
	ExitCode int32  `json:"exitCode"`
	Exited   bool   `json:"exited"`
	Status   string `json:"status"`
	Error    string `json:"error,omitempty"`
}

// UnmarshalJSON also accepts the proto field name exit_code, which
// protojson parsers accept as well as exitCode.
func (e *EndEvent) UnmarshalJSON(b []byte) error {
	type plain EndEvent
	var w struct {
		plain
		ExitCodeSnake *int32 `json:"exit_code"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = EndEvent(w.plain)
	if w.ExitCodeSnake != nil && e.ExitCode == 0 {
		e.ExitCode = *w.ExitCodeSnake
	}
	return nil
}

// Messages of envd's process service for input and attaching.
type (
	// SendInputRequest is ProcedureSendInput's request: Input to the
	// process's stdin.
	SendInputRequest struct {
		Process ProcessSelector `json:"process"`
		Input   ProcessInput    `json:"input"`
	}
	// ProcessInput is input for a process: Stdin bytes (Pty: for a
	// pseudo-terminal).
	ProcessInput struct {
		Stdin []byte `json:"stdin,omitempty"`
		Pty   []byte `json:"pty,omitempty"`
	}
	// ProcessRequest names a process: the request of ProcedureCloseStdin
	// and ProcedureConnect.
	ProcessRequest struct {
		Process ProcessSelector `json:"process"`
	}
)
