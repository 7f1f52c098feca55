package ddbstore

import (
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"

	"github.com/sandbox-broker/sandbox-broker/internal/core"
)

// item is the stored shape of a sandbox record or a reservation. Times are
// Unix milliseconds (0 = unset).
type item struct {
	PK           string `dynamodbav:"pk"`
	SK           string `dynamodbav:"sk"`
	SandboxID    string `dynamodbav:"sandbox_id,omitempty"`
	Tenant       string `dynamodbav:"tenant"`
	User         string `dynamodbav:"user_id"`
	Thread       string `dynamodbav:"thread_id"`
	Seed         string `dynamodbav:"seed,omitempty"`
	State        string `dynamodbav:"state"`
	PrevState    string `dynamodbav:"prev_state,omitempty"`
	Backend      string `dynamodbav:"backend,omitempty"`
	Fence        int64  `dynamodbav:"fence"`
	LeaseOwner   string `dynamodbav:"lease_owner,omitempty"`
	LeaseExpires int64  `dynamodbav:"lease_expires,omitempty"`
	Protocol     string `dynamodbav:"protocol,omitempty"`
	EndpointURL  string `dynamodbav:"endpoint_url,omitempty"`
	Token        string `dynamodbav:"endpoint_token,omitempty"`
	// TokenSealed is the access token sealed by the store's Sealer (then
	// Token is empty).
	TokenSealed  []byte `dynamodbav:"token_sealed,omitempty"`
	Reservation  string `dynamodbav:"reservation,omitempty"`
	Deployment   string `dynamodbav:"deployment"`
	CreatedAt    int64  `dynamodbav:"created_at"`
	UpdatedAt    int64  `dynamodbav:"updated_at"`
	ParkedAt     int64  `dynamodbav:"parked_at,omitempty"`
	ExpiresAt    int64  `dynamodbav:"expires_at,omitempty"`
	KillAttempts int    `dynamodbav:"kill_attempts,omitempty"`
	DestroyingAt int64  `dynamodbav:"destroying_since,omitempty"`
	// EndReason and ExpiringSent are core.Record.EndReason and
	// ExpiringSentFor.
	EndReason    string `dynamodbav:"end_reason,omitempty"`
	ExpiringSent int64  `dynamodbav:"expiring_sent,omitempty"`
	// PoolPlace: a thread-less record holding one of the pool's places
	// (see pool.go).
	PoolPlace bool `dynamodbav:"pool_place,omitempty"`
	// Usage metering (core.Record.MeteredAt, PrevMeteredAt, MeteredState).
	MeteredAt     int64  `dynamodbav:"metered_at,omitempty"`
	PrevMeteredAt int64  `dynamodbav:"prev_metered_at,omitempty"`
	MeteredState  string `dynamodbav:"metered_state,omitempty"`
	// NoRunningSlot, PausedSlot, PausedBucket and TenantPaused are
	// core.Slots (absent: a running slot only; an absent paused bucket is
	// bucket 0); PausedMS is core.Record.PausedFor in milliseconds.
	NoRunningSlot bool  `dynamodbav:"no_running_slot,omitempty"`
	PausedSlot    bool  `dynamodbav:"paused_slot,omitempty"`
	PausedBucket  int   `dynamodbav:"paused_bucket,omitempty"`
	TenantPaused  bool  `dynamodbav:"paused_tenant,omitempty"`
	PausedMS      int64 `dynamodbav:"paused_ms,omitempty"`
	// Bucket and Quota are the record's core.Slot.
	Bucket int    `dynamodbav:"bucket,omitempty"`
	Quota  bool   `dynamodbav:"quota,omitempty"`
	GSI1PK string `dynamodbav:"gsi1pk,omitempty"`
	GSI1SK string `dynamodbav:"gsi1sk,omitempty"`
	// GSI2PK and GSI2SK file a warm record in the owner index (owner.go).
	GSI2PK string `dynamodbav:"gsi2pk,omitempty"`
	GSI2SK string `dynamodbav:"gsi2sk,omitempty"`
	TTL    int64  `dynamodbav:"ttl,omitempty"`
}

// bindingItem is the stored thread binding.
type bindingItem struct {
	PK                 string `dynamodbav:"pk"`
	SK                 string `dynamodbav:"sk"`
	SandboxID          string `dynamodbav:"sandbox_id,omitempty"`
	Reservation        string `dynamodbav:"reservation,omitempty"`
	ReservationExpires int64  `dynamodbav:"reservation_expires,omitempty"`
	UpdatedAt          int64  `dynamodbav:"updated_at"`
}

const sortKey = "R"

func sandboxPK(id string) string        { return "SBX#" + id }
func reservationPK(token string) string { return "RES#" + token }
func bindingPK(k core.ThreadKey) string { return "THR#" + k.Tenant + "#" + k.User + "#" + k.Thread }

// userPK is the per-user slot counter (SANDBOX_MAX_PER_USER).
func userPK(deployment string, k core.ThreadKey) string {
	return "USR#" + deployment + "#" + k.Tenant + "#" + k.User
}

// tenantPK is the per-tenant slot counter (SANDBOX_MAX_PER_TENANT and
// fair-share eviction).
func tenantPK(deployment, tenant string) string {
	return "TEN#" + deployment + "#" + tenant
}

