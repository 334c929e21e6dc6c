package metrics

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/registry"
)

// BenchmarkGatherTenantCounters: one scrape (prometheus.Registry.Gather)
// of the per-tenant counters of 10,000 tenants that each had traffic
// (charged, refunded, used, admitted interactive and batch, requests
// answered ok and refused for token_rate_limit: 70,000 series), the work
// and garbage a Prometheus scrape of a pool's scheduler costs.
func BenchmarkGatherTenantCounters(b *testing.B) {
	reg := registry.New(clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
	prom := prometheus.NewRegistry()
	m := New(prom, nil)
	for i := range 10000 {
		id := fmt.Sprintf("tenant-%d", i)
		if err := reg.UpsertTenant(registry.TenantPolicy{ID: id, Name: id}); err != nil {
			b.Fatal(err)
		}
		s := m.Tenant(reg.Tenant(id))
		s.Charged().Add(100)
		s.Refunded().Add(40)
		s.Used().Add(60)
		s.Admitted(ClassInteractive).Inc()
		s.Admitted(ClassBatch).Inc()
		s.Requests(OutcomeOK).Inc()
		s.Requests("token_rate_limit").Inc()
	}
	b.ReportAllocs()
	for b.Loop() {
		mfs, err := prom.Gather()
		if err != nil {
			b.Fatal(err)
		}
		// The five counters, and the queue-wait histogram (no labels, so
		// always exported).
		if n := len(mfs); n != 6 {
			b.Fatalf("%d metric families, want 6", n)
		}
	}
}
