package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

func i64(v int64) *int64 { return &v }

// TestTenantGaugesReadAtScrape: per-tenant gauges come from the snapshot at
// scrape time, so a deleted tenant leaves no series; ForgetTenant drops its
// counters.
func TestTenantGaugesReadAtScrape(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reg := registry.New(clocktesting.NewFakeClock(t0))
	if err := reg.SetPool(registry.PoolPolicy{BaseURL: "http://127.0.0.1:1", Models: []registry.ModelPolicy{{Name: "m"}}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := reg.UpsertTenant(registry.TenantPolicy{ID: id, Limits: limiter.Limits{WeightedPerMinute: i64(600)}}); err != nil {
			t.Fatal(err)
		}
	}
	prom := prometheus.NewRegistry()
	m := New(prom, func() registry.Snapshot { return reg.Snapshot(t0) })
	m.Requests.WithLabelValues("a", OutcomeOK).Inc()
	m.Requests.WithLabelValues("b", "token_rate_limit").Add(2)

	want := `
# HELP fairshare_scheduler_tenant_remaining_weighted_tokens Weighted tokens left in the tenant's token bucket (absent when unlimited).
# TYPE fairshare_scheduler_tenant_remaining_weighted_tokens gauge
fairshare_scheduler_tenant_remaining_weighted_tokens{tenant="a"} 100
fairshare_scheduler_tenant_remaining_weighted_tokens{tenant="b"} 100
# HELP fairshare_scheduler_tenants Tenants loaded by the scheduler.
# TYPE fairshare_scheduler_tenants gauge
fairshare_scheduler_tenants 2
`
	if err := testutil.GatherAndCompare(prom, strings.NewReader(want), "fairshare_scheduler_tenant_remaining_weighted_tokens", "fairshare_scheduler_tenants"); err != nil {
		t.Error(err)
	}
	reg.RemoveTenant("b")
	m.ForgetTenant("b")
	want = `
# HELP fairshare_scheduler_requests_total Interactive requests and job submissions, by tenant and outcome (ok, queued, upstream_error, client_gone, or the error code of a refusal such as token_rate_limit, request_rate_limit, concurrency_limit, memory_limit, queue_full, budget_exhausted, upstream_quota_exhausted, request_too_large, tenant_suspended).
# TYPE fairshare_scheduler_requests_total counter
fairshare_scheduler_requests_total{outcome="ok",tenant="a"} 1
# HELP fairshare_scheduler_tenant_remaining_weighted_tokens Weighted tokens left in the tenant's token bucket (absent when unlimited).
# TYPE fairshare_scheduler_tenant_remaining_weighted_tokens gauge
fairshare_scheduler_tenant_remaining_weighted_tokens{tenant="a"} 100
`
	if err := testutil.GatherAndCompare(prom, strings.NewReader(want), "fairshare_scheduler_requests_total", "fairshare_scheduler_tenant_remaining_weighted_tokens"); err != nil {
		t.Error(err)
	}
}

// TestRequestAndBudgetGauges: the request bucket and the budget period are
// exported per tenant, and absent for a tenant without them.
func TestRequestAndBudgetGauges(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reg := registry.New(clocktesting.NewFakeClock(t0))
	if err := reg.SetPool(registry.PoolPolicy{BaseURL: "http://127.0.0.1:1", Models: []registry.ModelPolicy{{Name: "m"}}}); err != nil {
		t.Fatal(err)
	}
	_ = reg.UpsertTenant(registry.TenantPolicy{ID: "a", Limits: limiter.Limits{RequestsPerMinute: i64(120)},
		Budget: &registry.BudgetPolicy{WeightedTokens: 5000, Period: registry.BudgetDay}})
	_ = reg.UpsertTenant(registry.TenantPolicy{ID: "b"})
	reg.Tenant("a").AddUsed(t0, 1200)
	prom := prometheus.NewRegistry()
	New(prom, func() registry.Snapshot { return reg.Snapshot(t0) })
	want := `
# HELP fairshare_scheduler_tenant_budget_remaining_weighted_tokens Weighted tokens left in the tenant's current budget period (absent without a budget).
# TYPE fairshare_scheduler_tenant_budget_remaining_weighted_tokens gauge
fairshare_scheduler_tenant_budget_remaining_weighted_tokens{tenant="a"} 3800
# HELP fairshare_scheduler_tenant_budget_used_weighted_tokens Weighted tokens spent in the tenant's current budget period (absent without a budget).
# TYPE fairshare_scheduler_tenant_budget_used_weighted_tokens gauge
fairshare_scheduler_tenant_budget_used_weighted_tokens{tenant="a"} 1200
# HELP fairshare_scheduler_tenant_remaining_requests Requests left in the tenant's request bucket (absent when unlimited).
# TYPE fairshare_scheduler_tenant_remaining_requests gauge
fairshare_scheduler_tenant_remaining_requests{tenant="a"} 20
`
	if err := testutil.GatherAndCompare(prom, strings.NewReader(want), "fairshare_scheduler_tenant_budget_remaining_weighted_tokens",
		"fairshare_scheduler_tenant_budget_used_weighted_tokens", "fairshare_scheduler_tenant_remaining_requests"); err != nil {
		t.Error(err)
	}
}
