package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"
)

// inventory walks the provider inventory from the cursor.
func (p *pass) inventory(ctx context.Context) error {
	e := p.e
	cur := p.cursor
	if cur.Cycle == "" {
		cur.Cycle = strconv.FormatInt(p.start.UnixMilli(), 10) + "-" + p.owner[4:12]
		cur.CycleStart = p.start
		cur.Token, cur.Pass = "", 0
	}
	lister := e.caps.Pager
	if lister == nil {
		lister = &memLister{prov: e.prov}
	}
	// Paused sandboxes too: they are the threads' and hold paused slots.
	filter := ListFilter{Metadata: map[string]string{MetaDeployment: e.s.Deployment}, States: []string{SandboxRunning, SandboxPaused}}
	complete := false
	var walkErr error
	for {
		if p.st.Pages >= p.rs.MaxPages || p.st.Discovered >= p.rs.MaxItems || p.timeUp() {
			p.st.BudgetExhausted = true
			break
		}
		limit := min(p.rs.PageSize, p.rs.MaxItems-p.st.Discovered)
		infos, next, err := lister.ListPage(ctx, filter, cur.Token, limit)
		p.st.Pages++
		if err != nil {
			walkErr = fmt.Errorf("list provider inventory: %w", err)
			if cur.Token != "" && !IsAmbiguous(err) {
				// The provider refused the cursor (expired token): start over.
				cur.Cycle = ""
			}
			break
		}
		done, err := p.processPage(ctx, infos)
		if err != nil {
			// Nothing decided for this page: it is read again next pass, and
			// the walk stays incomplete (an incomplete inventory frees nothing).
			walkErr = err
			break
		}
		if !done {
			p.st.BudgetExhausted = true // stopped mid-page: the page is read again
			break
		}
		cur.Token = next
		if next == "" {
			complete = true
			break
		}
	}
	cur.Pass++
	if complete {
		p.st.InventoryComplete = true
		seen := p.seen
		if cur.Pass > 1 {
			earlier, err := p.rst.Seen(ctx, cur.Cycle)
			if err != nil {
				return errors.Join(walkErr, fmt.Errorf("read cycle inventory: %w", err))
			}
			seen = append(seen, earlier...)
		}
		if err := p.completeChecks(ctx, cur.CycleStart, seen); err != nil {
			walkErr = errors.Join(walkErr, err)
		}
		cur.Cycle, cur.Token, cur.Pass, cur.CycleStart = "", "", 0, time.Time{}
	} else if len(p.seen) > 0 && cur.Cycle != "" {
		part := fmt.Sprintf("%06d-%s", cur.Pass, p.owner[4:])
		if err := p.rst.SaveSeen(ctx, cur.Cycle, part, p.seen); err != nil {
			return errors.Join(walkErr, fmt.Errorf("save cycle inventory: %w", err))
		}
	}
	p.cursor = cur
	return walkErr
}

// tenantKnown reports whether tenant is one this deployment serves (every
// tenant when ReconcileSettings.KnownTenants is empty).
func (p *pass) tenantKnown(tenant string) bool {
	return len(p.rs.KnownTenants) == 0 || slices.Contains(p.rs.KnownTenants, tenant)
}

// validKey reports the thread key a sandbox's metadata names, if valid.
func validKey(md map[string]string) (ThreadKey, bool) {
	k := ThreadKey{Tenant: md[MetaTenant], User: md[MetaUser], Thread: md[MetaThread]}
	return k, k.Validate() == nil
}

// age is how long ago the sandbox started, as far as anyone knows.
func startedAt(in SandboxInfo) time.Time {
	t := in.StartedAt
	if c, err := time.Parse(time.RFC3339, in.Metadata[MetaCreatedAt]); err == nil && (t.IsZero() || c.Before(t)) {
		t = c
	}
	return t
}

