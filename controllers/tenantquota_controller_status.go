package controllers

import (
	"fmt"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// tenantKey is the TenantKeyField value of tq: "<pool>/<effective tenant id>".
func tenantKey(tq *v1alpha1.TenantQuota) string {
	return tq.Spec.PoolRef.Name + "/" + tq.TenantIDOrName()
}

// tenantIDHolder returns which of candidates (TenantQuotas of one pool with
// the same effective tenant id) holds the id: the oldest by
// creationTimestamp, ties broken by name, ignoring objects being deleted. A
// newcomer therefore never takes the id away from a tenant already serving.
// It returns nil when no candidate qualifies.
func tenantIDHolder(candidates []v1alpha1.TenantQuota) *v1alpha1.TenantQuota {
	var holder *v1alpha1.TenantQuota
	for i := range candidates {
		c := &candidates[i]
		if !c.DeletionTimestamp.IsZero() {
			continue
		}
		if holder == nil || c.CreationTimestamp.Before(&holder.CreationTimestamp) ||
			(c.CreationTimestamp.Equal(&holder.CreationTimestamp) && c.Name < holder.Name) {
			holder = c
		}
	}
	return holder
}

// poolReady reports whether pool is non-nil and its Ready condition is True.
func poolReady(pool *v1alpha1.ProviderPool) bool {
	return pool != nil && apimeta.IsStatusConditionTrue(pool.Status.Conditions, v1alpha1.ConditionReady)
}

// computeTenantStatus returns a copy of tq with the operator-owned status
// it should have given its pool (nil: not found) and the TenantQuota
// holding its tenant id (nil: none but tq): the Accepted then Ready
// conditions (setTenantAcceptedCondition, setTenantReadyCondition, stamped
// now), Serving when the pool is gone (setTenantServingPoolGone) and
// status.observedGeneration = metadata.generation. It makes no API call.
func computeTenantStatus(tq *v1alpha1.TenantQuota, pool *v1alpha1.ProviderPool, holder *v1alpha1.TenantQuota, now metav1.Time) *v1alpha1.TenantQuota {
	desired := tq.DeepCopy()
	setTenantAcceptedCondition(desired, pool, holder, now)
	setTenantReadyCondition(desired, pool, now)
	if pool == nil {
		setTenantServingPoolGone(desired, now)
	}
	desired.Status.ObservedGeneration = tq.Generation
	return desired
}

// setTenantServingPoolGone sets the tenant's Serving condition to False
// PoolNotFound. Serving is the scheduler's condition, but a pool that does
// not exist has no scheduler to say it stopped (its Deployment is deleted
// with the pool): without this, a tenant whose pool was deleted kept the
// scheduler's last Serving=True forever. Once the pool exists again the
// operator leaves Serving out of its apply, which removes its entry until
// the new scheduler writes its own.
func setTenantServingPoolGone(tq *v1alpha1.TenantQuota, now metav1.Time) {
	setCondition(&tq.Status.Conditions, metav1.Condition{
		Type:               v1alpha1.ConditionServing,
		Status:             metav1.ConditionFalse,
		ObservedGeneration: tq.Generation,
		Reason:             v1alpha1.ReasonPoolNotFound,
		Message: fmt.Sprintf("No scheduler serves this tenant: ProviderPool %q does not exist in namespace %q",
			tq.Spec.PoolRef.Name, tq.Namespace),
	}, now)
}

// tenantConditionTypes are the condition types the operator applies for
// desired (computeTenantStatus's result): controllerConditionTypes, and
// Serving while the tenant's pool does not exist.
func tenantConditionTypes(desired *v1alpha1.TenantQuota) []string {
	if c := apimeta.FindStatusCondition(desired.Status.Conditions, v1alpha1.ConditionAccepted); c != nil && c.Reason == v1alpha1.ReasonPoolNotFound {
		return append(controllerConditionTypes[:len(controllerConditionTypes):len(controllerConditionTypes)], v1alpha1.ConditionServing)
	}
	return controllerConditionTypes
}

// setTenantAcceptedCondition sets the tenant's Accepted condition:
//   - False PoolNotFound when pool is nil (spec.poolRef names no pool in the namespace);
//   - False DuplicateTenantID when holder (another TenantQuota of the pool
//     holding the same effective tenant id) is non-nil;
//   - True Accepted otherwise.
func setTenantAcceptedCondition(tq *v1alpha1.TenantQuota, pool *v1alpha1.ProviderPool, holder *v1alpha1.TenantQuota, now metav1.Time) {
	cond := metav1.Condition{
		Type:               v1alpha1.ConditionAccepted,
		Status:             metav1.ConditionFalse,
		ObservedGeneration: tq.Generation,
	}
	switch {
	case pool == nil:
		cond.Reason = v1alpha1.ReasonPoolNotFound
		cond.Message = fmt.Sprintf("ProviderPool %q not found in namespace %q; create it, or delete and recreate this TenantQuota with the right spec.poolRef.name (poolRef is immutable)",
			tq.Spec.PoolRef.Name, tq.Namespace)
	case holder != nil:
		cond.Reason = v1alpha1.ReasonDuplicateTenantID
		cond.Message = fmt.Sprintf("Tenant id %q is already used by TenantQuota %q of ProviderPool %q",
			tq.TenantIDOrName(), holder.Name, tq.Spec.PoolRef.Name)
	default:
		cond.Status = metav1.ConditionTrue
		cond.Reason = v1alpha1.ReasonAccepted
		cond.Message = fmt.Sprintf("Tenant %q accepted on ProviderPool %q", tq.TenantIDOrName(), tq.Spec.PoolRef.Name)
	}
	setCondition(&tq.Status.Conditions, cond, now)
}

// poolNotReadyWhy names the reason of a pool that is not Ready, for the
// tenant's Ready message: its Accepted condition's when that is False (an
// invalid spec), else its Ready condition's; "" when the pool has neither.
// Only the reason, not the pool's message: a pool's message may change
// often (replica counts), and every tenant of the pool would be written
// again with it.
func poolNotReadyWhy(pool *v1alpha1.ProviderPool) string {
	if c := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionAccepted); c != nil && c.Status == metav1.ConditionFalse {
		return fmt.Sprintf(": its Accepted condition is False (%s); see kubectl describe providerpool %s", c.Reason, pool.Name)
	}
	if c := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Reason != "" {
		return fmt.Sprintf(" (%s); see kubectl describe providerpool %s", c.Reason, pool.Name)
	}
	return ""
}

