package registry

import (
	"fmt"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fairshare-dev/fairshare/internal/usage"
)

// The usage window: calls and rejections recorded on a tenant reach the
// snapshot's evaluation, compared within the tenant's tier (seed 002
// section 7).
func TestUsageSnapshot(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	r := New(clk)
	pool := testPool()
	pool.Usage = usage.Config{Window: 10 * time.Minute, CostRatio: 10, MinTierSize: 5, MinWeightedTokens: 1000, RejectionPercent: 50, MinRejections: 100}
	if err := r.SetPool(pool); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := r.UpsertTenant(TenantPolicy{ID: fmt.Sprintf("t%d", i), Tier: "pro"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.UpsertTenant(TenantPolicy{ID: "x", Tier: "free"}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r.Tenant(fmt.Sprintf("t%d", i)).RecordCall(t0, 1000, 600, 80)
	}
	r.Tenant("t5").RecordCall(t0, 50_000, 30_000, 4_000)
	x := r.Tenant("x")
	x.RecordCall(t0, 10, 10, 0)
	for range 150 {
		x.AddRejection()
	}
	s := r.Snapshot(t0)
	byID := map[string]TenantSnapshot{}
	for _, ts := range s.Tenants {
		byID[ts.ID] = ts
	}
	if u := byID["t5"].Usage; !u.Signal.Outlier || u.Signal.Reason != usage.ReasonCostAboveTier ||
		u.TierMedian != 1000 || u.RatioPercent != 5000 || u.Counts != (usage.Counts{WeightedTokens: 50_000, InputTokens: 30_000, OutputTokens: 4_000, Admitted: 1}) ||
		u.Window != 10*time.Minute {
		t.Errorf("t5: %+v", u)
	}
	if u := byID["t0"].Usage; u.Signal.Outlier || u.RatioPercent != 100 || u.TierActive != 6 {
		t.Errorf("t0: %+v", u)
	}
	if u := byID["x"].Usage; !u.Signal.Outlier || u.Signal.Reason != usage.ReasonLimitViolations ||
		u.Counts.Refused != 150 || u.Counts.Admitted != 1 || u.RefusedPercent != 99 || byID["x"].Rejections != 150 {
		t.Errorf("x: %+v (rejections %d)", u, byID["x"].Rejections)
	}
	// Ten minutes later everything has left the window.
	for _, ts := range r.Snapshot(t0.Add(10 * time.Minute)).Tenants {
		if ts.Usage.Counts != (usage.Counts{}) || ts.Usage.Signal.Outlier {
			t.Errorf("%s after the window: %+v", ts.ID, ts.Usage)
		}
	}
}

// A new window resizes the rings and keeps what falls in it; the defaults
// apply to a pool that sets nothing.
func TestUsageWindowChange(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	r := New(clk)
	if err := r.SetPool(testPool()); err != nil {
		t.Fatal(err)
	}
	if got := r.Pool().Usage; got != usage.DefaultConfig() {
		t.Errorf("default usage config: %+v", got)
	}
	if err := r.UpsertTenant(TenantPolicy{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	a := r.Tenant("a")
	a.RecordCall(t0, 100, 1, 1)
	a.RecordCall(t0.Add(5*time.Minute), 10, 1, 1)
	clk.SetTime(t0.Add(5 * time.Minute))
	p := testPool()
	p.Usage = usage.Config{Window: 2 * time.Minute}
	if err := r.SetPool(p); err != nil {
		t.Fatal(err)
	}
	if got := a.usage.Load().Span(); got != 2*time.Minute {
		t.Errorf("span %s, want 2m", got)
	}
	if got := a.UsageWindow(t0.Add(5 * time.Minute)); got != (usage.Counts{WeightedTokens: 10, InputTokens: 1, OutputTokens: 1, Admitted: 1}) {
		t.Errorf("after resize: %+v", got)
	}
	if got := r.Pool().Usage; got.MinWeightedTokens != 0 || got.CostRatio != usage.DefaultCostRatio {
		t.Errorf("a set config keeps MinWeightedTokens 0 and defaults the rest: %+v", got)
	}
}

func BenchmarkRecordCall(b *testing.B) {
	r := New(clocktesting.NewFakeClock(t0))
	_ = r.SetPool(testPool())
	_ = r.UpsertTenant(TenantPolicy{ID: "a"})
	tn := r.Tenant("a")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tn.RecordCall(t0.Add(time.Duration(i)*time.Millisecond), 1200, 200, 200)
	}
}
