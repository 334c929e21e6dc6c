package kube

import (
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/usage"
)

// withinTierMessage is the message of a UsageOutlier condition that is
// False (reason WithinTier). It is constant: a tenant's status depends on
// its own figures only, so that an idle tenant is not rewritten when its
// peers' traffic moves its tier's median. The figures are in
// status.usage; the tier's median in the ProviderPool's status.usageTiers.
const withinTierMessage = "Usage is within the tier: neither cost above the tier's median nor limit violations in the window."

// maxUsageTiers is the most tiers the ProviderPool's status.usageTiers lists
// (the first by name), so that the pool's status stays under 4 KB.
const maxUsageTiers = 16

// maxUsageTierNameBytes caps the bytes of tier names status.usageTiers
// lists (16 names of 20 bytes): spec.tier may be 63 bytes long, and 16
// such names would take the pool's status past 4 KB. The first tier is
// always listed.
const maxUsageTierNameBytes = 320

// usageStatus returns a served tenant's status.usage and its UsageOutlier
// condition from the snapshot's evaluation (registry.TenantSnapshot.Usage,
// usage.Evaluate; seed 002 section 7): True with reason CostAboveTier or
// LimitViolations while the tenant is flagged (a warning: the writer emits
// a Warning event when it turns True), False with WithinTier otherwise.
// Both depend on the tenant's own figures only, except the message of a
// True condition, which cites the tier's median. The condition's
// LastTransitionTime is left to the writer. The figures are four integers,
// well within the status size budget.
func usageStatus(t registry.TenantSnapshot) (*v1alpha1.TenantUsageStatus, metav1.Condition) {
	e := t.Usage
	st := &v1alpha1.TenantUsageStatus{
		WindowSeconds:   int64(e.Window.Seconds()),
		WeightedTokens:  e.Counts.WeightedTokens,
		Requests:        e.Counts.Requests(),
		RefusedRequests: e.Counts.Refused,
	}
	c := metav1.Condition{
		Type:               v1alpha1.ConditionUsageOutlier,
		Status:             metav1.ConditionFalse,
		ObservedGeneration: t.Generation,
		Reason:             v1alpha1.ReasonWithinTier,
		Message:            withinTierMessage,
	}
	if e.Signal.Outlier {
		c.Status = metav1.ConditionTrue
		c.Message = e.Signal.Message
		switch e.Signal.Reason {
		case usage.ReasonCostAboveTier:
			c.Reason = v1alpha1.ReasonCostAboveTier
		case usage.ReasonLimitViolations:
			c.Reason = v1alpha1.ReasonLimitViolations
		}
	}
	return st, c
}

// usageTiers returns the ProviderPool's status.usageTiers: per tier of the
// snapshot's tenants, its active tenants and median weighted tokens over
// the usage window (usage.Evaluation.TierActive, TierMedian, HasMedian),
// the first tiers by name, at most maxUsageTiers and maxUsageTierNameBytes
// of names; nil without tenants.
func usageTiers(tenants []registry.TenantSnapshot) []v1alpha1.TierUsageStatus {
	byTier := map[string]v1alpha1.TierUsageStatus{}
	for _, t := range tenants {
		e := t.Usage
		if _, ok := byTier[e.Tier]; ok {
			continue
		}
		ts := v1alpha1.TierUsageStatus{Tier: e.Tier, Active: int64(e.TierActive)}
		if e.HasMedian {
			ts.Median = ptr(e.TierMedian)
		}
		byTier[e.Tier] = ts
	}
	if len(byTier) == 0 {
		return nil
	}
	out := make([]v1alpha1.TierUsageStatus, 0, len(byTier))
	for _, ts := range byTier {
		out = append(out, ts)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tier < out[j].Tier })
	shown := listedWithin(len(out), maxUsageTiers, maxUsageTierNameBytes, func(i int) int { return len(out[i].Tier) })
	return out[:shown]
}
