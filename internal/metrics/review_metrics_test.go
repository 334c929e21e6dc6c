package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/limiter"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestReviewPedanticGather: every series the scheduler exports passes the
// pedantic registry's consistency checks (label names of each sample match
// its descriptor).
func TestReviewPedanticGather(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reg := registry.New(clocktesting.NewFakeClock(t0))
	if err := reg.SetPool(registry.PoolPolicy{BaseURL: "http://127.0.0.1:1", Models: []registry.ModelPolicy{{Name: "m"}}}); err != nil {
		t.Fatal(err)
	}
	if err := reg.UpsertTenant(registry.TenantPolicy{ID: "a", Limits: limiter.Limits{WeightedPerMinute: i64(600), RequestsPerMinute: i64(60)}}); err != nil {
		t.Fatal(err)
	}
	prom := prometheus.NewPedanticRegistry()
	m := New(prom, func() registry.Snapshot { return reg.Snapshot(t0) })
	s := m.Tenant(reg.Tenant("a"))
	s.Requests(OutcomeOK).Inc()
	s.Requests("queue_full").Inc()
	s.Charged().Add(10)
	s.Refunded().Add(3)
	s.Used().Add(7)
	s.Admitted(ClassBatch).Inc()
	s.Admitted(ClassInteractive).Inc()
	m.Unattributed("invalid_api_key").Inc()
	m.UpstreamResponse("m", 200).Inc()
	m.ObserveUpstream("m", time.Second)
	m.ObserveQueueWait(time.Second)
	m.JobsExpired.WithLabelValues("a").Inc()
	m.DryRunRejections.WithLabelValues("a", "token_rate_limit").Inc()
	if _, err := prom.Gather(); err != nil {
		t.Fatal(err)
	}
}
