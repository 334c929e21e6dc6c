package controllers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
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
	// providerSecret says why the pool's provider Secret cannot give the
	// scheduler its key (zero when it can, or is not known not to):
	// providerSecretProblem.
	providerSecret secretProblem
	// secretErr is the error of the provider Secret's read, if any.
	secretErr error
}

// secretProblem is why the Secret a pool's spec.upstream.credentialsSecretRef
// names cannot give the scheduler its provider key. It names the Secret and
// the key, never a value.
type secretProblem struct {
	// reason is v1alpha1.ReasonProviderSecretNotFound or
	// v1alpha1.ReasonProviderSecretKeyMissing; "" when there is no problem.
	reason string
	// message says what is wrong and what the scheduler's pods do meanwhile.
	message string
}

// providerSecretProblem returns why the Secret the pool's
// spec.upstream.credentialsSecretRef names cannot give the scheduler's pods
// their provider key: ProviderSecretNotFound when it does not exist,
// ProviderSecretKeyMissing when it has no key (the kubelet cannot mount it)
// or an empty or whitespace-only value under it (the scheduler would have no
// key; it ignores surrounding whitespace). It returns the zero problem when
// the key has a value, when the pool names no Secret, or without an API
// reader (WithAPIReader), and an error when the read fails otherwise.
//
// The Secret is read with one GET past the cache: Kubernetes returns a
// Secret's keys only with their values, so the key cannot be checked from
// the metadata the operator watches (CacheByObject keeps no Secret data).
// The value is only looked at here, never kept, logged or written.
func (r *ProviderPoolReconciler) providerSecretProblem(ctx context.Context, pool *v1alpha1.ProviderPool) (secretProblem, error) {
	ref := pool.Spec.Upstream.CredentialsSecretRef
	if ref == nil || r.apiReader == nil {
		return secretProblem{}, nil
	}
	dataKey := ref.Key
	if dataKey == "" {
		dataKey = render.DefaultCredentialsKey
	}
	key := client.ObjectKey{Namespace: pool.Namespace, Name: ref.Name}
	secret := &corev1.Secret{}
	switch err := r.apiReader.Get(ctx, key, secret); {
	case apierrors.IsNotFound(err):
		return secretProblem{reason: v1alpha1.ReasonProviderSecretNotFound, message: fmt.Sprintf(
			"Secret %s (spec.upstream.credentialsSecretRef) does not exist: the scheduler's pods cannot start until it is created with the provider key under key %q",
			key, dataKey)}, nil
	case err != nil:
		return secretProblem{}, fmt.Errorf("getting the provider Secret %s: %w", key, err)
	}
	value, ok := secret.Data[dataKey]
	switch {
	case !ok:
		return secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing, message: fmt.Sprintf(
			"Secret %s has no key %q (spec.upstream.credentialsSecretRef.key; %s): the scheduler's pods cannot start until the provider key is added under it",
			key, dataKey, secretKeysPhrase(secret.Data))}, nil
	case len(bytes.TrimSpace(value)) == 0:
		return secretProblem{reason: v1alpha1.ReasonProviderSecretKeyMissing, message: fmt.Sprintf(
			"Secret %s has an empty value under key %q (spec.upstream.credentialsSecretRef.key): the scheduler has no provider key until it is set",
			key, dataKey)}, nil
	}
	return secretProblem{}, nil
}

// maxListedSecretKeys is how many of a Secret's keys a
// ProviderSecretKeyMissing message lists.
const maxListedSecretKeys = 8

