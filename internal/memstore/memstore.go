// Package memstore is the broker's whole store contract (core.Store, with
// every interface it embeds, and core.StorageStore) in memory: one
// mutex over maps of records, reservations, bindings, wait tickets and
// counters. Every write is atomic and exact, so the store never loses a
// race it did not have to, and it keeps one ledger for the running slots
// (a record's core.Slot is always the zero Slot). Engine tests run on it,
// and storetest holds it and the DynamoDB store to the same contract.
//
// A fault hook (Store.Fail) makes writes fail as a real store's do: before
// they apply, or after (the reply lost: an error wrapping
// core.ErrStoreUnavailable).
package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

var _ core.Store = (*Store)(nil)

// Store is an in-memory store. The zero value is not usable: call New.
type Store struct {
	mu   sync.Mutex
	hook func(op string) Fault

	records      map[string]*entry
	reservations map[string]*reservation
	bindings     map[core.ThreadKey]core.Binding

	// running counts the running slots held (those held in trust for
	// granted tickets included), granted those in trust; paused the
	// paused slots; pool the pool's places.
	running, granted, paused int
	pool                     int
	poolRevision             int64
	refillBackoff            core.RefillBackoff
	users                    map[userKey]int
	tenants                  map[string]int
	tenantPaused             map[string]int
	draining                 bool

	places map[placeKey]place
	queue  []*ticket // in service order (Ticket.Key)

	firstSeen   map[string]time.Time
	cursor      core.ReconcileCursor
	cursorSaved bool
	seen        map[string]map[string][]core.SeenSandbox

	// storedThread and storedTenant are the output storage ledger
	// (core.StorageStore).
	storedThread map[core.ThreadKey]int64
	storedTenant map[string]int64
	// owed notes the sandboxes whose outputs are not all stored, with
	// when each was noted (NoteOutputsOwed).
	owed     map[string]time.Time
	webhooks map[string]time.Time // event id -> remembered until
}

// entry is a stored record and what the store keeps beside it.
type entry struct {
	rec core.Record
	// quota: the running slot is counted in its user's and tenant's slot
	// counts (a thread's record; a pool member's is not until claimed).
	quota bool
	// poolPlace: a thread-less record holding one of the pool's places.
	poolPlace bool
	// at orders the record in its state's listings: its park time when
	// warm or paused, else the time of the write that moved it there.
	at time.Time
}

// reservation is a slot taken for a create in flight.
type reservation struct {
	pending core.PendingReservation
	seed    string
	// quota: a thread's reservation, counted in its user's and tenant's
	// slot counts; a pool reservation holds a pool place instead.
	quota bool
}

// userKey names one user's slot count.
type userKey struct{ tenant, user string }

// New returns an empty store: no records, nothing draining.
func New() *Store {
	return &Store{
		records:      map[string]*entry{},
		reservations: map[string]*reservation{},
		bindings:     map[core.ThreadKey]core.Binding{},
		users:        map[userKey]int{},
		tenants:      map[string]int{},
		tenantPaused: map[string]int{},
		places:       map[placeKey]place{},
		firstSeen:    map[string]time.Time{},
		seen:         map[string]map[string][]core.SeenSandbox{},
		storedThread: map[core.ThreadKey]int64{},
		storedTenant: map[string]int64{},
		owed:         map[string]time.Time{},
		webhooks:     map[string]time.Time{},
	}
}

// SeenWebhook records a webhook event id (see core.WebhookStore).
func (s *Store) SeenWebhook(_ context.Context, id string, now, until time.Time) error {
	return s.write("SeenWebhook", func() error {
		if u, ok := s.webhooks[id]; ok && now.Before(u) {
			return fmt.Errorf("webhook %s seen before: %w", id, core.ErrConflict)
		}
		s.webhooks[id] = until
		return nil
	})
}

// Fault is what a fault hook decides for one write.
type Fault struct {
	// Err, when not nil, is returned by the write.
	Err error
	// Applied: the write applies before Err is returned (a lost reply);
	// otherwise nothing is written.
	Applied bool
}

// ErrInjected is the error of the faults FailNext injects.
var ErrInjected = errors.New("memstore: injected fault")

// Fail sets the fault hook: it is called, outside the store's lock, with
// the name of every write (the method's, e.g. "Reserve") before the write
// runs, and decides whether it fails. nil removes the hook. Reads never
// fail.
func (s *Store) Fail(hook func(op string) Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hook = hook
}

// FailNext makes the next write named op (any write when op is "") fail
// once: without applying (an error wrapping ErrInjected: certainly not
// applied), or when applied is set after applying (an error wrapping
// core.ErrStoreUnavailable and ErrInjected: maybe applied).
func (s *Store) FailNext(op string, applied bool) {
	var once sync.Once
	s.Fail(func(name string) Fault {
		if op != "" && name != op {
			return Fault{}
		}
		f := Fault{}
		once.Do(func() {
			f = Fault{Err: fmt.Errorf("%s: %w", name, ErrInjected), Applied: applied}
			if applied {
				f.Err = fmt.Errorf("%s: %w: %w", name, core.ErrStoreUnavailable, ErrInjected)
			}
		})
		return f
	})
}

