// Package kube is the scheduler's only link to the API server.
//
//   - Sync reconcilers (PoolReconciler, TenantReconciler) read the pool's
//     ProviderPool, the TenantQuotas that reference it and the Secrets
//     holding tenant API keys, translate them at one seam (translate.go) and
//     apply them live to the registry. They embed only client.Reader: they
//     cannot write (style 2.5, GIE InferencePoolReconciler).
//   - StatusWriter, a leader-only Runnable, writes the scheduler-owned part
//     of the pool's and tenants' status with server-side apply under the
//     field manager fairshare-scheduler, skipping unchanged payloads (style
//     2.4; BC-42). The operator applies Accepted/Ready under
//     fairshare-controller; conditions are a list map keyed by type, so the
//     two writers never remove each other's entries.
//
// Tenant API keys are read from the Secrets that TenantQuotas reference and
// only their SHA-256 is kept. The scheduler may GET only those Secrets: the
// operator renders a Role "<pool>-scheduler-secrets" whose resourceNames are
// exactly the key Secrets of the pool's TenantQuotas (internal/render), and
// the scheduler's ClusterRole grants no Secret access. Secrets are therefore
// never listed, watched or cached: TenantReconciler GETs each one directly
// from the API server when its TenantQuota changes and again every
// SecretRereadInterval, which picks up a rotated key.
package kube

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// RBAC of the scheduler (config/rbac/scheduler, ClusterRole
// fairshare-scheduler, bound per namespace by the operator's RoleBinding):
// only what RBAC cannot restrict to one pool's objects by name, since every
// pool of a namespace shares it.
// +kubebuilder:rbac:groups=quota.fairshare.dev,resources=providerpools;tenantquotas,verbs=get;list;watch
// No status rule, no Lease get or update and no Secret rule: the operator's
// per-pool Roles grant them by name (render.RenderWithTenants): get and
// patch on the status of the pool and of its TenantQuotas and get and
// update on its Lease <pool>-scheduler ("<pool>-scheduler-pool"), GET on
// the tenants' key Secrets ("<pool>-scheduler-secrets"). A status write of
// a tenant the Role does not name yet is refused and retried on the next
// pass (the object stays dirty). Creating the Lease cannot be restricted by
// name (the name is not known to RBAC on create).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=create
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// defaultSecretKey is the Secret data key of a tenant API key when the
// reference names none (the API default).
const defaultSecretKey = "api-key"

// SecretRereadInterval is how often a tenant's key Secret is read again
// while its TenantQuota is unchanged, in time: the longest a rotated key
// waits to be applied (the kubelet refreshes mounted Secrets on a similar
// period, about one minute). One GET per tenant with credentials per
// interval.
const SecretRereadInterval = time.Minute

// SecretRetryInterval is how soon a key Secret that is missing, or not yet
// readable, is read again, in time. A TenantQuota is usually created before
// the operator has added its Secret to the scheduler's Role, so the first
// GET may be refused (403 Forbidden) for a few seconds.
const SecretRetryInterval = 5 * time.Second

// PoolReconciler loads the ProviderPool named PoolName into the registry.
type PoolReconciler struct {
	client.Reader
	Registry  *registry.Registry
	Namespace string
	PoolName  string
	// State records the last load error for the status writer.
	State *State
}

