package providererr_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/internal/providererr"
	"github.com/sandbox-broker/sandbox-broker/pkg/core"
)

func TestTransport(t *testing.T) {
	cause := fmt.Errorf("post: %w", context.DeadlineExceeded)
	err := providererr.Transport("create sandbox", cause)
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
	err := providererr.WithCause(pe, sentinel)
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
		if got := providererr.AmbiguousStatus(tt.status); got != tt.want {
			t.Errorf("AmbiguousStatus(%d) = %v, want %v", tt.status, got, tt.want)
		}
	}
}
