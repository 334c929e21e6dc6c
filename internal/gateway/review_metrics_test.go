package gateway

import (
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