// write runs apply, one write named op, under the lock, with the fault
// hook's decision: an error before it applies, or after it (then the
// hook's error is returned whatever apply said).
func (s *Store) write(op string, apply func() error) error {
	s.mu.Lock()
	hook := s.hook
	s.mu.Unlock()
	var f Fault
	if hook != nil {
		f = hook(op)
	}
	if f.Err != nil && !f.Applied {
		return f.Err
	}
	s.mu.Lock()
	err := apply()
	s.mu.Unlock()
	if f.Err != nil {
		return f.Err
	}
	return err
}

// writeRecord is write for a write returning a record: the zero Record
// with any error the hook injects.
func (s *Store) writeRecord(op string, apply func() (core.Record, error)) (core.Record, error) {
	var out core.Record
	err := s.write(op, func() error {
		var err error
		out, err = apply()
		return err
	})
	if err != nil && !errors.Is(err, core.ErrConflict) && !errors.Is(err, core.ErrLeaseHeld) && !errors.Is(err, core.ErrStaleFence) {
		return core.Record{}, err
	}
	return out, err
}

// Lookup reads the thread's binding, the draining flag and the tenant's
// slot count.
func (s *Store) Lookup(_ context.Context, key core.ThreadKey, _ int) (core.Lookup, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.bindings[key]
	if !ok {
		b = core.Binding{ThreadKey: key}
	}
	return core.Lookup{Binding: b, Bound: ok, Draining: s.draining, TenantUsed: s.tenants[key.Tenant]}, nil
}

// Get reads a record; ErrNotFound if none.
func (s *Store) Get(_ context.Context, id string) (core.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.records[id]
	if !ok {
		return core.Record{}, core.ErrNotFound
	}
	return e.rec, nil
}

// keepsParkTime reports whether a claim into st keeps the record's park
// time (a pause given up returns to warm parked when it was).
func keepsParkTime(st core.State) bool {
	switch st {
	case core.StateWarm, core.StatePausing, core.StatePaused, core.StateResuming:
		return true
	}
	return false
}

// parkedState reports whether records in st are listed by park time.
func parkedState(st core.State) bool { return st == core.StateWarm || st == core.StatePaused }

// meter moves the record's metering interval to end at now (see
// core.Record.MeteredAt); call before the state changes.
func meter(r *core.Record, now time.Time) {
	r.PrevMeteredAt = r.MeteredAt
	if r.PrevMeteredAt.IsZero() {
		r.PrevMeteredAt = now
	}
	r.MeteredAt, r.MeteredState = now, r.State
}

// moveTo moves e's record to state st at now (prev state, metering, the
// tombstone's first time and the listing time at).
func moveTo(e *entry, st core.State, now, at time.Time) {
	meter(&e.rec, now)
	e.rec.PrevState, e.rec.State = e.rec.State, st
	if st == core.StateDestroying && e.rec.DestroyingSince.IsZero() {
		e.rec.DestroyingSince = now
	}
	e.at = at
}

// claimable checks a claim's record conditions: c.Tenant's (else
// ErrNotFound; user too when set), in one of c.From (else ErrConflict) and
// not leased by another owner at c.Now (else ErrLeaseHeld).
func (s *Store) claimable(c core.Claim, user string) (*entry, error) {
	e, ok := s.records[c.SandboxID]
	if !ok || e.rec.Tenant != c.Tenant || user != "" && e.rec.User != user {
		return nil, core.ErrNotFound
	}
	if !slices.Contains(c.From, e.rec.State) {
		return e, fmt.Errorf("sandbox %s is %s: %w", c.SandboxID, e.rec.State, core.ErrConflict)
	}
	if e.rec.Leased(c.Owner, c.Now) {
		return e, fmt.Errorf("sandbox %s: %w", c.SandboxID, core.ErrLeaseHeld)
	}
	return e, nil
}

// lease takes c's lease on e (or clears it when c takes none).
func lease(e *entry, c core.Claim) {
	e.rec.UpdatedAt = c.Now
	e.rec.Fence++
	e.rec.LeaseOwner, e.rec.LeaseExpiresAt = c.Owner, c.LeaseUntil
	if c.LeaseUntil.IsZero() {
		e.rec.LeaseOwner = ""
	}
}

