package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// setCostModel applies the pool policy in force with another cost model,
// live (as a change of the ProviderPool's spec.costModel does).
func (e *env) setCostModel(m limiter.CostModel) {
	e.t.Helper()
	p := *e.reg.Pool()
	p.CostModel = m
	if err := e.reg.SetPool(p); err != nil {
		e.t.Fatal(err)
	}
}

// TestCostModelChangeRepricesQueuedJobs: the fair queue shares by weighted
// tokens of the cost model in force. Tenant a queues six jobs of 100 prompt
// and 100 output tokens under weights 1 and 1 (200 weighted tokens each);
// the pool's output weight then becomes 4, and tenant b queues six identical
// jobs (500 each). With quantum 500 the two tenants alternate. Before, a's
// jobs kept their submission cost of 200 and a got two and three jobs a
// visit to b's one: 2.5 times b's provider tokens for the same weight.
func TestCostModelChangeRepricesQueuedJobs(t *testing.T) {
	up := newUpstream(t, okJSON(100, 100))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{}), tenant("b", limiter.Limits{})},
		withConcurrency(1), withPool(func(p *registry.PoolPolicy) { p.Quantum = 500 }))
	e.pause(time.Minute)
	name := map[string]string{}
	for range 6 {
		name[e.submit("key-a", jobBody(100, 100, "")).ID] = "a"
	}
	e.setCostModel(limiter.CostModel{InputWeight: 1, OutputWeight: 4})
	for range 6 {
		name[e.submit("key-b", jobBody(100, 100, "")).ID] = "b"
	}
	waitFor(t, "the dispatcher to wait", e.clock.HasWaiters)
	e.clock.Step(2 * time.Minute)
	e.gw.dispatch.wake() // (a pass running at the step timed its wake from the stepped clock)
	waitFor(t, "every job to succeed", func() bool { return e.store.Counts()[jobs.StatusSucceeded] == 12 })
	order := make([]string, 12)
	for id, n := range name {
		j, err := e.store.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		order[j.DispatchSeq-1] = n
	}
	if got, want := strings.Join(order, " "), "a b a b a b a b a b a b"; got != want {
		t.Errorf("dispatch order %q, want %q (the same price for the same job)", got, want)
	}
}

// TestCostModelChangeAppliesToEligibility: a queued job is tested against
// its tenant's bucket at its charge under the cost model in force, as
// admission charges it. Tenant c's bucket holds 500 of 1,000 weighted
// tokens (10 a second); its job of 100 prompt and 200 output tokens costs
// 900 under weights 1 and 4 and waits. The output weight then becomes 1:
// the job costs 300 and starts at once, instead of waiting 40 s for the
// bucket to hold its submission cost.
func TestCostModelChangeAppliesToEligibility(t *testing.T) {
	up := newUpstream(t, okJSON(100, 10))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("c", limiter.Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(1000)})},
		withPool(func(p *registry.PoolPolicy) { p.CostModel = limiter.CostModel{InputWeight: 1, OutputWeight: 4} }))
	if _, rej := e.reg.Tenant("c").Limiter.Admit(t0, limiter.CostModel{InputWeight: 1, OutputWeight: 1}.Cost(500, 0)); rej != nil {
		t.Fatal(rej)
	}
	id := e.submit("key-c", jobBody(100, 200, "")).ID
	waitFor(t, "the dispatcher to wait", e.clock.HasWaiters)
	if st := e.storeStatus(id); st != jobs.StatusQueued {
		t.Fatalf("job %s, want queued (900 > 500)", st)
	}
	e.setCostModel(limiter.CostModel{InputWeight: 1, OutputWeight: 1})
	waitFor(t, "the job to succeed", func() bool { return e.storeStatus(id) == jobs.StatusSucceeded })
	j, err := e.store.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if !j.StartedAt.Equal(t0) {
		t.Errorf("started at %v, want %v (at once)", j.StartedAt, t0)
	}
}
