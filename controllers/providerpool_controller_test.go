package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/render"
	"github.com/fairshare-dev/fairshare/internal/schedconfig"
)

// ownedObjects returns empty objects of the six rendered kinds (a pool with
// the default Volume job store).
func ownedObjects() map[string]client.Object {
	return map[string]client.Object{
		"ConfigMap":             &corev1.ConfigMap{},
		"ServiceAccount":        &corev1.ServiceAccount{},
		"RoleBinding":           &rbacv1.RoleBinding{},
		"Service":               &corev1.Service{},
		"PersistentVolumeClaim": &corev1.PersistentVolumeClaim{},
		"Deployment":            &appsv1.Deployment{},
	}
}

func TestProviderPoolCreatesOwnedObjects(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "demo")
	create(t, pool)

	wantOwner := []metav1.OwnerReference{{
		APIVersion: "quota.fairshare.dev/v1alpha1", Kind: "ProviderPool", Name: "demo",
		UID: pool.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	for kind, obj := range ownedObjects() {
		t.Run(kind, func(t *testing.T) {
			eventually(t, kind+" demo-scheduler", func() error {
				return k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "demo-scheduler"}, obj)
			})
			if diff := cmp.Diff(wantOwner, obj.GetOwnerReferences()); diff != "" {
				t.Errorf("owner references (-want +got):\n%s", diff)
			}
			if got := obj.GetLabels()[v1alpha1.LabelPool]; got != "demo" {
				t.Errorf("label %s = %q, want demo", v1alpha1.LabelPool, got)
			}
		})
	}

	// The API server filled in the defaults; the hash is that of the defaulted pool.
	get(t, ns, "demo", pool)
	d := &appsv1.Deployment{}
	get(t, ns, "demo-scheduler", d)
	if got, want := d.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash], render.Settings(pool).Hash(); got != want {
		t.Errorf("settings hash = %q, want %q", got, want)
	}
	if got := d.Spec.Template.Spec.Containers[0].Image; got != testRenderOptions.DefaultImage {
		t.Errorf("image = %q, want the operator default %q", got, testRenderOptions.DefaultImage)
	}
	rb := &rbacv1.RoleBinding{}
	get(t, ns, "demo-scheduler", rb)
	if rb.RoleRef.Name != "fairshare-scheduler" || rb.Subjects[0].Name != "demo-scheduler" {
		t.Errorf("RoleBinding binds %s to %s, want demo-scheduler to fairshare-scheduler", rb.Subjects[0].Name, rb.RoleRef.Name)
	}
	eventually(t, "pool Accepted", wantCondition(pool, v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))
	eventually(t, "pool not Ready before the Deployment is available",
		wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSchedulerProgressing))
}

func TestProviderPoolSettingsChangeRollsDeployment(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "roll")
	create(t, pool)
	d := &appsv1.Deployment{}
	eventually(t, "Deployment", func() error {
		return k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "roll-scheduler"}, d)
	})
	before := d.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash]

	updateWithRetry(t, pool, func() { pool.Spec.Scheduler.StatusIntervalSeconds = 20 })
	want := render.Settings(pool).Hash()
	if want == before {
		t.Fatal("fixture: the new settings hash equals the old one")
	}
	eventually(t, "settings hash annotation to change", func() error {
		get(t, ns, "roll-scheduler", d)
		if got := d.Spec.Template.Annotations[v1alpha1.AnnotationSettingsHash]; got != want {
			return fmt.Errorf("hash = %s, want %s (before %s)", got, want, before)
		}
		return nil
	})
	cm := &corev1.ConfigMap{}
	get(t, ns, "roll-scheduler", cm)
	s, err := schedconfig.Parse([]byte(cm.Data[schedconfig.SettingsKey]))
	if err != nil {
		t.Fatal(err)
	}
	if s.StatusIntervalSeconds != 20 {
		t.Errorf("ConfigMap statusIntervalSeconds = %d, want 20", s.StatusIntervalSeconds)
	}
}

func TestProviderPoolReadyFollowsDeployment(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := readyPool(t, ns, "ready")

	setDeploymentAvailable(t, ns, "ready-scheduler", 0)
	eventually(t, "pool not Ready", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSchedulerProgressing))

	setDeploymentAvailable(t, ns, "ready-scheduler", 1)
	eventually(t, "pool Ready again", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable))
	if pool.Status.ObservedGeneration != pool.Generation {
		t.Errorf("observedGeneration = %d, want %d", pool.Status.ObservedGeneration, pool.Generation)
	}
}

