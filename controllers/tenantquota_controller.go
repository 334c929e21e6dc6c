package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// Field indexes on TenantQuota registered by TenantQuotaReconciler.SetupWithManager.
const (
	// PoolRefNameField indexes TenantQuotas by spec.poolRef.name: the tenants
	// of a pool, re-reconciled when the pool appears, disappears or flips Ready.
	PoolRefNameField = "spec.poolRef.name"
	// TenantKeyField indexes TenantQuotas by "<pool>/<effective tenant id>":
	// the candidates for a DuplicateTenantID conflict, found without listing
	// the whole pool.
	TenantKeyField = "fairshare.tenantKey"
)

// TenantQuotaReconciler sets a TenantQuota's Accepted condition (its pool
// exists and its effective tenant id is unique in the pool) and its Ready
// condition (Accepted and the pool is Ready).
type TenantQuotaReconciler struct {
	client   client.Client
	scheme   *runtime.Scheme
	recorder record.EventRecorder
	options
}

var _ reconcile.Reconciler = (*TenantQuotaReconciler)(nil)

// NewTenantQuotaReconciler returns a TenantQuotaReconciler that reads through c
// (a cached client with the field indexes of SetupWithManager) and applies
// status through it. Options: WithClock.
func NewTenantQuotaReconciler(c client.Client, scheme *runtime.Scheme, recorder record.EventRecorder, opts ...Option) *TenantQuotaReconciler {
	return &TenantQuotaReconciler{client: c, scheme: scheme, recorder: recorder, options: newOptions(opts)}
}

// +kubebuilder:rbac:groups=quota.fairshare.dev,resources=tenantquotas,verbs=get;list;watch
// +kubebuilder:rbac:groups=quota.fairshare.dev,resources=tenantquotas/status,verbs=get;patch
// +kubebuilder:rbac:groups=quota.fairshare.dev,resources=providerpools,verbs=get;list;watch

// Reconcile runs the tenant's phases in the Cluster API style:
//
//  1. get the TenantQuota (gone or being deleted: nothing to do);
//  2. lookupPool and lookupTenantIDHolder: resolve its pool and any other
//     TenantQuota already holding its tenant id (cached reads only);
//  3. computeTenantStatus: the Accepted and Ready conditions and
//     status.observedGeneration, pure (no API call);
//  4. reconcileStatus: one status apply, only when that differs from what
//     the server holds (a Warning event with the reason when the tenant is
//     rejected: PoolNotFound, DuplicateTenantID); while the pool is gone,
//     the removal of its scheduler's status first, checked once more
//     after schedulerGoneRecheck.
func (r *TenantQuotaReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	tq := &v1alpha1.TenantQuota{}
	if err := r.client.Get(ctx, req.NamespacedName, tq); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !tq.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}

	pool, err := r.lookupPool(ctx, tq)
	if err != nil {
		return ctrl.Result{}, err
	}
	holder, err := r.lookupTenantIDHolder(ctx, tq)
	if err != nil {
		return ctrl.Result{}, err
	}
	desired := computeTenantStatus(tq, pool, holder, conditionTime(r.clock))

	cleared, err := r.reconcileStatus(ctx, tq, desired)
	if err != nil {
		if res, ok := retryOnConflict(ctx, err); ok {
			return res, nil
		}
		return ctrl.Result{}, err
	}
	if cleared {
		// The scheduler of the deleted pool may still be terminating,
		// and a write of its own in flight: look once more after it is
		// surely gone. Its status writes do not trigger this reconciler.
		return ctrl.Result{RequeueAfter: schedulerGoneRecheck}, nil
	}
	return ctrl.Result{}, nil
}

// schedulerGoneRecheck is when a tenant whose deleted pool's scheduler
// status was just removed is reconciled again: past the scheduler pod's
// termination grace period (30 s, the Kubernetes default the rendered
// Deployment keeps), so that a last write of the terminating scheduler is
// removed too.
const schedulerGoneRecheck = 45 * time.Second

// lookupPool returns the tenant's ProviderPool, or nil when it does not exist.
func (r *TenantQuotaReconciler) lookupPool(ctx context.Context, tq *v1alpha1.TenantQuota) (*v1alpha1.ProviderPool, error) {
	pool := &v1alpha1.ProviderPool{}
	err := r.client.Get(ctx, types.NamespacedName{Namespace: tq.Namespace, Name: tq.Spec.PoolRef.Name}, pool)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("getting ProviderPool %s/%s: %w", tq.Namespace, tq.Spec.PoolRef.Name, err)
	}
	return pool, nil
}

// lookupTenantIDHolder returns the TenantQuota that holds tq's effective
// tenant id in its pool when that is not tq, or nil.
func (r *TenantQuotaReconciler) lookupTenantIDHolder(ctx context.Context, tq *v1alpha1.TenantQuota) (*v1alpha1.TenantQuota, error) {
	var same v1alpha1.TenantQuotaList
	if err := r.client.List(ctx, &same, client.InNamespace(tq.Namespace),
		client.MatchingFields{TenantKeyField: tenantKey(tq)}); err != nil {
		return nil, fmt.Errorf("listing TenantQuotas with tenant id %q: %w", tq.TenantIDOrName(), err)
	}
	holder := tenantIDHolder(same.Items)
	if holder == nil || holder.UID == tq.UID {
		return nil, nil
	}
	return holder, nil
}

