package memstore

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// quotaRetry is the retry time of a quota refusal (the DynamoDB store's).
const quotaRetry = 5 * time.Second

// bindingIs reports whether key's binding is what a write replacing it
// expects: naming replaceID, or replaceRes, or (both empty) absent.
func (s *Store) bindingIs(key core.ThreadKey, replaceID, replaceRes string) bool {
	b, ok := s.bindings[key]
	switch {
	case replaceID != "":
		return ok && b.SandboxID == replaceID
	case replaceRes != "":
		return ok && b.Reservation == replaceRes
	}
	return !ok
}

// take is a take of a running slot for a thread: within limit, or the
// slot grant holds in trust; with the thread's user's and tenant's counts
// within their caps (0: none).
type take struct {
	key                 core.ThreadKey
	limit               int
	maxUser, maxTenant  int
	grant               *core.Grant
	skipQuota, skipRoom bool
	// below, when set, is a fair-share condition on the tenant's count.
	below *core.TenantBelow
}

// checkTake reports why t cannot be taken, in the DynamoDB store's order:
// the grant lost, the user's quota, the tenant's, its fair share,
// draining, capacity.
func (s *Store) checkTake(t take) error {
	if t.grant != nil && !s.holdsGrant(*t.grant) {
		return fmt.Errorf("take: %w", core.ErrGrantLost)
	}
	if !t.skipQuota {
		if t.maxUser > 0 && s.users[userKey{t.key.Tenant, t.key.User}] >= t.maxUser {
			return &core.CapacityError{Reason: api.RefusalUserQuota, RetryAfter: quotaRetry, Status: core.CapacityStatus{Limit: t.limit}}
		}
		if t.maxTenant > 0 && s.tenants[t.key.Tenant] >= t.maxTenant {
			return &core.CapacityError{Reason: api.RefusalTenantQuota, RetryAfter: quotaRetry, Status: core.CapacityStatus{Limit: t.limit}}
		}
	}
	if t.below != nil && s.tenants[t.below.Tenant] >= t.below.Slots {
		return fmt.Errorf("tenant %s holds %d slots: %w", t.below.Tenant, s.tenants[t.below.Tenant], core.ErrAtFairShare)
	}
	if s.draining {
		st, tenants := s.status()
		st.Limit = t.limit
		return &core.CapacityError{Reason: api.RefusalDraining, Status: st, Tenants: tenants}
	}
	if t.grant == nil && !t.skipRoom && s.running >= t.limit {
		st, tenants := s.status()
		st.Limit = t.limit
		return &core.CapacityError{Reason: api.RefusalCapacity, Status: st, Tenants: tenants}
	}
	return nil
}

// doTake takes t's slot (checked by checkTake): the grant's (its ticket
// and place leave the queue) or a new one, and the user's and tenant's
// counts unless t.skipQuota.
func (s *Store) doTake(t take) {
	if t.grant != nil {
		s.granted--
		s.removeTicket(t.grant.Ticket.ID)
		s.dropPlace(t.grant.Ticket)
	} else {
		s.running++
	}
	if !t.skipQuota {
		s.users[userKey{t.key.Tenant, t.key.User}]++
		s.tenants[t.key.Tenant]++
	}
}

// freeRunning frees a running slot (and its user's and tenant's counts
// when quota).
func (s *Store) freeRunning(key core.ThreadKey, quota bool) {
	s.running--
	if quota {
		s.users[userKey{key.Tenant, key.User}]--
		s.tenants[key.Tenant]--
		if s.tenants[key.Tenant] <= 0 {
			delete(s.tenants, key.Tenant)
		}
	}
}

// freePaused frees e's paused slot (and its tenant's paused count).
func (s *Store) freePaused(e *entry) {
	s.paused--
	if e.rec.Slots.TenantPaused && e.rec.Tenant != "" {
		s.tenantPaused[e.rec.Tenant]--
	}
	e.rec.Slots.Paused, e.rec.Slots.TenantPaused = false, false
}

// takePaused takes a paused slot for e (its tenant's paused count too).
func (s *Store) takePaused(e *entry) {
	s.paused++
	e.rec.Slots.Paused = true
	if e.rec.Tenant != "" {
		e.rec.Slots.TenantPaused = true
		s.tenantPaused[e.rec.Tenant]++
	}
}

