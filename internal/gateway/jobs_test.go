package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// pause makes the test model's throttle refuse every start until t0+d (an
// upstream 429 with Retry-After d).
func (e *env) pause(d time.Duration) {
	e.t.Helper()
	m := e.reg.Model(testModel)
	p, ok, _ := m.Throttle.TryStart(e.clock.Now(), 1, throttle.Interactive)
	if !ok {
		e.t.Fatal("probe refused")
	}
	m.Throttle.OnTooManyRequests(e.clock.Now(), p, throttle.Quota{RetryAfter: d, HasRetryAfter: true})
}

func jobBody(prompt int, maxTokens int64, extra string) string {
	return `{"endpoint":"/v1/completions","body":` + completionsBody(prompt, maxTokens, "") + extra + `}`
}

func (e *env) submit(key, body string) jobView {
	e.t.Helper()
	resp := e.do("POST", "/v1/jobs", key, body)
	if resp.StatusCode != http.StatusAccepted {
		e.t.Fatalf("submit: %d %s", resp.StatusCode, readAll(e.t, resp))
	}
	return decode[jobView](e.t, resp)
}

func (e *env) job(key, id string) jobView {
	e.t.Helper()
	resp := e.do("GET", "/v1/jobs/"+id, key, "")
	if resp.StatusCode != 200 {
		e.t.Fatalf("get %s: %d", id, resp.StatusCode)
	}
	return decode[jobView](e.t, resp)
}

func (e *env) storeStatus(id string) jobs.Status {
	j, err := e.store.Get(id)
	if err != nil {
		return ""
	}
	return j.Status
}

