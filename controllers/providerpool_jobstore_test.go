package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/schedconfig"
)

// waitObserved waits until the operator has reconciled the pool's current
// generation (it writes observedGeneration after applying the objects).
func waitObserved(t *testing.T, pool *v1alpha1.ProviderPool) {
	t.Helper()
	eventually(t, "observedGeneration", func() error {
		get(t, pool.Namespace, pool.Name, pool)
		if pool.Status.ObservedGeneration != pool.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", pool.Status.ObservedGeneration, pool.Generation)
		}
		return nil
	})
}

// TestProviderPoolJobStoreClaim: the default job store is a 1Gi
// ReadWriteOnce claim named like the other objects, controlled by the pool,
// mounted by the Deployment at /var/lib/fairshare with fsGroup 65532, and the
// settings point the scheduler at the file on it.
func TestProviderPoolJobStoreClaim(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "store")
	create(t, pool)

	claim := &corev1.PersistentVolumeClaim{}
	eventually(t, "claim store-scheduler", func() error {
		return k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "store-scheduler"}, claim)
	})
	wantSpec := corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceStorage: resource.MustParse("1Gi"),
		}},
		VolumeMode: ptr.To(corev1.PersistentVolumeFilesystem), // API server default
	}
	if diff := cmp.Diff(wantSpec, claim.Spec); diff != "" {
		t.Errorf("claim spec (-want +got):\n%s", diff)
	}
	wantOwner := []metav1.OwnerReference{{
		APIVersion: "quota.fairshare.dev/v1alpha1", Kind: "ProviderPool", Name: "store",
		UID: pool.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	if diff := cmp.Diff(wantOwner, claim.OwnerReferences); diff != "" {
		t.Errorf("claim owner references (-want +got):\n%s", diff)
	}
	managers := map[string]bool{}
	for _, mf := range claim.ManagedFields {
		managers[mf.Manager+"/"+string(mf.Operation)] = true
	}
	if !managers[v1alpha1.FieldManagerController+"/Apply"] {
		t.Errorf("claim managed fields %v: not applied by %s", managers, v1alpha1.FieldManagerController)
	}

	// The claim is applied before the Deployment: wait for the latter.
	d := &appsv1.Deployment{}
	eventually(t, "Deployment store-scheduler", func() error {
		return k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "store-scheduler"}, d)
	})
	ps := d.Spec.Template.Spec
	var vol *corev1.Volume
	for i := range ps.Volumes {
		if ps.Volumes[i].PersistentVolumeClaim != nil {
			vol = &ps.Volumes[i]
		}
	}
	if vol == nil || vol.Name != "jobs" || vol.PersistentVolumeClaim.ClaimName != "store-scheduler" || vol.PersistentVolumeClaim.ReadOnly {
		t.Fatalf("Deployment volumes %+v: want volume jobs of claim store-scheduler", ps.Volumes)
	}
	wantMounts := []corev1.VolumeMount{
		{Name: "settings", MountPath: "/etc/fairshare", ReadOnly: true},
		{Name: "jobs", MountPath: "/var/lib/fairshare"},
	}
	if diff := cmp.Diff(wantMounts, ps.Containers[0].VolumeMounts); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	if got := ps.SecurityContext.FSGroup; got == nil || *got != 65532 {
		t.Errorf("fsGroup = %v, want 65532", got)
	}
	cm := &corev1.ConfigMap{}
	get(t, ns, "store-scheduler", cm)
	s, err := schedconfig.Parse([]byte(cm.Data[schedconfig.SettingsKey]))
	if err != nil {
		t.Fatal(err)
	}
	if s.JobStorePath != "/var/lib/fairshare/jobs.db" {
		t.Errorf("settings jobStorePath = %q, want /var/lib/fairshare/jobs.db", s.JobStorePath)
	}
}

// TestProviderPoolJobStoreGrows: the claim's storage class and access mode
// are those of the spec; a larger size is not sent while the claim is
// unbound (the API server refuses it) and is applied once it is Bound.
func TestProviderPoolJobStoreGrows(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{GenerateName: "expandable-"},
		Provisioner: "example.com/none", AllowVolumeExpansion: ptr.To(true)}
	create(t, class)
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), class) })
	pool := makePool(ns, "grow")
	pool.Spec.Scheduler.JobStore = v1alpha1.JobStoreSpec{
		Size: ptr.To(resource.MustParse("1Gi")), StorageClassName: ptr.To(class.Name), AccessMode: v1alpha1.JobStoreReadWriteMany,
	}
	create(t, pool)
	claim := &corev1.PersistentVolumeClaim{}
	key := client.ObjectKey{Namespace: ns, Name: "grow-scheduler"}
	eventually(t, "claim", func() error { return k8sClient.Get(context.Background(), key, claim) })
	if got := ptr.Deref(claim.Spec.StorageClassName, ""); got != class.Name {
		t.Errorf("storage class %q, want %q", got, class.Name)
	}
	if diff := cmp.Diff([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, claim.Spec.AccessModes); diff != "" {
		t.Errorf("access modes (-want +got):\n%s", diff)
	}
	storage := func() string {
		get(t, ns, "grow-scheduler", claim)
		q := claim.Spec.Resources.Requests[corev1.ResourceStorage]
		return q.String()
	}

	updateWithRetry(t, pool, func() { pool.Spec.Scheduler.JobStore.Size = ptr.To(resource.MustParse("2Gi")) })
	waitObserved(t, pool)
	if got := storage(); got != "1Gi" {
		t.Errorf("unbound claim request = %s after the pool asked 2Gi, want 1Gi (kept until Bound)", got)
	}
	// The apply of the unbound claim did not fail (an apply error is reported as RenderFailed).
	if c := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason == v1alpha1.ReasonRenderFailed {
		t.Errorf("Ready condition %+v, want no apply error", c)
	}

	bindClaim(t, client.ObjectKeyFromObject(claim), "1Gi", claim)
	eventually(t, "claim request 2Gi once Bound", func() error {
		if got := storage(); got != "2Gi" {
			return fmt.Errorf("request %s", got)
		}
		return nil
	})
	if got := ptr.Deref(claim.Spec.StorageClassName, ""); got != class.Name {
		t.Errorf("storage class after growth %q, want %q", got, class.Name)
	}
}