// Reserve takes a slot and binds the thread to the reservation (see
// core.Store.Reserve). Refusals come in the DynamoDB store's order: the
// binding, an existing reservation, the grant, the quotas, draining,
// capacity.
func (s *Store) Reserve(_ context.Context, r core.Reservation) error {
	r.Now, r.ExpiresAt = ms(r.Now), ms(r.ExpiresAt)
	if h := r.Handover; h != nil && (r.Grant != nil || h.Tenant == "") {
		return fmt.Errorf("reserve: a handover of %s with a grant or of no tenant: %w", h.SandboxID, core.ErrConflict)
	}
	return s.write("Reserve", func() error {
		if !s.bindingIs(r.ThreadKey, r.ReplaceSandboxID, r.ReplaceReservation) {
			return fmt.Errorf("thread %s: %w", r.ThreadKey, core.ErrThreadBound)
		}
		if _, ok := s.reservations[r.Token]; ok {
			return fmt.Errorf("reservation %s exists: %w", r.Token, core.ErrConflict)
		}
		t := take{key: r.ThreadKey, limit: r.Limit, maxUser: r.MaxPerUser, maxTenant: r.MaxPerTenant, grant: r.Grant}
		if r.Handover != nil {
			if err := s.handOver(r, t); err != nil {
				return err
			}
		} else if err := s.checkTake(t); err != nil {
			return err
		} else {
			s.doTake(t)
		}
		s.reservations[r.Token] = &reservation{quota: true, seed: r.Seed, pending: core.PendingReservation{
			Token: r.Token, ThreadKey: r.ThreadKey, CreatedAt: r.Now, ExpiresAt: r.ExpiresAt}}
		s.bindings[r.ThreadKey] = core.Binding{ThreadKey: r.ThreadKey, Reservation: r.Token, ReservationExpiresAt: r.ExpiresAt}
		return nil
	})
}

// handOver is t, a reservation's take, of the running slot r.Handover
// holds, as if freed and taken again at once: the tombstone ends gone and
// its slot (with its user's and tenant's counts) passes to t's thread.
// ErrConflict when the slot cannot change holder (over a lowered limit).
func (s *Store) handOver(r core.Reservation, t take) error {
	e, err := s.current(*r.Handover)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	if !e.rec.Slots.Running() {
		return fmt.Errorf("reserve: sandbox %s holds no running slot: %w", e.rec.SandboxID, core.ErrConflict)
	}
	from := take{key: e.rec.ThreadKey, skipQuota: !e.quota}
	s.freeRunning(from.key, e.quota)
	if err := s.checkTake(t); err != nil {
		s.doTake(from) // undone: the tombstone keeps its slot
		if ce, ok := err.(*core.CapacityError); ok && ce.Reason == api.RefusalCapacity {
			return fmt.Errorf("reserve: the slot of %s cannot change holder: %w", e.rec.SandboxID, core.ErrConflict)
		}
		return err
	}
	s.doTake(t)
	s.end(e, r.Handover.EndReason, r.Now)
	return nil
}

// Finalize turns reservation token into rec (fence 1), moving the binding
// to it; ErrConflict when the reservation is gone, the binding no longer
// names it or the record exists.
func (s *Store) Finalize(_ context.Context, token string, rec core.Record) (core.Record, error) {
	rec = msRecord(rec)
	return s.writeRecord("Finalize", func() (core.Record, error) {
		res, ok := s.reservations[token]
		b, bound := s.bindings[rec.ThreadKey]
		_, exists := s.records[rec.SandboxID]
		if !ok || !res.quota || !bound || b.Reservation != token || exists {
			return core.Record{}, fmt.Errorf("finalize reservation %s: %w", token, core.ErrConflict)
		}
		delete(s.reservations, token)
		rec = s.put(rec, token, res.quota, false)
		s.bindings[rec.ThreadKey] = core.Binding{ThreadKey: rec.ThreadKey, SandboxID: rec.SandboxID}
		return rec, nil
	})
}

// put stores rec at fence 1 (holding a running slot already counted, with
// quota, and a pool place when poolPlace) and returns it.
func (s *Store) put(rec core.Record, token string, quota, poolPlace bool) core.Record {
	rec.Fence = 1
	rec.ReservationToken = token
	rec.Slot = core.Slot{}
	at := rec.UpdatedAt
	if parkedState(rec.State) {
		at = rec.ParkedAt
	}
	s.records[rec.SandboxID] = &entry{rec: rec, quota: quota, poolPlace: poolPlace, at: at}
	return rec
}

// FreeReservation drops a reservation and frees its slot (a pool
// reservation's place too, key zero), then the binding if it still names
// it; ErrNotFound when there is no such reservation.
func (s *Store) FreeReservation(_ context.Context, token string, key core.ThreadKey) error {
	return s.write("FreeReservation", func() error {
		res, ok := s.reservations[token]
		if !ok {
			return fmt.Errorf("free reservation %s: %w", token, core.ErrNotFound)
		}
		delete(s.reservations, token)
		s.freeRunning(res.pending.ThreadKey, res.quota)
		if !res.quota {
			s.movePool(-1)
		}
		if b, ok := s.bindings[key]; ok && b.Reservation == token {
			delete(s.bindings, key)
		}
		return nil
	})
}

