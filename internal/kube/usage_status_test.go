package kube

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/usage"
)

func TestUsageStatus(t *testing.T) {
	cfg := usage.Config{Window: time.Hour, MinTierSize: 5, MinWeightedTokens: 1000}
	in := []usage.Input{
		{ID: "a", Tier: "pro", Counts: usage.Counts{WeightedTokens: 1000, Admitted: 10}},
		{ID: "b", Tier: "pro", Counts: usage.Counts{WeightedTokens: 1000, Admitted: 10}},
		{ID: "c", Tier: "pro", Counts: usage.Counts{WeightedTokens: 1000, Admitted: 10}},
		{ID: "d", Tier: "pro", Counts: usage.Counts{WeightedTokens: 1000, Admitted: 10, Refused: 2}},
		{ID: "e", Tier: "pro", Counts: usage.Counts{WeightedTokens: 20000, Admitted: 10}},
		{ID: "f", Tier: "free", Counts: usage.Counts{Admitted: 100, Refused: 300}},
		{ID: "g", Tier: "free"},
	}
	ev := usage.Evaluate(cfg, in)
	m := int64(1000)
	cases := []struct {
		i      int
		st     v1alpha1.TenantUsageStatus
		status metav1.ConditionStatus
		reason string
		msg    string
	}{
		{3, v1alpha1.TenantUsageStatus{WindowSeconds: 3600, WeightedTokens: 1000, TierMedianWeightedTokens: &m, Requests: 12, RefusedRequests: 2},
			metav1.ConditionFalse, v1alpha1.ReasonWithinTier, `1000 weighted tokens in the last 1h0m0s: 1.0x the median of tier "pro" (1000); 16% of requests refused`},
		{4, v1alpha1.TenantUsageStatus{WindowSeconds: 3600, WeightedTokens: 20000, TierMedianWeightedTokens: &m, Requests: 10},
			metav1.ConditionTrue, v1alpha1.ReasonCostAboveTier, `20000 weighted tokens in the last 1h0m0s: 20.0x the median of tier "pro" (1000, over 5 active tenants); threshold 10x`},
		{5, v1alpha1.TenantUsageStatus{WindowSeconds: 3600, Requests: 400, RefusedRequests: 300},
			metav1.ConditionTrue, v1alpha1.ReasonLimitViolations, `300 of 400 requests (75%) refused by the tenant's own limits in the last 1h0m0s; threshold 50% and 100 refusals`},
		{6, v1alpha1.TenantUsageStatus{WindowSeconds: 3600},
			metav1.ConditionFalse, v1alpha1.ReasonWithinTier, `0 weighted tokens in the last 1h0m0s; tier "free" has 1 active tenants, too few for a median`},
	}
	for _, c := range cases {
		st, cond := usageStatus(registry.TenantSnapshot{ID: in[c.i].ID, Generation: 7, Usage: ev[c.i]})
		if (st.TierMedianWeightedTokens == nil) != (c.st.TierMedianWeightedTokens == nil) ||
			(st.TierMedianWeightedTokens != nil && *st.TierMedianWeightedTokens != *c.st.TierMedianWeightedTokens) {
			t.Errorf("%s: median %v, want %v", in[c.i].ID, st.TierMedianWeightedTokens, c.st.TierMedianWeightedTokens)
		}
		st.TierMedianWeightedTokens, c.st.TierMedianWeightedTokens = nil, nil
		if *st != c.st {
			t.Errorf("%s: status %+v, want %+v", in[c.i].ID, *st, c.st)
		}
		want := metav1.Condition{Type: v1alpha1.ConditionUsageOutlier, Status: c.status, ObservedGeneration: 7, Reason: c.reason, Message: c.msg}
		if cond != want {
			t.Errorf("%s: condition\n got %+v\nwant %+v", in[c.i].ID, cond, want)
		}
	}
	// A tenant of an empty snapshot (no pool yet) still gets a valid condition.
	if _, cond := usageStatus(registry.TenantSnapshot{}); cond.Reason != v1alpha1.ReasonWithinTier || cond.Message != "No usage in the window." {
		t.Errorf("empty: %+v", cond)
	}
}