// secretKeysPhrase names the keys of a Secret's data, sorted, at most
// maxListedSecretKeys of them ("the Secret's keys: "a", "b" and 3 more";
// "the Secret has no keys"), so that a key named with a typo (apikey for
// api-key) shows in the ProviderSecretKeyMissing message. Key names are not
// secret (kubectl describe secret shows them); the values are never read
// here.
func secretKeysPhrase(data map[string][]byte) string {
	if len(data) == 0 {
		return "the Secret has no keys"
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	shown := keys[:min(len(keys), maxListedSecretKeys)]
	quoted := make([]string, len(shown))
	for i, k := range shown {
		quoted[i] = strconv.Quote(k)
	}
	phrase := "the Secret's keys: " + strings.Join(quoted, ", ")
	if more := len(keys) - len(shown); more > 0 {
		phrase += fmt.Sprintf(" and %d more", more)
	}
	return phrase
}

// reconcileObjects renders the pool's objects and applies each one with
// server-side apply (field manager v1alpha1.FieldManagerController,
// ForceOwnership), dependencies before the Deployment. Applying an unchanged
// object is a no-op on the server: no write, no new resourceVersion. The job
// store claim of an existing pool is only grown (see claimToApply); with a
// Memory job store the pool's claim is deleted once the Deployment no longer
// mounts it, and the jobs on it are lost.
func (r *ProviderPoolReconciler) reconcileObjects(ctx context.Context, pool *v1alpha1.ProviderPool) objectsResult {
	tenants, err := r.poolTenants(ctx, pool)
	if err != nil {
		return objectsResult{applyErr: err}
	}
	objs, err := render.RenderWithTenants(pool, r.render, tenants)
	if err != nil {
		return objectsResult{renderErr: err}
	}
	if render.Replicas(pool) > 1 && render.VolumeJobStore(pool) && pool.Spec.Scheduler.JobStore.AccessMode != v1alpha1.JobStoreReadWriteMany {
		// Only a pool stored before the CEL rule existed can get here.
		r.recorder.Event(pool, corev1.EventTypeWarning, v1alpha1.ReasonJobStoreNotShared,
			"spec.scheduler.replicas > 1 with a ReadWriteOnce job store claim: a standby on another node cannot mount it; "+
				"set spec.scheduler.jobStore.type Memory, then Volume with accessMode ReadWriteMany")
	}
	if err := r.checkOwnership(ctx, pool, objs.List()); err != nil {
		return objectsResult{applyErr: err}
	}
	var claimErr error // a refused resize of an existing claim: reported, not blocking
	for _, obj := range objs.List() {
		existing := false
		if claim, ok := obj.(*corev1.PersistentVolumeClaim); ok {
			var mismatch error
			if obj, existing, mismatch, err = r.claimToApply(ctx, claim); err != nil {
				if errors.Is(err, errClaimTerminating) {
					// Applied again once it is gone (its deletion is an
					// owned-object event); the rest still reaches the cluster.
					claimErr = err
					continue
				}
				return objectsResult{applyErr: err}
			}
			if mismatch != nil {
				claimErr = mismatch
			}
		}
		var announceRoll func() // set for the Deployment: called once it is applied
		if d, ok := obj.(*appsv1.Deployment); ok {
			if announceRoll, err = r.rollAnnouncement(ctx, pool, d); err != nil {
				return objectsResult{applyErr: err}
			}
		}
		if err := r.client.Patch(ctx, obj, client.Apply,
			client.FieldOwner(v1alpha1.FieldManagerController), client.ForceOwnership); err != nil {
			err = fmt.Errorf("applying %s %s: %w",
				obj.GetObjectKind().GroupVersionKind().Kind, client.ObjectKeyFromObject(obj), err)
			if existing {
				// The claim exists at its current size: the Deployment can
				// still mount it, so later spec changes keep reaching it.
				claimErr = err
				continue
			}
			return objectsResult{applyErr: err}
		}
		if announceRoll != nil {
			announceRoll()
		}
	}
	if objs.JobStoreClaim == nil {
		if err := r.deleteJobStoreClaim(ctx, pool); err != nil {
			return objectsResult{applyErr: err}
		}
	}
	return objectsResult{deployment: objs.Deployment, applyErr: claimErr}
}

// checkOwnership returns an error naming the first of objs (the pool's
// rendered objects) that exists in the cluster and does not belong to the
// pool, before anything is applied: an apply would make the pool its
// controller owner, so that deleting the pool would garbage-collect an
// object someone else created (a ConfigMap or Service that happened to be
// named "<pool>-scheduler"), or mix its fields with the rendered ones. An
// object belongs to the pool when its controller reference is a
// ProviderPool of the pool's name (this pool, or a deleted pool of the
// same name whose objects the garbage collector has not removed yet), or,
// without a controller reference (orphaned by a deletion with
// --cascade=orphan), when it carries the pool's label v1alpha1.LabelPool.
// The cache holds only the objects with the operator's managed-by label
// (CacheByObject); one it does not have is looked for past it, by its
// metadata only, with the API reader (WithAPIReader; without one, only the
// cache is checked).
func (r *ProviderPoolReconciler) checkOwnership(ctx context.Context, pool *v1alpha1.ProviderPool, objs []render.Object) error {
	for _, obj := range objs {
		gvk := obj.GetObjectKind().GroupVersionKind()
		key := client.ObjectKeyFromObject(obj)
		var found metav1.Object
		cur, ok := obj.DeepCopyObject().(client.Object)
		if !ok {
			return fmt.Errorf("%s %s is not a client.Object", gvk.Kind, key)
		}
		err := r.client.Get(ctx, key, cur)
		switch {
		case err == nil:
			found = cur
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("getting %s %s: %w", gvk.Kind, key, err)
		case r.apiReader != nil:
			m := &metav1.PartialObjectMetadata{}
			m.SetGroupVersionKind(gvk)
			switch err := r.apiReader.Get(ctx, key, m); {
			case err == nil:
				found = m
			case !apierrors.IsNotFound(err):
				return fmt.Errorf("getting %s %s: %w", gvk.Kind, key, err)
			}
		}
		if found == nil || belongsToPool(found, pool) {
			continue
		}
		owner := "no controller and not the label " + v1alpha1.LabelPool + "=" + pool.Name
		if ref := metav1.GetControllerOf(found); ref != nil {
			owner = fmt.Sprintf("controlled by %s %s", ref.Kind, ref.Name)
		}
		return fmt.Errorf("%s %s already exists and does not belong to ProviderPool %s (%s): "+
			"the operator does not take over objects it did not create; delete or rename it, or give the pool another name",
			gvk.Kind, key, pool.Name, owner)
	}
	return nil
}

// belongsToPool reports whether o, an object named like one of pool's
// rendered objects, is the pool's own (see checkOwnership).
func belongsToPool(o metav1.Object, pool *v1alpha1.ProviderPool) bool {
	if ref := metav1.GetControllerOf(o); ref != nil {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		return err == nil && gv.Group == v1alpha1.GroupVersion.Group && ref.Kind == "ProviderPool" && ref.Name == pool.Name
	}
	return o.GetLabels()[v1alpha1.LabelPool] == pool.Name
}

// poolTenants returns the names of the pool's tenants and of their key
// Secrets (render.PoolTenants of the TenantQuotas in the pool's namespace,
// read from the cache): the only TenantQuotas whose status, and the only
// Secrets, the rendered Roles let the scheduler write and GET. The
// reconciler watches TenantQuotas, so the Roles follow tenants added,
// removed or pointed at another Secret.
func (r *ProviderPoolReconciler) poolTenants(ctx context.Context, pool *v1alpha1.ProviderPool) (render.Tenants, error) {
	var list v1alpha1.TenantQuotaList
	if err := r.client.List(ctx, &list, client.InNamespace(pool.Namespace)); err != nil {
		return render.Tenants{}, fmt.Errorf("listing the TenantQuotas of ProviderPool %s: %w", client.ObjectKeyFromObject(pool), err)
	}
	return render.PoolTenants(pool, list.Items), nil
}

// rollAnnouncement reads the pool's current scheduler Deployment (from the
// cache) before desired is applied and returns what to call once the apply
// succeeded: remember desired's pod template and, when the apply changes the
// pod template of an existing Deployment (compared with the template last
// applied, see rollAnnouncer.message), record a Normal SchedulerRolled event
// on the pool. A roll already
// announced is not announced again (a cache that has not yet seen the
// operator's own apply still shows the old template); a Deployment that
// does not exist yet is being created: no event.
func (r *ProviderPoolReconciler) rollAnnouncement(ctx context.Context, pool *v1alpha1.ProviderPool, desired *appsv1.Deployment) (func(), error) {
	key := client.ObjectKeyFromObject(pool)
	want := templateOf(desired)
	cur := &appsv1.Deployment{}
	msg := ""
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(desired), cur); err == nil {
		msg = r.rolls.message(key, desired.Name, templateOf(cur), want)
	} else if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("getting Deployment %s: %w", client.ObjectKeyFromObject(desired), err)
	}
	return func() {
		r.rolls.remember(key, want)
		if msg != "" {
			r.recorder.Event(pool, corev1.EventTypeNormal, v1alpha1.ReasonSchedulerRolled, msg)
		}
	}, nil
}