// movePool moves the pool's place count by delta.
func (s *Store) movePool(delta int) {
	s.pool += delta
	s.poolRevision++
}

// Free marks rec gone (fenced by rec.Fence: else ErrStaleFence) and frees
// every slot and place it holds.
func (s *Store) Free(_ context.Context, rec core.Record, now time.Time) error {
	now = ms(now)
	return s.write("Free", func() error {
		e, err := s.current(rec)
		if err != nil {
			return err
		}
		if e.rec.Slots.Running() {
			s.freeRunning(e.rec.ThreadKey, e.quota)
		}
		s.end(e, rec.EndReason, now)
		return nil
	})
}

// current is rec's entry when rec is current (its fence, not gone), else
// ErrStaleFence.
func (s *Store) current(rec core.Record) (*entry, error) {
	e, ok := s.records[rec.SandboxID]
	if !ok || e.rec.Fence != rec.Fence || e.rec.State == core.StateGone {
		return nil, fmt.Errorf("sandbox %s fence %d: %w", rec.SandboxID, rec.Fence, core.ErrStaleFence)
	}
	return e, nil
}

// end marks e gone for reason (when set), freeing its paused slot and
// pool place; its running slot is the caller's to free or pass on.
func (s *Store) end(e *entry, reason string, now time.Time) {
	if e.rec.Slots.Paused {
		s.freePaused(e)
	}
	if e.poolPlace {
		s.movePool(-1)
	}
	e.quota, e.poolPlace = false, false
	e.rec.State, e.rec.UpdatedAt, e.at = core.StateGone, now, now
	e.rec.Fence++
	e.rec.LeaseOwner, e.rec.LeaseExpiresAt = "", time.Time{}
	e.rec.Endpoint.AccessToken = ""
	if reason != "" {
		e.rec.EndReason = reason
	}
}

// status sums the slots by state (every record holding a running slot,
// every reservation), and lists the tenants holding slots.
func (s *Store) status() (core.CapacityStatus, []string) {
	st := core.CapacityStatus{Used: s.running, Granted: s.granted, Paused: s.paused, Draining: s.draining,
		Reserved: len(s.reservations)}
	for _, e := range s.records {
		if !e.rec.Slots.Running() || e.rec.State == core.StateGone {
			continue
		}
		st.AddState(e.rec.State, 1)
	}
	var tenants []string
	for t, n := range s.tenants {
		if n > 0 {
			tenants = append(tenants, t)
		}
	}
	slices.Sort(tenants)
	return st, tenants
}

// Capacity reports the deployment's slots, with the counts by state of
// this moment (CountedAt zero: counted on every read; Limit and Policy
// are the caller's to fill).
func (s *Store) Capacity(context.Context) (core.CapacityStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, _ := s.status()
	return st, nil
}

// TenantsHolding lists the tenants holding slots, sorted.
func (s *Store) TenantsHolding(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, tenants := s.status()
	return tenants, nil
}

// list returns up to limit records in state that keep, in listing order
// (oldest first; limit <= 0: all).
func (s *Store) list(state core.State, limit int, keep func(*entry) bool) []core.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	var es []*entry
	for _, e := range s.records {
		if e.rec.State == state && (keep == nil || keep(e)) {
			es = append(es, e)
		}
	}
	sort.Slice(es, func(i, j int) bool {
		if !es[i].at.Equal(es[j].at) {
			return es[i].at.Before(es[j].at)
		}
		return es[i].rec.SandboxID < es[j].rec.SandboxID
	})
	if limit > 0 && len(es) > limit {
		es = es[:limit]
	}
	out := make([]core.Record, len(es))
	for i, e := range es {
		out[i] = e.rec
	}
	return out
}

// WarmParkedBefore lists up to limit warm records parked before t, oldest
// first.
func (s *Store) WarmParkedBefore(_ context.Context, t time.Time, limit int) ([]core.Record, error) {
	return s.list(core.StateWarm, limit, func(e *entry) bool { return e.rec.ParkedAt.Before(t) }), nil
}

// Sample lists up to limit records in state, oldest first: all of them
// (every part of the state is the sample).
func (s *Store) Sample(_ context.Context, state core.State, limit int) ([]core.Record, error) {
	return s.list(state, limit, nil), nil
}

// OwnWarm lists up to limit warm records of tenant (of its user only when
// user is not empty), least recently parked first.
func (s *Store) OwnWarm(_ context.Context, tenant, user string, limit int) ([]core.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	return s.list(core.StateWarm, limit, func(e *entry) bool {
		return e.rec.Tenant == tenant && (user == "" || e.rec.User == user)
	}), nil
}

// Tombstones lists up to limit records in StateDestroying, oldest first.
func (s *Store) Tombstones(_ context.Context, limit int) ([]core.Record, error) {
	return s.list(core.StateDestroying, limit, nil), nil
}