// TestJobAPIRoundTrip: submit, get, list paged and by status, cancel a
// queued job (twice: 409), another tenant gets 404; after the pause the
// remaining jobs succeed with usage and the upstream response.
func TestJobAPIRoundTrip(t *testing.T) {
	up := newUpstream(t, okJSON(10, 20))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})})
	e.pause(60 * time.Second)

	var ids []string
	for i := range 3 {
		j := e.submit("key-a", jobBody(10, 100, fmt.Sprintf(`,"metadata":{"n":%d},"deadlineSeconds":600`, i)))
		if j.Status != jobs.StatusQueued || j.Tenant != "a" || j.Model != testModel || !j.Deadline.Equal(t0.Add(600*time.Second)) {
			t.Fatalf("submitted job %+v", j)
		}
		ids = append(ids, j.ID)
	}
	if got := e.job("key-a", ids[1]); got.ID != ids[1] || string(got.Metadata) != `{"n":1}` {
		t.Errorf("get: %+v", got)
	}
	for _, method := range []string{"GET", "DELETE"} {
		resp := e.do(method, "/v1/jobs/"+ids[0], "key-b", "")
		body := decode[errorBody](t, resp)
		if resp.StatusCode != 404 || body.Error.Code != "job_not_found" {
			t.Errorf("%s by another tenant: %d %+v, want 404", method, resp.StatusCode, body.Error)
		}
	}

	page1 := decode[listResponse](t, e.do("GET", "/v1/jobs?limit=2", "key-a", ""))
	if len(page1.Data) != 2 || !page1.HasMore || page1.Data[0].ID != ids[0] || *page1.LastID != ids[1] {
		t.Fatalf("page 1: %+v", page1)
	}
	page2 := decode[listResponse](t, e.do("GET", "/v1/jobs?limit=2&after="+*page1.LastID, "key-a", ""))
	if len(page2.Data) != 1 || page2.HasMore || page2.Data[0].ID != ids[2] {
		t.Fatalf("page 2: %+v", page2)
	}
	if other := decode[listResponse](t, e.do("GET", "/v1/jobs", "key-b", "")); len(other.Data) != 0 {
		t.Errorf("tenant b lists %d jobs, want 0", len(other.Data))
	}

	resp := e.do("DELETE", "/v1/jobs/"+ids[2], "key-a", "")
	if c := decode[jobView](t, resp); resp.StatusCode != 200 || c.Status != jobs.StatusCancelled || c.FinishedAt == nil {
		t.Fatalf("cancel: %d %+v", resp.StatusCode, c)
	}
	resp = e.do("DELETE", "/v1/jobs/"+ids[2], "key-a", "")
	if body := decode[errorBody](t, resp); resp.StatusCode != 409 || body.Error.Code != "job_not_cancellable" ||
		body.Error.Message != "The job is already cancelled and can no longer be cancelled." {
		t.Errorf("second cancel: %d %+v, want 409", resp.StatusCode, body.Error)
	}

	e.clock.Step(62 * time.Second)
	waitFor(t, "both jobs to succeed", func() bool {
		return e.storeStatus(ids[0]) == jobs.StatusSucceeded && e.storeStatus(ids[1]) == jobs.StatusSucceeded
	})
	j := e.job("key-a", ids[0])
	want := jobView{ID: ids[0], Object: "job", Tenant: "a", Status: jobs.StatusSucceeded, Endpoint: "/v1/completions", Model: testModel,
		Attempts: 1, DispatchSeq: 1, Usage: &jobs.Usage{PromptTokens: 10, CompletionTokens: 20}}
	got := j
	got.CreatedAt, got.StartedAt, got.FinishedAt, got.Deadline, got.QueueWaitMS, got.Response, got.Metadata, got.Error = nil, nil, nil, nil, nil, nil, nil, nil
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("succeeded job (-want +got):\n%s", d)
	}
	if j.QueueWaitMS == nil || *j.QueueWaitMS != 62000 || !strings.Contains(string(j.Response), `"completion_tokens":20`) {
		t.Errorf("queue_wait_ms %v, response %s", j.QueueWaitMS, j.Response)
	}
	resp = e.do("DELETE", "/v1/jobs/"+ids[0], "key-a", "")
	if body := decode[errorBody](t, resp); resp.StatusCode != 409 || body.Error.Code != "job_not_cancellable" ||
		body.Error.Message != "The job has succeeded and can no longer be cancelled." {
		t.Errorf("cancel of a succeeded job: %d %+v, want 409", resp.StatusCode, body.Error)
	}
	done := decode[listResponse](t, e.do("GET", "/v1/jobs?status=succeeded", "key-a", ""))
	if len(done.Data) != 2 {
		t.Errorf("status=succeeded lists %d, want 2", len(done.Data))
	}
	if n := up.calls.Load(); n != 2 {
		t.Errorf("upstream calls = %d, want 2", n)
	}
	if s := e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()); s.InFlight != 0 {
		t.Errorf("in flight after completion: %d", s.InFlight)
	}
}

