package controllers

import (
	"context"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// ProviderPoolReconciler reconciles a ProviderPool into its scheduler objects
// (ConfigMap, ServiceAccount, RoleBinding, Service, Deployment, all named
// "<pool>-scheduler", the Role and RoleBinding "<pool>-scheduler-secrets"
// granting GET on its tenants' key Secrets, and the Role and RoleBinding
// "<pool>-scheduler-pool" granting get and patch on the status of the pool
// and its tenants and get and update on its Lease, all owned by the pool)
// and sets the pool's Accepted and Ready conditions.
type ProviderPoolReconciler struct {
	client   client.Client
	scheme   *runtime.Scheme
	recorder record.EventRecorder
	// rolls deduplicates SchedulerRolled events (see rollAnnouncer).
	rolls rollAnnouncer
	options
}

var _ reconcile.Reconciler = (*ProviderPoolReconciler)(nil)

// NewProviderPoolReconciler returns a ProviderPoolReconciler that reads and
// applies through c, resolves kinds with scheme and records events with
// recorder. Options: WithClock, WithRenderOptions.
func NewProviderPoolReconciler(c client.Client, scheme *runtime.Scheme, recorder record.EventRecorder, opts ...Option) *ProviderPoolReconciler {
	return &ProviderPoolReconciler{client: c, scheme: scheme, recorder: recorder, options: newOptions(opts)}
}

// +kubebuilder:rbac:groups=quota.fairshare.dev,resources=providerpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=quota.fairshare.dev,resources=providerpools/status,verbs=get;patch
// +kubebuilder:rbac:groups=quota.fairshare.dev,resources=providerpools/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=services;configmaps;serviceaccounts,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=rolebindings;roles,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=quota.fairshare.dev,resources=tenantquotas,verbs=get;list;watch
// The API server lets the operator create a Role granting GET on a Secret
// only if the operator may GET it itself (RBAC escalation check); it also
// GETs a pool's provider Secret to check its key (providerSecretProblem).
// list and watch serve the metadata-only watch of Secrets that reconciles a
// pool when its provider Secret is created or changes (RBAC cannot grant a
// metadata-only list: docs/operations.md, "Security").
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=bind,resourceNames=fairshare-scheduler
// Likewise for the pool Role (render.PoolRoleName): get and update on the
// pool's Lease, which the operator itself never calls (its own leader
// election uses the Role of its namespace); the status verbs it holds for
// its own writes.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile runs the pool's phases in the Cluster API style:
//
//  1. get the pool (gone or being deleted: nothing to do; the garbage
//     collector deletes the owned objects);
//  2. reconcileObjects: render and apply the scheduler objects (events:
//     SchedulerRolled, JobStoreNotShared), then providerSecretProblem: is
//     the provider key in the Secret credentialsSecretRef names;
//  3. computePoolStatus: the Accepted and Ready conditions and
//     status.observedGeneration, pure (no API call);
//  4. reconcileStatus: one status apply, only when that differs from what
//     the server holds (events: SchedulerAvailable, RenderFailed, the
//     provider Secret's problem when it appears, and the Ready reason when
//     Ready is lost).
//
// The scheduler objects are applied whether or not the provider Secret
// gives the key: the kubelet retries the mount, so the pods start by
// themselves once the Secret is fixed, and Ready says meanwhile why they do
// not (ProviderSecretNotFound, ProviderSecretKeyMissing).
//
// A pool that cannot be rendered is not retried (Accepted=False InvalidSpec
// until its spec changes); an apply error or a failed read of the provider
// Secret is returned so the request is retried with backoff.
func (r *ProviderPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &v1alpha1.ProviderPool{}
	if err := r.client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.rolls.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}

	objs := r.reconcileObjects(ctx, pool)
	objs.providerSecret, objs.secretErr = r.providerSecretProblem(ctx, pool)
	desired := computePoolStatus(pool, objs, conditionTime(r.clock))

	if err := r.reconcileStatus(ctx, pool, desired, objs.providerSecret); err != nil {
		if res, ok := retryOnConflict(ctx, err); ok && objs.applyErr == nil && objs.secretErr == nil {
			return res, nil
		}
		return ctrl.Result{}, errors.Join(objs.applyErr, objs.secretErr, err)
	}
	// A Secret that is missing or lacks the key needs no requeue: its
	// creation or change triggers a reconcile (SetupWithManager).
	return ctrl.Result{}, errors.Join(objs.applyErr, objs.secretErr)
}

// CredentialsSecretField indexes ProviderPools by the name of the Secret
// their spec.upstream.credentialsSecretRef names ("" indexes nothing): the
// pools a created, changed or deleted Secret of their namespace concerns.
const CredentialsSecretField = "spec.upstream.credentialsSecretRef.name"

// credentialsSecretName is the CredentialsSecretField value of a ProviderPool.
func credentialsSecretName(o client.Object) []string {
	pool, ok := o.(*v1alpha1.ProviderPool)
	if !ok || pool.Spec.Upstream.CredentialsSecretRef == nil || pool.Spec.Upstream.CredentialsSecretRef.Name == "" {
		return nil
	}
	return []string{pool.Spec.Upstream.CredentialsSecretRef.Name}
}

// poolsOfSecret maps a Secret (its metadata) to the ProviderPools of its
// namespace whose credentialsSecretRef names it, through the cache's
// CredentialsSecretField index.
func (r *ProviderPoolReconciler) poolsOfSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.ProviderPoolList
	if err := r.client.List(ctx, &list, client.InNamespace(o.GetNamespace()),
		client.MatchingFields{CredentialsSecretField: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list the ProviderPools of a Secret", "secret", klog.KObj(o))
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// tenantPool maps a TenantQuota to the ProviderPool it references.
func tenantPool(_ context.Context, o client.Object) []reconcile.Request {
	tq, ok := o.(*v1alpha1.TenantQuota)
	if !ok || tq.Spec.PoolRef.Name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: tq.Namespace, Name: tq.Spec.PoolRef.Name}}}
}

// SetupWithManager registers the CredentialsSecretField index and the
// reconciler: it runs on ProviderPool spec changes (generation; the
// scheduler's periodic status writes do not trigger it), on TenantQuota
// spec changes (the pool's Roles), on any change to an owned object, so
// drift is re-applied and Ready follows the Deployment, and on the
// creation, deletion or any change (a Secret's data cannot be seen in its
// metadata, but every change moves its resourceVersion) of the Secret a
// pool's spec.upstream.credentialsSecretRef names, so that Ready follows
// the provider Secret without polling. Secrets are watched by their
// metadata only (see CacheByObject).
func (r *ProviderPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.ProviderPool{}, CredentialsSecretField, credentialsSecretName); err != nil {
		return fmt.Errorf("indexing ProviderPool %s: %w", CredentialsSecretField, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ProviderPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.RoleBinding{}).
		Owns(&rbacv1.Role{}).
		Owns(&corev1.PersistentVolumeClaim{}).
		// A TenantQuota added, removed or changed (its credentials)
		// changes the Secrets its pool's scheduler may read and the
		// statuses it may write.
		Watches(&v1alpha1.TenantQuota{}, handler.EnqueueRequestsFromMapFunc(tenantPool),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// The pools' provider key Secrets: metadata only, no data.
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.poolsOfSecret),
			builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Named("providerpool").
		Complete(r)
}
