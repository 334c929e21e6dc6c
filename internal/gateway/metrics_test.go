package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// metricsScenario drives tenant "a" (bucket 100 weighted tokens, refill 60
// per minute, weights 1:1; the fake clock never moves) through one admitted
// call, one call refused by its token limit, one batch job completed and one
// batch job expired unsent; tenant "b" makes one call after a's first.
func metricsScenario(t *testing.T, beforePause func(e *env)) *env {
	t.Helper()
	up := newUpstream(t, okJSON(10, 5))
	e := newEnv(t, up, []registry.TenantPolicy{
		tenant("a", limiter.Limits{WeightedPerMinute: i64(60), WeightedBurst: i64(100)}),
		tenant("b", limiter.Limits{}),
	})
	// Admitted: charged 10 + 20 = 30, used 10 + 5 = 15, refunded 15; the
	// bucket is left with 85.
	if resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 20, "")); resp.StatusCode != http.StatusOK {
		t.Fatalf("admitted call: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	// Tenant b: one call, charged 1 + 1, used 15 (the provider's usage
	// is above the charge: nothing is refunded).
	if resp := e.do("POST", "/v1/completions", "key-b", completionsBody(1, 1, "")); resp.StatusCode != http.StatusOK {
		t.Fatalf("call of b: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	// Refused: 10 + 80 = 90 > 85.
	if resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 80, "")); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("refused call: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	// Completed job: charged 30, used 15, refunded 15; the bucket is left with 70.
	j := e.submit("key-a", jobBody(10, 20, ""))
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(j.ID) == jobs.StatusSucceeded })
	// The tenant's count follows the job's metrics (dispatcher.finishWith).
	waitFor(t, "the job to be counted", func() bool { return e.tenantSnap("a").Completed == 1 })
	if beforePause != nil {
		beforePause(e)
	}
	// Expired job: the provider is paused past its deadline; it expires at
	// its deadline, unsent (BC-37). The 30 s refill the bucket (60 a
	// minute) from 70 to its burst, 100.
	e.pause(60 * time.Second)
	x := e.submit("key-a", jobBody(10, 20, `,"deadlineSeconds":30`))
	waitFor(t, "the dispatcher to wait on its timer", e.clock.HasWaiters)
	e.clock.Step(30 * time.Second)
	waitFor(t, "the job to expire", func() bool { return e.storeStatus(x.ID) == jobs.StatusExpired })
	waitFor(t, "the job to be counted", func() bool { return e.tenantSnap("a").Expired == 1 })
	return e
}

// modelGaugesBeforePause are the model's gauges after three answered calls
// that each carried the provider's figures (limits 1000000 tokens and 10000
// requests, remaining 999000 and 9999): nothing is pending, so the estimate
// is the provider's last figure.
const modelGaugesBeforePause = `
# HELP fairshare_scheduler_upstream_limit_requests Provider request limit per window for the model (absent when unknown).
# TYPE fairshare_scheduler_upstream_limit_requests gauge
fairshare_scheduler_upstream_limit_requests{model="gpt-test"} 10000
# HELP fairshare_scheduler_upstream_limit_tokens Provider token limit per window for the model (absent when unknown).
# TYPE fairshare_scheduler_upstream_limit_tokens gauge
fairshare_scheduler_upstream_limit_tokens{model="gpt-test"} 1e+06
# HELP fairshare_scheduler_upstream_paused 1 while the model is paused after an upstream 429, else 0.
# TYPE fairshare_scheduler_upstream_paused gauge
fairshare_scheduler_upstream_paused{model="gpt-test"} 0
# HELP fairshare_scheduler_upstream_remaining_requests Provider requests the provider's quota has left for the model (estimate; absent when unknown).
# TYPE fairshare_scheduler_upstream_remaining_requests gauge
fairshare_scheduler_upstream_remaining_requests{model="gpt-test"} 9999
# HELP fairshare_scheduler_upstream_remaining_tokens Provider tokens the provider's quota has left for the model (estimate; absent when unknown).
# TYPE fairshare_scheduler_upstream_remaining_tokens gauge
fairshare_scheduler_upstream_remaining_tokens{model="gpt-test"} 999000
`