// TestJobsDispatchedByDeficitRoundRobin: with a quantum of one job's cost,
// tenant b's two jobs are interleaved with tenant a's backlog of six, not
// queued behind it (seed 000 "The problem with one queue").
func TestJobsDispatchedByDeficitRoundRobin(t *testing.T) {
	up := newUpstream(t, okJSON(10, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
		withConcurrency(1), withPool(func(p *registry.PoolPolicy) { p.Quantum = 110 }))
	e.pause(10 * time.Second)
	owner := map[string]string{}
	for range 6 {
		owner[e.submit("key-a", jobBody(10, 100, "")).ID] = "a"
	}
	for range 2 {
		owner[e.submit("key-b", jobBody(10, 100, "")).ID] = "b"
	}
	e.clock.Step(11 * time.Second)
	waitFor(t, "all jobs to succeed", func() bool { return e.store.Counts()[jobs.StatusSucceeded] == 8 })
	order := make([]string, 8)
	for id, who := range owner {
		j, _ := e.store.Get(id)
		order[j.DispatchSeq-1] = who
	}
	// a's first job was dequeued and put back during the pause, which may
	// give a one quantum of head start (BC-34 allows at most one).
	want := map[string][]string{
		"strict":            {"a", "b", "a", "b", "a", "a", "a", "a"},
		"one quantum ahead": {"a", "a", "b", "a", "b", "a", "a", "a"},
	}
	if d1, d2 := cmp.Diff(want["strict"], order), cmp.Diff(want["one quantum ahead"], order); d1 != "" && d2 != "" {
		t.Errorf("dispatch order by dispatch_seq (-want +got):\n%s", d1)
	}
}

// TestBC37_DeadlineBeforePauseEndExpiresUnsent: a job with deadline NOW+30s
// while the provider is paused until NOW+60s stays queued until its
// deadline and expires then (BC-37: at NOW+30s, within the sweep interval),
// with zero upstream calls, counted as expired, never charged.
func TestBC37_DeadlineBeforePauseEndExpiresUnsent(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60000), WeightedBurst: i64(10000)})})
	e.pause(60 * time.Second)
	j := e.submit("key-a", jobBody(10, 100, `,"deadlineSeconds":30`))
	waitFor(t, "the dispatcher to wait on its timer", e.clock.HasWaiters)
	e.clock.Step(29 * time.Second)
	waitFor(t, "the dispatcher to wait on its timer", e.clock.HasWaiters)
	if st := e.storeStatus(j.ID); st != jobs.StatusQueued {
		t.Fatalf("job at NOW+29s: %s, want queued until its deadline", st)
	}
	e.clock.Step(time.Second)
	waitFor(t, "the job to expire", func() bool { return e.storeStatus(j.ID) == jobs.StatusExpired })
	got := e.job("key-a", j.ID)
	if got.Error == nil || got.Error.Code != "deadline_exceeded" || got.Attempts != 0 || got.StartedAt != nil {
		t.Errorf("expired job: %+v", got)
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("upstream calls = %d, want 0", n)
	}
	if left := e.tokensLeft("a"); left != 10000 {
		t.Errorf("bucket = %d, want 10000 (never charged)", left)
	}
	waitFor(t, "the expired count", func() bool { return e.reg.Snapshot(e.clock.Now()).Tenants[0].Expired == 1 })
}

// TestBC37_SweepExpiresJobHeldByTenantLimit: a job held back by its
// tenant's token bucket expires at its deadline (sweep), unsent.
func TestBC37_SweepExpiresJobHeldByTenantLimit(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(60), WeightedBurst: i64(1000)})})
	if _, rej := e.reg.Tenant("a").Limiter.Admit(t0, limiter.CostModel{InputWeight: 1, OutputWeight: 1}.Cost(1000, 0)); rej != nil {
		t.Fatal(rej)
	}
	j := e.submit("key-a", jobBody(10, 100, `,"deadlineSeconds":30`))
	waitFor(t, "the dispatcher to wait on its timer", e.clock.HasWaiters)
	e.clock.Step(30 * time.Second)
	waitFor(t, "the job to expire", func() bool { return e.storeStatus(j.ID) == jobs.StatusExpired })
	if n := up.calls.Load(); n != 0 {
		t.Errorf("upstream calls = %d, want 0", n)
	}
}

// TestBC10_JobThatNeverFitsRejectedAtEnqueue: bucket capacity 8000, a job
// of 3000 + 6000 is refused at submission with 413 request_too_large and
// nothing is queued.
func TestBC10_JobThatNeverFitsRejectedAtEnqueue(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(48000), WeightedBurst: i64(8000)})})
	resp := e.do("POST", "/v1/jobs", "key-a", jobBody(3000, 6000, ""))
	body := decode[errorBody](t, resp)
	if resp.StatusCode != 413 || body.Error.Code != "request_too_large" || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("got %d %+v Retry-After %q, want 413 request_too_large without Retry-After", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
	}
	if n := e.reg.Snapshot(t0).Backlog; n != 0 {
		t.Errorf("backlog = %d, want 0", n)
	}
}

