package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestTenantSeriesNotRecreatedAfterForget: after RemoveTenant and ForgetTenant,
// series the tenant had not used before (used tokens, batch admissions) are
// not created by later counts of a call still in flight.
func TestTenantSeriesNotRecreatedAfterForget(t *testing.T) {
	reg := registry.New(clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
	if err := reg.UpsertTenant(registry.TenantPolicy{ID: "a", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	ten := reg.Tenant("a")
	prom := prometheus.NewRegistry()
	m := New(prom, nil)
	s := m.Tenant(ten)
	s.Charged().Add(5) // only this slot is filled before the removal
	reg.RemoveTenant("a")
	m.ForgetTenant("a")
	s.Used().Add(1)
	s.Admitted(ClassBatch).Inc()
	if n, err := testutil.GatherAndCount(prom, "fairshare_scheduler_charged_weighted_tokens_total",
		"fairshare_scheduler_used_weighted_tokens_total", "fairshare_scheduler_admitted_requests_total"); err != nil || n != 0 {
		t.Errorf("series of removed tenant a re-created after ForgetTenant: %d (%v), want 0", n, err)
	}
}
