package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestLookaheadRequeueKeepsTheBypassBound: BestEffortFIFO passes the
// tenant's oldest job over at most registry.MaxBypass (4) times. The
// tenant's bucket holds 150 of 1,000 weighted tokens; its oldest job "big"
// (model gpt-y) needs 200; then x1 (gpt-test, whose throttle is paused for
// 2 s) and y1..y7 (gpt-y), 20 each. x1 is picked past big and refused by
// the paused throttle: the dispatcher requeues it behind big (it once went
// in front of big, became the head, and big was passed over a fifth time
// without a count). Once the bucket refills, big goes, then x1.
func TestLookaheadRequeueKeepsTheBypassBound(t *testing.T) {
	up := newUpstream(t, okJSON(10, 10))
	e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(1000)})},
		withPool(func(p *registry.PoolPolicy) {
			p.Models = append(p.Models, registry.ModelPolicy{Name: "gpt-y", TokensPerMinute: 1000000, RequestsPerMinute: 10000})
		}))
	if _, rej := e.reg.Tenant("a").Limiter.Admit(t0, limiter.CostModel{InputWeight: 1, OutputWeight: 1}.Cost(850, 0)); rej != nil {
		t.Fatal(rej)
	}
	e.pause(2 * time.Second)
	y := func(prompt int, max int64) string {
		return strings.Replace(jobBody(prompt, max, ""), testModel, "gpt-y", 1)
	}
	name := map[string]string{e.submit("key-a", y(100, 100)).ID: "big"}
	name[e.submit("key-a", jobBody(10, 10, "")).ID] = "x1"
	for i := range 7 {
		name[e.submit("key-a", y(10, 10)).ID] = "y" + string(rune('1'+i))
	}
	waitFor(t, "four jobs to succeed", func() bool { return e.store.Counts()[jobs.StatusSucceeded] == 4 })
	waitFor(t, "the dispatcher to wait", e.clock.HasWaiters)
	e.clock.Step(2 * time.Minute)
	waitFor(t, "every job to succeed", func() bool { return e.store.Counts()[jobs.StatusSucceeded] == 9 })
	order := make([]string, 9)
	for id, n := range name {
		j, err := e.store.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		order[j.DispatchSeq-1] = n
	}
	if got, want := strings.Join(order, " "), "y1 y2 y3 y4 big x1 y5 y6 y7"; got != want {
		t.Errorf("dispatch order %q, want %q (big passed over MaxBypass = %d times)", got, want, registry.MaxBypass)
	}
}
