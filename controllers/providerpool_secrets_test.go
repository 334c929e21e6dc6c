package controllers

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// wantSecretRole checks that the pool's Role "<pool>-scheduler-secrets"
// grants GET on exactly names (no rule when names is empty).
func wantSecretRole(namespace, pool string, names ...string) func() error {
	return func() error {
		role := &rbacv1.Role{}
		if err := k8sClient.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: pool + "-scheduler-secrets"}, role); err != nil {
			return err
		}
		if len(names) == 0 {
			if len(role.Rules) != 0 {
				return fmt.Errorf("rules %+v, want none", role.Rules)
			}
			return nil
		}
		if len(role.Rules) != 1 {
			return fmt.Errorf("rules %+v, want one", role.Rules)
		}
		r := role.Rules[0]
		if !slices.Equal(r.Verbs, []string{"get"}) || !slices.Equal(r.Resources, []string{"secrets"}) ||
			!slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.ResourceNames, names) {
			return fmt.Errorf("rule %+v, want get on secrets %v", r, names)
		}
		return nil
	}
}

// TestProviderPoolSecretRoleFollowsTenants: the Role lists the key Secrets
// of the pool's TenantQuotas only, and follows a tenant added, pointed at
// another Secret, deleted, or left without credentials.
func TestProviderPoolSecretRoleFollowsTenants(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	create(t, makePool(ns, "p1"))
	create(t, makePool(ns, "p2"))
	eventually(t, "empty Role of p1", wantSecretRole(ns, "p1"))

	withKey := func(name, pool, secret string) *v1alpha1.TenantQuota {
		tq := makeTenant(ns, name, pool, "")
		tq.Spec.Credentials = &v1alpha1.TenantCredentials{SecretRef: v1alpha1.SecretKeyRef{Name: secret}}
		return tq
	}
	a := withKey("a", "p1", "a-key")
	create(t, a)
	create(t, withKey("b", "p1", "b-key"))
	create(t, withKey("c", "p2", "c-key"))
	create(t, makeTenant(ns, "nokey", "p1", ""))
	eventually(t, "p1 Role names a-key, b-key", wantSecretRole(ns, "p1", "a-key", "b-key"))
	eventually(t, "p2 Role names c-key", wantSecretRole(ns, "p2", "c-key"))

	updateWithRetry(t, a, func() { a.Spec.Credentials.SecretRef.Name = "a-key-2" })
	eventually(t, "p1 Role follows a's new Secret", wantSecretRole(ns, "p1", "a-key-2", "b-key"))

	if err := k8sClient.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deleted: p1 Role", wantSecretRole(ns, "p1", "b-key"))
	b := &v1alpha1.TenantQuota{}
	get(t, ns, "b", b)
	updateWithRetry(t, b, func() { b.Spec.Credentials = nil })
	eventually(t, "b without credentials: p1 Role has no rule", wantSecretRole(ns, "p1"))
	eventually(t, "p2 Role unchanged", wantSecretRole(ns, "p2", "c-key"))
}

// TestProviderSecretMissingNamedInReady: a pool whose
// spec.upstream.credentialsSecretRef names a Secret that does not exist is
// Ready False ProviderSecretNotFound, the message naming the Secret (its
// pods could not start: their provider key comes from it); once the Secret
// is created (a watch of Secrets' metadata triggers the pool) it is
// SchedulerProgressing, then SchedulerAvailable.
func TestProviderSecretMissingNamedInReady(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "keyless")
	pool.Spec.Upstream.CredentialsSecretRef = &v1alpha1.SecretKeyRef{Name: "provider-key"}
	create(t, pool)
	eventually(t, "Ready=False ProviderSecretNotFound", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonProviderSecretNotFound))
	c := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady)
	if want := fmt.Sprintf(`Secret %s/provider-key (spec.upstream.credentialsSecretRef) does not exist: the scheduler's pods cannot start until it is created with the provider key under key "api-key"`, ns); c.Message != want {
		t.Errorf("Ready message %q, want %q", c.Message, want)
	}
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "provider-key"}, StringData: map[string]string{"api-key": "k"}})
	eventually(t, "Ready=False SchedulerProgressing", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSchedulerProgressing))
	setDeploymentAvailable(t, ns, "keyless-scheduler", 1)
	eventually(t, "Ready=True", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable))
}
