package metrics

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
	"github.com/fairshare-dev/fairshare/internal/usage"
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
	m.Tenant(reg.Tenant("a")).Requests(OutcomeOK).Inc()
	m.Tenant(reg.Tenant("b")).Requests("token_rate_limit").Add(2)

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

// TestForgetTenantDeletesEveryTenantCounter: every counter labelled with a
// tenant loses that tenant's series, and only that tenant's.
func TestForgetTenantDeletesEveryTenantCounter(t *testing.T) {
	prom := prometheus.NewRegistry()
	m := New(prom, nil)
	reg := registry.New(clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
	for _, id := range []string{"x", "y"} {
		if err := reg.UpsertTenant(registry.TenantPolicy{ID: id, Name: id}); err != nil {
			t.Fatal(err)
		}
		s := m.Tenant(reg.Tenant(id))
		s.Requests(OutcomeOK).Inc()
		s.Charged().Add(30)
		s.Refunded().Add(15)
		s.Used().Add(15)
		s.Admitted(ClassBatch).Inc()
		m.JobsExpired.WithLabelValues(id).Inc()
		m.DryRunRejections.WithLabelValues(id, "token_rate_limit").Inc()
	}
	reg.RemoveTenant("x")
	m.ForgetTenant("x")
	mfs, err := prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	perTenant := map[string]int{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "tenant" {
					perTenant[l.GetValue()]++
				}
			}
		}
	}
	if perTenant["x"] != 0 || perTenant["y"] != 7 {
		t.Errorf("series per tenant after ForgetTenant(x): %v, want x 0, y 7", perTenant)
	}
}

