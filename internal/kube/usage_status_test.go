package kube

import (
	"context"
	"encoding/json"
	"fmt"
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
	cases := []struct {
		i      int
		st     v1alpha1.TenantUsageStatus
		status metav1.ConditionStatus
		reason string
		msg    string
	}{
		{3, v1alpha1.TenantUsageStatus{WindowSeconds: 3600, WeightedTokens: 1000, Requests: 12, RefusedRequests: 2},
			metav1.ConditionFalse, v1alpha1.ReasonWithinTier, withinTierMessage},
		{4, v1alpha1.TenantUsageStatus{WindowSeconds: 3600, WeightedTokens: 20000, Requests: 10},
			metav1.ConditionTrue, v1alpha1.ReasonCostAboveTier, `20000 weighted tokens in the last 1h0m0s: 20.0x the median of tier "pro" (1000, over 5 active tenants); threshold 10x`},
		{5, v1alpha1.TenantUsageStatus{WindowSeconds: 3600, Requests: 400, RefusedRequests: 300},
			metav1.ConditionTrue, v1alpha1.ReasonLimitViolations, `300 of 400 requests (75%) refused by the tenant's own limits in the last 1h0m0s; threshold 50% and 100 refusals`},
		{6, v1alpha1.TenantUsageStatus{WindowSeconds: 3600},
			metav1.ConditionFalse, v1alpha1.ReasonWithinTier, withinTierMessage},
	}
	for _, c := range cases {
		st, cond := usageStatus(registry.TenantSnapshot{ID: in[c.i].ID, Generation: 7, Usage: ev[c.i]})
		if *st != c.st {
			t.Errorf("%s: status %+v, want %+v", in[c.i].ID, *st, c.st)
		}
		want := metav1.Condition{Type: v1alpha1.ConditionUsageOutlier, Status: c.status, ObservedGeneration: 7, Reason: c.reason, Message: c.msg}
		if cond != want {
			t.Errorf("%s: condition\n got %+v\nwant %+v", in[c.i].ID, cond, want)
		}
	}
	// A tenant of an empty snapshot (no pool yet) still gets a valid condition.
	if _, cond := usageStatus(registry.TenantSnapshot{}); cond.Reason != v1alpha1.ReasonWithinTier || cond.Message != withinTierMessage {
		t.Errorf("empty: %+v", cond)
	}

	// The tiers' figures are in the pool's status.usageTiers, by tier name.
	snaps := make([]registry.TenantSnapshot, len(in))
	for i := range in {
		snaps[i] = registry.TenantSnapshot{ID: in[i].ID, Usage: ev[i]}
	}
	tiers := usageTiers(snaps)
	wantTiers := []v1alpha1.TierUsageStatus{{Tier: "free", Active: 1}, {Tier: "pro", Active: 5, Median: ptr(1000)}}
	if len(tiers) != len(wantTiers) {
		t.Fatalf("usageTiers = %+v, want %+v", tiers, wantTiers)
	}
	for i := range tiers {
		g, w := tiers[i], wantTiers[i]
		if g.Tier != w.Tier || g.Active != w.Active || (g.Median == nil) != (w.Median == nil) ||
			(g.Median != nil && *g.Median != *w.Median) {
			t.Errorf("usageTiers[%d] = %+v (median %v), want %+v (median %v)", i, g, g.Median, w, w.Median)
		}
	}
}

// At most maxUsageTiers tiers are listed, the first by name.
func TestUsageTiersCapped(t *testing.T) {
	var snaps []registry.TenantSnapshot
	for i := 20; i > 0; i-- {
		tier := fmt.Sprintf("tier-%02d", i)
		snaps = append(snaps, registry.TenantSnapshot{ID: tier, Usage: usage.Evaluation{Tier: tier, TierActive: 1}})
	}
	tiers := usageTiers(snaps)
	if len(tiers) != 16 || tiers[0].Tier != "tier-01" || tiers[15].Tier != "tier-16" {
		t.Errorf("usageTiers of 20 tiers: %d entries, first %q, last %q; want 16, tier-01 .. tier-16", len(tiers), tiers[0].Tier, tiers[len(tiers)-1].Tier)
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
