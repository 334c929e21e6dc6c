package kube

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/usage"
)

// usageStatus returns a served tenant's status.usage and its UsageOutlier
// condition from the snapshot's evaluation (registry.TenantSnapshot.Usage,
// usage.Evaluate; seed 002 section 7): True with reason CostAboveTier or
// LimitViolations while the tenant is flagged (a warning: the writer emits
// a Warning event when it turns True), False with WithinTier otherwise.
// The condition's LastTransitionTime is left to the writer
// (meta.SetStatusCondition). The figures are four integers and an
// optional fifth, well within the status size budget.
func usageStatus(t registry.TenantSnapshot) (*v1alpha1.TenantUsageStatus, metav1.Condition) {
	e := t.Usage
	st := &v1alpha1.TenantUsageStatus{
		WindowSeconds:   int64(e.Window.Seconds()),
		WeightedTokens:  e.Counts.WeightedTokens,
		Requests:        e.Counts.Requests(),
		RefusedRequests: e.Counts.Refused,
	}
	if e.HasMedian {
		m := e.TierMedian
		st.TierMedianWeightedTokens = &m
	}
	c := metav1.Condition{
		Type:               v1alpha1.ConditionUsageOutlier,
		Status:             metav1.ConditionFalse,
		ObservedGeneration: t.Generation,
		Reason:             v1alpha1.ReasonWithinTier,
		Message:            e.Signal.Message,
	}
	if e.Signal.Outlier {
		c.Status = metav1.ConditionTrue
		switch e.Signal.Reason {
		case usage.ReasonCostAboveTier:
			c.Reason = v1alpha1.ReasonCostAboveTier
		case usage.ReasonLimitViolations:
			c.Reason = v1alpha1.ReasonLimitViolations
		}
	}
	if c.Message == "" {
		c.Message = "No usage in the window."
	}
	return st, c
}
