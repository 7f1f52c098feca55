package e2b

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// rotatingKeys is a KeySource whose cached key is stale until a refresh
// reads the source (next).
type rotatingKeys struct {
	mu        sync.Mutex
	cached    string
	next      string
	refreshes int
}

func (k *rotatingKeys) Key(_ context.Context, refresh bool) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if refresh {
		k.refreshes++
		k.cached = k.next
	}
	return k.cached, nil
}

// TestRefusedKeyIsRefreshed: after the key is rotated, the control plane
// (the local sandbox host, which checks X-API-Key) answers 401 to the cached
// key; the client asks its key source for a fresh key and sends the request
// once more with it. When the source has nothing newer, the 401 stands.
func TestRefusedKeyIsRefreshed(t *testing.T) {
	tests := []struct {
		name          string
		next          string
		wantErrStatus int // 0 = success
	}{
		{"rotated key picked up", testKey, 0},
		{"nothing newer", "still-wrong", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := &rotatingKeys{cached: "rotated-away", next: tt.next}
			c, _ := startHost(t, func(o *Options) { o.APIKey, o.Keys = "", keys })
			ctx := context.Background()
			ref, err := c.Create(ctx, core.CreateSpec{Timeout: time.Minute})
			var pe *core.ProviderError
			switch {
			case tt.wantErrStatus == 0 && err != nil:
				t.Fatalf("Create: %v, want success with the refreshed key", err)
			case tt.wantErrStatus != 0 && (!errors.As(err, &pe) || pe.StatusCode != tt.wantErrStatus || pe.Ambiguous):
				t.Fatalf("Create error = %v, want a certain HTTP %d provider error", err, tt.wantErrStatus)
			}
			if keys.refreshes != 1 {
				t.Errorf("refreshes = %d, want 1", keys.refreshes)
			}
			if tt.wantErrStatus != 0 {
				return
			}
			// Later calls use the refreshed key without another refresh.
			if err := c.Kill(ctx, ref.ID); err != nil {
				t.Fatalf("Kill: %v", err)
			}
			if keys.refreshes != 1 {
				t.Errorf("refreshes after a second call = %d, want still 1", keys.refreshes)
			}
		})
	}
}
