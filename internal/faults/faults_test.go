package faults

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestTransportKinds(t *testing.T) {
	var applied atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		applied.Add(1)
		_, _ = io.WriteString(w, "0123456789")
	}))
	defer srv.Close()
	tests := []struct {
		kind        Kind
		wantApplied int64
		wantErr     bool // the round trip fails
		wantBodyErr bool // the body read fails
	}{
		{Fail, 0, true, false},
		{Stall, 0, true, false},
		{Lost, 1, true, false},
		{Cut, 1, false, true},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind), func(t *testing.T) {
			applied.Store(0)
			tr := &Transport{}
			c := &http.Client{Transport: tr}
			tr.Arm(tt.kind, BodyContains(PathSuffix("POST", "/x"), "hit"))
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/x", strings.NewReader("hit me"))
			resp, err := c.Do(req)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err == nil {
				_, berr := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if (berr != nil) != tt.wantBodyErr {
					t.Errorf("body err = %v, want error %v", berr, tt.wantBodyErr)
				}
			}
			if tt.kind == Stall && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("stall err = %v, want the caller's deadline", err)
			}
			if got := applied.Load(); got != tt.wantApplied {
				t.Errorf("applied %d times, want %d", got, tt.wantApplied)
			}
			// A request the rule does not match passes untouched.
			resp, err = c.Post(srv.URL+"/x", "text/plain", strings.NewReader("other"))
			if err != nil {
				t.Fatalf("unmatched request: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if string(b) != "0123456789" {
				t.Errorf("unmatched body = %q", b)
			}
			if hits := tr.Disarm(); hits != 1 {
				t.Errorf("hits = %d, want 1", hits)
			}
		})
	}
}

func TestDynamoDBMatcher(t *testing.T) {
	h := http.Header{}
	h.Set("X-Amz-Target", "DynamoDB_20120810.UpdateItem")
	for _, tt := range []struct {
		op   string
		want bool
	}{{"UpdateItem", true}, {"", true}, {"PutItem", false}} {
		if got := DynamoDB(tt.op)(Request{Header: h}); got != tt.want {
			t.Errorf("DynamoDB(%q) = %v, want %v", tt.op, got, tt.want)
		}
	}
}