// Reconcile applies the pool's current spec, or clears the policy when the
// pool is gone (and tells the status writer, through State, to write no
// more status: see StatusWriter.pass). An invalid spec keeps the previous policy and is reported
// through State (Serving False, InvalidSpec).
func (r *PoolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.Name != r.PoolName || req.Namespace != r.Namespace {
		return reconcile.Result{}, nil
	}
	var p v1alpha1.ProviderPool
	if err := r.Get(ctx, req.NamespacedName, &p); err != nil {
		if apierrors.IsNotFound(err) {
			r.Registry.ClearPool()
			r.State.setPoolErr(0, nil)
			r.State.setPoolGone(true)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	r.State.setPoolGone(false)
	err := r.Registry.SetPool(PoolPolicy(&p))
	r.State.setPoolErr(p.Generation, err)
	if err != nil {
		logf.FromContext(ctx).Error(err, "ProviderPool spec cannot be served; keeping the previous policy")
	}
	return reconcile.Result{}, nil
}

// TenantReconciler loads one TenantQuota of the pool (and the hash of its
// API key) into the registry, or removes it.
type TenantReconciler struct {
	client.Reader
	// Secrets reads the tenants' key Secrets, one GET each; it must not be a
	// caching client (that would list and watch every Secret of the
	// namespace, which the scheduler's account may not). Nil: Reader.
	Secrets   client.Reader
	Registry  *registry.Registry
	Namespace string
	PoolName  string
}

// Reconcile applies the TenantQuota's current spec, or removes the tenant
// when the object is gone or references another pool. A tenant with
// credentials is requeued after SecretRereadInterval (rotation), or after
// SecretRetryInterval while its Secret is missing or not readable. A tenant
// left without a key is served with a registry.KeyIssue (reason
// NoCredentials, CredentialsNotFound or CredentialsNotReadable), which the
// status writer reports as Serving False while the pool identifies tenants
// by API key.
func (r *TenantReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var tq v1alpha1.TenantQuota
	if err := r.Get(ctx, req.NamespacedName, &tq); err != nil {
		if apierrors.IsNotFound(err) {
			r.Registry.RemoveTenant(req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if tq.Spec.PoolRef.Name != r.PoolName || !tq.DeletionTimestamp.IsZero() {
		r.Registry.RemoveTenant(tq.Name)
		return reconcile.Result{}, nil
	}
	return r.apply(ctx, &tq)
}

func (r *TenantReconciler) secrets() client.Reader {
	if r.Secrets != nil {
		return r.Secrets
	}
	return r.Reader
}

func (r *TenantReconciler) apply(ctx context.Context, tq *v1alpha1.TenantQuota) (reconcile.Result, error) {
	pol := TenantPolicy(tq)
	var res reconcile.Result
	c := tq.Spec.Credentials
	if c == nil {
		pol.KeyIssue = &registry.KeyIssue{Reason: ReasonNoCredentials,
			Message: "The pool identifies tenants by API key and spec.credentials is not set: no key authenticates as this tenant."}
	} else {
		res.RequeueAfter = SecretRereadInterval
		key := c.SecretRef.Key
		if key == "" {
			key = defaultSecretKey
		}
		var sec corev1.Secret
		err := r.secrets().Get(ctx, types.NamespacedName{Namespace: tq.Namespace, Name: c.SecretRef.Name}, &sec)
		unreadable := ""
		switch {
		case apierrors.IsNotFound(err):
			unreadable = "Secret " + c.SecretRef.Name + " not found"
			pol.KeyIssue = &registry.KeyIssue{Reason: ReasonCredentialsNotFound,
				Message: fmt.Sprintf("Secret %q (spec.credentials.secretRef) not found: no key authenticates as this tenant until it exists with key %q.", c.SecretRef.Name, key)}
			logf.FromContext(ctx).Info("tenant key Secret not found; the tenant cannot authenticate by API key until it exists", "secret", c.SecretRef.Name)
		case apierrors.IsForbidden(err):
			// The operator has not yet added the Secret to the pool's Role.
			unreadable = "Secret " + c.SecretRef.Name + " not readable by the scheduler yet"
			pol.KeyIssue = &registry.KeyIssue{Reason: ReasonCredentialsNotReadable,
				Message: fmt.Sprintf("Secret %q (spec.credentials.secretRef) is not readable by the scheduler yet (the operator grants it in Role %q); retried every %v.",
					c.SecretRef.Name, r.PoolName+render.NameSuffix+render.SecretsNameSuffix, SecretRetryInterval)}
			logf.FromContext(ctx).Info("tenant key Secret not readable yet (the operator adds it to the scheduler's Role); retrying", "secret", c.SecretRef.Name)
		case err != nil:
			return reconcile.Result{}, err
		default:
			raw, has := sec.Data[key]
			if v := strings.TrimSpace(string(raw)); v != "" {
				pol.KeyHashes = []registry.KeyHash{registry.HashKey(v)}
			} else {
				msg := fmt.Sprintf("Secret %q has no key %q (spec.credentials.secretRef.key): no key authenticates as this tenant until it is added.", c.SecretRef.Name, key)
				if has {
					msg = fmt.Sprintf("Secret %q has an empty value under key %q (spec.credentials.secretRef.key): no key authenticates as this tenant until it is set.", c.SecretRef.Name, key)
				}
				pol.KeyIssue = &registry.KeyIssue{Reason: ReasonCredentialsNotFound, Message: msg}
				logf.FromContext(ctx).Info("tenant key Secret has no such key", "secret", c.SecretRef.Name, "key", key)
			}
			if c.WebhookSigningKey != "" {
				pol.WebhookSigning = WebhookSigning(sec.Data[c.WebhookSigningKey])
				if pol.WebhookSigning.Invalid != "" {
					logf.FromContext(ctx).Info("webhook signing secret unusable; the tenant's webhooks fail until it is fixed",
						"secret", c.SecretRef.Name, "key", c.WebhookSigningKey, "reason", pol.WebhookSigning.Invalid)
				}
			}
		}
		if unreadable != "" {
			res.RequeueAfter = SecretRetryInterval
			if c.WebhookSigningKey != "" {
				pol.WebhookSigning = &registry.WebhookSigning{Invalid: unreadable}
			}
		}
	}
	if err := r.Registry.UpsertTenant(pol); err != nil {
		// Recorded in the registry for the status writer (Serving False);
		// retrying cannot help until the spec or another object changes.
		logf.FromContext(ctx).Info("TenantQuota cannot be served", "reason", err.Error())
	}
	return res, nil
}

// SetupWithManager registers both sync reconcilers and the initial sync that
// marks the registry ready. The reconcilers run on every replica (no leader
// election), so a standby is warm. Secrets are read with the manager's API
// reader (direct GETs, no informer).
func SetupWithManager(mgr manager.Manager, reg *registry.Registry, state *State, namespace, pool string) error {
	noLeader := false
	pr := &PoolReconciler{Reader: mgr.GetClient(), Registry: reg, Namespace: namespace, PoolName: pool, State: state}
	if err := ctrl.NewControllerManagedBy(mgr).Named("providerpool-sync").
		For(&v1alpha1.ProviderPool{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetName() == pool && o.GetNamespace() == namespace
		}))).
		WithOptions(controller.Options{NeedLeaderElection: &noLeader}).
		Complete(pr); err != nil {
		return err
	}
	tr := &TenantReconciler{Reader: mgr.GetClient(), Secrets: mgr.GetAPIReader(), Registry: reg, Namespace: namespace, PoolName: pool}
	if err := ctrl.NewControllerManagedBy(mgr).Named("tenantquota-sync").
		For(&v1alpha1.TenantQuota{}).
		WithOptions(controller.Options{NeedLeaderElection: &noLeader}).
		Complete(tr); err != nil {
		return err
	}
	return mgr.Add(&initialSync{cache: mgr.GetCache(), pool: pr, tenants: tr, reg: reg})
}

// initialSync loads the pool and every TenantQuota once the cache has
// synced, then marks the registry's tenants loaded (readiness). A load that
// fails (a key Secret's GET refused by an API server that is restarting or
// overloaded) is tried again, after initialSyncRetry doubling up to
// initialSyncRetryMax, until it succeeds: the scheduler stays not ready
// meanwhile instead of exiting.
type initialSync struct {
	cache interface {
		WaitForCacheSync(ctx context.Context) bool
	}
	pool    *PoolReconciler
	tenants *TenantReconciler
	reg     *registry.Registry
	// retry is the first wait after a failed load; 0 means
	// initialSyncRetry.
	retry time.Duration
}

// initialSyncRetry is the first wait before the initial load is tried
// again; each failure doubles it up to initialSyncRetryMax.
const (
	initialSyncRetry    = time.Second
	initialSyncRetryMax = 30 * time.Second
)

// NeedLeaderElection is false: every replica loads its policy.
func (s *initialSync) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (s *initialSync) Start(ctx context.Context) error {
	if !s.cache.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	wait := s.retry
	if wait <= 0 {
		wait = initialSyncRetry
	}
	for {
		err := s.Sync(ctx)
		if err == nil {
			break
		}
		logf.FromContext(ctx).Error(err, "initial load of the pool and its tenants failed; retrying", "after", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, initialSyncRetryMax)
	}
	<-ctx.Done()
	return nil
}

// Sync reads the pool and its TenantQuotas and applies them, then marks the
// registry's tenants loaded.
func (s *initialSync) Sync(ctx context.Context) error {
	if _, err := s.pool.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.pool.Namespace, Name: s.pool.PoolName}}); err != nil {
		return fmt.Errorf("loading the ProviderPool: %w", err)
	}
	var list v1alpha1.TenantQuotaList
	if err := s.tenants.List(ctx, &list, client.InNamespace(s.tenants.Namespace)); err != nil {
		return fmt.Errorf("listing TenantQuotas: %w", err)
	}
	for i := range list.Items {
		tq := &list.Items[i]
		if tq.Spec.PoolRef.Name != s.tenants.PoolName || !tq.DeletionTimestamp.IsZero() {
			continue
		}
		if _, err := s.tenants.apply(ctx, tq); err != nil {
			return fmt.Errorf("loading TenantQuota %s: %w", tq.Name, err)
		}
	}
	s.reg.SetTenantsSynced()
	return nil
}