// Claim applies c (see core.Store.Claim).
func (s *Store) Claim(_ context.Context, c core.Claim) (core.Record, error) {
	if len(c.From) == 0 {
		return core.Record{}, errors.New("claim: no source states")
	}
	c = msClaim(c)
	return s.writeRecord("Claim", func() (core.Record, error) {
		e, err := s.claimable(c, "")
		if err != nil {
			return recordOf(e), err
		}
		if err := s.checkBelow(c); err != nil {
			return core.Record{}, err
		}
		lease(e, c)
		if c.To != "" {
			moveTo(e, c.To, c.Now, c.Now)
			if !keepsParkTime(c.To) {
				e.rec.ParkedAt = time.Time{}
			}
		}
		return e.rec, nil
	})
}

// recordOf is e's record (the zero Record when e is nil).
func recordOf(e *entry) core.Record {
	if e == nil {
		return core.Record{}
	}
	return e.rec
}

// checkBelow checks a claim's conditions on the tenants' counts
// (core.Claim.Below and PausedBelow): ErrAtFairShare when they fail.
func (s *Store) checkBelow(c core.Claim) error {
	if b := c.Below; b != nil && s.tenants[b.Tenant] >= b.Slots {
		return fmt.Errorf("claim sandbox %s: tenant %s holds %d slots: %w", c.SandboxID, b.Tenant, s.tenants[b.Tenant], core.ErrAtFairShare)
	}
	if p := c.PausedBelow; p != nil {
		if p.Tenant == c.Tenant {
			return fmt.Errorf("a paused share check of tenant %s against itself", p.Tenant)
		}
		if s.tenantPaused[p.Tenant] > p.Held || s.tenantPaused[c.Tenant] < p.Held+2 {
			return fmt.Errorf("claim sandbox %s: paused counts: %w", c.SandboxID, core.ErrAtFairShare)
		}
	}
	return nil
}

// Apply makes a fenced update (see core.Update).
func (s *Store) Apply(_ context.Context, u core.Update) (core.Record, error) {
	u.Now, u.ParkedAt, u.ExpiresAt = ms(u.Now), ms(u.ParkedAt), ms(u.ExpiresAt)
	return s.writeRecord("Apply", func() (core.Record, error) {
		e, ok := s.records[u.SandboxID]
		if !ok {
			return core.Record{}, core.ErrNotFound
		}
		if e.rec.Fence != u.Fence {
			return e.rec, fmt.Errorf("sandbox %s fence %d, now %d: %w", u.SandboxID, u.Fence, e.rec.Fence, core.ErrStaleFence)
		}
		metered := e.rec
		at := u.Now
		if parkedState(u.State) {
			at = u.ParkedAt
		}
		moveTo(e, u.State, u.Now, at)
		e.rec.PrevState = metered.PrevState // a fenced update keeps the claim's
		e.rec.UpdatedAt = u.Now
		e.rec.Fence++
		e.rec.ParkedAt = time.Time{}
		if parkedState(u.State) {
			e.rec.ParkedAt = u.ParkedAt
		}
		if !u.ExpiresAt.IsZero() {
			e.rec.ExpiresAt = u.ExpiresAt
		}
		if !u.KeepLease {
			e.rec.LeaseOwner, e.rec.LeaseExpiresAt = "", time.Time{}
		}
		if u.KillAttempt {
			e.rec.KillAttempts++
		}
		if u.EndReason != "" {
			e.rec.EndReason = u.EndReason
		}
		return e.rec, nil
	})
}

// Draining reports whether the deployment drains.
func (s *Store) Draining(context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining, nil
}

// SetDraining marks the deployment draining (or not); starting a drain
// marks every waiting ticket draining too.
func (s *Store) SetDraining(_ context.Context, draining bool) error {
	return s.write("SetDraining", func() error {
		s.draining = draining
		if draining {
			for _, t := range s.queue {
				if !t.granted {
					t.draining = true
				}
			}
		}
		return nil
	})
}

// ms is t as the DynamoDB store keeps it: whole milliseconds, UTC (the
// zero time stays zero), so that times read back, and the metering
// intervals summed from them, are the same on both stores.
func ms(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return time.UnixMilli(t.UnixMilli()).UTC()
}

// msRecord is rec with its times (and PausedFor) in whole milliseconds.
func msRecord(rec core.Record) core.Record {
	for _, t := range []*time.Time{&rec.LeaseExpiresAt, &rec.CreatedAt, &rec.UpdatedAt, &rec.ParkedAt, &rec.ExpiresAt, &rec.ExpiringSentFor,
		&rec.DestroyingSince, &rec.MeteredAt, &rec.PrevMeteredAt} {
		*t = ms(*t)
	}
	rec.PausedFor = rec.PausedFor.Truncate(time.Millisecond)
	return rec
}

// msClaim is c with its times in whole milliseconds.
func msClaim(c core.Claim) core.Claim {
	c.Now, c.LeaseUntil = ms(c.Now), ms(c.LeaseUntil)
	return c
}
