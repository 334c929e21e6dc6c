package gateway

import (
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestQueuedJobAboveALoweredBudgetFails (BC-10 after a live update): a job
// of 200 weighted tokens is queued under a daily budget of 100,000; the
// TenantQuota then lowers the budget to 150. No period will ever admit the
// job (at submission it would now be refused with 413 request_too_large),
// so it fails with request_too_large at dispatch, as a job left larger
// than a lowered token bucket does, instead of sitting queued until its
// deadline (an hour) and holding back the tenant's later jobs once it has
// been passed over MaxBypass times. The small job behind it succeeds.
func TestQueuedJobAboveALoweredBudgetFails(t *testing.T) {
	for _, strategy := range []string{registry.QueueingBestEffortFIFO, registry.QueueingStrictFIFO} {
		t.Run(strategy, func(t *testing.T) {
			up := newUpstream(t, okJSON(10, 10))
			a := tenant("a", limiter.Limits{})
			a.Budget = &registry.BudgetPolicy{WeightedTokens: 100000, Period: registry.BudgetDay}
			e := newEnv(t, up, []registry.TenantPolicy{a}, withPool(func(p *registry.PoolPolicy) { p.QueueingStrategy = strategy }))
			e.pause(2 * time.Second) // both jobs stay queued until the budget is lowered
			big := e.submit("key-a", jobBody(100, 100, "")).ID
			small := e.submit("key-a", jobBody(10, 10, "")).ID
			a.Budget = &registry.BudgetPolicy{WeightedTokens: 150, Period: registry.BudgetDay}
			if err := e.reg.UpsertTenant(a); err != nil {
				t.Fatal(err)
			}
			e.clock.Step(3 * time.Second)
			waitFor(t, "the small job to succeed", func() bool { return e.storeStatus(small) == jobs.StatusSucceeded })
			waitFor(t, "the big job to finish", func() bool { return e.storeStatus(big).Finished() })
			j, err := e.store.Get(big)
			if err != nil {
				t.Fatal(err)
			}
			if j.Status != jobs.StatusFailed || j.Error == nil || j.Error.Code != string(limiter.ReasonTooLarge) {
				t.Errorf("big job: status %s error %+v, want failed %s", j.Status, j.Error, limiter.ReasonTooLarge)
			}
			if n := up.calls.Load(); n != 1 {
				t.Errorf("upstream calls = %d, want 1 (the small job)", n)
			}
		})
	}
}