// processPage examines one page. It returns false when the wall-clock
// budget ran out before the page was done, and an error when the store
// could not be read (nothing was decided then).
func (p *pass) processPage(ctx context.Context, infos []SandboxInfo) (bool, error) {
	look, err := p.lookUpPage(ctx, infos)
	if err != nil {
		return false, err
	}
	groups := map[ThreadKey][]SandboxInfo{}
	var order []ThreadKey
	for _, in := range infos {
		if p.timeUp() {
			return false, nil
		}
		p.st.Discovered++
		p.seen = append(p.seen, SeenSandbox{ID: in.ID, Reservation: in.Metadata[MetaReservation]})
		if in.Metadata[MetaPool] == MetaPoolMember {
			p.poolSandbox(ctx, in, look)
			continue
		}
		k, ok := validKey(in.Metadata)
		if !ok || !p.tenantKnown(k.Tenant) {
			p.orphan(ctx, in, look)
			continue
		}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], in)
	}
	for _, k := range order {
		g := groups[k]
		sort.SliceStable(g, func(i, j int) bool {
			ti, tj := startedAt(g[i]), startedAt(g[j])
			if !ti.Equal(tj) {
				return ti.Before(tj)
			}
			return g[i].ID < g[j].ID
		})
		p.group(ctx, k, g, look)
	}
	return true, nil
}

// lookUpPage reads what the store holds of an inventory page: the
// records of its sandboxes and the bindings of their threads, then (a
// second round) the records those bindings name and the reservations.
func (p *pass) lookUpPage(ctx context.Context, infos []SandboxInfo) (ReconcileLookup, error) {
	ids := make([]string, 0, len(infos))
	var keys []ThreadKey
	keySeen := map[ThreadKey]bool{}
	for _, in := range infos {
		ids = append(ids, in.ID)
		if k, ok := validKey(in.Metadata); ok && !keySeen[k] {
			keySeen[k] = true
			keys = append(keys, k)
		}
	}
	look, err := p.rst.LookupMany(ctx, ids, keys, nil)
	if err != nil {
		return look, fmt.Errorf("look up inventory page: %w", err)
	}
	var more, tokens []string
	for _, b := range look.Bindings {
		if _, ok := look.Records[b.SandboxID]; b.SandboxID != "" && !ok {
			more = append(more, b.SandboxID)
		}
		if b.Reservation != "" {
			tokens = append(tokens, b.Reservation)
		}
	}
	for _, in := range infos {
		if t := in.Metadata[MetaReservation]; t != "" {
			tokens = append(tokens, t)
		}
	}
	if len(more) > 0 || len(tokens) > 0 {
		look2, err := p.rst.LookupMany(ctx, more, nil, tokens)
		if err != nil {
			return look, fmt.Errorf("look up inventory page: %w", err)
		}
		for id, r := range look2.Records {
			look.Records[id] = r
		}
		look.Reservations = look2.Reservations
	}
	if look.Reservations == nil {
		look.Reservations = map[string]PendingReservation{}
	}
	return look, nil
}

// crashed reports whether a reservation's create is presumed dead.
func (p *pass) crashed(r PendingReservation, now time.Time) bool {
	return !now.Before(r.ExpiresAt.Add(p.rs.Grace))
}