// metricsAfterScenario is the whole exposition after metricsScenario.
// Tenant a: charged 30 (call) + 30 (job) + 30 (the expiring job, admitted by
// its limits at dispatch, then refused by the paused throttle and refunded
// in full) = 90; refunded 15 + 15 + 30 = 60; used 15 + 15 = 30 (charged
// minus refunded); bucket 100 - 30 = 70, refilled (60 a minute) to its
// burst, 100, by the 30 s to the expiring job's deadline. Tenant b: charged
// 2, used 15 (the provider's usage), no limit. Admitted counts only calls
// that got an upstream slot: the expiring job is not one. After the 429
// that paused the model its estimate is 0, and 30 s of the 60 s window
// later half the limits: 5000 requests, 500000 tokens. The fake clock
// moves only then, so every duration is 0.
const metricsAfterScenario = `
# HELP fairshare_scheduler_admitted_requests_total Upstream calls admitted by the tenant's limits, budget and the pool's throttle, by tenant and class (interactive, or batch: once per dispatch attempt of a job).
# TYPE fairshare_scheduler_admitted_requests_total counter
fairshare_scheduler_admitted_requests_total{class="batch",tenant="a"} 1
fairshare_scheduler_admitted_requests_total{class="interactive",tenant="a"} 1
fairshare_scheduler_admitted_requests_total{class="interactive",tenant="b"} 1
# HELP fairshare_scheduler_charged_weighted_tokens_total Weighted tokens charged at admission (prompt*w_in + max output*w_out), by tenant.
# TYPE fairshare_scheduler_charged_weighted_tokens_total counter
fairshare_scheduler_charged_weighted_tokens_total{tenant="a"} 90
fairshare_scheduler_charged_weighted_tokens_total{tenant="b"} 2
# HELP fairshare_scheduler_job_store_quarantined_records Records the job store file holds in its quarantine bucket: records that could not be loaded as jobs, moved there unchanged when the store was opened (docs/operations.md, "The job store").
# TYPE fairshare_scheduler_job_store_quarantined_records gauge
fairshare_scheduler_job_store_quarantined_records 0
# HELP fairshare_scheduler_jobs_expired_total Batch jobs that reached their deadline before being sent (never charged), by tenant.
# TYPE fairshare_scheduler_jobs_expired_total counter
fairshare_scheduler_jobs_expired_total{tenant="a"} 1
# HELP fairshare_scheduler_jobs_finished_total Batch jobs that reached a terminal status: succeeded, failed, expired or cancelled.
# TYPE fairshare_scheduler_jobs_finished_total counter
fairshare_scheduler_jobs_finished_total{status="expired"} 1
fairshare_scheduler_jobs_finished_total{status="succeeded"} 1
# HELP fairshare_scheduler_queue_wait_seconds Time a batch job waited in the fair queue before its first upstream call, in seconds.
# TYPE fairshare_scheduler_queue_wait_seconds histogram
fairshare_scheduler_queue_wait_seconds_bucket{le="0.01"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="0.05"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="0.1"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="0.5"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="1"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="5"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="10"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="30"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="60"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="300"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="900"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="3600"} 1
fairshare_scheduler_queue_wait_seconds_bucket{le="+Inf"} 1
fairshare_scheduler_queue_wait_seconds_sum 0
fairshare_scheduler_queue_wait_seconds_count 1
# HELP fairshare_scheduler_queued_jobs Batch jobs queued in the pool.
# TYPE fairshare_scheduler_queued_jobs gauge
fairshare_scheduler_queued_jobs 0
# HELP fairshare_scheduler_refunded_weighted_tokens_total Weighted tokens refunded at settlement (charge minus usage, or the full charge of a call that failed before the provider counted it), by tenant.
# TYPE fairshare_scheduler_refunded_weighted_tokens_total counter
fairshare_scheduler_refunded_weighted_tokens_total{tenant="a"} 60
# HELP fairshare_scheduler_requests_total Interactive requests and job submissions, by tenant and outcome (ok, queued, upstream_error, client_gone, or the error code of a refusal such as token_rate_limit, request_rate_limit, concurrency_limit, memory_limit, queue_full, budget_exhausted, upstream_quota_exhausted, request_too_large, tenant_suspended).
# TYPE fairshare_scheduler_requests_total counter
fairshare_scheduler_requests_total{outcome="ok",tenant="a"} 1
fairshare_scheduler_requests_total{outcome="ok",tenant="b"} 1
fairshare_scheduler_requests_total{outcome="queued",tenant="a"} 2
fairshare_scheduler_requests_total{outcome="token_rate_limit",tenant="a"} 1
# HELP fairshare_scheduler_tenant_in_flight_requests Upstream calls in flight, by tenant.
# TYPE fairshare_scheduler_tenant_in_flight_requests gauge
fairshare_scheduler_tenant_in_flight_requests{tenant="a"} 0
fairshare_scheduler_tenant_in_flight_requests{tenant="b"} 0
# HELP fairshare_scheduler_tenant_kv_blocks KV-cache blocks held by in-flight calls, by tenant.
# TYPE fairshare_scheduler_tenant_kv_blocks gauge
fairshare_scheduler_tenant_kv_blocks{tenant="a"} 0
fairshare_scheduler_tenant_kv_blocks{tenant="b"} 0
# HELP fairshare_scheduler_tenant_limited 1 while one of the tenant's limits binds, else 0.
# TYPE fairshare_scheduler_tenant_limited gauge
fairshare_scheduler_tenant_limited{tenant="a"} 0
fairshare_scheduler_tenant_limited{tenant="b"} 0
# HELP fairshare_scheduler_tenant_queued_jobs Batch jobs queued, by tenant.
# TYPE fairshare_scheduler_tenant_queued_jobs gauge
fairshare_scheduler_tenant_queued_jobs{tenant="a"} 0
fairshare_scheduler_tenant_queued_jobs{tenant="b"} 0
# HELP fairshare_scheduler_tenant_remaining_weighted_tokens Weighted tokens left in the tenant's token bucket (absent when unlimited).
# TYPE fairshare_scheduler_tenant_remaining_weighted_tokens gauge
fairshare_scheduler_tenant_remaining_weighted_tokens{tenant="a"} 100
# HELP fairshare_scheduler_tenant_window_weighted_tokens Weighted tokens the tenant used over the pool's usage window (spec.usageMonitoring.windowSeconds), by tenant.
# TYPE fairshare_scheduler_tenant_window_weighted_tokens gauge
fairshare_scheduler_tenant_window_weighted_tokens{tenant="a"} 30
fairshare_scheduler_tenant_window_weighted_tokens{tenant="b"} 15
# HELP fairshare_scheduler_tenants Tenants loaded by the scheduler.
# TYPE fairshare_scheduler_tenants gauge
fairshare_scheduler_tenants 2
# HELP fairshare_scheduler_upstream_in_flight_requests Upstream calls in flight from the pool.
# TYPE fairshare_scheduler_upstream_in_flight_requests gauge
fairshare_scheduler_upstream_in_flight_requests 0
# HELP fairshare_scheduler_upstream_limit_requests Provider request limit per window for the model (absent when unknown).
# TYPE fairshare_scheduler_upstream_limit_requests gauge
fairshare_scheduler_upstream_limit_requests{model="gpt-test"} 10000
# HELP fairshare_scheduler_upstream_limit_tokens Provider token limit per window for the model (absent when unknown).
# TYPE fairshare_scheduler_upstream_limit_tokens gauge
fairshare_scheduler_upstream_limit_tokens{model="gpt-test"} 1e+06
# HELP fairshare_scheduler_upstream_paused 1 while the model is paused after an upstream 429, else 0.
# TYPE fairshare_scheduler_upstream_paused gauge
fairshare_scheduler_upstream_paused{model="gpt-test"} 1
# HELP fairshare_scheduler_upstream_remaining_requests Provider requests the provider's quota has left for the model (estimate; absent when unknown).
# TYPE fairshare_scheduler_upstream_remaining_requests gauge
fairshare_scheduler_upstream_remaining_requests{model="gpt-test"} 5000
# HELP fairshare_scheduler_upstream_remaining_tokens Provider tokens the provider's quota has left for the model (estimate; absent when unknown).
# TYPE fairshare_scheduler_upstream_remaining_tokens gauge
fairshare_scheduler_upstream_remaining_tokens{model="gpt-test"} 500000
# HELP fairshare_scheduler_upstream_request_duration_seconds Time from sending an upstream call to its response headers, by model, in seconds; every call (interactive and batch) is observed, including 429s, errors and transport failures (measured to the failure).
# TYPE fairshare_scheduler_upstream_request_duration_seconds histogram
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="0.05"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="0.1"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="0.25"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="0.5"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="1"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="2.5"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="5"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="10"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="20"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="30"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="60"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="120"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="300"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="600"} 3
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="+Inf"} 3
fairshare_scheduler_upstream_request_duration_seconds_sum{model="gpt-test"} 0
fairshare_scheduler_upstream_request_duration_seconds_count{model="gpt-test"} 3
# HELP fairshare_scheduler_upstream_responses_total Provider responses by model and HTTP status code ("error" when no response arrived).
# TYPE fairshare_scheduler_upstream_responses_total counter
fairshare_scheduler_upstream_responses_total{code="200",model="gpt-test"} 3
# HELP fairshare_scheduler_used_weighted_tokens_total Weighted tokens used, as settled (the provider's usage prompt*w_in + completion*w_out, or the charge when the usage is unknown; 0 for a call refunded in full), by tenant.
# TYPE fairshare_scheduler_used_weighted_tokens_total counter
fairshare_scheduler_used_weighted_tokens_total{tenant="a"} 30
fairshare_scheduler_used_weighted_tokens_total{tenant="b"} 15
`

