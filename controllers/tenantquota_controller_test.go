package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
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
	eventually(t, "Serving=False PoolNotFound", wantCondition(tq, v1alpha1.ConditionServing, metav1.ConditionFalse, v1alpha1.ReasonPoolNotFound))
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

// TestTenantQuotaServingWhenPoolDeleted: a tenant the scheduler reported
// Serving=True does not keep it after its pool is deleted (the scheduler
// goes with the pool and cannot say so): the operator sets Serving=False
// PoolNotFound, and every status field the scheduler wrote (backlog here)
// is removed but status.budget, the period's spend the next scheduler
// seeds its budgets from, and the cumulative counters the next scheduler
// carries on from. When the pool is created again the operator's Serving
// entry is removed, and the new scheduler's write is taken as is.
func TestTenantQuotaServingWhenPoolDeleted(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := readyPool(t, ns, "gone")
	tq := makeTenant(ns, "acme", "gone", "")
	create(t, tq)
	eventually(t, "Accepted", wantCondition(tq, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))
	schedulerApply(t, "TenantQuota", ns, "acme", map[string]any{
		"backlog":       int64(5),
		"budget":        map[string]any{"used": int64(900), "remaining": int64(100), "resetTime": "2026-01-02T00:00:00Z"},
		"conditions":    []any{schedulerCondition(v1alpha1.ConditionServing, v1alpha1.ReasonLoaded)},
		"completedJobs": int64(42), "expiredJobs": int64(3), "rejections": int64(17), "tokensUsed": int64(123456),
	})
	eventually(t, "Serving=True from the scheduler", wantCondition(tq, v1alpha1.ConditionServing, metav1.ConditionTrue, v1alpha1.ReasonLoaded))
	if tq.Status.Backlog == nil || *tq.Status.Backlog != 5 {
		t.Fatalf("backlog %v, want the scheduler's 5", tq.Status.Backlog)
	}

	if err := k8sClient.Delete(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Serving=False PoolNotFound", wantCondition(tq, v1alpha1.ConditionServing, metav1.ConditionFalse, v1alpha1.ReasonPoolNotFound))
	want := `No scheduler serves this tenant: ProviderPool "gone" does not exist in namespace "` + ns + `"`
	if c := apimeta.FindStatusCondition(tq.Status.Conditions, v1alpha1.ConditionServing); c.Message != want || c.ObservedGeneration != tq.Generation {
		t.Errorf("Serving message %q observedGeneration %d, want %q %d", c.Message, c.ObservedGeneration, want, tq.Generation)
	}
	if tq.Status.Backlog != nil {
		t.Errorf("backlog %d after the pool is gone, want the scheduler's stale figure removed", *tq.Status.Backlog)
	}
	if b := tq.Status.Budget; b == nil || b.Used == nil || *b.Used != 900 || b.Remaining == nil || *b.Remaining != 100 {
		t.Errorf("budget %+v after the pool is gone, want the period's spend kept (used 900, remaining 100)", b)
	}
	if st := tq.Status; st.CompletedJobs == nil || *st.CompletedJobs != 42 || st.ExpiredJobs == nil || *st.ExpiredJobs != 3 ||
		st.Rejections == nil || *st.Rejections != 17 || st.TokensUsed == nil || *st.TokensUsed != 123456 || st.DryRunRejections != nil {
		t.Errorf("counters after the pool is gone: completedJobs %v expiredJobs %v rejections %v tokensUsed %v dryRunRejections %v; want 42 3 17 123456 and none kept",
			st.CompletedJobs, st.ExpiredJobs, st.Rejections, st.TokensUsed, st.DryRunRejections)
	}
	if schedulerOwnsStatus(tq.ManagedFields) {
		t.Errorf("the scheduler still owns status fields other than the budget after its pool is gone: %+v", tq.ManagedFields)
	}

	create(t, makePool(ns, "gone"))
	eventually(t, "Accepted again", wantCondition(tq, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))
	eventually(t, "no Serving until the new scheduler writes it", func() error {
		get(t, ns, "acme", tq)
		if c := apimeta.FindStatusCondition(tq.Status.Conditions, v1alpha1.ConditionServing); c != nil {
			return fmt.Errorf("Serving = %s/%s, want none", c.Status, c.Reason)
		}
		return nil
	})
	schedulerApply(t, "TenantQuota", ns, "acme", map[string]any{
		"conditions": []any{schedulerCondition(v1alpha1.ConditionServing, v1alpha1.ReasonLoaded)},
	})
	eventually(t, "Serving=True from the new scheduler", wantCondition(tq, v1alpha1.ConditionServing, metav1.ConditionTrue, v1alpha1.ReasonLoaded))
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

// TestTenantQuotaDuplicateHolderTerminating: a holder of a tenant id that a
// finalizer keeps in the API after its deletion stops holding the id when
// it is marked for deletion, and the duplicate is accepted then, not only
// once the finalizer is gone (the update that sets deletionTimestamp was
// once filtered out, so the duplicate stayed DuplicateTenantID).
func TestTenantQuotaDuplicateHolderTerminating(t *testing.T) {
	requireEnv(t)
	ctx := context.Background()
	ns := newNamespace(t)
	readyPool(t, ns, "dup")
	holder := makeTenant(ns, "acme", "dup", "")
	holder.Finalizers = []string{"example.com/hold"}
	create(t, holder)
	eventually(t, "holder Accepted", wantCondition(holder, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))
	second := makeTenant(ns, "acme-copy", "dup", "acme")
	create(t, second)
	eventually(t, "second DuplicateTenantID", wantCondition(second, v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonDuplicateTenantID))

	if err := k8sClient.Delete(ctx, holder); err != nil {
		t.Fatal(err)
	}
	eventually(t, "second Accepted while the holder terminates", wantCondition(second, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))
	var cur v1alpha1.TenantQuota
	get(t, ns, "acme", &cur)
	if cur.DeletionTimestamp.IsZero() {
		t.Fatal("the holder is not terminating")
	}
	cur.Finalizers = nil
	if err := k8sClient.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
}

// TestTenantQuotaReadyFollowsPoolReason: a tenant of a pool that is not
// Ready names the pool's reason in its Ready message, and that reason
// follows the pool while it stays not Ready: ProviderSecretNotFound, then
// SchedulerProgressing once the Secret exists, then the pool's Accepted
// reason once its spec becomes invalid. The tenant's Ready status never
// flips on the way, so only the pool's reason can say what changed.
func TestTenantQuotaReadyFollowsPoolReason(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "why")
	pool.Spec.Upstream.CredentialsSecretRef = &v1alpha1.SecretKeyRef{Name: "provider-key"}
	create(t, pool)
	eventually(t, "pool Ready=False ProviderSecretNotFound", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonProviderSecretNotFound))
	tq := makeTenant(ns, "acme", "why", "")
	create(t, tq)
	wantReadyMessage := func(want string) func() error {
		return func() error {
			if err := wantCondition(tq, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonPoolNotReady)(); err != nil {
				return err
			}
			if msg := apimeta.FindStatusCondition(tq.Status.Conditions, v1alpha1.ConditionReady).Message; msg != want {
				return fmt.Errorf("Ready message %q, want %q", msg, want)
			}
			return nil
		}
	}
	eventually(t, "tenant names ProviderSecretNotFound", wantReadyMessage(`ProviderPool "why" is not Ready (ProviderSecretNotFound); see kubectl describe providerpool why`))

	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "provider-key"}, StringData: map[string]string{"api-key": "k"}})
	eventually(t, "pool Ready=False SchedulerProgressing", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSchedulerProgressing))
	eventually(t, "tenant names SchedulerProgressing", wantReadyMessage(`ProviderPool "why" is not Ready (SchedulerProgressing); see kubectl describe providerpool why`))

	updateWithRetry(t, pool, func() {
		pool.Spec.Scheduler.Resources = &corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m")},
		}
	})
	eventually(t, "pool Accepted=False InvalidSpec", wantCondition(pool, v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec))
	eventually(t, "tenant names the pool's InvalidSpec", wantReadyMessage(`ProviderPool "why" is not Ready: its Accepted condition is False (InvalidSpec); see kubectl describe providerpool why`))
}
