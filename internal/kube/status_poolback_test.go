package kube

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// TestPoolBackRewritesClearedStatus: while the ProviderPool is found
// deleted the writer writes nothing and the operator removes the
// scheduler's status fields from the tenants (controllers'
// clearSchedulerStatus). When the pool comes back while this scheduler
// still runs (deleted and created again before its Deployment is
// collected), the idle tenant's Serving condition and figures must be
// written again: the writer may not take the cleared status for the one it
// last wrote.
func TestPoolBackRewritesClearedStatus(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	ns, reg, tqs := manyTenants(t, c, fc, 1)
	state := &State{}
	w := &StatusWriter{Client: c, Registry: reg, State: state, Namespace: ns, PoolName: "pool", Clock: fc}
	runPasses(t, w, fc, t0.Add(10*time.Second), nil)
	key := client.ObjectKeyFromObject(tqs[0])
	var got v1alpha1.TenantQuota
	if err := c.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionServing) == nil {
		t.Fatalf("before the pool is deleted: status %+v; want Serving", got.Status)
	}

	state.setPoolGone(true)
	runPasses(t, w, fc, fc.Now().Add(30*time.Second), nil)
	// The operator's clearSchedulerStatus: an apply as the scheduler's
	// field manager with no status fields.
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("TenantQuota"))
	u.SetName(key.Name)
	u.SetNamespace(key.Namespace)
	if err := c.Status().Patch(ctx, u, client.Apply, client.FieldOwner(v1alpha1.FieldManagerScheduler), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionServing) != nil {
		t.Fatalf("cleared status still has Serving: %+v", got.Status)
	}

	state.setPoolGone(false)
	runPasses(t, w, fc, fc.Now().Add(2*time.Minute), nil)
	if err := c.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionServing) == nil || got.Status.Backlog == nil {
		t.Errorf("2 simulated minutes after the pool came back: status %+v; want the scheduler's Serving condition and figures again", got.Status)
	}
}

// TestStatusChangedBehindWriterIsRewritten: a status the writer wrote and
// that someone else changed since (the other replica, leading while this
// one was cut off from the API server and then gone again; a hand edit) is
// written again within ForceRefresh and a pass, although the scheduler's
// figures did not change: the writer may not take the API server to hold
// what it last wrote for ever.
func TestStatusChangedBehindWriterIsRewritten(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	ns, reg, tqs := manyTenants(t, c, fc, 1)
	w := &StatusWriter{Client: c, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	runPasses(t, w, fc, t0.Add(10*time.Second), nil)
	key := client.ObjectKeyFromObject(tqs[0])

	// Another writer under the same field manager: a backlog of 7.
	var got v1alpha1.TenantQuota
	if err := c.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&got.Status)
	if err != nil {
		t.Fatal(err)
	}
	st["backlog"] = int64(7)
	delete(st, "observedGeneration")
	u := &unstructured.Unstructured{Object: map[string]any{"status": st}}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("TenantQuota"))
	u.SetName(key.Name)
	u.SetNamespace(key.Namespace)
	if err := c.Status().Patch(ctx, u, client.Apply, client.FieldOwner(v1alpha1.FieldManagerScheduler), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}

	runPasses(t, w, fc, fc.Now().Add(DefaultForceRefresh+time.Minute), nil)
	if err := c.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Backlog == nil || *got.Status.Backlog != 0 {
		t.Errorf("status.backlog %d (-1: unset) after ForceRefresh; want 0, the scheduler's figure, written again", ptrVal(got.Status.Backlog))
	}
}

func ptrVal(p *int64) int64 {
	if p == nil {
		return -1
	}
	return *p
}