// TestMetricsExposition: the scheduler's whole exposition after a fixed
// scenario, with exact values (the per-tenant and per-model series).
func TestMetricsExposition(t *testing.T) {
	e := metricsScenario(t, func(e *env) {
		if err := testutil.GatherAndCompare(e.prom, strings.NewReader(modelGaugesBeforePause),
			"fairshare_scheduler_upstream_limit_requests", "fairshare_scheduler_upstream_limit_tokens",
			"fairshare_scheduler_upstream_paused", "fairshare_scheduler_upstream_remaining_requests",
			"fairshare_scheduler_upstream_remaining_tokens"); err != nil {
			t.Error(err)
		}
	})
	if err := testutil.GatherAndCompare(e.prom, strings.NewReader(metricsAfterScenario)); err != nil {
		t.Error(err)
	}
}

// seriesOf lists the gathered series carrying label name=value, as
// "family{labels}".
func seriesOf(t *testing.T, g prometheus.Gatherer, name, value string) []string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == name && l.GetValue() == value {
					out = append(out, fmt.Sprintf("%s%v", mf.GetName(), m.GetLabel()))
				}
			}
		}
	}
	return out
}

// TestMetricsRemovedTenantSeriesGone: after tenant a's TenantQuota is
// removed no series carries tenant="a" (counters forgotten by the
// OnTenantRemoved hook, gauges absent from the snapshot), while b keeps its
// series.
func TestMetricsRemovedTenantSeriesGone(t *testing.T) {
	e := metricsScenario(t, nil)
	if got := seriesOf(t, e.prom, "tenant", "a"); len(got) != 15 {
		t.Fatalf("series of a before removal: %d, want 15: %v", len(got), got)
	}
	if e.reg.RemoveTenant("a") == nil {
		t.Fatal("tenant a not removed")
	}
	if got := seriesOf(t, e.prom, "tenant", "a"); len(got) != 0 {
		t.Errorf("series of a after removal: %v", got)
	}
	// b: admitted, charged, used, requests{ok}, and the in-flight, KV,
	// limited, queued and window weighted tokens gauges.
	if got := seriesOf(t, e.prom, "tenant", "b"); len(got) != 9 {
		t.Errorf("series of b after a's removal: %d, want 9: %v", len(got), got)
	}
}