// The usage status stays small (the whole status must stay under 4 KB):
// at the largest figures it is under 200 bytes of JSON.
func TestUsageStatusSize(t *testing.T) {
	e := usage.Evaluation{Window: usage.MaxWindow, HasMedian: true, TierMedian: math.MaxInt64,
		Counts: usage.Counts{WeightedTokens: math.MaxInt64, Admitted: math.MaxInt64 / 2, Refused: math.MaxInt64 / 2}}
	st, _ := usageStatus(registry.TenantSnapshot{Usage: e})
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) >= 200 {
		t.Errorf("usage status is %d bytes: %s", len(b), b)
	}
}

// spec.tier and spec.usageMonitoring reach the registry policies; unset
// fields take the API defaults.
func TestTranslateUsage(t *testing.T) {
	tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: v1alpha1.TenantQuotaSpec{Tier: "pro"}}
	if got := TenantPolicy(tq).Tier; got != "pro" {
		t.Errorf("Tier = %q", got)
	}
	if got := UsageConfig(&v1alpha1.UsageMonitoringSpec{}); got != usage.DefaultConfig() {
		t.Errorf("defaults: %+v", got)
	}
	zero := int64(0)
	got := UsageConfig(&v1alpha1.UsageMonitoringSpec{WindowSeconds: 600, CostRatioThreshold: 20, MinTierSize: 8,
		MinWeightedTokens: &zero, RejectionPercentThreshold: 75, MinRejections: 30})
	want := usage.Config{Window: 10 * time.Minute, CostRatio: 20, MinTierSize: 8, MinWeightedTokens: 0, RejectionPercent: 75, MinRejections: 30}
	if got != want {
		t.Errorf("UsageConfig = %+v, want %+v", got, want)
	}
	pool := &v1alpha1.ProviderPool{Spec: v1alpha1.ProviderPoolSpec{UsageMonitoring: v1alpha1.UsageMonitoringSpec{CostRatioThreshold: 15}}}
	if got := PoolPolicy(pool).Usage.CostRatio; got != 15 {
		t.Errorf("PoolPolicy Usage.CostRatio = %d", got)
	}
}

// The API server applies the usageMonitoring defaults and refuses values
// outside the documented ranges (CRD OpenAPI and CEL).
func TestUsageMonitoringValidation(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, _ := fixture(t, c)
	got := &v1alpha1.ProviderPool{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), got); err != nil {
		t.Fatal(err)
	}
	u := got.Spec.UsageMonitoring
	if u.WindowSeconds != 3600 || u.CostRatioThreshold != 10 || u.MinTierSize != 5 || u.MinWeightedTokens == nil ||
		*u.MinWeightedTokens != 100000 || u.RejectionPercentThreshold != 50 || u.MinRejections != 100 {
		t.Errorf("defaults: %+v", u)
	}
	if d := UsageConfig(&u); d != usage.DefaultConfig() {
		t.Errorf("the API defaults translate to %+v, want usage.DefaultConfig()", d)
	}
	for _, bad := range []struct {
		spec v1alpha1.UsageMonitoringSpec
		msg  string
	}{
		{v1alpha1.UsageMonitoringSpec{WindowSeconds: 3630}, "whole number of minutes"},
		{v1alpha1.UsageMonitoringSpec{WindowSeconds: 60}, "windowSeconds"},
		{v1alpha1.UsageMonitoringSpec{CostRatioThreshold: 1}, "costRatioThreshold"},
		{v1alpha1.UsageMonitoringSpec{RejectionPercentThreshold: 101}, "rejectionPercentThreshold"},
		{v1alpha1.UsageMonitoringSpec{MinTierSize: 2}, "minTierSize"},
	} {
		p := got.DeepCopy()
		p.Spec.UsageMonitoring = bad.spec
		if err := c.Update(ctx, p); err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("%+v: err %v, want one naming %q", bad.spec, err, bad.msg)
		}
	}
	tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "tiered", Namespace: ns},
		Spec: v1alpha1.TenantQuotaSpec{PoolRef: v1alpha1.PoolRef{Name: "pool"}, Tier: "Pro_Tier"}}
	if err := c.Create(ctx, tq); err == nil || !strings.Contains(err.Error(), "spec.tier") {
		t.Errorf("tier Pro_Tier: err %v", err)
	}
	tq.Spec.Tier = "enterprise"
	if err := c.Create(ctx, tq); err != nil {
		t.Errorf("tier enterprise: %v", err)
	}
}