// group decides for the sandboxes of one thread (oldest first): the
// canonical one is the one the binding names, else the oldest live one,
// which is adopted; the others are duplicates.
func (p *pass) group(ctx context.Context, key ThreadKey, g []SandboxInfo, look ReconcileLookup) {
	e := p.e
	now := e.now()
	b, bound := look.Bindings[key]
	canonical := ""
	inflight := false
	switch {
	case bound && b.SandboxID != "":
		if r, ok := look.Records[b.SandboxID]; ok && slices.Contains(liveStates, r.State) {
			canonical = b.SandboxID
		}
	case bound && b.Reservation != "":
		if r, ok := look.Reservations[b.Reservation]; ok && !p.crashed(r, now) {
			inflight = true
		}
	}
	for _, in := range g {
		rec, tracked := look.Records[in.ID]
		if tracked && !slices.Contains(liveStates, rec.State) {
			continue // tombstone (retried above) or gone (a sandbox killed late is found again later)
		}
		if in.ID == canonical {
			if tracked {
				p.keepTimer(ctx, in, rec)
			}
			continue
		}
		token := in.Metadata[MetaReservation]
		res, hasRes := look.Reservations[token]
		if !tracked && hasRes && !p.crashed(res, now) {
			p.st.Deferred++ // its create is still in flight
			continue
		}
		if inflight {
			p.st.Deferred++ // the thread's create is in flight; decide once it settled
			continue
		}
		if canonical == "" {
			var err error
			if tracked {
				err = p.rst.Rebind(ctx, key, in.ID, b, bound)
			} else {
				rec := p.adoptedRecord(in, key, p.adoptedState(in))
				if !p.locate(ctx, &rec) {
					continue
				}
				a := Adoption{Record: rec, Bind: true, From: b, FromBound: bound}
				if hasRes {
					a.Reservation = token
				}
				var adopted Record
				adopted, err = p.rst.Adopt(ctx, a)
				if err == nil {
					p.adopted(ctx, adopted, hasRes)
				}
			}
			if err != nil {
				p.st.Deferred++
				e.log.InfoContext(ctx, "reconcile: adoption deferred", "sandbox_id", in.ID, "thread", key.String(), "err", err)
				continue
			}
			e.log.InfoContext(ctx, "reconcile: adopted", "sandbox_id", in.ID, "thread", key.String(), "tracked", tracked)
			p.st.Adopted++
			canonical = in.ID
			b, bound = Binding{ThreadKey: key, SandboxID: in.ID}, true
			continue
		}
		p.st.Duplicates++
		p.killDuplicate(ctx, listed{in: in, rec: rec, tracked: tracked, token: token, hasRes: hasRes}, key, canonical)
	}
}

// adoptedRecord is the record written for an untracked sandbox. Warm: the
// thread's next acquire reclaims it (and idle expiry ends it if unused).
func (p *pass) adoptedRecord(in SandboxInfo, key ThreadKey, state State) Record {
	now := p.e.now()
	created := startedAt(in)
	if created.IsZero() {
		created = now
	}
	r := Record{SandboxID: in.ID, ThreadKey: key, Seed: key.Seed(), State: state, Backend: p.e.prov.Name(),
		ReservationToken: in.Metadata[MetaReservation], CreatedAt: created, UpdatedAt: now, ExpiresAt: in.EndAt,
		PrevMeteredAt: created, MeteredAt: now} // it ran untracked since its start
	switch state {
	case StateWarm:
		r.ParkedAt = now
	case StatePaused:
		r.ParkedAt, r.Slots = now, Slots{NoRunning: true, Paused: true}
	case StateDestroying:
		r.LeaseOwner, r.LeaseExpiresAt = p.owner, now.Add(p.e.s.LeaseDuration)
	}
	return r
}

// locate gives rec, a sandbox about to be adopted for its thread, its
// endpoint and access token (Capabilities.Locate), so that the thread's
// next acquire reaches it: without its token the sandbox would be
// discarded as unresponsive, having held a slot for nothing. A read that
// failed defers the adoption to the next pass (counted Deferred), before
// any slot is taken; a sandbox gone meanwhile is not adopted at all.
func (p *pass) locate(ctx context.Context, rec *Record) bool {
	loc := p.e.caps.Locate
	if loc == nil {
		return true
	}
	cctx, cancel := context.WithTimeout(ctx, timerCallTimeout)
	defer cancel()
	ep, err := loc(cctx, rec.SandboxID)
	if err != nil {
		p.st.Deferred++
		if !errors.Is(err, ErrSandboxGone) {
			p.e.log.InfoContext(ctx, "reconcile: adoption deferred: the sandbox's endpoint was not read", "sandbox_id", rec.SandboxID, "err", err)
		}
		return false
	}
	rec.Endpoint = ep
	return true
}

// adopted accounts for a sandbox adopted for its thread and publishes
// EventAdopted (from creating when it took over its create's reservation).
func (p *pass) adopted(ctx context.Context, rec Record, hadReservation bool) {
	from := State("")
	if hadReservation {
		p.st.ReservationsSettled++
		from = StateCreating
	}
	p.e.emit(ctx, rec, from, rec.State, EventAdopted, EventReasonUntracked)
}

