package memstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// placeKey names one of a tenant's waiter places.
type placeKey struct {
	tenant string
	n      int
}

// place is a held waiter place: free again once until has passed.
type place struct {
	ticket string
	until  time.Time
	round  int
}

// ticket is a queued wait ticket.
type ticket struct {
	t core.Ticket
	// granted: a running slot is held in trust for it until grantUntil.
	granted    bool
	grantUntil time.Time
	draining   bool
}

// live reports whether the ticket still counts at now: a waiting one until
// its waiter's wait ends, a granted one until its grant lapses.
func (t *ticket) live(now time.Time) bool {
	if t.granted {
		return now.Before(t.grantUntil)
	}
	return now.Before(t.t.Until)
}

// fairKey is a ticket's sort key: round, arrival, id.
func fairKey(round int, arrived time.Time, id string) string {
	return fmt.Sprintf("%010d#%015d#%s", round, arrived.UnixMilli(), id)
}

// findTicket returns the queued ticket id (nil when there is none).
func (s *Store) findTicket(id string) *ticket {
	for _, t := range s.queue {
		if t.t.ID == id {
			return t
		}
	}
	return nil
}

// removeTicket takes ticket id out of the queue.
func (s *Store) removeTicket(id string) {
	for i, t := range s.queue {
		if t.t.ID == id {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return
		}
	}
}

// dropPlace gives back t's place if t still holds it.
func (s *Store) dropPlace(t core.Ticket) {
	k := placeKey{t.Tenant, t.Place}
	if p, ok := s.places[k]; ok && p.ticket == t.ID {
		delete(s.places, k)
	}
}

// holdsGrant reports whether g's ticket is queued, granted, and still
// holds its place.
func (s *Store) holdsGrant(g core.Grant) bool {
	t := s.findTicket(g.Ticket.ID)
	p, ok := s.places[placeKey{g.Ticket.Tenant, g.Ticket.Place}]
	return t != nil && t.granted && ok && p.ticket == g.Ticket.ID
}

// EnterWait takes a free (or lapsed) place of w.Tenant's w.Max and queues
// w.Ticket: in the round of the queue's first live ticket, or one after
// the latest round the tenant's live places hold, whichever is later.
func (s *Store) EnterWait(_ context.Context, w core.Waiter) (core.Ticket, error) {
	if w.Max <= 0 {
		return core.Ticket{}, errors.New("enter wait: no places")
	}
	var out core.Ticket
	err := s.write("EnterWait", func() error {
		now := ms(w.Now)
		free, latest := -1, -1
		for n := range w.Max {
			p, ok := s.places[placeKey{w.Tenant, n}]
			if ok && now.Before(p.until) {
				latest = max(latest, p.round)
			} else if free < 0 {
				free = n
			}
		}
		if free < 0 {
			return &core.CapacityError{Reason: api.RefusalTooManyWaiters, RetryAfter: quotaRetry}
		}
		if s.findTicket(w.Ticket) != nil {
			return fmt.Errorf("enter wait: ticket %s: %w", w.Ticket, core.ErrConflict)
		}
		round := 0
		for i, t := range s.queue {
			if t.live(now) || i == len(s.queue)-1 {
				round = t.t.Round
				break
			}
		}
		if latest >= 0 {
			round = max(round, latest+1)
		}
		out = core.Ticket{ID: w.Ticket, Tenant: w.Tenant, Place: free, Round: round, Key: fairKey(round, now, w.Ticket),
			Arrived: now, Until: ms(w.Until)}
		s.places[placeKey{w.Tenant, free}] = place{ticket: w.Ticket, until: out.Until, round: round}
		s.queue = append(s.queue, &ticket{t: out})
		sort.SliceStable(s.queue, func(i, j int) bool { return s.queue[i].t.Key < s.queue[j].t.Key })
		return nil
	})
	if err != nil {
		return core.Ticket{}, err
	}
	return out, nil
}

// PollTicket reads the ticket.
func (s *Store) PollTicket(_ context.Context, t core.Ticket) (core.TicketState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.findTicket(t.ID)
	switch {
	case q == nil || q.t.Tenant != t.Tenant || q.t.Key != t.Key:
		return core.TicketState{Gone: true}, nil // none, or not the caller's
	case q.granted:
		return core.TicketState{Granted: true, Grant: core.Grant{Ticket: q.t, Until: q.grantUntil}}, nil
	}
	return core.TicketState{Draining: q.draining}, nil
}