// setTenantReadyCondition sets the tenant's Ready condition from its Accepted
// condition (set first by setTenantAcceptedCondition) and the pool's Ready
// condition: False NotAccepted, False PoolNotReady, or True PoolReady.
func setTenantReadyCondition(tq *v1alpha1.TenantQuota, pool *v1alpha1.ProviderPool, now metav1.Time) {
	cond := metav1.Condition{
		Type:               v1alpha1.ConditionReady,
		Status:             metav1.ConditionFalse,
		ObservedGeneration: tq.Generation,
	}
	switch {
	case !apimeta.IsStatusConditionTrue(tq.Status.Conditions, v1alpha1.ConditionAccepted):
		cond.Reason = v1alpha1.ReasonNotAccepted
		cond.Message = "TenantQuota is not Accepted"
	case !poolReady(pool):
		cond.Reason = v1alpha1.ReasonPoolNotReady
		cond.Message = fmt.Sprintf("ProviderPool %q is not Ready", tq.Spec.PoolRef.Name) + poolNotReadyWhy(pool)
	default:
		cond.Status = metav1.ConditionTrue
		cond.Reason = v1alpha1.ReasonPoolReady
		cond.Message = fmt.Sprintf("ProviderPool %q is Ready", tq.Spec.PoolRef.Name)
	}
	setCondition(&tq.Status.Conditions, cond, now)
}