// TestMetricsCallOutlivingTenantRemoval: a call in flight when its tenant
// is removed settles afterwards without bringing the tenant's series back.
func TestMetricsCallOutlivingTenantRemoval(t *testing.T) {
	release := make(chan struct{})
	ok := okJSON(10, 5)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		<-release
		ok(w, r, body)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60), WeightedBurst: i64(100)})})
	var wg sync.WaitGroup
	var status int
	wg.Go(func() {
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(10, 20, ""))
		status = resp.StatusCode
		readAll(t, resp)
	})
	waitFor(t, "the call to reach the provider", func() bool { return up.calls.Load() == 1 })
	if got := seriesOf(t, e.prom, "tenant", "a"); len(got) == 0 {
		t.Fatal("no series of a while its call is in flight")
	}
	e.reg.RemoveTenant("a")
	close(release)
	wg.Wait()
	if status != http.StatusOK {
		t.Errorf("call: %d, want 200 (admitted before the removal)", status)
	}
	if got := seriesOf(t, e.prom, "tenant", "a"); len(got) != 0 {
		t.Errorf("series of a after its call settled: %v", got)
	}
}

// TestUpstreamDurationUsesGatewayClock: the upstream latency histogram
// measures, with the gateway's clock, from sending a call to its response
// headers, for a 200 (1.5 s) and for a provider error (0.25 s) alike.
func TestUpstreamDurationUsesGatewayClock(t *testing.T) {
	var e *env
	var n int
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		n++ // calls are sequential
		if n == 1 {
			e.clock.Step(1500 * time.Millisecond)
			okJSON(1, 1)(w, r, body)
			return
		}
		e.clock.Step(250 * time.Millisecond)
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
	})
	e = newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	for _, want := range []int{http.StatusOK, http.StatusInternalServerError} {
		resp := e.do("POST", "/v1/completions", "key-a", completionsBody(1, 1, ""))
		readAll(t, resp)
		if resp.StatusCode != want {
			t.Fatalf("status %d, want %d", resp.StatusCode, want)
		}
	}
	want := `
# HELP fairshare_scheduler_upstream_request_duration_seconds Time from sending an upstream call to its response headers, by model, in seconds; every call (interactive and batch) is observed, including 429s, errors and transport failures (measured to the failure).
# TYPE fairshare_scheduler_upstream_request_duration_seconds histogram
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="0.05"} 0
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="0.1"} 0
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="0.25"} 1
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="0.5"} 1
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="1"} 1
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="2.5"} 2
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="5"} 2
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="10"} 2
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="20"} 2
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="30"} 2
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="60"} 2
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="120"} 2
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="300"} 2
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="600"} 2
fairshare_scheduler_upstream_request_duration_seconds_bucket{model="gpt-test",le="+Inf"} 2
fairshare_scheduler_upstream_request_duration_seconds_sum{model="gpt-test"} 1.75
fairshare_scheduler_upstream_request_duration_seconds_count{model="gpt-test"} 2
# HELP fairshare_scheduler_upstream_responses_total Provider responses by model and HTTP status code ("error" when no response arrived).
# TYPE fairshare_scheduler_upstream_responses_total counter
fairshare_scheduler_upstream_responses_total{code="200",model="gpt-test"} 1
fairshare_scheduler_upstream_responses_total{code="500",model="gpt-test"} 1
`
	if err := testutil.GatherAndCompare(e.prom, strings.NewReader(want),
		"fairshare_scheduler_upstream_request_duration_seconds", "fairshare_scheduler_upstream_responses_total"); err != nil {
		t.Error(err)
	}
}
