package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
	"github.com/fairshare-dev/fairshare/internal/render"
)

// TestTenantSecretReadAsServiceAccount: the scheduler reads its tenants'
// key Secrets with GETs as its ServiceAccount, which the operator's Role
// lets read exactly those Secrets. Before the Role names the Secret the GET
// is refused: the tenant is served without a key and retried after
// SecretRetryInterval; once named, the key is loaded and re-read every
// SecretRereadInterval, which applies a rotation; a deleted Secret stops
// the key. The account can neither list Secrets nor get another one.
func TestTenantSecretReadAsServiceAccount(t *testing.T) {
	admin := newClient(t)
	ctx := context.Background()
	ns, pool, tq := fixture(t, admin)
	for name, val := range map[string]string{"a-key": "sk-first", "other": "not-for-the-scheduler"} {
		if err := admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Data: map[string][]byte{"api-key": []byte(val)}}); err != nil {
			t.Fatal(err)
		}
	}
	tq.Spec.Credentials = &v1alpha1.TenantCredentials{SecretRef: v1alpha1.SecretKeyRef{Name: "a-key"}}
	if err := admin.Update(ctx, tq); err != nil {
		t.Fatal(err)
	}

	// The operator's objects, with no Secret named yet.
	applyRole := func(names []string) {
		t.Helper()
		objs, err := render.RenderWithTenants(pool, render.Options{DefaultImage: "img", SchedulerClusterRole: "fairshare-scheduler"}, render.Tenants{Secrets: names})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []client.Object{objs.SecretsRole, objs.SecretsRoleBinding} {
			if err := admin.Patch(ctx, o, client.Apply, client.FieldOwner("test"), client.ForceOwnership); err != nil {
				t.Fatal(err)
			}
		}
	}
	applyRole(nil)
	saCfg := rest.CopyConfig(cfg)
	saCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + render.Name(pool)}
	sa, err := client.New(saCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	reg := registry.New(clocktesting.NewFakeClock(time.Now()))
	pr := &PoolReconciler{Reader: admin, Registry: reg, Namespace: ns, PoolName: "pool", State: &State{}}
	if _, err := pr.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "pool"}}); err != nil {
		t.Fatal(err)
	}
	tr := &TenantReconciler{Reader: admin, Secrets: sa, Registry: reg, Namespace: ns, PoolName: "pool"}
	reconcileTenant := func(want time.Duration) {
		t.Helper()
		res, err := tr.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "tq-a"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter != want {
			t.Fatalf("RequeueAfter %v, want %v", res.RequeueAfter, want)
		}
	}

	reconcileTenant(SecretRetryInterval)
	if reg.Tenant("tq-a") == nil || reg.TenantByKey("sk-first") != nil {
		t.Fatal("before the Role names the Secret: want the tenant served without a key")
	}

	applyRole([]string{"a-key"})
	waitReadable(t, sa, ns, "a-key")
	reconcileTenant(SecretRereadInterval)
	if tn := reg.TenantByKey("sk-first"); tn == nil || tn.ID != "tq-a" {
		t.Fatal("the key is not loaded once the Role names its Secret")
	}

	// Rotation: the next periodic read applies the new key.
	var sec corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a-key"}, &sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["api-key"] = []byte("sk-second")
	if err := admin.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	reconcileTenant(SecretRereadInterval)
	if reg.TenantByKey("sk-second") == nil || reg.TenantByKey("sk-first") != nil {
		t.Fatal("rotation: want the new key only")
	}

	// Nothing else: no list, no watch, no other Secret.
	if err := sa.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Errorf("list Secrets as the scheduler: %v, want Forbidden", err)
	}
	if err := sa.Get(ctx, client.ObjectKey{Namespace: ns, Name: "other"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("get Secret other as the scheduler: %v, want Forbidden", err)
	}

	// A deleted Secret: not found, the key stops working, retried soon.
	if err := admin.Delete(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	reconcileTenant(SecretRetryInterval)
	if reg.TenantByKey("sk-second") != nil || reg.Tenant("tq-a") == nil {
		t.Fatal("deleted Secret: want the tenant served without its key")
	}

	// The Role emptied again: no rule at all, so no Secret is readable.
	applyRole(nil)
	var role rbacv1.Role
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: render.SecretsName(pool)}, &role); err != nil {
		t.Fatal(err)
	}
	if len(role.Rules) != 0 {
		t.Errorf("Role with no tenant Secrets has rules %+v", role.Rules)
	}
}

// waitReadable waits (at most 10 s) until the RBAC authorizer has seen the
// Role granting the account GET on the Secret.
func waitReadable(t *testing.T, sa client.Client, ns, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := sa.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &corev1.Secret{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Secret %s not readable as the scheduler: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