// adoptedState is the state a canonical sandbox reconcile adopts gets:
// paused when the provider lists it paused and the broker can resume it
// (it takes a paused slot), else warm (the thread's next acquire
// reclaims it, and idle expiry ends it if unused).
func (p *pass) adoptedState(in SandboxInfo) State {
	if in.State == SandboxPaused && p.e.pauseStore() != nil {
		return StatePaused
	}
	return StateWarm
}

// graceOver reports whether reconcile first saw id at least d ago (and
// records the first sighting when this is it). since, when non-zero, is
// an earlier known start.
func (p *pass) graceOver(ctx context.Context, id string, d time.Duration, since time.Time) (bool, error) {
	now := p.e.now()
	first, err := p.rst.FirstSeen(ctx, id, now)
	if err != nil {
		return false, err
	}
	if !since.IsZero() && since.Before(first) {
		first = since
	}
	return !now.Before(first.Add(d)), nil
}

// graceWaited is graceOver for a decision to kill: false, counted
// Deferred (or as a failure when the sighting could not be recorded),
// until d has passed.
func (p *pass) graceWaited(ctx context.Context, id string, d time.Duration, since time.Time) bool {
	over, err := p.graceOver(ctx, id, d, since)
	if err != nil {
		p.fail(ctx, "record first sighting", id, err)
		return false
	}
	if !over {
		p.st.Deferred++
	}
	return over
}

// listed is one sandbox of the provider's inventory with what the store
// knows of it.
type listed struct {
	in      SandboxInfo
	rec     Record // its record, when tracked
	tracked bool
	token   string // the reservation token in its metadata
	hasRes  bool   // that reservation still exists
}

// killDuplicate destroys a duplicate once its grace period is over and no
// peer holds it, under a destroy claim conditional on the binding still
// naming canonical.
func (p *pass) killDuplicate(ctx context.Context, l listed, key ThreadKey, canonical string) {
	e := p.e
	in, rec, tracked, token, hasRes := l.in, l.rec, l.tracked, l.token, l.hasRes
	now := e.now()
	if tracked && rec.Leased(p.owner, now) {
		p.st.Deferred++
		return
	}
	if !p.graceWaited(ctx, in.ID, p.rs.Grace, time.Time{}) {
		return
	}
	var claimed Record
	var err error
	if tracked {
		claimed, err = p.rst.ClaimDuplicate(ctx, Claim{SandboxID: in.ID, Tenant: rec.Tenant, From: liveStates, To: StateDestroying,
			Owner: p.owner, Now: now, LeaseUntil: now.Add(e.s.LeaseDuration)}, key, canonical)
	} else {
		a := Adoption{Record: p.adoptedRecord(in, key, StateDestroying), Canonical: canonical}
		if hasRes {
			a.Reservation = token
		}
		claimed, err = p.rst.Adopt(ctx, a)
		if err == nil && hasRes {
			p.st.ReservationsSettled++
		}
	}
	if err != nil {
		p.st.Deferred++
		e.log.InfoContext(ctx, "reconcile: duplicate claim lost", "sandbox_id", in.ID, "err", err)
		return
	}
	e.log.InfoContext(ctx, "reconcile: killing duplicate", "sandbox_id", in.ID, "thread", key.String(), "canonical", canonical)
	p.destroy(ctx, claimed, EventReasonDuplicate, &p.st.Killed)
}

