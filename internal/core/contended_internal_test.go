package core

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// An acquire whose time ran out on races answers the retryable conflict
// of a held lease, naming the last race only as text: the HTTP layer
// branches on ErrNotFound before ErrLeaseHeld, so a wrapped ErrNotFound
// would turn the retryable 409 into a 404. Any other error is left as is.
func TestContendedIsTheRetryableConflict(t *testing.T) {
	for _, race := range []error{ErrThreadBound, ErrConflict, ErrNotFound, ErrStaleFence} {
		t.Run(race.Error(), func(t *testing.T) {
			got := contended(fmt.Errorf("claim: %w", race))
			if !errors.Is(got, ErrLeaseHeld) {
				t.Errorf("contended(%v) = %v, want it to wrap ErrLeaseHeld", race, got)
			}
			if errors.Is(got, race) {
				t.Errorf("contended(%v) = %v still wraps %v, want it as text only", race, got, race)
			}
		})
	}
	for _, other := range []error{ErrStoreUnavailable, &CapacityError{Reason: api.RefusalCapacity}, errors.New("bug")} {
		t.Run("passes "+other.Error(), func(t *testing.T) {
			if got := contended(other); got != other {
				t.Errorf("contended(%v) = %v, want it unchanged", other, got)
			}
		})
	}
}