// TestProviderPoolJobStoreToMemory: switching the job store to Memory
// removes the volume and the path from the scheduler and deletes the claim.
func TestProviderPoolJobStoreToMemory(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "mem")
	create(t, pool)
	key := client.ObjectKey{Namespace: ns, Name: "mem-scheduler"}
	eventually(t, "claim", func() error { return k8sClient.Get(context.Background(), key, &corev1.PersistentVolumeClaim{}) })

	updateWithRetry(t, pool, func() { pool.Spec.Scheduler.JobStore.Type = v1alpha1.JobStoreMemory })
	// envtest runs no pvc-protection controller: the claim keeps its
	// kubernetes.io/pvc-protection finalizer, so deleted means marked for deletion.
	eventually(t, "claim deleted", func() error {
		c := &corev1.PersistentVolumeClaim{}
		err := k8sClient.Get(context.Background(), key, c)
		if apierrors.IsNotFound(err) || (err == nil && !c.DeletionTimestamp.IsZero()) {
			return nil
		}
		return fmt.Errorf("claim still present (err %v)", err)
	})
	d := &appsv1.Deployment{}
	get(t, ns, "mem-scheduler", d)
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			t.Errorf("Deployment still mounts claim %s", v.PersistentVolumeClaim.ClaimName)
		}
	}
	cm := &corev1.ConfigMap{}
	get(t, ns, "mem-scheduler", cm)
	s, err := schedconfig.Parse([]byte(cm.Data[schedconfig.SettingsKey]))
	if err != nil {
		t.Fatal(err)
	}
	if s.JobStorePath != "" {
		t.Errorf("settings jobStorePath = %q, want empty for Memory", s.JobStorePath)
	}
}

// TestProviderPoolJobStoreClassSetLater: a claim created without a class (the
// pool set none and the cluster has no default StorageClass, so it stays
// Pending) takes the class the pool sets afterwards; a class that differs
// from an existing claim's is not applied (a claim's class cannot change) and
// is reported in the pool's Ready condition.
func TestProviderPoolJobStoreClassSetLater(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	classOf := func(name string) string {
		claim := &corev1.PersistentVolumeClaim{}
		get(t, ns, name, claim)
		return ptr.Deref(claim.Spec.StorageClassName, "<none>")
	}
	waitClaim := func(name string) {
		eventually(t, "claim "+name, func() error {
			return k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &corev1.PersistentVolumeClaim{})
		})
		if got := classOf(name); got != "<none>" {
			t.Skipf("claim %s got storage class %q: the control plane has a default StorageClass", name, got)
		}
	}

	late := makePool(ns, "late")
	create(t, late)
	waitClaim("late-scheduler")
	updateWithRetry(t, late, func() { late.Spec.Scheduler.JobStore.StorageClassName = ptr.To("fast") })
	eventually(t, "claim late-scheduler of class fast", func() error {
		if got := classOf("late-scheduler"); got != "fast" {
			return fmt.Errorf("storage class %q", got)
		}
		return nil
	})
	waitObserved(t, late)
	if c := apimeta.FindStatusCondition(late.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason == v1alpha1.ReasonRenderFailed {
		t.Errorf("Ready condition %+v, want no apply error", c)
	}

	// A claim that already has a class (as the DefaultStorageClass admission
	// plugin gives it) keeps it, and the pool says so.
	other := makePool(ns, "other")
	create(t, other)
	waitClaim("other-scheduler")
	claim := &corev1.PersistentVolumeClaim{}
	get(t, ns, "other-scheduler", claim)
	claim.Spec.StorageClassName = ptr.To("standard")
	if err := k8sClient.Update(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	updateWithRetry(t, other, func() { other.Spec.Scheduler.JobStore.StorageClassName = ptr.To("fast") })
	want := `has storage class "standard", not spec.scheduler.jobStore.storageClassName "fast"`
	eventually(t, "Ready RenderFailed naming both classes", func() error {
		get(t, ns, "other", other)
		c := apimeta.FindStatusCondition(other.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Reason != v1alpha1.ReasonRenderFailed || !strings.Contains(c.Message, want) {
			return fmt.Errorf("Ready condition %+v", c)
		}
		return nil
	})
	if got := classOf("other-scheduler"); got != "standard" {
		t.Errorf("claim other-scheduler storage class %q, want standard (unchanged)", got)
	}
}