// reconcileStatus applies desired's operator-owned status when it differs
// from tq's, and records a warning event when the tenant stops being
// Accepted or the reason changes (PoolNotFound, DuplicateTenantID). While
// the pool is gone it first removes the gone scheduler's status fields
// (clearSchedulerStatus; cleared reports such a write).
func (r *TenantQuotaReconciler) reconcileStatus(ctx context.Context, tq, desired *v1alpha1.TenantQuota) (cleared bool, err error) {
	types := tenantConditionTypes(desired)
	if len(types) > len(controllerConditionTypes) {
		// The pool is gone, and its scheduler with it: what it wrote is stale.
		if cleared, err = clearSchedulerStatus(ctx, r.client, tq); err != nil {
			return false, fmt.Errorf("clearing the scheduler's status of TenantQuota %s: %w", client.ObjectKeyFromObject(tq), err)
		}
	}
	if !statusChanged(tq.Status.Conditions, desired.Status.Conditions, tq.Status.ObservedGeneration, desired.Status.ObservedGeneration, types) {
		return cleared, nil
	}
	if err := applyStatus(ctx, r.client, r.scheme, tq, desired.Status.ObservedGeneration, desired.Status.Conditions, types); err != nil {
		return cleared, fmt.Errorf("applying status of TenantQuota %s: %w", client.ObjectKeyFromObject(tq), err)
	}
	accepted := apimeta.FindStatusCondition(desired.Status.Conditions, v1alpha1.ConditionAccepted)
	ctrl.LoggerFrom(ctx).V(1).Info("Updated TenantQuota status", "tenantQuota", klog.KObj(tq),
		"accepted", accepted.Status, "reason", accepted.Reason)
	if old := apimeta.FindStatusCondition(tq.Status.Conditions, v1alpha1.ConditionAccepted); accepted.Status == metav1.ConditionFalse &&
		(old == nil || old.Reason != accepted.Reason) {
		r.recorder.Event(tq, corev1.EventTypeWarning, accepted.Reason, accepted.Message)
	}
	return cleared, nil
}

// SetupWithManager registers the field indexes and the reconciler. It runs on
// TenantQuota spec changes; on the creation or deletion of a TenantQuota with
// the same pool and tenant id (a DuplicateTenantID conflict appears or
// resolves); and for every tenant of a pool that is created, deleted,
// flips Ready or, while not Ready, changes the reason its tenants' Ready
// message names. The scheduler's periodic status writes trigger nothing.
func (r *TenantQuotaReconciler) SetupWithManager(mgr ctrl.Manager) error {
	ctx := context.Background()
	indexer := mgr.GetFieldIndexer()
	if err := indexer.IndexField(ctx, &v1alpha1.TenantQuota{}, PoolRefNameField, func(o client.Object) []string {
		return []string{o.(*v1alpha1.TenantQuota).Spec.PoolRef.Name}
	}); err != nil {
		return fmt.Errorf("indexing TenantQuota %s: %w", PoolRefNameField, err)
	}
	if err := indexer.IndexField(ctx, &v1alpha1.TenantQuota{}, TenantKeyField, func(o client.Object) []string {
		return []string{tenantKey(o.(*v1alpha1.TenantQuota))}
	}); err != nil {
		return fmt.Errorf("indexing TenantQuota %s: %w", TenantKeyField, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.TenantQuota{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.TenantQuota{}, handler.EnqueueRequestsFromMapFunc(r.tenantsWithSameKey),
			builder.WithPredicates(existsOrTerminating)).
		Watches(&v1alpha1.ProviderPool{}, handler.EnqueueRequestsFromMapFunc(r.tenantsOfPool),
			builder.WithPredicates(poolExistsOrReadyChanged)).
		Named("tenantquota").
		Complete(r)
}

// tenantsWithSameKey maps a TenantQuota to the TenantQuotas sharing its pool and tenant id.
func (r *TenantQuotaReconciler) tenantsWithSameKey(ctx context.Context, o client.Object) []reconcile.Request {
	return r.listRequests(ctx, o.GetNamespace(), TenantKeyField, tenantKey(o.(*v1alpha1.TenantQuota)))
}

// tenantsOfPool maps a ProviderPool to the TenantQuotas that reference it.
func (r *TenantQuotaReconciler) tenantsOfPool(ctx context.Context, o client.Object) []reconcile.Request {
	return r.listRequests(ctx, o.GetNamespace(), PoolRefNameField, o.GetName())
}

func (r *TenantQuotaReconciler) listRequests(ctx context.Context, namespace, field, value string) []reconcile.Request {
	var list v1alpha1.TenantQuotaList
	if err := r.client.List(ctx, &list, client.InNamespace(namespace), client.MatchingFields{field: value}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list TenantQuotas", "field", field, "value", value)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// existsOrTerminating passes creations, deletions, and the update that
// marks an object for deletion: a TenantQuota held by a finalizer stops
// holding its tenant id then (tenantIDHolder skips it), so a duplicate of
// it must be reconciled at once, not only when the object is finally gone.
var existsOrTerminating = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// poolExistsOrReadyChanged passes pool creations, deletions, and updates that
// change what its tenants' Ready condition says of it: the pool's Ready
// status, or, while it is not Ready, the reason the tenants' message names
// (poolNotReadyWhy: a pool that gets its first conditions, goes from
// ProviderSecretNotFound to SchedulerProgressing, or whose spec becomes
// invalid). A change of the pool's messages alone passes nothing.
var poolExistsOrReadyChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		oldPool, ok1 := e.ObjectOld.(*v1alpha1.ProviderPool)
		newPool, ok2 := e.ObjectNew.(*v1alpha1.ProviderPool)
		if !ok1 || !ok2 {
			return false
		}
		if poolReady(oldPool) != poolReady(newPool) {
			return true
		}
		return !poolReady(newPool) && poolNotReadyWhy(oldPool) != poolNotReadyWhy(newPool)
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}
