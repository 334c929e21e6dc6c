package registry

import (
	"sort"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/throttle"
	"github.com/fairshare-dev/fairshare/internal/usage"
)

// Snapshot is the pool's live figures at one instant, read by the status
// writer and the metrics collector (style 2.4: figures come from memory, not
// from the API).
type Snapshot struct {
	// Time the snapshot was taken.
	Time time.Time
	// Pool is the policy in force (nil before one is set).
	Pool *PoolPolicy
	// Backlog is the number of queued jobs (in the fair queue or, see
	// Registry.SetQueuedOutside, outside it, such as those waiting for a
	// retry backoff); InFlight the upstream calls in
	// flight; UpstreamThrottled the upstream 429s counted since the
	// registry was created, plus the base SeedUpstreamThrottled set.
	Backlog, InFlight, UpstreamThrottled int64
	// Tenants, sorted by id.
	Tenants []TenantSnapshot
	// Objects are the TenantQuota objects the registry has seen, sorted by
	// name, with the error that kept one from being served.
	Objects []ObjectSnapshot
	// Models, sorted by name.
	Models []ModelSnapshot
}

// TenantSnapshot is one tenant's figures.
type TenantSnapshot struct {
	ID, Name   string
	Generation int64
	// Queued jobs of the tenant (those waiting for a retry backoff
	// included, as Backlog).
	Queued int64
	// Limiter figures (in flight, KV blocks, tokens remaining, ...).
	Limiter limiter.Snapshot
	// Cumulative counters (Tenant.Counters): finished jobs, expired jobs,
	// rejections, weighted tokens used, and DryRunRejections, requests and
	// jobs Enforce would have refused (DryRun mode). They count from the
	// tenant's creation in this registry, plus the base of SeedCounters
	// once CountersSeeded.
	Completed, Expired, Rejections, TokensUsed int64
	DryRunRejections                           int64
	// CountersSeeded: the counters include the base SeedCounters added
	// (Tenant.CountersSeeded, read before them).
	CountersSeeded bool
	// DryRun: the tenant's mode is DryRun.
	DryRun bool
	// Limits are the tenant's limits in force (TenantPolicy.Limits; do not
	// modify them): a limit of 0 suspends the tenant.
	Limits limiter.Limits
	// KeyIssue is TenantPolicy.KeyIssue: why the tenant has no API key, or
	// nil.
	KeyIssue *KeyIssue
	// Budget of the current period, when the tenant has one.
	Budget *BudgetStatus
	// Usage is the tenant's consumption over the pool's usage window
	// compared with its tier, and the verdict (usage.Evaluate; seed 002
	// section 7).
	Usage usage.Evaluation
}

// ObjectSnapshot is what the registry knows of one TenantQuota object.
type ObjectSnapshot struct {
	Name, TenantID string
	// UID of the object as last applied (TenantPolicy.UID; "" when unknown).
	UID        string
	Generation int64
	// Err is why the object is not served, or nil.
	Err error
}

// ModelSnapshot is one model's throttle status and 429 count.
type ModelSnapshot struct {
	Name      string
	Status    throttle.Status
	Throttled int64
}

// Snapshot returns the figures at now.
func (r *Registry) Snapshot(now time.Time) Snapshot {
	s := Snapshot{
		Time:              now,
		Pool:              r.pool.Load(),
		InFlight:          r.inFlight.Load(),
		UpstreamThrottled: r.upstreamThrottled.Load(),
	}
	r.mu.RLock()
	tenants := r.tenantListLocked()
	for name, o := range r.objects {
		s.Objects = append(s.Objects, ObjectSnapshot{Name: name, TenantID: o.id, UID: o.uid, Generation: o.generation, Err: o.err})
	}
	for _, m := range r.models {
		s.Models = append(s.Models, ModelSnapshot{Name: m.Name, Status: m.Throttle.Status(now), Throttled: m.throttled.Load()})
	}
	r.mu.RUnlock()
	sort.Slice(s.Objects, func(i, j int) bool { return s.Objects[i].Name < s.Objects[j].Name })
	sort.Slice(s.Models, func(i, j int) bool { return s.Models[i].Name < s.Models[j].Name })

	queued := make([]int64, len(tenants))
	r.qmu.Lock()
	s.Backlog = int64(r.queue.Total())
	var outside map[string]int
	if r.queuedOut != nil {
		var total int
		outside, total = r.queuedOut()
		s.Backlog += int64(total)
	}
	for i, t := range tenants {
		queued[i] = int64(r.queue.Len(t.ID) + outside[t.ID])
	}
	r.qmu.Unlock()

	s.Tenants = make([]TenantSnapshot, len(tenants))
	ucfg := usage.DefaultConfig()
	if s.Pool != nil {
		ucfg = s.Pool.Usage
	}
	uin := make([]usage.Input, len(tenants))
	for i, t := range tenants {
		uin[i] = usage.Input{ID: t.ID, Tier: t.Policy().Tier, Counts: t.UsageWindow(now)}
	}
	evals := usage.Evaluate(ucfg, uin)
	for i, t := range tenants {
		p := t.Policy()
		seeded := t.CountersSeeded() // before the counters (SeedCounters)
		c := t.Counters()
		ts := TenantSnapshot{
			ID: t.ID, Name: p.Name, Generation: p.Generation, Queued: queued[i],
			Limiter:   t.Limiter.Snapshot(now),
			Completed: c.Completed, Expired: c.Expired,
			Rejections: c.Rejections, TokensUsed: c.TokensUsed,
			DryRunRejections: c.DryRunRejections, CountersSeeded: seeded, DryRun: p.DryRun,
			Limits: p.Limits, KeyIssue: p.KeyIssue,
			Usage: evals[i],
		}
		if b, ok := t.Budget(now); ok {
			ts.Budget = &b
		}
		s.Tenants[i] = ts
	}
	return s
}
