package gateway

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fairshare-dev/fairshare/internal/jobs"
	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestBC32_QueueingStrategy: the tenant's token bucket has 150 of 1,000
// weighted tokens left; its oldest job needs 200, the seven after it 20 each.
// Under BestEffortFIFO (the default) four small jobs start at once (the big
// one is passed over at most registry.MaxBypass times), then the tenant
// waits for the big one, which starts once the bucket has refilled, before
// the last three. Under StrictFIFO nothing starts until the refill, and the
// jobs start in the order they came.
func TestBC32_QueueingStrategy(t *testing.T) {
	for _, tc := range []struct {
		strategy  string
		startNow  int
		wantOrder []string
	}{
		{registry.QueueingBestEffortFIFO, registry.MaxBypass, []string{"s1", "s2", "s3", "s4", "big", "s5", "s6", "s7"}},
		{registry.QueueingStrictFIFO, 0, []string{"big", "s1", "s2", "s3", "s4", "s5", "s6", "s7"}},
	} {
		t.Run(tc.strategy, func(t *testing.T) {
			up := newUpstream(t, okJSON(1, 1))
			e := newEnv(t, up, []registry.TenantPolicy{tenant("a", limiter.Limits{WeightedPerMinute: i64(600), WeightedBurst: i64(1000)})},
				withPool(func(p *registry.PoolPolicy) { p.QueueingStrategy = tc.strategy }))
			if _, rej := e.reg.Tenant("a").Limiter.Admit(t0, limiter.CostModel{InputWeight: 1, OutputWeight: 1}.Cost(850, 0)); rej != nil {
				t.Fatal(rej)
			}
			name := map[string]string{e.submit("key-a", jobBody(100, 100, "")).ID: "big"}
			for i := range 7 {
				name[e.submit("key-a", jobBody(10, 10, "")).ID] = "s" + string(rune('1'+i))
			}
			waitFor(t, "the first jobs to succeed", func() bool { return e.store.Counts()[jobs.StatusSucceeded] == tc.startNow })
			waitFor(t, "the dispatcher to wait for the refill", e.clock.HasWaiters)
			if n := up.calls.Load(); n != int64(tc.startNow) {
				t.Fatalf("upstream calls before the refill = %d, want %d", n, tc.startNow)
			}
			e.clock.Step(2 * time.Minute) // the bucket is full again
			waitFor(t, "every job to succeed", func() bool { return e.store.Counts()[jobs.StatusSucceeded] == 8 })
			order := make([]string, 8)
			for id, n := range name {
				j, err := e.store.Get(id)
				if err != nil {
					t.Fatal(err)
				}
				order[j.DispatchSeq-1] = n
			}
			if diff := cmp.Diff(tc.wantOrder, order); diff != "" {
				t.Errorf("dispatch order (-want +got):\n%s", diff)
			}
		})
	}
}
