package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/throttle"
)

// TestRemovedModelJobsCostNoTurn: jobs for a model taken out of the pool
// fail (model_not_found) without taking their tenant's turns. Tenant a has
// three jobs for gpt-y, then one for gpt-test; tenant b three for
// gpt-test; each job is one quantum. gpt-y is removed while both models
// are paused. a's gpt-test job is the first sent; it used to go after b's
// first job: a's visit went to a doomed job, which was dispatched, charged
// a's quantum and failed at start.
func TestRemovedModelJobsCostNoTurn(t *testing.T) {
	up := newUpstream(t, okJSON(10, 10))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
		withPool(func(p *registry.PoolPolicy) {
			p.Quantum = 20
			p.Models = append(p.Models, registry.ModelPolicy{Name: "gpt-y", TokensPerMinute: 1000000, RequestsPerMinute: 10000})
		}))
	e.pause(time.Minute)
	y := e.reg.Model("gpt-y")
	p, ok, _ := y.Throttle.TryStart(e.clock.Now(), 1, throttle.Interactive)
	if !ok {
		t.Fatal("probe refused")
	}
	y.Throttle.OnTooManyRequests(e.clock.Now(), p, throttle.Quota{RetryAfter: time.Minute, HasRetryAfter: true})
	var doomed []string
	for range 3 {
		doomed = append(doomed, e.submit("key-a", strings.Replace(jobBody(10, 10, ""), testModel, "gpt-y", 1)).ID)
	}
	ax := e.submit("key-a", jobBody(10, 10, "")).ID
	for range 3 {
		e.submit("key-b", jobBody(10, 10, ""))
	}
	pol := *e.reg.Pool()
	pol.Models = pol.Models[:1]
	if err := e.reg.SetPool(pol); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the dispatcher to wait", e.clock.HasWaiters)
	e.clock.Step(2 * time.Minute)
	e.gw.dispatch.wake()
	waitFor(t, "every job to finish", func() bool {
		c := e.store.Counts()
		return c[jobs.StatusSucceeded] == 4 && c[jobs.StatusFailed] == 3
	})
	for _, id := range doomed {
		if j, _ := e.store.Get(id); j.Error == nil || j.Error.Code != jobCodeModelRemoved || j.Attempts != 0 {
			t.Errorf("job for the removed model: %+v, want failed model_not_found, never sent", j)
		}
	}
	if j, _ := e.store.Get(ax); j.DispatchSeq != 1 {
		t.Errorf("a's gpt-test job was sent %d-th, want first (its doomed jobs took no turn)", j.DispatchSeq)
	}
}
