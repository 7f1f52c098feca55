package aio

import (
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"strings"
	"testing"
)

func TestResponseSuccessAndFailure(t *testing.T) {
	tests := []struct {
		body       string
		wantFailed bool
		want       FileOperationError
	}{
		{`{"message":"ok","data":{}}`, false, FileOperationError{}},
		{`{"success":true,"data":null}`, false, FileOperationError{}},
		{`{"success":false,"message":"envelope","data":{"path":"/x","error_type":"not_found"}}`, true,
			FileOperationError{Path: "/x", ErrorType: ErrorTypeNotFound, Message: "envelope"}},
		{`{"success":false,"message":"envelope","data":{"message":"own","error_type":"io_error","retryable":true}}`, true,
			FileOperationError{Message: "own", ErrorType: "io_error", Retryable: true}},
		{`{"success":false,"message":"no data"}`, true, FileOperationError{Message: "no data"}},
	}
	for _, tt := range tests {
		var r Response[json.RawMessage]
		if err := json.Unmarshal([]byte(tt.body), &r); err != nil {
			t.Fatalf("Unmarshal(%s): %v", tt.body, err)
		}
		got, failed := Failure(r)
		if failed != tt.wantFailed || got != tt.want {
			t.Errorf("Failure(%s) = %+v, %t; want %+v, %t", tt.body, got, failed, tt.want, tt.wantFailed)
		}
	}
}

func TestSyncExecWireForm(t *testing.T) {
	b, err := json.Marshal(SyncExec("echo $A", "/home/user", map[string]string{"A": "1"}, 30))
	want := `{"command":"echo $A","exec_dir":"/home/user","env":{"A":"1"},"async_mode":false,"timeout":35,"hard_timeout":30,"max_output_length":0}`
	if err != nil || string(b) != want {
		t.Errorf("Marshal = %s, %v; want %s", b, err, want)
	}
	var r ExecRequest
	if err := json.Unmarshal([]byte(`{"command":"true"}`), &r); err != nil || r.HardTimeout != nil || r.MaxOutputLength != nil {
		t.Errorf("Unmarshal minimal request = %+v, %v; want nil optional fields", r, err)
	}
}

func TestUploadBody(t *testing.T) {
	body, ct := UploadBody("/home/user/dir/f.txt", strings.NewReader("bytes"))
	_, params, err := mime.ParseMediaType(ct)
	if err != nil {
		t.Fatal(err)
	}
	mr := multipart.NewReader(body, params["boundary"])
	var got []string
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(part)
		got = append(got, part.FormName()+"|"+part.FileName()+"|"+string(b))
	}
	want := []string{"path||/home/user/dir/f.txt", "file|f.txt|bytes"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("parts = %q, want %q", got, want)
	}
}