// TestJobQueueFull: the tenant's bound refuses with 429 queue_full and a
// Retry-After estimated from its token rate, then from its measured drain
// interval; another tenant can still submit.
func TestJobQueueFull(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	a := tenant("a", limiter.Limits{WeightedPerMinute: i64(6000)})
	a.MaxQueued = 2
	e := newEnv(t, up, []registry.TenantPolicy{a, tenant("b", limiter.Limits{})})
	e.pause(60 * time.Second)
	e.submit("key-a", jobBody(10, 100, ""))
	e.submit("key-a", jobBody(10, 100, ""))
	resp := e.do("POST", "/v1/jobs", "key-a", jobBody(10, 290, ""))
	body := decode[errorBody](t, resp)
	if resp.StatusCode != 429 || body.Error.Code != "queue_full" || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("got %d %+v Retry-After %q, want 429 queue_full 3 (300 tokens at 100/s)", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
	}
	e.submit("key-b", jobBody(10, 100, ""))

	// Once the tenant's queue has drained jobs, the estimate is its drain
	// interval: dispatches 7 s apart, so a slot frees in about 7 s.
	ta := e.reg.Tenant("a")
	ta.ObserveDispatch(e.clock.Now().Add(-14 * time.Second))
	ta.ObserveDispatch(e.clock.Now().Add(-7 * time.Second))
	resp = e.do("POST", "/v1/jobs", "key-a", jobBody(10, 290, ""))
	body = decode[errorBody](t, resp)
	if resp.StatusCode != 429 || body.Error.Code != "queue_full" || resp.Header.Get("Retry-After") != "7" {
		t.Fatalf("got %d %+v Retry-After %q, want 429 queue_full 7 (the drain interval)", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
	}
}

// TestJobBatchDisabled: a plan with maxQueuedJobs 0 allows no batch job:
// 403 batch_disabled with no Retry-After (waiting would not help), nothing
// stored, on POST /v1/jobs and on each line of a bulk submission, while the
// tenant's interactive calls and other tenants' jobs go on.
func TestJobBatchDisabled(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	a := tenant("a", limiter.Limits{})
	a.MaxQueued = 0
	e := newEnv(t, up, []registry.TenantPolicy{a, tenant("b", limiter.Limits{})})
	resp := e.do("POST", "/v1/jobs", "key-a", jobBody(10, 100, ""))
	body := decode[errorBody](t, resp)
	if resp.StatusCode != 403 || body.Error.Code != "batch_disabled" || body.Error.Type != "permission_error" || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("got %d %+v Retry-After %q, want 403 permission_error batch_disabled without Retry-After", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
	}
	if want := "The tenant's plan allows no batch jobs (its TenantQuota sets spec.batch.maxQueuedJobs to 0)."; body.Error.Message != want {
		t.Errorf("message %q, want %q", body.Error.Message, want)
	}
	if list, _, err := e.store.List("a", jobs.Filter{}); err != nil || len(list) != 0 {
		t.Errorf("stored jobs of a: %d (%v), want 0", len(list), err)
	}
	bulk := decode[bulkResponse](t, e.bulk("key-a", jobBody(10, 100, "")+"\n"+jobBody(10, 100, "")+"\n"))
	if got := summarize(bulk); len(got) != 2 || got[0].code != codeBatchDisabled || got[0].status != 403 || got[1].code != codeBatchDisabled {
		t.Errorf("bulk lines %+v, want both 403 batch_disabled", got)
	}
	if resp := e.do("POST", "/v1/chat/completions", "key-a", chatBody(10)); resp.StatusCode != 200 {
		t.Errorf("interactive call of a: %d, want 200", resp.StatusCode)
	}
	e.submit("key-b", jobBody(10, 100, ""))
}

// TestJobUpstream429RequeuedWithoutDoubleCharge: an upstream 429 pauses the
// model and puts the job back at its tenant's head, refunded; after the
// pause it succeeds on its second attempt and is charged once.
func TestJobUpstream429RequeuedWithoutDoubleCharge(t *testing.T) {
	var first = true
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if first {
			first = false
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(429)
			return
		}
		okJSON(10, 10)(w, r, body)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(10000)})})
	j := e.submit("key-a", jobBody(10, 100, ""))
	waitFor(t, "the 429 to be recorded", func() bool { return e.reg.Snapshot(e.clock.Now()).UpstreamThrottled == 1 })
	waitFor(t, "the job to be queued again", func() bool {
		return e.storeStatus(j.ID) == jobs.StatusQueued && e.reg.Snapshot(e.clock.Now()).Backlog == 1
	})
	if left := e.tokensLeft("a"); left != 10000 {
		t.Errorf("bucket after the 429 = %d, want 10000 (refunded)", left)
	}
	e.clock.Step(6 * time.Second)
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(j.ID) == jobs.StatusSucceeded })
	got := e.job("key-a", j.ID)
	if got.Attempts != 2 {
		t.Errorf("attempts = %d, want 2", got.Attempts)
	}
	if left := e.tokensLeft("a"); left != 10000-20 {
		t.Errorf("bucket = %d, want %d (charged once: 20 used)", left, 10000-20)
	}
}

