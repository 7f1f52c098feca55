package providerhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/internal/providerhttp"
)

func TestTransport(t *testing.T) {
	cause := fmt.Errorf("post: %w", context.DeadlineExceeded)
	err := providerhttp.Transport("create sandbox", cause)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(%v, DeadlineExceeded) = false, want true", err)
	}
	var pe *core.ProviderError
	if !errors.As(err, &pe) {
		t.Fatalf("errors.As(%v, *core.ProviderError) = false, want true", err)
	}
	if pe.Op != "create sandbox" || pe.Message != cause.Error() || !pe.Ambiguous {
		t.Errorf("ProviderError = %+v, want op %q, message %q, ambiguous", pe, "create sandbox", cause.Error())
	}
	if got, want := err.Error(), pe.Error(); got != want {
		t.Errorf("Error() = %q, want the ProviderError's %q", got, want)
	}
}

func TestWithCause(t *testing.T) {
	sentinel := errors.New("image too old")
	pe := &core.ProviderError{Op: "exec", Message: "no"}
	err := providerhttp.WithCause(pe, sentinel)
	var got *core.ProviderError
	if !errors.Is(err, sentinel) || !errors.As(err, &got) || got != pe {
		t.Errorf("WithCause: Is(sentinel)=%v, As=%v (%p, want %p)", errors.Is(err, sentinel), errors.As(err, &got), got, pe)
	}
	if core.IsAmbiguous(err) {
		t.Errorf("IsAmbiguous(%v) = true, want false (pe is certain)", err)
	}
}

func TestAmbiguousStatus(t *testing.T) {
	tests := []struct {
		status int
		want   bool
	}{
		{http.StatusBadRequest, false},
		{http.StatusUnauthorized, false},
		{http.StatusNotFound, false},
		{http.StatusConflict, false},
		{http.StatusRequestTimeout, true},
		{http.StatusTooManyRequests, true},
		{http.StatusInternalServerError, true},
		{http.StatusBadGateway, true},
		{http.StatusFound, true},
	}
	for _, tt := range tests {
		if got := providerhttp.AmbiguousStatus(tt.status); got != tt.want {
			t.Errorf("AmbiguousStatus(%d) = %v, want %v", tt.status, got, tt.want)
		}
	}
}

func TestDoHeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/late" {
			select { // headers never come before the client gives up
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		// Headers at once, then a body slower than the header timeout.
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(w, "slow body")
	}))
	defer srv.Close()
	defer close(release)

	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+"/late", nil)
	start := time.Now()
	resp, cancel, err := providerhttp.DoHeaderTimeout(srv.Client(), req, 100*time.Millisecond)
	if !errors.Is(err, providerhttp.ErrHeaderTimeout) || !errors.Is(err, context.DeadlineExceeded) || resp != nil || cancel != nil {
		t.Errorf("late headers: resp %v, cancel set %v, error %v; want ErrHeaderTimeout and DeadlineExceeded", resp, cancel != nil, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("late headers: gave up after %s, want about 100ms", d)
	}

	req, _ = http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+"/slow", nil)
	resp, cancel, err = providerhttp.DoHeaderTimeout(srv.Client(), req, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("slow body: %v", err)
	}
	defer cancel(nil)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "slow body" {
		t.Errorf("slow body: read %q, %v; want %q (only the headers are bounded)", b, err, "slow body")
	}
}
