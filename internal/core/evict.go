package core

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/sandbox-broker/sandbox-broker/pkg/api"
)

// maxEvictions bounds how many slots one acquire frees by eviction.
const maxEvictions = 3

// evictCandidates is how many of the least recently parked warm sandboxes
// (of the sample, see Store.Sample) one eviction considers;
// ownTenantCandidates, of the whole pool, when only the acquiring
// tenant's own may be taken and the sample holds none of them.
const (
	evictCandidates     = 10
	ownTenantCandidates = 50
)

// evictOne makes one slot for key's thread: it gives up a pool member
// (only below its tenant's fair share, as a pool claim), else kills the
// least recently parked warm sandbox of another thread among a random
// quarter of the warm pool (Store.Sample: the whole pool when small; on
// average the fourth oldest of a large one, one of its 16 oldest with
// probability 1 - (3/4)^16 > 99%), whose tombstone then holds the slot
// for the take. A warm sandbox of another tenant is taken only under
// below, which the claim checks (key's tenant holds fewer slots than its
// fair share); of key's own tenant only when below is nil (a tenant at or
// over its fair share never takes another tenant's warm sandbox; when the
// sample holds none of its own, the pool's exact order is read). It
// reports what it did (see eviction).
func (e *Engine) evictOne(ctx context.Context, key ThreadKey, owner string, below *TenantBelow) eviction {
	if below != nil && e.evictPoolMember(ctx, owner, false) {
		return eviction{freed: true}
	}
	ownTenant := below == nil
	may := func(rec Record) bool {
		return rec.ThreadKey != key && (!ownTenant || rec.Tenant == key.Tenant)
	}
	// The least recently parked of a random quarter of the pool (all of
	// it when small), see Store.Sample.
	warm, err := e.store.Sample(ctx, StateWarm, evictCandidates)
	if err == nil && ownTenant && len(warm) > 0 && !slices.ContainsFunc(warm, may) {
		// None of the tenant's own among them: the pool's exact order,
		// deep enough to find its own among other tenants'.
		warm, err = e.store.WarmParkedBefore(ctx, e.now().Add(time.Millisecond), ownTenantCandidates)
	}
	if err != nil {
		e.log.WarnContext(ctx, "list warm pool for eviction failed", "err", err)
		return eviction{}
	}
	return e.evictParked(ctx, key, owner, warm, may, evictGuard{below: below}, EventReasonCapacity)
}

// eviction is what an eviction for a take did.
type eviction struct {
	// freed: a slot was freed for the take, or killed holds one.
	freed bool
	// killed, when set, is the sandbox destroyed for the take: its
	// tombstone still holds the slot, for the take to take over
	// (Reservation.Handover) or free (freeKilled).
	killed *killed
	// atShare: a claim found the acquiring tenant at its fair share.
	atShare bool
	// killErr: a kill the provider did not confirm (wrapping
	// errKillUncertain) left a tombstone holding the slot and stopped
	// the eviction.
	killErr error
}

// freeEvicted frees the slot ev.killed holds, if any, and reports whether
// ev made a slot.
func (e *Engine) freeEvicted(ctx context.Context, ev eviction) bool {
	if ev.killed != nil {
		return e.freeKilled(ctx, *ev.killed) == nil
	}
	return ev.freed
}

// quotaRefusal reports whether reason is a refusal for one of the
// caller's own quotas (SANDBOX_MAX_PER_USER, SANDBOX_MAX_PER_TENANT).
func quotaRefusal(reason api.RefusalReason) bool {
	return reason == api.RefusalUserQuota || reason == api.RefusalTenantQuota
}

// quotaCandidates is how many of the caller's own least recently parked
// warm sandboxes one eviction for a quota considers (a peer may take some
// first).
const quotaCandidates = 5

// evictForQuota frees one slot of the quota that refused key's thread
// (reason): it destroys the least recently parked warm sandbox of key's
// user (RefusalUserQuota) or of key's tenant, any of its users
// (RefusalTenantQuota), never another tenant's, never key's own thread's,
// never one in use: the claim applies only to a record still warm and
// unleased (Store.OwnWarm lists the candidates from the tenant's or
// user's own entries, never the warm pool). It reports what it did as
// evictOne.
func (e *Engine) evictForQuota(ctx context.Context, key ThreadKey, owner string, reason api.RefusalReason) eviction {
	user := key.User
	if reason == api.RefusalTenantQuota {
		user = "" // any of the tenant's users
	}
	warm, err := e.store.OwnWarm(ctx, key.Tenant, user, quotaCandidates)
	if err != nil {
		e.log.WarnContext(ctx, "list own warm sandboxes for a quota failed", "err", err, "reason", reason)
		return eviction{}
	}
	may := func(rec Record) bool { return rec.Tenant == key.Tenant && (user == "" || rec.User == user) }
	return e.evictParked(ctx, key, owner, warm, may, evictGuard{}, EventReasonQuota)
}

// evictGuard is what the claim of another tenant's record carries in an
// eviction (Claim.Below, Claim.PausedBelow); the zero value, nothing.
type evictGuard struct {
	below  *TenantBelow
	paused *PausedBelow
}

// evictParked kills the first of parked (warm or paused records, least
// recently parked first) that belongs to another thread than key's and
// that may passes, for key's thread, leaving its tombstone holding its
// slots (eviction.killed); the claim of another tenant's record carries
// guard (a claim finding key's tenant at its share reports atShare, and
// the other tenants' records are then skipped). A peer that moved a
// record first wins it; a kill that fails stops the eviction (killErr).
// reason (one of EventReasons) is why.
func (e *Engine) evictParked(ctx context.Context, key ThreadKey, owner string, parked []Record, may func(Record) bool, guard evictGuard, reason string) eviction {
	var ev eviction
	for _, rec := range parked {
		other := rec.Tenant != key.Tenant
		if rec.ThreadKey == key || !may(rec) || (other && ev.atShare) {
			continue
		}
		c := Claim{SandboxID: rec.SandboxID, Tenant: rec.Tenant, From: []State{rec.State},
			To: StateDestroying, Owner: owner, Now: e.now(), LeaseUntil: e.leaseUntil(ctx)}
		if other {
			c.Below, c.PausedBelow = guard.below, guard.paused
		}
		claimed, err := e.store.Claim(ctx, c)
		if errors.Is(err, ErrAtFairShare) {
			ev.atShare = true
			continue // its own tenant's may still be taken
		}
		if err != nil {
			continue // taken back or evicted by a peer
		}
		claimed = keepPause(claimed, rec)
		e.log.InfoContext(ctx, "evicting "+string(rec.State)+" sandbox", "sandbox_id", rec.SandboxID, "parked_at", rec.ParkedAt, "for_thread", key.String())
		e.emit(ctx, claimed, rec.State, StateDestroying, EventEvicted, reason)
		k, err := e.killClaimed(ctx, claimed, reason)
		if err != nil {
			ev.killErr = uncertainKill(err)
			return ev
		}
		ev.freed, ev.killed = true, &k
		return ev
	}
	return ev
}

// uncertainKill is err when it is a kill the provider did not confirm
// (errKillUncertain), else nil.
func uncertainKill(err error) error {
	if errors.Is(err, errKillUncertain) {
		return err
	}
	return nil
}
