package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// Growing the job store on a class without volume expansion: the claim
// apply is refused, and because the claim is applied before the Deployment
// every later spec change stops reaching the Deployment; the size cannot be
// set back (CEL forbids shrinking).
func TestReviewJobStoreGrowOnFixedClassWedgesPool(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{GenerateName: "fixed-"},
		Provisioner: "example.com/none", AllowVolumeExpansion: ptr.To(false)}
	create(t, class)
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), class) })
	pool := makePool(ns, "wedge")
	pool.Spec.Scheduler.JobStore = v1alpha1.JobStoreSpec{Size: ptr.To(resource.MustParse("1Gi")), StorageClassName: ptr.To(class.Name)}
	create(t, pool)
	claim := &corev1.PersistentVolumeClaim{}
	key := client.ObjectKey{Namespace: ns, Name: "wedge-scheduler"}
	eventually(t, "claim", func() error { return k8sClient.Get(context.Background(), key, claim) })
	bindClaim(t, client.ObjectKeyFromObject(claim), "1Gi", claim)
	d := &appsv1.Deployment{}
	eventually(t, "Deployment", func() error { return k8sClient.Get(context.Background(), key, d) })
	hash0 := d.Spec.Template.Annotations["quota.fairshare.dev/settings-hash"]

	updateWithRetry(t, pool, func() { pool.Spec.Scheduler.JobStore.Size = ptr.To(resource.MustParse("2Gi")) })
	eventually(t, "RenderFailed", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRenderFailed))
	t.Logf("Ready: %s", apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady).Message)

	// An unrelated change that must reach the scheduler.
	updateWithRetry(t, pool, func() { pool.Spec.Scheduler.StatusIntervalSeconds = 33 })
	// The operator's reconcile of the change takes as long as it takes
	// (a loaded host): poll for the new hash rather than read it once.
	updated := false
	for deadline := time.Now().Add(pollTimeout); !updated && time.Now().Before(deadline); time.Sleep(pollInterval) {
		get(t, ns, "wedge-scheduler", d)
		updated = d.Spec.Template.Annotations["quota.fairshare.dev/settings-hash"] != hash0
	}
	if !updated {
		t.Errorf("Deployment not updated %v after a spec change (settings hash unchanged): the refused claim apply blocks it", pollTimeout)
	}
	// Undo is refused.
	err := func() error {
		get(t, ns, "wedge", pool)
		pool.Spec.Scheduler.JobStore.Size = ptr.To(resource.MustParse("1Gi"))
		return k8sClient.Update(context.Background(), pool)
	}()
	if err != nil {
		t.Errorf("cannot set the size back: %v", err)
	}
	_ = fmt.Sprint
}