// TestTenantRemovedFailsQueuedJobs: deleting a TenantQuota stops admission
// and fails its queued jobs with tenant_removed, including a job the
// dispatcher holds out of the queue at that moment (it tried the job, the
// paused model refused it, and it puts it back): such a job is failed when
// it would be put back, not left queued until the pause ends (the fake
// clock never ends it here).
func TestTenantRemovedFailsQueuedJobs(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{})})
	e.pause(60 * time.Second)
	j := e.submit("key-a", jobBody(10, 100, ""))
	e.reg.RemoveTenant("a")
	waitFor(t, "the job to fail with tenant_removed", func() bool {
		got, _ := e.store.Get(j.ID)
		return got.Status == jobs.StatusFailed && got.Error != nil && got.Error.Code == "tenant_removed"
	})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(1, 1, ""))
	readAll(t, resp)
	if resp.StatusCode != 401 {
		t.Errorf("request after removal: %d, want 401", resp.StatusCode)
	}
}

// TestJobRetriesUpstream5xxWithBackoff: an upstream 500 refunds the job's
// charge and retries it after the backoff (1 s * 2^0, jittered into
// [0.5 s, 1 s]); the retry succeeds on attempt 2.
func TestJobRetriesUpstream5xxWithBackoff(t *testing.T) {
	var calls int
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		calls++
		if calls == 1 {
			w.WriteHeader(500)
			return
		}
		okJSON(10, 10)(w, r, body)
	})
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600000), WeightedBurst: i64(10000)})})
	j := e.submit("key-a", jobBody(10, 100, ""))
	waitFor(t, "the first attempt to fail", func() bool {
		got, _ := e.store.Get(j.ID)
		return got.Attempts == 1 && got.Status == jobs.StatusQueued && got.Error != nil
	})
	if left := e.tokensLeft("a"); left != 10000 {
		t.Errorf("bucket after the 500 = %d, want 10000 (refunded)", left)
	}
	waitFor(t, "the dispatcher to wait for the backoff", e.clock.HasWaiters)
	e.clock.Step(time.Second)
	waitFor(t, "the retry to succeed", func() bool { return e.storeStatus(j.ID) == jobs.StatusSucceeded })
	got := e.job("key-a", j.ID)
	if got.Attempts != 2 || got.Error != nil || got.DispatchSeq != 2 {
		t.Errorf("job after the retry: %+v", got)
	}
}