// errClaimTerminating: the pool's job store claim is being deleted.
var errClaimTerminating = errors.New("the job store claim is being deleted")

// claimToApply returns the job store claim to apply. A new claim is applied
// as rendered. For an existing one, only spec.resources.requests.storage may
// change (access modes and storage class are immutable on a claim): the
// apply carries the claim's current access modes and storage class, so no
// immutable field is ever sent with a different value, and the larger of the
// current and the rendered storage request. The one exception is a claim
// without a class that is not bound yet (created while the pool set no class
// and the cluster had no default one, so it is Pending): it takes the spec's
// class, the one change of class the API server allows. A spec class that
// differs from the claim's otherwise is returned as mismatch (the claim is
// still applied as it is): reported in the pool's Ready condition. The request is grown only on a
// Bound claim (the API server refuses to resize an unbound one); the claim
// binding triggers a new reconcile (the operator watches its claims). The
// storage class must allow volume expansion, or the apply is refused and
// reported in the pool's Ready condition.
func (r *ProviderPoolReconciler) claimToApply(ctx context.Context, desired *corev1.PersistentVolumeClaim) (_ *corev1.PersistentVolumeClaim, existing bool, mismatch error, err error) {
	cur := &corev1.PersistentVolumeClaim{}
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(desired), cur); err != nil {
		if apierrors.IsNotFound(err) {
			return desired, false, nil, nil
		}
		return nil, false, nil, fmt.Errorf("getting PersistentVolumeClaim %s: %w", client.ObjectKeyFromObject(desired), err)
	}
	if !cur.DeletionTimestamp.IsZero() {
		// Deleted by a switch to Memory (or by hand) and held by its
		// pvc-protection finalizer: applying now would keep the old claim's
		// access modes and class instead of creating the one asked for.
		return nil, false, nil, fmt.Errorf("%w: PersistentVolumeClaim %s; it is created again once it is gone", errClaimTerminating, client.ObjectKeyFromObject(cur))
	}
	out := desired.DeepCopy()
	out.Spec.AccessModes = cur.Spec.AccessModes
	out.Spec.StorageClassName = cur.Spec.StorageClassName
	if want := desired.Spec.StorageClassName; want != nil && *want != "" {
		switch {
		case cur.Spec.StorageClassName == nil && cur.Spec.VolumeName == "":
			// A claim created without a class (the pool set none and the
			// cluster had no default StorageClass: it stays Pending) may be
			// given one once; the API server allows that change only.
			out.Spec.StorageClassName = ptr.To(*want)
		case ptr.Deref(cur.Spec.StorageClassName, "") != *want:
			// Applied as it is (its class cannot change), and reported.
			mismatch = fmt.Errorf("PersistentVolumeClaim %s has storage class %q, not spec.scheduler.jobStore.storageClassName %q: "+
				"a claim's class cannot change; set spec.scheduler.jobStore.type Memory, then Volume, to create the claim again (its jobs are lost)",
				client.ObjectKeyFromObject(cur), ptr.Deref(cur.Spec.StorageClassName, ""), *want)
		}
	}
	have := cur.Spec.Resources.Requests[corev1.ResourceStorage]
	want := desired.Spec.Resources.Requests[corev1.ResourceStorage]
	if cur.Status.Phase != corev1.ClaimBound || want.Cmp(have) <= 0 {
		out.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: have}
	}
	return out, true, mismatch, nil
}