// tenantPausedPK is the per-tenant paused slot counter (the paused slots'
// share: core.PausedBelow). It is an item of its own, not an attribute of
// the tenant's slot count, so that pauses and resumes add no writes to
// the item every acquire of the tenant writes.
func tenantPausedPK(deployment, tenant string) string {
	return "TPA#" + deployment + "#" + tenant
}

// parkedState reports whether records in st are filed in gsi1 by park
// time (the LRU order of eviction and idle expiry) rather than by the time
// of their last write.
func parkedState(st core.State) bool { return st == core.StateWarm || st == core.StatePaused }

// stateSK orders index entries by time, then id.
func stateSK(t time.Time, id string) string { return fmt.Sprintf("%015d#%s", ms(t), id) }

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// meter adds to u the metering of a write at now (core.Record.MeteredAt):
// the write accounts for the time since the last one, spent in the state
// the record was in. SET evaluates right-hand sides against the item
// before the update; a record written before metering starts at now.
func meter(u expression.UpdateBuilder, now time.Time) expression.UpdateBuilder {
	return u.Set(expression.Name("prev_metered_at"), expression.IfNotExists(expression.Name("metered_at"), expression.Value(ms(now)))).
		Set(expression.Name("metered_at"), expression.Value(ms(now))).
		Set(expression.Name("metered_state"), expression.Name("state"))
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

func (it item) record() core.Record {
	return core.Record{
		SandboxID:        it.SandboxID,
		ThreadKey:        core.ThreadKey{Tenant: it.Tenant, User: it.User, Thread: it.Thread},
		Seed:             it.Seed,
		State:            core.State(it.State),
		PrevState:        core.State(it.PrevState),
		Backend:          it.Backend,
		Fence:            it.Fence,
		LeaseOwner:       it.LeaseOwner,
		LeaseExpiresAt:   fromMS(it.LeaseExpires),
		Endpoint:         core.Endpoint{Protocol: it.Protocol, URL: it.EndpointURL, AccessToken: it.Token},
		ReservationToken: it.Reservation,
		CreatedAt:        fromMS(it.CreatedAt),
		UpdatedAt:        fromMS(it.UpdatedAt),
		ParkedAt:         fromMS(it.ParkedAt),
		ExpiresAt:        fromMS(it.ExpiresAt),
		KillAttempts:     it.KillAttempts,
		DestroyingSince:  fromMS(it.DestroyingAt),
		EndReason:        it.EndReason,
		ExpiringSentFor:  fromMS(it.ExpiringSent),
		MeteredAt:        fromMS(it.MeteredAt),
		PrevMeteredAt:    fromMS(it.PrevMeteredAt),
		MeteredState:     core.State(it.MeteredState),
		Slots:            core.Slots{NoRunning: it.NoRunningSlot, Paused: it.PausedSlot, PausedRef: core.SlotRef(it.PausedBucket), TenantPaused: it.TenantPaused},
		PausedFor:        time.Duration(it.PausedMS) * time.Millisecond,
		Slot:             core.Slot{Ref: core.SlotRef(it.Bucket), Quota: it.Quota},
	}
}

func (s *Store) recordItem(r core.Record) item {
	deployment := s.deployment
	it := item{
		PK: sandboxPK(r.SandboxID), SK: sortKey, SandboxID: r.SandboxID,
		Tenant: r.Tenant, User: r.User, Thread: r.Thread, Seed: r.Seed, State: string(r.State),
		Backend: r.Backend, Fence: r.Fence, LeaseOwner: r.LeaseOwner, LeaseExpires: ms(r.LeaseExpiresAt),
		Protocol: r.Endpoint.Protocol, EndpointURL: r.Endpoint.URL, Token: r.Endpoint.AccessToken, Reservation: r.ReservationToken, Deployment: deployment,
		CreatedAt: ms(r.CreatedAt), UpdatedAt: ms(r.UpdatedAt), ParkedAt: ms(r.ParkedAt), ExpiresAt: ms(r.ExpiresAt),
		KillAttempts: r.KillAttempts, DestroyingAt: ms(r.DestroyingSince),
		EndReason: r.EndReason, ExpiringSent: ms(r.ExpiringSentFor),
		MeteredAt: ms(r.MeteredAt), PrevMeteredAt: ms(r.PrevMeteredAt), MeteredState: string(r.MeteredState),
		NoRunningSlot: r.Slots.NoRunning, PausedSlot: r.Slots.Paused, PausedBucket: int(r.Slots.PausedRef), TenantPaused: r.Slots.TenantPaused,
		PausedMS: r.PausedFor.Milliseconds(),
		Bucket:   int(r.Slot.Ref), Quota: r.Slot.Quota,
	}
	if r.State != core.StateGone {
		it.GSI1PK = s.statePK(r.State, r.SandboxID)
		it.GSI1SK = stateSK(r.UpdatedAt, r.SandboxID)
		if parkedState(r.State) {
			it.GSI1SK = stateSK(r.ParkedAt, r.SandboxID)
		}
	}
	if r.State == core.StateWarm && r.Tenant != "" && r.User != "" {
		it.GSI2PK = ownerPK(deployment, r.Tenant, ownerShard(r.User))
		it.GSI2SK = ownerSK(r.ThreadKey, r.ParkedAt, r.SandboxID)
	}
	return it
}
