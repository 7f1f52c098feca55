package faults

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
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

// TestHold: a held request is sent once the rule is disarmed (after an
// unmatched one sent meanwhile), or fails with its context's error,
// unsent, when that ends first.
func TestHold(t *testing.T) {
	var mu sync.Mutex
	var order []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		order = append(order, r.URL.Path)
		mu.Unlock()
	}))
	defer srv.Close()
	tests := []struct {
		name      string
		cancel    bool // the held request's context ends before the disarm
		wantOrder []string
	}{
		{"disarmed", false, []string{"/other", "/held"}},
		{"context ended", true, []string{"/other"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			order = nil
			tr := &Transport{}
			c := &http.Client{Transport: tr}
			reached := make(chan struct{}, 1)
			tr.Arm(Hold, func(r Request) bool {
				if r.Path != "/held" {
					return false
				}
				reached <- struct{}{}
				return true
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			held := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/held", nil)
				resp, err := c.Do(req)
				if err == nil {
					_ = resp.Body.Close()
				}
				held <- err
			}()
			<-reached
			resp, err := c.Get(srv.URL + "/other")
			if err != nil {
				t.Fatalf("unmatched request: %v", err)
			}
			_ = resp.Body.Close()
			if tt.cancel {
				cancel()
				if err := <-held; !errors.Is(err, context.Canceled) {
					t.Errorf("held request after its context ended = %v, want canceled", err)
				}
			}
			tr.Disarm()
			if !tt.cancel {
				if err := <-held; err != nil {
					t.Errorf("held request after disarm = %v, want sent", err)
				}
			}
			if hits := tr.Hits(); hits != 1 { // counted once the rule matched: read after the request ended
				t.Errorf("hits = %d, want 1", hits)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(order, tt.wantOrder) {
				t.Errorf("server saw %v, want %v", order, tt.wantOrder)
			}
		})
	}
}

func TestBodyMatchers(t *testing.T) {
	r := Request{Method: "POST", Path: "/x", Body: []byte(`{"pk":"WTR#d#t#0"}`)}
	post := PathSuffix("POST", "/x")
	for _, tt := range []struct {
		name string
		m    Match
		want bool
	}{
		{"contains, present", BodyContains(post, "WTR#"), true},
		{"contains, absent", BodyContains(post, "WQ#"), false},
		{"lacks, absent", BodyLacks(post, "WQ#"), true},
		{"lacks, present", BodyLacks(post, "WTR#"), false},
		{"lacks, other request", BodyLacks(PathSuffix("GET", "/x"), "WQ#"), false},
	} {
		if got := tt.m(r); got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, got, tt.want)
		}
	}
}
