package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// controllerConditionTypes are the condition types the operator owns; every
// status apply sends exactly these (a listType=map entry left out of an
// apply would be removed from the field manager's set).
var controllerConditionTypes = []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionReady}

// conditionTime returns now truncated to whole seconds, the precision the API
// server stores, so that a condition read back compares equal to the one written.
func conditionTime(c clock.PassiveClock) metav1.Time {
	return metav1.NewTime(c.Now().Truncate(time.Second))
}

// setCondition sets cond in conds. lastTransitionTime becomes now only when
// the condition is new or its status flips; otherwise the existing time is
// kept (BC-42).
func setCondition(conds *[]metav1.Condition, cond metav1.Condition, now metav1.Time) {
	cond.LastTransitionTime = now
	apimeta.SetStatusCondition(conds, cond)
}

// statusChanged reports whether the operator-owned part of a status differs:
// status.observedGeneration or any of the condition types in types
// (controllerConditionTypes, and Serving for a tenant whose pool is gone:
// tenantConditionTypes) by type, status, reason, message,
// observedGeneration, lastTransitionTime.
func statusChanged(oldConds, newConds []metav1.Condition, oldGeneration, newGeneration int64, types []string) bool {
	if oldGeneration != newGeneration {
		return true
	}
	for _, t := range types {
		if !equality.Semantic.DeepEqual(apimeta.FindStatusCondition(oldConds, t), apimeta.FindStatusCondition(newConds, t)) {
			return true
		}
	}
	return false
}

// applyStatus writes the operator's part of obj's status (a ProviderPool or
// TenantQuota; its kind is resolved through scheme) with server-side
// apply on the status subresource under field manager
// v1alpha1.FieldManagerController, with ForceOwnership. The apply carries only
// apiVersion, kind, name, namespace, uid (a precondition: a recreated object
// is not written with its predecessor's status), status.observedGeneration and
// the entries of conds of the condition types in types, so fields applied by
// the scheduler (field manager v1alpha1.FieldManagerScheduler) are left
// alone. A type the operator applied before and leaves out now is removed
// unless the scheduler has applied it since (server-side apply's ownership
// of listType=map entries). It returns the API server's error, if any.
func applyStatus(ctx context.Context, c client.Client, scheme *runtime.Scheme, obj client.Object, observedGeneration int64, conds []metav1.Condition, types []string) error {
	gvk, err := apiutil.GVKForObject(obj, scheme)
	if err != nil {
		return err
	}
	list := make([]any, 0, len(types))
	for _, t := range types {
		cond := apimeta.FindStatusCondition(conds, t)
		if cond == nil {
			return fmt.Errorf("status apply of %s %s: condition %s not set", gvk.Kind, client.ObjectKeyFromObject(obj), t)
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cond)
		if err != nil {
			return fmt.Errorf("converting condition %s: %w", t, err)
		}
		list = append(list, m)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"status": map[string]any{
			"observedGeneration": observedGeneration,
			"conditions":         list,
		},
	}}
	u.SetGroupVersionKind(gvk)
	u.SetName(obj.GetName())
	u.SetNamespace(obj.GetNamespace())
	u.SetUID(obj.GetUID())
	// The conditions' lastTransitionTimes were computed from obj as read
	// (usually from the informer cache): refuse the write (409 Conflict,
	// retried) when the object changed since, so a stale read never
	// re-stamps a condition the server already holds.
	u.SetResourceVersion(obj.GetResourceVersion())
	return c.Status().Patch(ctx, u, client.Apply, client.FieldOwner(v1alpha1.FieldManagerController), client.ForceOwnership)
}

