package controllers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// asScheduler returns an uncached client that impersonates the scheduler
// ServiceAccount of pool in namespace, as the API server authenticates it.
func asScheduler(t *testing.T, namespace, pool string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(testConfig)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + pool + "-scheduler",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	c, err := client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wantPoolRole checks that the pool's Role "<pool>-scheduler-pool" grants
// get and patch on the status of the pool and of exactly tenants (no
// TenantQuota rule when there are none), and get and update on the Lease
// "<pool>-scheduler".
func wantPoolRole(namespace, pool string, tenants ...string) func() error {
	return func() error {
		role := &rbacv1.Role{}
		if err := k8sClient.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: pool + "-scheduler-pool"}, role); err != nil {
			return err
		}
		want := []rbacv1.PolicyRule{{APIGroups: []string{"quota.fairshare.dev"}, Resources: []string{"providerpools/status"}, Verbs: []string{"get", "patch"}, ResourceNames: []string{pool}}}
		if len(tenants) > 0 {
			want = append(want, rbacv1.PolicyRule{APIGroups: []string{"quota.fairshare.dev"}, Resources: []string{"tenantquotas/status"}, Verbs: []string{"get", "patch"}, ResourceNames: tenants})
		}
		want = append(want, rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "update"}, ResourceNames: []string{pool + "-scheduler"}})
		if !slices.EqualFunc(role.Rules, want, func(a, b rbacv1.PolicyRule) bool {
			return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) &&
				slices.Equal(a.Verbs, b.Verbs) && slices.Equal(a.ResourceNames, b.ResourceNames) && len(a.NonResourceURLs) == 0
		}) {
			return fmt.Errorf("rules %+v, want %+v", role.Rules, want)
		}
		return nil
	}
}

// schedulerStatus writes status.lastReportTime of the object kind/name the way
// the scheduler's status writer does: a server-side apply on the status
// subresource under the field manager fairshare-scheduler.
func schedulerStatus(c client.Client, namespace, kind, name string) error {
	u := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{
		"lastReportTime": time.Now().UTC().Format(time.RFC3339),
	}}}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)
	return c.Status().Patch(context.Background(), u, client.Apply, client.FieldOwner(v1alpha1.FieldManagerScheduler), client.ForceOwnership)
}

// renewLease reads the Lease and writes it back with a new holder, as
// client-go's leader election lock does (get, then update).
func renewLease(c client.Client, namespace, name, holder string) error {
	l := &coordinationv1.Lease{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, l); err != nil {
		return err
	}
	l.Spec.HolderIdentity = &holder
	return c.Update(context.Background(), l)
}

// forbidden returns a check that err() is refused with Forbidden.
func forbidden(err func() error) func() error {
	return func() error {
		if e := err(); !apierrors.IsForbidden(e) {
			return fmt.Errorf("got %v, want Forbidden", e)
		}
		return nil
	}
}

// TestSchedulerRBACIsPoolScoped: with two pools in one namespace, the
// scheduler of pool a, with only the shipped ClusterRole and the Roles the
// operator renders for a, may write the status of a and of a's tenants and
// take a's Lease, and is Forbidden to write the status of b or of b's
// tenants or to read or update b's Lease. The Role follows the tenants: a
// tenant added to a becomes writable, one deleted is no longer named.
func TestSchedulerRBACIsPoolScoped(t *testing.T) {
	requireEnv(t)
	installRBAC(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, makePool(ns, "a"))
	create(t, makePool(ns, "b"))
	create(t, makeTenant(ns, "a1", "a", ""))
	create(t, makeTenant(ns, "b1", "b", ""))
	for _, name := range []string{"a-scheduler", "b-scheduler"} {
		create(t, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	eventually(t, "a's Role names a1", wantPoolRole(ns, "a", "a1"))
	eventually(t, "b's Role names b1", wantPoolRole(ns, "b", "b1"))

	// The RBAC authorizer sees a new or changed Role a moment after it is
	// written: each check is polled.
	sa := asScheduler(t, ns, "a")
	eventually(t, "a's scheduler writes a's status", func() error { return schedulerStatus(sa, ns, "ProviderPool", "a") })
	eventually(t, "a's scheduler writes a1's status", func() error { return schedulerStatus(sa, ns, "TenantQuota", "a1") })
	eventually(t, "a's scheduler takes a's Lease", func() error { return renewLease(sa, ns, "a-scheduler", "a-0") })

	eventually(t, "a's scheduler refused b's status", forbidden(func() error { return schedulerStatus(sa, ns, "ProviderPool", "b") }))
	eventually(t, "a's scheduler refused b1's status", forbidden(func() error { return schedulerStatus(sa, ns, "TenantQuota", "b1") }))
	eventually(t, "a's scheduler refused b's Lease", forbidden(func() error { return renewLease(sa, ns, "b-scheduler", "a-0") }))
	// Not even with the Lease it read another way: the update itself is refused.
	other := &coordinationv1.Lease{}
	get(t, ns, "b-scheduler", other)
	holder := "a-0"
	other.Spec.HolderIdentity = &holder
	if err := sa.Update(ctx, other); !apierrors.IsForbidden(err) {
		t.Errorf("a's scheduler updating b's Lease: %v, want Forbidden", err)
	}
	// What the ClusterRole keeps: reading pools and tenants (the Lease
	// owner lookup GETs the pool), creating a Lease.
	if err := sa.Get(ctx, types.NamespacedName{Namespace: ns, Name: "a"}, &v1alpha1.ProviderPool{}); err != nil {
		t.Errorf("a's scheduler getting its pool: %v", err)
	}
	if err := sa.List(ctx, &v1alpha1.TenantQuotaList{}, client.InNamespace(ns)); err != nil {
		t.Errorf("a's scheduler listing TenantQuotas: %v", err)
	}

	// A tenant added to a: the Role follows and its status is writable.
	create(t, makeTenant(ns, "a2", "a", ""))
	eventually(t, "a's Role names a1, a2", wantPoolRole(ns, "a", "a1", "a2"))
	eventually(t, "a's scheduler writes a2's status", func() error { return schedulerStatus(sa, ns, "TenantQuota", "a2") })

	// A tenant deleted: no longer named (a new TenantQuota of that name,
	// possibly of another pool, is not writable by a's scheduler).
	a1 := &v1alpha1.TenantQuota{}
	get(t, ns, "a1", a1)
	if err := k8sClient.Delete(ctx, a1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a's Role names a2 only", wantPoolRole(ns, "a", "a2"))
	create(t, makeTenant(ns, "a1", "b", ""))
	eventually(t, "b's Role names a1, b1", wantPoolRole(ns, "b", "a1", "b1"))
	eventually(t, "a's scheduler refused the new a1 of b", forbidden(func() error { return schedulerStatus(sa, ns, "TenantQuota", "a1") }))

	// Every tenant of b gone: no TenantQuota rule at all (not one matching every name).
	for _, name := range []string{"a1", "b1"} {
		tq := &v1alpha1.TenantQuota{}
		get(t, ns, name, tq)
		if err := k8sClient.Delete(ctx, tq); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "b's Role has no TenantQuota rule", wantPoolRole(ns, "b"))
}