// deleteJobStoreClaim deletes the pool's job store claim, if any, when the
// pool's job store is Memory. Only a claim controlled by this pool is
// deleted. The claim's kubernetes.io/pvc-protection finalizer keeps it until
// the old scheduler pod that mounts it is gone.
func (r *ProviderPoolReconciler) deleteJobStoreClaim(ctx context.Context, pool *v1alpha1.ProviderPool) error {
	claim := &corev1.PersistentVolumeClaim{}
	key := client.ObjectKey{Namespace: pool.Namespace, Name: render.Name(pool)}
	if err := r.client.Get(ctx, key, claim); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("getting PersistentVolumeClaim %s: %w", key, err)
	}
	if ref := metav1.GetControllerOf(claim); ref == nil || ref.UID != pool.UID || !claim.DeletionTimestamp.IsZero() {
		return nil
	}
	if err := r.client.Delete(ctx, claim, client.Preconditions{UID: &claim.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting PersistentVolumeClaim %s of the Volume job store (type is now Memory): %w", key, err)
	}
	ctrl.LoggerFrom(ctx).Info("Deleted the job store claim: the pool's job store is Memory", "persistentVolumeClaim", key)
	return nil
}

// reconcileStatus applies desired's operator-owned status when it differs
// from pool's, and records an event for each meaningful transition
// (recordTransitions; secret is the provider Secret's problem desired was
// computed with).
func (r *ProviderPoolReconciler) reconcileStatus(ctx context.Context, pool, desired *v1alpha1.ProviderPool, secret secretProblem) error {
	if !statusChanged(pool.Status.Conditions, desired.Status.Conditions, pool.Status.ObservedGeneration, desired.Status.ObservedGeneration, controllerConditionTypes) {
		return nil
	}
	if err := applyStatus(ctx, r.client, r.scheme, pool, desired.Status.ObservedGeneration, desired.Status.Conditions, controllerConditionTypes); err != nil {
		return fmt.Errorf("applying status of ProviderPool %s: %w", client.ObjectKeyFromObject(pool), err)
	}
	ready := apimeta.FindStatusCondition(desired.Status.Conditions, v1alpha1.ConditionReady)
	ctrl.LoggerFrom(ctx).V(1).Info("Updated ProviderPool status", "providerPool", klog.KObj(pool),
		"ready", ready.Status, "reason", ready.Reason, "message", ready.Message)
	r.recordTransitions(pool, pool.Status.Conditions, desired.Status.Conditions, secret)
	return nil
}