// TestBudgetExhausted: a request beyond the tenant's budget is 429
// budget_exhausted with a Retry-After until the period resets.
func TestBudgetExhausted(t *testing.T) {
	up := newUpstream(t, okJSON(100, 100))
	a := tenant("a", limiter.Limits{})
	a.Budget = &registry.BudgetPolicy{WeightedTokens: 300, Period: registry.BudgetDay}
	e := newEnv(t, up, []registry.TenantPolicy{a})
	resp := e.do("POST", "/v1/completions", "key-a", completionsBody(100, 100, ""))
	readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("first call: %d", resp.StatusCode)
	}
	resp = e.do("POST", "/v1/completions", "key-a", completionsBody(100, 100, ""))
	body := decode[errorBody](t, resp)
	if resp.StatusCode != 429 || body.Error.Code != "budget_exhausted" || resp.Header.Get("Retry-After") != "86400" {
		t.Errorf("second call: %d %+v Retry-After %q, want 429 budget_exhausted 86400", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
	}
}

// waitsForRetry reports whether the dispatcher holds the job for a retry
// backoff. The job's record says queued a moment before (the store is
// written first), and only from then does it count toward the queue bounds.
func (e *env) waitsForRetry(id string) bool {
	d := e.gw.dispatch
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.retries[id]
	return ok
}

// TestRetryingJobsCountTowardTheQueueBound: a job waiting for a retry
// backoff (the provider answered 500) is a queued job and holds its slot
// of the tenant's maxQueuedJobs: a second submission is refused with 429
// queue_full until the first is cancelled. (Jobs waiting for a retry were
// once not counted, so during a provider outage a tenant's queued jobs
// grew without bound.)
func TestRetryingJobsCountTowardTheQueueBound(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	tp := tenant("a", limiter.Limits{})
	tp.MaxQueued = 1
	e := newEnv(t, up, []registry.TenantPolicy{tp})
	first := e.submit("key-a", jobBody(10, 20, "")).ID
	waitFor(t, "the first attempt to fail and wait for its retry", func() bool {
		j, err := e.store.Get(first)
		return err == nil && j.Attempts == 1 && j.Status == jobs.StatusQueued && e.waitsForRetry(first)
	})
	resp := e.do("POST", "/v1/jobs", "key-a", jobBody(10, 20, ""))
	if body := decode[errorBody](t, resp); resp.StatusCode != http.StatusTooManyRequests || body.Error.Code != codeQueueFull {
		t.Fatalf("second submission: %d %+v, want 429 %s", resp.StatusCode, body.Error, codeQueueFull)
	}
	if resp := e.do("DELETE", "/v1/jobs/"+first, "key-a", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("cancel of the retrying job: %d", resp.StatusCode)
	}
	e.submit("key-a", jobBody(10, 20, "")) // the slot is free again

	// The pool-wide bound (maxQueuedJobs of the ProviderPool) counts them too.
	up2 := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	e2 := newEnv(t, up2, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
		withPool(func(p *registry.PoolPolicy) { p.MaxQueuedJobs = 1 }))
	first = e2.submit("key-a", jobBody(10, 20, "")).ID
	waitFor(t, "the first attempt to fail (pool bound)", func() bool {
		j, err := e2.store.Get(first)
		return err == nil && j.Attempts == 1 && j.Status == jobs.StatusQueued && e2.waitsForRetry(first)
	})
	resp = e2.do("POST", "/v1/jobs", "key-b", jobBody(10, 20, ""))
	if body := decode[errorBody](t, resp); resp.StatusCode != http.StatusServiceUnavailable || body.Error.Code != codePoolQueueFull {
		t.Fatalf("submission of another tenant: %d %+v, want 503 %s", resp.StatusCode, body.Error, codePoolQueueFull)
	}
}

