package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

const (
	pollInterval = 25 * time.Millisecond
	pollTimeout  = 30 * time.Second
)

// eventually polls check until it returns nil, failing the test with the
// last error after pollTimeout.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(pollTimeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(pollInterval)
	}
}

// newNamespace creates a fresh namespace for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fairshare-test-"}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// makePool returns a minimal pool; the API server fills in the defaults.
func makePool(namespace, name string) *v1alpha1.ProviderPool {
	return &v1alpha1.ProviderPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1alpha1.ProviderPoolSpec{
			Upstream: v1alpha1.UpstreamSpec{BaseURL: "http://127.0.0.1:8090"},
			Models:   []v1alpha1.ModelSpec{{Name: "sim-gpt"}},
		},
	}
}

func makeTenant(namespace, name, pool, tenantID string) *v1alpha1.TenantQuota {
	return &v1alpha1.TenantQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       v1alpha1.TenantQuotaSpec{PoolRef: v1alpha1.PoolRef{Name: pool}, TenantID: tenantID},
	}
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8sClient.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

func get(t *testing.T, namespace, name string, obj client.Object) {
	t.Helper()
	if err := k8sClient.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, obj); err != nil {
		t.Fatalf("getting %T %s/%s: %v", obj, namespace, name, err)
	}
}

// wantCondition returns a check that obj's condition condType has the given
// status and reason.
func wantCondition(obj client.Object, condType string, status metav1.ConditionStatus, reason string) func() error {
	return func() error {
		if err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		var conds []metav1.Condition
		switch o := obj.(type) {
		case *v1alpha1.ProviderPool:
			conds = o.Status.Conditions
		case *v1alpha1.TenantQuota:
			conds = o.Status.Conditions
		default:
			return fmt.Errorf("unsupported type %T", obj)
		}
		c := apimeta.FindStatusCondition(conds, condType)
		if c == nil {
			return fmt.Errorf("%s has no %s condition (conditions %v)", obj.GetName(), condType, conds)
		}
		if c.Status != status || c.Reason != reason {
			return fmt.Errorf("%s %s = %s/%s (%q), want %s/%s", obj.GetName(), condType, c.Status, c.Reason, c.Message, status, reason)
		}
		return nil
	}
}

// setDeploymentAvailable writes the Deployment's status as a Deployment
// controller would (envtest runs none): observed its generation, with
// `available` of its replicas available.
func setDeploymentAvailable(t *testing.T, namespace, name string, available int32) {
	t.Helper()
	eventually(t, "Deployment "+name+" status write", func() error {
		d := &appsv1.Deployment{}
		if err := k8sClient.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, d); err != nil {
			return err
		}
		d.Status = appsv1.DeploymentStatus{
			ObservedGeneration: d.Generation,
			Replicas:           *d.Spec.Replicas,
			UpdatedReplicas:    *d.Spec.Replicas,
			ReadyReplicas:      available,
			AvailableReplicas:  available,
		}
		return k8sClient.Status().Update(context.Background(), d)
	})
}

// bindClaim plays the volume controller: it marks the claim key Bound with
// the given capacity, retrying on conflicts (the operator may apply the claim
// between the read and the write). The bound claim is left in claim.
func bindClaim(t *testing.T, key types.NamespacedName, capacity string, claim *corev1.PersistentVolumeClaim) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(context.Background(), key, claim); err != nil {
			return err
		}
		claim.Status.Phase = corev1.ClaimBound
		claim.Status.AccessModes = claim.Spec.AccessModes
		claim.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)}
		return k8sClient.Status().Update(context.Background(), claim)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readyPool creates a pool, waits for its Deployment and marks it available,
// and waits for the pool to be Ready.
func readyPool(t *testing.T, namespace, name string) *v1alpha1.ProviderPool {
	t.Helper()
	pool := makePool(namespace, name)
	create(t, pool)
	eventually(t, "scheduler Deployment", func() error {
		return k8sClient.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name + "-scheduler"}, &appsv1.Deployment{})
	})
	setDeploymentAvailable(t, namespace, name+"-scheduler", 1)
	eventually(t, "pool Ready", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable))
	return pool
}

// updateWithRetry reads obj, applies mutate and updates it, retrying when the
// operator's concurrent status writes changed the resourceVersion meanwhile.
func updateWithRetry(t *testing.T, obj client.Object, mutate func()) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mutate()
		return k8sClient.Update(context.Background(), obj)
	})
	if err != nil {
		t.Fatal(err)
	}
}
