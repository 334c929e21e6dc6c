package controllers

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// objectsResult is the outcome of the reconcileObjects phase.
type objectsResult struct {
	// deployment is the applied Deployment as the API server returned it
	// (with its current status); nil when rendering or applying failed first.
	deployment *appsv1.Deployment
	// renderErr wraps render.ErrInvalidPool: the spec cannot be rendered.
	renderErr error
	// applyErr is the first server-side apply error.
	applyErr error
}

// reconcileObjects renders the pool's objects and applies each one with
// server-side apply (field manager v1alpha1.FieldManagerController,
// ForceOwnership), dependencies before the Deployment. Applying an unchanged
// object is a no-op on the server: no write, no new resourceVersion.
func (r *ProviderPoolReconciler) reconcileObjects(ctx context.Context, pool *v1alpha1.ProviderPool) objectsResult {
	objs, err := render.Render(pool, r.render)
	if err != nil {
		return objectsResult{renderErr: err}
	}
	for _, obj := range objs.List() {
		if err := r.client.Patch(ctx, obj, client.Apply,
			client.FieldOwner(v1alpha1.FieldManagerController), client.ForceOwnership); err != nil {
			return objectsResult{applyErr: fmt.Errorf("applying %s %s: %w",
				obj.GetObjectKind().GroupVersionKind().Kind, client.ObjectKeyFromObject(obj), err)}
		}
	}
	return objectsResult{deployment: objs.Deployment}
}

// reconcileStatus applies desired's operator-owned status when it differs
// from pool's, and records an event for each meaningful transition.
func (r *ProviderPoolReconciler) reconcileStatus(ctx context.Context, pool, desired *v1alpha1.ProviderPool) error {
	if !statusChanged(pool.Status.Conditions, desired.Status.Conditions, pool.Status.ObservedGeneration, desired.Status.ObservedGeneration) {
		return nil
	}
	if err := applyStatus(ctx, r.client, r.scheme, pool, desired.Status.ObservedGeneration, desired.Status.Conditions); err != nil {
		return fmt.Errorf("applying status of ProviderPool %s: %w", client.ObjectKeyFromObject(pool), err)
	}
	ready := apimeta.FindStatusCondition(desired.Status.Conditions, v1alpha1.ConditionReady)
	ctrl.LoggerFrom(ctx).V(1).Info("Updated ProviderPool status", "providerPool", klog.KObj(pool),
		"ready", ready.Status, "reason", ready.Reason, "message", ready.Message)
	r.recordTransitions(pool, pool.Status.Conditions, desired.Status.Conditions)
	return nil
}

// recordTransitions emits events when the pool becomes Ready, stops being
// Ready, or cannot be rendered or applied (each once per transition).
func (r *ProviderPoolReconciler) recordTransitions(pool *v1alpha1.ProviderPool, oldConds, newConds []metav1.Condition) {
	oldReady := apimeta.FindStatusCondition(oldConds, v1alpha1.ConditionReady)
	newReady := apimeta.FindStatusCondition(newConds, v1alpha1.ConditionReady)
	switch {
	case newReady == nil:
	case newReady.Reason == v1alpha1.ReasonRenderFailed && (oldReady == nil || oldReady.Reason != v1alpha1.ReasonRenderFailed):
		r.recorder.Event(pool, corev1.EventTypeWarning, v1alpha1.ReasonRenderFailed, newReady.Message)
	case newReady.Status == metav1.ConditionTrue && (oldReady == nil || oldReady.Status != metav1.ConditionTrue):
		r.recorder.Event(pool, corev1.EventTypeNormal, v1alpha1.ReasonSchedulerAvailable, newReady.Message)
	case newReady.Status != metav1.ConditionTrue && oldReady != nil && oldReady.Status == metav1.ConditionTrue:
		r.recorder.Event(pool, corev1.EventTypeWarning, newReady.Reason, newReady.Message)
	}
}
