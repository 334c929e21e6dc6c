package gateway

import (
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestQueueFullRetryAfterCountsJobsOverTheBound: a queue over its bound (the
// bound lowered from 5 to 2 under 5 queued jobs; likewise jobs put back
// after a provider 429) frees a slot only once 4 jobs have left it, and
// queue_full's Retry-After says so: 4 times the time the tenant's token
// rate takes to pay for the job (4 x 300 tokens at 100/s = 12 s), then 4
// times its drain interval (4 x 7 s). It said 3 s and 7 s: a client that
// followed it was refused three more times.
func TestQueueFullRetryAfterCountsJobsOverTheBound(t *testing.T) {
	up := newUpstream(t, okJSON(1, 1))
	a := tenant("a", limiter.Limits{WeightedPerMinute: i64(6000)})
	a.MaxQueued = 5
	e := newEnv(t, up, []registry.TenantPolicy{a})
	e.pause(60 * time.Second)
	for range 5 {
		e.submit("key-a", jobBody(10, 100, ""))
	}
	a.MaxQueued = 2
	if err := e.reg.UpsertTenant(a); err != nil {
		t.Fatal(err)
	}
	check := func(want string) {
		t.Helper()
		resp := e.do("POST", "/v1/jobs", "key-a", jobBody(10, 290, ""))
		body := decode[errorBody](t, resp)
		if resp.StatusCode != 429 || body.Error.Code != "queue_full" || resp.Header.Get("Retry-After") != want {
			t.Fatalf("got %d %+v Retry-After %q, want 429 queue_full %s", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"), want)
		}
	}
	check("12")
	ta := e.reg.Tenant("a")
	ta.ObserveDispatch(e.clock.Now().Add(-14 * time.Second))
	ta.ObserveDispatch(e.clock.Now().Add(-7 * time.Second))
	check("28")
}

// TestRetryAfterArithmeticSaturates: the estimates saturate instead of
// overflowing into a negative or zero wait.
func TestRetryAfterArithmeticSaturates(t *testing.T) {
	if got := refillTime(1<<62, 1); got != time.Duration(1<<63-1) {
		t.Errorf("refillTime(2^62, 1/min) = %v, want the largest Duration", got)
	}
	if got := scaleDuration(time.Hour, 1<<40); got != time.Duration(1<<63-1) {
		t.Errorf("scaleDuration(1h, 2^40) = %v, want the largest Duration", got)
	}
	if got := scaleDuration(7*time.Second, 4); got != 28*time.Second {
		t.Errorf("scaleDuration(7s, 4) = %v, want 28s", got)
	}
}
