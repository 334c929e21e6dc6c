package gateway

import (
	"net/http"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// TestReviewDryRunRejectionAfterRemovalCountsNothing: a DryRun tenant's
// call identified before its TenantQuota was deleted and admitted after
// (the OnTenantRemoved hook has run ForgetTenant) must not bring back a
// series with the tenant's label (docs/operations.md: "When a TenantQuota is
// deleted every series with its tenant disappears, counters included (a
// call still in flight then counts nothing)").
func TestReviewDryRunRejectionAfterRemovalCountsNothing(t *testing.T) {
	up := newUpstream(t, okJSON(10, 5))
	tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(600)})
	tp.DryRun = true
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	ta := e.reg.Tenant("a")
	if e.reg.RemoveTenant("a") == nil {
		t.Fatal("tenant a not removed")
	}
	c, aerr := e.gw.admit(e.clock.Now(), ta, e.reg.Pool(), e.reg.Model(testModel), 10, 20, throttle.Interactive, "max_tokens_too_large")
	if aerr == nil && c != nil {
		c.settle(settleRefund, limiter.Usage{})
	}
	if got := seriesOf(t, e.prom, "tenant", "a"); len(got) != 0 {
		t.Errorf("series of the removed tenant a after a late DryRun admission: %v", got)
	}
}

// TestReviewBacklogCountsJobsWaitingForRetry: a job waiting for a retry
// backoff after an upstream 5xx is queued (GET /v1/jobs says "queued", and
// it counts toward maxQueuedJobs), so the tenant's and the pool's backlog
// (status.backlog, tenant_queued_jobs, queued_jobs) must count it: during a
// provider outage BACKLOG read 0 while the tenant's queue was full.
func TestReviewBacklogCountsJobsWaitingForRetry(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) { w.WriteHeader(500) })
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(10000)})})
	j := e.submit("key-a", jobBody(10, 100, ""))
	waitFor(t, "the first attempt to fail", func() bool {
		got, _ := e.store.Get(j.ID)
		return got.Attempts == 1 && got.Status == jobs.StatusQueued && got.Error != nil
	})
	waitFor(t, "the dispatcher to wait for the backoff", e.clock.HasWaiters)
	if v := e.job("key-a", j.ID); v.Status != "queued" {
		t.Fatalf("job status %q, want queued", v.Status)
	}
	snap := e.reg.Snapshot(e.clock.Now())
	if snap.Backlog != 1 || len(snap.Tenants) != 1 || snap.Tenants[0].Queued != 1 {
		t.Errorf("backlog %d, tenant queued %v; want 1 and 1 (the job waiting for its retry)", snap.Backlog, snap.Tenants)
	}
}