// TestProviderPoolUnrenderableNameIsRefused: a valid object name that is not
// a DNS-1035 label ("<pool>-scheduler" cannot be rendered) is refused by the
// API server (the CRD's CEL rule), so the operator never sees such a pool.
// The operator's own check, which sets Accepted=False InvalidSpec, is
// covered by the render unit tests.
func TestProviderPoolUnrenderableNameIsRefused(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	err := k8sClient.Create(context.Background(), makePool(ns, "1st-pool"))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "metadata.name of a ProviderPool must be a DNS-1035 label of at most 53 characters") {
		t.Fatalf("creating pool 1st-pool: got %v, want Invalid naming metadata.name", err)
	}
}

// TestProviderPoolLimitBelowRequestIsInvalidSpec: resources whose cpu limit
// is below its request (which the CRD cannot check: CEL cannot compare the
// quantities of an unbounded resource map within its cost budget) make the
// pool Accepted=False InvalidSpec naming the pool's field, with nothing
// applied, instead of a Deployment the API server refuses on every retry
// (Ready RenderFailed naming the Deployment's field, as it once was).
func TestProviderPoolLimitBelowRequestIsInvalidSpec(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "p")
	pool.Spec.Scheduler.Resources = &corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m")},
	}
	create(t, pool)
	eventually(t, "Accepted=False InvalidSpec", wantCondition(pool, v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec))
	want := "spec.scheduler.resources.limits.cpu (100m) is below spec.scheduler.resources.requests.cpu (200m)"
	if msg := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionAccepted).Message; !strings.Contains(msg, want) {
		t.Errorf("Accepted message %q, want it to contain %q", msg, want)
	}
	var d appsv1.Deployment
	if err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "p-scheduler"}, &d); !apierrors.IsNotFound(err) {
		t.Errorf("Deployment of an invalid pool: got %v, want NotFound", err)
	}
}

// TestProviderPoolDeletion: envtest has no garbage collector, so the test
// asserts what the collector acts on (controller owner references to the
// pool's UID) and that the pool itself is deleted without a finalizer.
func TestProviderPoolDeletion(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "gone")
	create(t, pool)
	for kind, obj := range ownedObjects() {
		eventually(t, kind, func() error {
			return k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "gone-scheduler"}, obj)
		})
		ref := metav1.GetControllerOf(obj)
		if ref == nil || ref.UID != pool.UID || !ptr.Deref(ref.BlockOwnerDeletion, false) {
			t.Errorf("%s controller reference = %+v, want pool UID %s with blockOwnerDeletion", kind, ref, pool.UID)
		}
	}
	if len(pool.Finalizers) != 0 {
		t.Errorf("pool has finalizers %v; deletion must rely on owner references only", pool.Finalizers)
	}
	if err := k8sClient.Delete(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool deleted", func() error {
		err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(pool), &v1alpha1.ProviderPool{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("pool still present (err %v)", err)
	})
}

// TestProviderPoolDoesNotTakeOverForeignObjects: a ConfigMap named
// "<pool>-scheduler" that someone else created before the pool is not taken
// over (applied with the pool as its controller owner, so that deleting the
// pool would delete it): the pool is Ready False RenderFailed naming it,
// nothing of the pool is applied, and the ConfigMap keeps its data and has
// no owner. Once it is deleted, the pool's objects are created.
func TestProviderPoolDoesNotTakeOverForeignObjects(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	foreign := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken-scheduler"},
		Data:       map[string]string{"mine": "important"},
	}
	create(t, foreign)
	pool := makePool(ns, "taken")
	create(t, pool)
	eventually(t, "Ready=False RenderFailed", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRenderFailed))
	want := fmt.Sprintf("ConfigMap %s/taken-scheduler already exists and does not belong to ProviderPool taken", ns)
	if msg := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady).Message; !strings.Contains(msg, want) {
		t.Errorf("Ready message %q, want it to contain %q", msg, want)
	}
	get(t, ns, "taken-scheduler", foreign)
	if refs := foreign.GetOwnerReferences(); len(refs) != 0 || foreign.Data["mine"] != "important" || len(foreign.Data) != 1 {
		t.Errorf("foreign ConfigMap taken over: owners %+v, data %v", refs, foreign.Data)
	}
	for _, obj := range []client.Object{&corev1.ServiceAccount{}, &corev1.Service{}, &appsv1.Deployment{}} {
		if err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "taken-scheduler"}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T of a pool whose ConfigMap name is taken: got %v, want NotFound", obj, err)
		}
	}

	if err := k8sClient.Delete(context.Background(), foreign); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pool's own ConfigMap", func() error {
		cm := &corev1.ConfigMap{}
		if err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "taken-scheduler"}, cm); err != nil {
			return err
		}
		if ref := metav1.GetControllerOf(cm); ref == nil || ref.UID != pool.UID {
			return fmt.Errorf("ConfigMap controller %+v, want the pool", ref)
		}
		return nil
	})
	eventually(t, "Ready=False SchedulerProgressing", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSchedulerProgressing))
}