// firstWaiting is the first live waiting ticket of the queue but skip
// (nil when there is none).
func (s *Store) firstWaiting(now time.Time, skip string) *ticket {
	for _, t := range s.queue {
		if !t.granted && t.live(now) && t.t.ID != skip {
			return t
		}
	}
	return nil
}

// AnyWaiting reports whether a live waiting ticket is queued.
func (s *Store) AnyWaiting(_ context.Context, now time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstWaiting(now, "") != nil, nil
}

// passOn ends grant g's ticket and hands its slot to next for grantFor
// from now, or frees it when next is nil.
func (s *Store) passOn(g, next *ticket, now time.Time, grantFor time.Duration) {
	s.removeTicket(g.t.ID)
	if next == nil {
		s.running--
		s.granted--
		return
	}
	next.granted, next.grantUntil = true, ms(now.Add(grantFor))
}

// LeaveWait takes the ticket out of the queue and gives back its place; a
// grant it holds goes to the first live waiting ticket (or its slot is
// freed).
func (s *Store) LeaveWait(_ context.Context, t core.Ticket, now time.Time, grantFor time.Duration) error {
	return s.write("LeaveWait", func() error {
		s.dropPlace(t)
		q := s.findTicket(t.ID)
		switch {
		case q == nil:
		case q.granted:
			s.passOn(q, s.firstWaiting(now, t.ID), now, grantFor)
		default:
			s.removeTicket(t.ID)
		}
		return nil
	})
}

// Dispatch serves the queue in order (see core.Dispatch): lapsed waiting
// tickets are removed, lapsed grants passed on to the first live waiting
// tickets (or their slots freed), then live waiting tickets are granted
// the room there is: the slot d.Freed names (when the ledger has room
// under d.Limit), and the ledger's whole room when d.Scan, or when d.Self
// is the first waiting ticket.
func (s *Store) Dispatch(_ context.Context, d core.Dispatch) (core.DispatchResult, error) {
	var res core.DispatchResult
	err := s.write("Dispatch", func() error {
		waiting := s.cleanQueue(d, &res)
		room := 0
		if d.Freed >= 0 {
			room = 1
		}
		read := false
		for len(waiting) > 0 {
			t := waiting[0]
			if room <= 0 {
				if read || !(d.Scan || d.Self != "" && t.t.ID == d.Self) {
					break
				}
				read = true
				res.Read = true
				res.Status, res.Tenants = s.status()
				res.Status.Limit = d.Limit
				room = d.Limit - s.running
				continue
			}
			if s.draining || s.running >= d.Limit {
				break
			}
			s.running++
			s.granted++
			t.granted, t.grantUntil = true, ms(d.Now.Add(d.GrantFor))
			res.Granted = append(res.Granted, t.t)
			waiting = waiting[1:]
			room--
		}
		if len(waiting) > 0 {
			res.Head = waiting[0].t.ID
		}
		return nil
	})
	return res, err
}

// cleanQueue removes the lapsed waiting tickets and passes the lapsed
// grants on to the first live waiting tickets, in order (freeing the
// slots of those left without one), and returns the live waiting tickets
// left, in order.
func (s *Store) cleanQueue(d core.Dispatch, res *core.DispatchResult) []*ticket {
	var waiting, lapsed []*ticket
	for _, t := range append([]*ticket(nil), s.queue...) {
		switch {
		case t.live(d.Now) && t.granted:
		case t.live(d.Now):
			waiting = append(waiting, t)
		case t.granted:
			lapsed = append(lapsed, t)
		default:
			s.removeTicket(t.t.ID)
			res.Cleaned++
		}
	}
	for _, g := range lapsed {
		var next *ticket
		if len(waiting) > 0 {
			next, waiting = waiting[0], waiting[1:]
			res.Granted = append(res.Granted, next.t)
		}
		s.passOn(g, next, d.Now, d.GrantFor)
		res.Cleaned++
	}
	return waiting
}