// recordTransitions emits events when the pool becomes Ready, stops being
// Ready, cannot be rendered or applied, or its Ready condition starts to
// report secret, a problem of its provider Secret (a Warning with its reason,
// ProviderSecretNotFound or ProviderSecretKeyMissing, and message, whether
// Ready is False for it or still True with it in the message; again when the
// problem changes, e.g. from a missing Secret to a missing key). Each is
// recorded once per transition; a pool that loses Ready for its provider
// Secret gets that one Warning.
func (r *ProviderPoolReconciler) recordTransitions(pool *v1alpha1.ProviderPool, oldConds, newConds []metav1.Condition, secret secretProblem) {
	oldReady := apimeta.FindStatusCondition(oldConds, v1alpha1.ConditionReady)
	newReady := apimeta.FindStatusCondition(newConds, v1alpha1.ConditionReady)
	reportsSecret := func(c *metav1.Condition) bool {
		return c != nil && secret.reason != "" && strings.Contains(c.Message, secret.message)
	}
	secretReported := reportsSecret(newReady) && !reportsSecret(oldReady)
	if secretReported {
		r.recorder.Event(pool, corev1.EventTypeWarning, secret.reason, secret.message)
	}
	switch {
	case newReady == nil:
	case newReady.Reason == v1alpha1.ReasonRenderFailed && (oldReady == nil || oldReady.Reason != v1alpha1.ReasonRenderFailed):
		r.recorder.Event(pool, corev1.EventTypeWarning, v1alpha1.ReasonRenderFailed, newReady.Message)
	case newReady.Status == metav1.ConditionTrue && (oldReady == nil || oldReady.Status != metav1.ConditionTrue):
		r.recorder.Event(pool, corev1.EventTypeNormal, v1alpha1.ReasonSchedulerAvailable, newReady.Message)
	case newReady.Status != metav1.ConditionTrue && oldReady != nil && oldReady.Status == metav1.ConditionTrue && !secretReported:
		r.recorder.Event(pool, corev1.EventTypeWarning, newReady.Reason, newReady.Message)
	}
}