// TestModelRequestGauges: the model's request quota is exported once the
// provider's figures are known, and absent before.
func TestModelRequestGauges(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reg := registry.New(clocktesting.NewFakeClock(t0))
	if err := reg.SetPool(registry.PoolPolicy{BaseURL: "http://127.0.0.1:1", Models: []registry.ModelPolicy{{Name: "m"}}}); err != nil {
		t.Fatal(err)
	}
	prom := prometheus.NewRegistry()
	New(prom, func() registry.Snapshot { return reg.Snapshot(t0) })
	names := []string{"fairshare_scheduler_upstream_remaining_requests", "fairshare_scheduler_upstream_limit_requests"}
	if n, err := testutil.GatherAndCount(prom, names...); err != nil || n != 0 {
		t.Fatalf("request gauges before any figure: %d series (%v), want 0", n, err)
	}
	th := reg.Model("m").Throttle
	p, ok, _ := th.TryStart(t0, 10, throttle.Interactive)
	if !ok {
		t.Fatal("start refused")
	}
	q := th.ParseHeaders(http.Header{
		"X-Ratelimit-Limit-Requests":     {"500"},
		"X-Ratelimit-Remaining-Requests": {"499"},
		"X-Ratelimit-Reset-Requests":     {"120ms"},
	}, t0)
	th.Observe(t0, p, q)
	th.Done(t0, p, 10, true)
	want := `
# HELP fairshare_scheduler_upstream_limit_requests Provider request limit per window for the model (absent when unknown).
# TYPE fairshare_scheduler_upstream_limit_requests gauge
fairshare_scheduler_upstream_limit_requests{model="m"} 500
# HELP fairshare_scheduler_upstream_remaining_requests Provider requests the provider's quota has left for the model (estimate; absent when unknown).
# TYPE fairshare_scheduler_upstream_remaining_requests gauge
fairshare_scheduler_upstream_remaining_requests{model="m"} 499
`
	if err := testutil.GatherAndCompare(prom, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

// TestUsageGauges: the window's weighted tokens for every tenant, the
// outlier gauge only for flagged tenants with their reason, and neither for
// a deleted tenant.
func TestUsageGauges(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reg := registry.New(clocktesting.NewFakeClock(t0))
	if err := reg.SetPool(registry.PoolPolicy{BaseURL: "http://127.0.0.1:1", Models: []registry.ModelPolicy{{Name: "m"}},
		Usage: usage.Config{MinTierSize: 3, MinWeightedTokens: 100}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if err := reg.UpsertTenant(registry.TenantPolicy{ID: id, Tier: "pro"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		reg.Tenant(id).RecordCall(t0, 50, 40, 2)
	}
	reg.Tenant("d").RecordCall(t0, 5000, 1000, 800)
	for range 120 {
		reg.Tenant("c").AddRejection()
	}
	prom := prometheus.NewRegistry()
	New(prom, func() registry.Snapshot { return reg.Snapshot(t0) })
	head := `
# HELP fairshare_scheduler_tenant_usage_outlier 1 while the tenant is flagged by usage monitoring, by tenant and reason (CostAboveTier: weighted tokens over the window at least costRatioThreshold times its tier's median; LimitViolations: a high share of its requests refused by its own limits); absent otherwise.
# TYPE fairshare_scheduler_tenant_usage_outlier gauge
`
	want := head + `fairshare_scheduler_tenant_usage_outlier{reason="CostAboveTier",tenant="d"} 1
fairshare_scheduler_tenant_usage_outlier{reason="LimitViolations",tenant="c"} 1
# HELP fairshare_scheduler_tenant_window_weighted_tokens Weighted tokens the tenant used over the pool's usage window (spec.usageMonitoring.windowSeconds), by tenant.
# TYPE fairshare_scheduler_tenant_window_weighted_tokens gauge
fairshare_scheduler_tenant_window_weighted_tokens{tenant="a"} 50
fairshare_scheduler_tenant_window_weighted_tokens{tenant="b"} 50
fairshare_scheduler_tenant_window_weighted_tokens{tenant="c"} 50
fairshare_scheduler_tenant_window_weighted_tokens{tenant="d"} 5000
`
	names := []string{"fairshare_scheduler_tenant_usage_outlier", "fairshare_scheduler_tenant_window_weighted_tokens"}
	if err := testutil.GatherAndCompare(prom, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	reg.RemoveTenant("d")
	reg.RemoveTenant("c")
	want = `
# HELP fairshare_scheduler_tenant_window_weighted_tokens Weighted tokens the tenant used over the pool's usage window (spec.usageMonitoring.windowSeconds), by tenant.
# TYPE fairshare_scheduler_tenant_window_weighted_tokens gauge
fairshare_scheduler_tenant_window_weighted_tokens{tenant="a"} 50
fairshare_scheduler_tenant_window_weighted_tokens{tenant="b"} 50
`
	if err := testutil.GatherAndCompare(prom, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

// TestTenantSeriesCached: a tenant's series are kept on the tenant, are
// exported (name, help, labels and value) from their first count and not
// before, are a second Metrics' own, and are gone with the tenant:
// ForgetTenant forgets them, and a removed tenant's later counts do not
// bring them back.
func TestTenantSeriesCached(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reg := registry.New(clocktesting.NewFakeClock(t0))
	if err := reg.UpsertTenant(registry.TenantPolicy{ID: "a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	ten := reg.Tenant("a")
	prom := prometheus.NewRegistry()
	m := New(prom, nil)
	s := m.Tenant(ten)
	if m.Tenant(ten) != s {
		t.Fatal("the series of a tenant are not kept on it")
	}
	names := []string{"fairshare_scheduler_charged_weighted_tokens_total", "fairshare_scheduler_refunded_weighted_tokens_total",
		"fairshare_scheduler_used_weighted_tokens_total", "fairshare_scheduler_admitted_requests_total", "fairshare_scheduler_requests_total"}
	if n, err := testutil.GatherAndCount(prom, names...); err != nil || n != 0 {
		t.Fatalf("series before any count: %d (%v), want 0", n, err)
	}
	s.Charged().Add(5)
	s.Charged().Add(-3) // ignored: a counter never decreases
	s.Admitted(ClassInteractive).Inc()
	s.Requests(OutcomeOK).Inc()
	s.Requests("token_rate_limit").Inc()
	want := `# HELP fairshare_scheduler_admitted_requests_total Upstream calls admitted by the tenant's limits, budget and the pool's throttle, by tenant and class (interactive, or batch: once per dispatch attempt of a job).
# TYPE fairshare_scheduler_admitted_requests_total counter
fairshare_scheduler_admitted_requests_total{class="interactive",tenant="a"} 1
# HELP fairshare_scheduler_charged_weighted_tokens_total Weighted tokens charged at admission (prompt*w_in + max output*w_out), by tenant.
# TYPE fairshare_scheduler_charged_weighted_tokens_total counter
fairshare_scheduler_charged_weighted_tokens_total{tenant="a"} 5
# HELP fairshare_scheduler_requests_total Interactive requests and job submissions, by tenant and outcome (ok, queued, upstream_error, client_gone, or the error code of a refusal such as token_rate_limit, request_rate_limit, concurrency_limit, memory_limit, queue_full, budget_exhausted, upstream_quota_exhausted, request_too_large, tenant_suspended).
# TYPE fairshare_scheduler_requests_total counter
fairshare_scheduler_requests_total{outcome="ok",tenant="a"} 1
fairshare_scheduler_requests_total{outcome="token_rate_limit",tenant="a"} 1
`
	if err := testutil.GatherAndCompare(prom, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	mfs, err := prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "fairshare_scheduler_charged_weighted_tokens_total" {
			if ct := mf.GetMetric()[0].GetCounter().GetCreatedTimestamp(); ct == nil || ct.AsTime().IsZero() {
				t.Errorf("charged series without a created timestamp")
			}
		}
	}
	// A second Metrics on the same registry counts into its own series.
	prom2 := prometheus.NewRegistry()
	m2 := New(prom2, nil)
	m2.Tenant(ten).Used().Add(3)
	if got, ok := m2.Tenant(ten).Used().Value(); got != 3 || !ok {
		t.Errorf("second metrics used = %d (%v), want 3", got, ok)
	}
	if n, err := testutil.GatherAndCount(prom2, "fairshare_scheduler_used_weighted_tokens_total"); err != nil || n != 1 {
		t.Errorf("second metrics used series = %d (%v), want 1", n, err)
	}
	if n, err := testutil.GatherAndCount(prom, "fairshare_scheduler_used_weighted_tokens_total"); err != nil || n != 0 {
		t.Errorf("first metrics used series = %d (%v), want 0", n, err)
	}

	reg.RemoveTenant("a")
	m.ForgetTenant("a")
	s.Charged().Add(1) // an in-flight call settling after the removal
	s.Used().Add(1)
	if n, err := testutil.GatherAndCount(prom, names...); err != nil || n != 0 {
		t.Errorf("series after ForgetTenant = %d (%v), want 0", n, err)
	}
	// The id added again is a new tenant with new series.
	if err := reg.UpsertTenant(registry.TenantPolicy{ID: "a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	m.Tenant(reg.Tenant("a")).Charged().Add(2)
	if err := testutil.GatherAndCompare(prom, strings.NewReader(`# HELP fairshare_scheduler_charged_weighted_tokens_total Weighted tokens charged at admission (prompt*w_in + max output*w_out), by tenant.
# TYPE fairshare_scheduler_charged_weighted_tokens_total counter
fairshare_scheduler_charged_weighted_tokens_total{tenant="a"} 2
`), names...); err != nil {
		t.Error(err)
	}
}

// TestUpstreamSeriesCached: the per-model series are the vectors' children.
func TestUpstreamSeriesCached(t *testing.T) {
	m := New(prometheus.NewRegistry(), nil)
	m.UpstreamResponse("m", 200).Inc()
	m.UpstreamResponse("m", 200).Inc()
	m.UpstreamResponse("m", 503).Inc()
	if got := testutil.ToFloat64(m.UpstreamResponses.WithLabelValues("m", "200")); got != 2 {
		t.Errorf("200 = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.UpstreamResponses.WithLabelValues("m", "503")); got != 1 {
		t.Errorf("503 = %v, want 1", got)
	}
	m.ObserveUpstream("m", 2*time.Second)
	m.ObserveUpstream("m", time.Second)
	if n := testutil.CollectAndCount(m.UpstreamDuration); n != 1 {
		t.Errorf("duration series = %d, want 1", n)
	}
}

// TestUnattributedRequests: requests no tenant is known for are counted
// under tenant="", by outcome, and ForgetTenant of any tenant keeps them.
func TestUnattributedRequests(t *testing.T) {
	prom := prometheus.NewRegistry()
	m := New(prom, nil)
	m.Unattributed("invalid_api_key").Inc()
	m.Unattributed("invalid_api_key").Inc()
	m.Unattributed("missing_api_key").Inc()
	m.ForgetTenant("")
	m.ForgetTenant("a")
	want := `# HELP fairshare_scheduler_requests_total Interactive requests and job submissions, by tenant and outcome (ok, queued, upstream_error, client_gone, or the error code of a refusal such as token_rate_limit, request_rate_limit, concurrency_limit, memory_limit, queue_full, budget_exhausted, upstream_quota_exhausted, request_too_large, tenant_suspended).
# TYPE fairshare_scheduler_requests_total counter
fairshare_scheduler_requests_total{outcome="invalid_api_key",tenant=""} 2
fairshare_scheduler_requests_total{outcome="missing_api_key",tenant=""} 1
`
	if err := testutil.GatherAndCompare(prom, strings.NewReader(want), "fairshare_scheduler_requests_total"); err != nil {
		t.Error(err)
	}
}

// TestForgetTenantAfterReAdd: a ForgetTenant of a removed tenant that runs
// after a tenant of the same id was added again and counted (removal hooks
// run after the registry lets go of the id) keeps the new tenant's series.
func TestForgetTenantAfterReAdd(t *testing.T) {
	reg := registry.New(clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
	if err := reg.UpsertTenant(registry.TenantPolicy{ID: "a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	prom := prometheus.NewRegistry()
	m := New(prom, nil)
	m.Tenant(reg.Tenant("a")).Charged().Add(5)
	reg.RemoveTenant("a")
	if err := reg.UpsertTenant(registry.TenantPolicy{ID: "a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	again := m.Tenant(reg.Tenant("a"))
	again.Charged().Add(2)
	m.ForgetTenant("a") // the old tenant's removal, late
	again.Charged().Add(1)
	want := `# HELP fairshare_scheduler_charged_weighted_tokens_total Weighted tokens charged at admission (prompt*w_in + max output*w_out), by tenant.
# TYPE fairshare_scheduler_charged_weighted_tokens_total counter
fairshare_scheduler_charged_weighted_tokens_total{tenant="a"} 3
`
	if err := testutil.GatherAndCompare(prom, strings.NewReader(want), "fairshare_scheduler_charged_weighted_tokens_total"); err != nil {
		t.Error(err)
	}
}
