package registry

// Cumulative counters across schedulers.
//
// A tenant's counters (Completed, Expired, Rejections, TokensUsed,
// DryRunRejections) and the pool's UpstreamThrottled are counted in memory
// by the scheduler that serves, and reported in status. So that the figures
// in status keep growing across a scheduler restart and a leader change,
// the scheduler that becomes the status writer adds to its own counts,
// once, what the status held when it first read it (the figures the
// previous writer last wrote): SeedCounters and SeedUpstreamThrottled. Its
// own counts made before that, from the process's start, are kept, since no
// writer reported them yet. A TenantQuota deleted and created again (a new
// UID), or a tenant id taken over by another TenantQuota, is a new object:
// UpsertTenant sets its counters back to 0 and unseeded. The Prometheus
// counters of internal/metrics are not fed from these and stay
// process-local.

// Counters are a tenant's cumulative counts: Completed batch jobs finished,
// Expired batch jobs that reached their deadline unsent, Rejections
// (requests and jobs refused by the tenant's own limits), TokensUsed
// (weighted tokens spent, after refunds) and DryRunRejections (requests and
// jobs Enforce would have refused, DryRun mode). All are counts but
// TokensUsed, in weighted tokens; none is negative.
type Counters struct {
	Completed, Expired, Rejections, TokensUsed, DryRunRejections int64
}

// nonNegative returns c with every negative figure raised to 0.
func (c Counters) nonNegative() Counters {
	return Counters{
		Completed: max(c.Completed, 0), Expired: max(c.Expired, 0), Rejections: max(c.Rejections, 0),
		TokensUsed: max(c.TokensUsed, 0), DryRunRejections: max(c.DryRunRejections, 0),
	}
}

// Counters returns the tenant's counters: its own counts since it was
// created in this registry (or since its TenantQuota was replaced, see
// UpsertTenant), plus the base SeedCounters added.
func (t *Tenant) Counters() Counters {
	return Counters{
		Completed: t.completed.Load(), Expired: t.expired.Load(), Rejections: t.rejections.Load(),
		TokensUsed: t.tokensUsed.Load(), DryRunRejections: t.dryRunRejections.Load(),
	}
}

// CountersSeeded reports whether SeedCounters has added a base to the
// tenant's counters since it was created or last reset.
func (t *Tenant) CountersSeeded() bool { return t.countersSeeded.Load() }

// SeedCounters adds base (negative figures read as 0) to the tenant's
// counters, once: base is what the status of the TenantQuota whose
// metadata.uid is uid held when the status writer first read it, the
// figures an earlier scheduler reported. The tenant's own counts, all made
// since it was created in this registry and never reported before, are
// kept: the result is base plus them. It returns what it added and ok true
// when the counters include a base now (added is zero when they already
// did); ok false, adding nothing, when uid is not the UID of the
// TenantQuota the tenant serves (the registry has not yet applied a
// TenantQuota created again under the same name: its counts are not
// uid's). A tenant whose policy has no UID (unknown) takes any uid.
func (t *Tenant) SeedCounters(uid string, base Counters) (added Counters, ok bool) {
	t.counterMu.Lock()
	defer t.counterMu.Unlock()
	if t.countersSeeded.Load() {
		return Counters{}, true
	}
	if p := t.Policy(); p != nil && p.UID != "" && p.UID != uid {
		return Counters{}, false
	}
	base = base.nonNegative()
	t.completed.Add(base.Completed)
	t.expired.Add(base.Expired)
	t.rejections.Add(base.Rejections)
	t.tokensUsed.Add(base.TokensUsed)
	t.dryRunRejections.Add(base.DryRunRejections)
	// The flag is set after the counters, and Snapshot reads it before
	// them: a snapshot that says seeded has counters that include base.
	t.countersSeeded.Store(true)
	return base, true
}

// resetCounters sets the tenant's counters to 0 and unseeded: its
// TenantQuota is another object from now on (UpsertTenant).
func (t *Tenant) resetCounters() {
	t.counterMu.Lock()
	defer t.counterMu.Unlock()
	t.countersSeeded.Store(false)
	t.completed.Store(0)
	t.expired.Store(0)
	t.rejections.Store(0)
	t.tokensUsed.Store(0)
	t.dryRunRejections.Store(0)
}

// sameObject reports whether the policies p and q come from the same
// TenantQuota object: the same name, and the same UID unless either is
// unknown ("").
func sameObject(p, q *TenantPolicy) bool {
	return p.Name == q.Name && (p.UID == "" || q.UID == "" || p.UID == q.UID)
}

// SeedUpstreamThrottled makes the pool's upstream 429 count (Snapshot's
// UpstreamThrottled) carry on from base, the status.upstreamThrottled of the
// ProviderPool whose metadata.uid is uid as the status writer read it
// (negative read as 0), and returns what it added to the count (negative
// when it lowered it). The first call adds base to the count, which keeps
// the 429s counted since the registry was created; a later call with the
// same uid adds nothing; one with another uid (the ProviderPool deleted and
// created again while this scheduler runs) sets the count to base, the new
// object's figure: the 429s counted between the new pool's creation and
// that call are lost with the old object's.
func (r *Registry) SeedUpstreamThrottled(uid string, base int64) int64 {
	base = max(base, 0)
	r.throttledMu.Lock()
	defer r.throttledMu.Unlock()
	switch {
	case r.throttledSeeded && r.throttledUID == uid:
		return 0
	case r.throttledSeeded:
		r.throttledUID = uid
		return base - r.upstreamThrottled.Swap(base)
	default:
		r.throttledSeeded, r.throttledUID = true, uid
		r.upstreamThrottled.Add(base)
		return base
	}
}