// TestQueueFullRetryAfterIgnoresIdleTime: a tenant whose queue drained a
// job every 2 s, then sent nothing for a day, then filled its queue while
// the model is paused is told to retry in a few seconds, not in a day (the
// time since its last dispatch was idle, not a stalled drain); and the
// first dispatch after the idle day does not put the day into its drain
// interval.
func TestQueueFullRetryAfterIgnoresIdleTime(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	a := tenant("a", limiter.Limits{RequestsPerMinute: i64(30), RequestBurst: i64(1)}) // a start every 2 s
	a.MaxQueued = 2
	a.DefaultDeadline = 48 * time.Hour
	e := newEnv(t, up, []registry.TenantPolicy{a})
	first := []string{e.submit("key-a", jobBody(10, 20, "")).ID, e.submit("key-a", jobBody(10, 20, "")).ID}
	waitFor(t, "the first job to succeed", func() bool { return e.storeStatus(first[0]) == jobs.StatusSucceeded })
	e.clock.Step(2 * time.Second)
	e.gw.dispatch.wake()
	waitFor(t, "the second job to succeed", func() bool { return e.storeStatus(first[1]) == jobs.StatusSucceeded })
	ta := e.reg.Tenant("a")
	if d, ok := ta.DrainInterval(e.clock.Now()); !ok || d != 2*time.Second {
		t.Fatalf("DrainInterval after dispatches 2 s apart = %v, %v; want 2s", d, ok)
	}

	e.clock.Step(24 * time.Hour)
	e.pause(60 * time.Second)
	id := e.submit("key-a", jobBody(10, 20, "")).ID
	e.submit("key-a", jobBody(10, 20, ""))
	e.clock.Step(3 * time.Second)
	resp := e.do("POST", "/v1/jobs", "key-a", jobBody(10, 20, ""))
	body := decode[errorBody](t, resp)
	if resp.StatusCode != 429 || body.Error.Code != codeQueueFull || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("got %d %+v Retry-After %q, want 429 queue_full 3 (stalled 3 s since the queue filled, not a day)",
			resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
	}

	e.clock.Step(2 * time.Minute) // past the pause and its jitter
	e.gw.dispatch.wake()
	waitFor(t, "the first queued job to succeed", func() bool { return e.storeStatus(id) == jobs.StatusSucceeded })
	// It was sent 2 min 3 s after the queue filled: 2 s x 0.75 + 123 s x
	// 0.25 = 32.25 s (with the idle day in the average: about 6 h).
	if d, _ := ta.DrainInterval(e.clock.Now()); d != 32250*time.Millisecond {
		t.Fatalf("DrainInterval after the idle day = %v, want 32.25s", d)
	}
}

// TestJobUpstreamTimeoutKeepsRequestCharge: a batch job whose call was sent
// and then timed out waiting for the provider is retried later; the attempt
// keeps its request charge (the provider received it) and gives its tokens
// back, as an interactive call that times out does.
func TestJobUpstreamTimeoutKeepsRequestCharge(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { <-r.Context().Done() })
	const burst, requestBurst = 1_000_000, 100
	tp := tenant("a", limiter.Limits{WeightedPerMinute: i64(burst * 6), WeightedBurst: i64(burst),
		RequestsPerMinute: i64(6), RequestBurst: i64(requestBurst)})
	e := newEnv(t, up, []registry.TenantPolicy{tp}, withPool(func(p *registry.PoolPolicy) { p.UpstreamTimeout = 150 * time.Millisecond }))
	id := e.submit("key-a", jobBody(10, 20, "")).ID
	waitFor(t, "the timed-out attempt to be recorded", func() bool {
		j := e.job("key-a", id)
		return j.Attempts == 1 && j.Status == jobs.StatusQueued && j.Error != nil
	})
	waitFor(t, "the call to settle", func() bool { return e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now()).InFlight == 0 })
	snap := e.reg.Tenant("a").Limiter.Snapshot(e.clock.Now())
	if snap.TokensRemaining != burst || snap.RequestsRemaining != requestBurst-1 {
		t.Fatalf("bucket %d, request bucket %d; want %d (tokens refunded), %d (the request stays charged)",
			snap.TokensRemaining, snap.RequestsRemaining, burst, requestBurst-1)
	}
}