// clearSchedulerStatus removes the status fields tq holds under field
// manager v1alpha1.FieldManagerScheduler (conditions Serving and Throttled,
// usage, backlog, quota remaining), all but status.budget and the
// cumulative counters (keptSchedulerFields), by applying as that manager
// an object whose status has only those. The operator calls it when the
// scheduler that wrote them is gone with its pool: nothing else would ever
// take them back. status.budget and the counters stay, owned by the
// scheduler's field manager as before, because the next scheduler (of the
// pool created again) carries on from them: the budget is the period's
// spend it seeds its budgets from, the counters (completedJobs,
// expiredJobs, rejections, tokensUsed, dryRunRejections) count from the
// TenantQuota's creation (docs/api.md). It reports whether it wrote: it
// makes no API call when the scheduler owns no other status field
// (schedulerOwnsStatus). On a write, tq's resourceVersion becomes the
// written object's. It returns the API server's error, if any.
func clearSchedulerStatus(ctx context.Context, c client.Client, tq *v1alpha1.TenantQuota) (bool, error) {
	if !schedulerOwnsStatus(tq.GetManagedFields()) {
		return false, nil
	}
	u := &unstructured.Unstructured{Object: map[string]any{}}
	status := map[string]any{}
	if tq.Status.Budget != nil {
		b, err := runtime.DefaultUnstructuredConverter.ToUnstructured(tq.Status.Budget)
		if err != nil {
			return false, fmt.Errorf("converting status.budget: %w", err)
		}
		status["budget"] = b
	}
	for name, v := range map[string]*int64{"completedJobs": tq.Status.CompletedJobs, "expiredJobs": tq.Status.ExpiredJobs,
		"rejections": tq.Status.Rejections, "tokensUsed": tq.Status.TokensUsed, "dryRunRejections": tq.Status.DryRunRejections} {
		if v != nil {
			status[name] = *v
		}
	}
	if len(status) > 0 {
		u.Object["status"] = status
	}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("TenantQuota"))
	u.SetName(tq.Name)
	u.SetNamespace(tq.Namespace)
	u.SetUID(tq.UID)
	if err := c.Status().Patch(ctx, u, client.Apply, client.FieldOwner(v1alpha1.FieldManagerScheduler), client.ForceOwnership); err != nil {
		return false, err
	}
	// The operator's own apply that follows has tq's resourceVersion as
	// its precondition: move it on past this write.
	tq.SetResourceVersion(u.GetResourceVersion())
	return true, nil
}

// keptSchedulerFields are the TenantQuota status fields (as field set
// keys) of the scheduler's field manager that clearSchedulerStatus keeps:
// the budget and the cumulative counters.
var keptSchedulerFields = map[string]bool{
	".": true, "f:budget": true, "f:completedJobs": true, "f:expiredJobs": true,
	"f:rejections": true, "f:tokensUsed": true, "f:dryRunRejections": true,
}

// schedulerOwnsStatus reports whether managed (an object's
// metadata.managedFields) gives field manager
// v1alpha1.FieldManagerScheduler any status field other than those of
// keptSchedulerFields (status.budget and the cumulative counters) on the
// status subresource. An entry whose field set cannot be read counts as
// owning some.
func schedulerOwnsStatus(managed []metav1.ManagedFieldsEntry) bool {
	for _, mf := range managed {
		if mf.Manager != v1alpha1.FieldManagerScheduler || mf.Subresource != "status" {
			continue
		}
		if mf.FieldsV1 == nil {
			continue
		}
		var set struct {
			Status map[string]json.RawMessage `json:"f:status"`
		}
		if err := json.Unmarshal(mf.FieldsV1.Raw, &set); err != nil {
			return true
		}
		for k := range set.Status {
			if !keptSchedulerFields[k] {
				return true
			}
		}
	}
	return false
}

// conflictRetry is how long a reconcile whose status write met a newer
// object (409 Conflict, see applyStatus) waits before it runs again, on a
// cache that has caught up by then.
const conflictRetry = 250 * time.Millisecond

// retryOnConflict turns a status write refused with 409 Conflict (the
// object changed after it was read, usually by the scheduler's own status
// writer or an informer cache behind the server) into a quiet requeue after
// conflictRetry: status writes do not trigger the reconcilers, so the
// retry must be asked for. A write refused with 404 Not Found (the object
// was deleted after it was read) ends the reconcile quietly: there is no
// status left to write, and the delete event runs the reconciler again.
// ok is false for any other error.
func retryOnConflict(ctx context.Context, err error) (ctrl.Result, bool) {
	if apierrors.IsNotFound(err) {
		ctrl.LoggerFrom(ctx).V(1).Info("Object deleted before its status write; nothing to write")
		return ctrl.Result{}, true
	}
	if !apierrors.IsConflict(err) {
		return ctrl.Result{}, false
	}
	ctrl.LoggerFrom(ctx).V(1).Info("Status write met a newer object; retrying", "after", conflictRetry)
	return ctrl.Result{RequeueAfter: conflictRetry}, true
}
