package controllers

import (
	"context"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// staleClient serves one ProviderPool from a saved (older) copy, as a lagging
// informer cache does right after the operator's own status write.
type staleClient struct {
	client.Client
	pool *v1alpha1.ProviderPool
}

func (c staleClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if p, ok := obj.(*v1alpha1.ProviderPool); ok && key == client.ObjectKeyFromObject(c.pool) {
		c.pool.DeepCopyInto(p)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// A reconcile that reads a stale pool (Ready False in the cache, True on the
// server) must not re-stamp the server's Ready lastTransitionTime.
func TestReview_StaleCacheDoesNotRestampReady(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "stale")
	create(t, pool)
	eventually(t, "pool Progressing", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSchedulerProgressing))
	stale := pool.DeepCopy() // what a lagging cache still holds
	setDeploymentAvailable(t, ns, "stale-scheduler", 1)
	eventually(t, "pool Ready", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable))
	ltt := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady).LastTransitionTime

	testClock.SetTime(testClock.Now().Add(time.Hour))
	r := NewProviderPoolReconciler(staleClient{Client: k8sClient, pool: stale}, k8sClient.Scheme(), poolReconciler.recorder,
		WithClock(testClock), WithRenderOptions(testRenderOptions))
	_, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pool)})
	t.Logf("reconcile on a stale read: err=%v", err)
	get(t, ns, "stale", pool)
	if got := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady); !got.LastTransitionTime.Equal(&ltt) {
		t.Errorf("Ready %s lastTransitionTime %v -> %v without a flip (stale read)", got.Status, ltt, got.LastTransitionTime)
	}
}
