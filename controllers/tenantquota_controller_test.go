package controllers

import (
	"context"
	"strings"
	"testing"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// TestTenantQuotaPoolNotFoundRecovers: a tenant created before its pool is
// Accepted=False PoolNotFound, and recovers without any change to the tenant
// when the pool appears, then becomes Ready when the pool does. Deleting the
// pool sends it back to PoolNotFound.
func TestTenantQuotaPoolNotFoundRecovers(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	tq := makeTenant(ns, "early", "late-pool", "")
	create(t, tq)
	eventually(t, "PoolNotFound", wantCondition(tq, v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonPoolNotFound))
	eventually(t, "Ready=False NotAccepted", wantCondition(tq, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNotAccepted))
	msg := apimeta.FindStatusCondition(tq.Status.Conditions, v1alpha1.ConditionAccepted).Message
	if !strings.Contains(msg, `"late-pool"`) || !strings.Contains(msg, ns) {
		t.Errorf("PoolNotFound message %q does not name the pool and namespace", msg)
	}

	pool := makePool(ns, "late-pool")
	create(t, pool)
	eventually(t, "Accepted after the pool appears", wantCondition(tq, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))
	eventually(t, "Ready=False PoolNotReady", wantCondition(tq, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonPoolNotReady))

	setDeploymentAvailable(t, ns, "late-pool-scheduler", 1)
	eventually(t, "Ready=True PoolReady", wantCondition(tq, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPoolReady))
	if tq.Status.ObservedGeneration != tq.Generation {
		t.Errorf("observedGeneration = %d, want %d", tq.Status.ObservedGeneration, tq.Generation)
	}

	if err := k8sClient.Delete(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, "PoolNotFound after the pool is deleted", wantCondition(tq, v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonPoolNotFound))
}

// TestTenantQuotaDuplicateTenantID: two TenantQuotas of one pool with the same
// effective tenant id: the first keeps it, the second is DuplicateTenantID
// until the first is deleted.
func TestTenantQuotaDuplicateTenantID(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	readyPool(t, ns, "dup")
	first := makeTenant(ns, "acme", "dup", "") // effective id: its name
	create(t, first)
	eventually(t, "first Accepted", wantCondition(first, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))

	second := makeTenant(ns, "acme-copy", "dup", "acme")
	create(t, second)
	eventually(t, "second DuplicateTenantID", wantCondition(second, v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonDuplicateTenantID))
	eventually(t, "second Ready=False NotAccepted", wantCondition(second, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNotAccepted))
	if msg := apimeta.FindStatusCondition(second.Status.Conditions, v1alpha1.ConditionAccepted).Message; !strings.Contains(msg, `"acme"`) {
		t.Errorf("DuplicateTenantID message %q does not name the holder", msg)
	}
	// The holder is not disturbed by the newcomer.
	eventually(t, "first still Ready", wantCondition(first, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPoolReady))

	// Another pool's tenant may use the same id.
	readyPool(t, ns, "other")
	elsewhere := makeTenant(ns, "acme-other", "other", "acme")
	create(t, elsewhere)
	eventually(t, "same id on another pool Accepted", wantCondition(elsewhere, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))

	if err := k8sClient.Delete(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	eventually(t, "second Accepted after the holder is deleted", wantCondition(second, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))
	eventually(t, "second Ready", wantCondition(second, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPoolReady))
}