// orphan handles a sandbox tagged for this deployment without a valid
// thread key: killed once older than OrphanTTL.
func (p *pass) orphan(ctx context.Context, in SandboxInfo, look ReconcileLookup) {
	e := p.e
	p.st.Orphans++
	if rec, ok := look.Records[in.ID]; ok && rec.State != StateGone {
		return // tracked (a tombstone being retried)
	}
	if !p.graceWaited(ctx, in.ID, p.rs.OrphanTTL, startedAt(in)) {
		return
	}
	key := ThreadKey{Tenant: in.Metadata[MetaTenant], User: in.Metadata[MetaUser], Thread: in.Metadata[MetaThread]}
	a := Adoption{Record: p.adoptedRecord(in, key, StateDestroying)}
	if t := in.Metadata[MetaReservation]; t != "" {
		if _, ok := look.Reservations[t]; ok {
			a.Reservation = t
		}
	}
	claimed, err := p.rst.Adopt(ctx, a)
	if err != nil {
		p.st.Deferred++
		p.skip(ctx, "adopt orphan", in.ID, err)
		return
	}
	e.log.InfoContext(ctx, "reconcile: killing orphan", "sandbox_id", in.ID)
	p.destroy(ctx, claimed, EventReasonOrphan, &p.st.Killed)
}

// completeChecks runs once a cycle's inventory is complete: records whose
// sandbox is in no page are dead (confirmed with a read, then freed under a
// destroy claim) and crashed reservations whose token is in no sandbox are
// freed. Only what predates the cycle is judged.
func (p *pass) completeChecks(ctx context.Context, cycleStart time.Time, seen []SeenSandbox) error {
	e := p.e
	ids := make(map[string]bool, len(seen))
	tokens := make(map[string]bool, len(seen))
	for _, s := range seen {
		ids[s.ID] = true
		if s.Reservation != "" {
			tokens[s.Reservation] = true
		}
	}
	var candidates []Record
	for _, st := range liveStates {
		err := p.rst.ScanState(ctx, st, func(r Record) bool {
			if !ids[r.SandboxID] && r.CreatedAt.Before(cycleStart) {
				candidates = append(candidates, r)
			}
			return len(candidates) < p.rs.MaxItems
		})
		if err != nil {
			return fmt.Errorf("scan %s records: %w", st, err)
		}
	}
	for _, r := range candidates {
		if p.timeUp() {
			break
		}
		if gone, err := e.confirmedGone(ctx, r.SandboxID); !gone {
			if err != nil {
				p.fail(ctx, "confirm dead sandbox", r.SandboxID, err) // unknown: never free on doubt
			}
			continue // alive after all (listed late)
		}
		claimed, err := p.claim(ctx, r, StateDestroying, liveStates...)
		if errors.Is(err, ErrLeaseHeld) {
			p.st.Deferred++
			continue
		}
		if err != nil {
			p.skip(ctx, "claim dead record", r.SandboxID, err)
			continue
		}
		p.destroy(ctx, claimed, e.endedReason(r, r.State), &p.st.Dead)
	}
	var crashed []Record
	now := e.now()
	err := p.rst.ScanState(ctx, StateCreating, func(r Record) bool {
		if !tokens[r.ReservationToken] && r.ExpiresAt.Add(p.rs.Grace).Before(cycleStart) && !now.Before(r.ExpiresAt.Add(p.rs.Grace)) {
			crashed = append(crashed, r)
		}
		return len(crashed) < p.rs.MaxItems
	})
	if err != nil {
		return fmt.Errorf("scan reservations: %w", err)
	}
	for _, r := range crashed {
		if err := e.store.FreeReservation(ctx, r.ReservationToken, r.ThreadKey); err != nil {
			p.skip(ctx, "free crashed reservation "+r.ReservationToken, "", err) // ErrNotFound: a peer freed it
			continue
		}
		e.log.InfoContext(ctx, "reconcile: freed crashed reservation", "reservation", r.ReservationToken, "thread", r.ThreadKey.String())
		p.st.ReservationsSettled++
	}
	return nil
}

// memLister pages a provider's full listing in memory (providers without
// PagedLister): the cursor is the last id returned.
type memLister struct{ prov Provider }

func (m *memLister) ListPage(ctx context.Context, f ListFilter, cursor string, limit int) ([]SandboxInfo, string, error) {
	all, err := m.prov.List(ctx, f)
	if err != nil {
		return nil, "", err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	i := sort.Search(len(all), func(i int) bool { return all[i].ID > cursor })
	if cursor == "" {
		i = 0
	}
	end := min(i+limit, len(all))
	next := ""
	if end < len(all) {
		next = all[end-1].ID
	}
	return all[i:end], next, nil
}
