package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestStatusWriterUsageOutlier: a tenant whose weighted tokens over the
// window reach costRatioThreshold times its tier's median gets status.usage
// with the figures, UsageOutlier=True CostAboveTier, and exactly one Warning
// event naming it, written with the status (seed 002 section 7; issue 6).
// Its peers are WithinTier; the tier's median is in the pool's
// status.usageTiers; when the window has passed, the condition
// returns to False and no further event is recorded.
func TestStatusWriterUsageOutlier(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, _ := fixture(t, c)
	pool.Spec.UsageMonitoring = v1alpha1.UsageMonitoringSpec{WindowSeconds: 600, MinTierSize: 3,
		MinWeightedTokens: func() *int64 { v := int64(1000); return &v }()}
	fc := clocktesting.NewFakeClock(time.Now().Truncate(time.Minute))
	reg := registry.New(fc)
	if err := reg.SetPool(PoolPolicy(pool)); err != nil {
		t.Fatal(err)
	}
	names := []string{"tq-a", "peer-1", "peer-2", "peer-3"}
	for _, name := range names {
		tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.TenantQuotaSpec{PoolRef: v1alpha1.PoolRef{Name: "pool"}, Tier: "pro"}}
		if name == "tq-a" {
			if err := c.Get(ctx, client.ObjectKeyFromObject(tq), tq); err != nil {
				t.Fatal(err)
			}
			tq.Spec.Tier = "pro"
			if err := c.Update(ctx, tq); err != nil {
				t.Fatal(err)
			}
		} else if err := c.Create(ctx, tq); err != nil {
			t.Fatal(err)
		}
		if err := reg.UpsertTenant(TenantPolicy(tq)); err != nil {
			t.Fatal(err)
		}
	}
	now := fc.Now()
	for _, name := range names[1:] {
		reg.Tenant(name).RecordCall(now, 2000, 1000, 250)
	}
	reg.Tenant("tq-a").RecordCall(now, 40_000, 20_000, 5_000)

	rec := record.NewFakeRecorder(10)
	w := &StatusWriter{Client: c, Registry: reg, Namespace: ns, PoolName: "pool", Clock: fc, Recorder: rec}
	if n, err := w.WriteOnce(ctx); err != nil || n != 5 {
		t.Fatalf("first pass: %d writes, %v; want 5", n, err)
	}
	get := func(name string) v1alpha1.TenantQuotaStatus {
		var tq v1alpha1.TenantQuota
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &tq); err != nil {
			t.Fatal(err)
		}
		return tq.Status
	}
	st := get("tq-a")
	want := v1alpha1.TenantUsageStatus{WindowSeconds: 600, WeightedTokens: 40_000, Requests: 1}
	if st.Usage == nil || *st.Usage != want {
		t.Errorf("tq-a usage = %+v, want %+v", st.Usage, want)
	}
	// The tier's median is in the pool's status.
	var p v1alpha1.ProviderPool
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, &p); err != nil {
		t.Fatal(err)
	}
	if ut := p.Status.UsageTiers; len(ut) != 1 || ut[0].Tier != "pro" || ut[0].Active != 4 ||
		ut[0].Median == nil || *ut[0].Median != 2000 {
		t.Errorf("pool status.usageTiers = %+v, want [{pro 4 2000}]", ut)
	}
	oc := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionUsageOutlier)
	if oc == nil || oc.Status != metav1.ConditionTrue || oc.Reason != v1alpha1.ReasonCostAboveTier {
		t.Fatalf("tq-a UsageOutlier = %+v, want True CostAboveTier", oc)
	}
	if pc := meta.FindStatusCondition(get("peer-1").Conditions, v1alpha1.ConditionUsageOutlier); pc == nil ||
		pc.Status != metav1.ConditionFalse || pc.Reason != v1alpha1.ReasonWithinTier {
		t.Errorf("peer-1 UsageOutlier = %+v, want False WithinTier", pc)
	}
	wantEvent := fmt.Sprintf("%s %s %s", corev1.EventTypeWarning, v1alpha1.ReasonCostAboveTier, oc.Message)
	select {
	case e := <-rec.Events:
		if e != wantEvent {
			t.Errorf("event %q, want %q", e, wantEvent)
		}
	default:
		t.Fatal("no event for the outlier")
	}

	// Still flagged a minute later: the figures are the same, no event.
	fc.Step(time.Minute)
	if _, err := w.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// The window has passed: within tier again, no event.
	fc.Step(10 * time.Minute)
	if _, err := w.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if oc := meta.FindStatusCondition(get("tq-a").Conditions, v1alpha1.ConditionUsageOutlier); oc == nil || oc.Status != metav1.ConditionFalse {
		t.Errorf("tq-a UsageOutlier after the window = %+v, want False", oc)
	}
	select {
	case e := <-rec.Events:
		t.Errorf("unexpected event %q", e)
	default:
	}
}
