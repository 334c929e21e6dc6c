package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// TestBC42_NoStatusWriteOnceConverged: once a pool and a tenant are
// converged, further reconciles (triggered through the manager by changes
// to an owned object, and called directly, with the clock an hour later)
// write no status, leave resourceVersion unchanged, and never refresh
// lastTransitionTime.
func TestBC42_NoStatusWriteOnceConverged(t *testing.T) {
	requireEnv(t)
	ctx := context.Background()
	ns := newNamespace(t)
	pool := readyPool(t, ns, "steady")
	tq := makeTenant(ns, "steady-tenant", "steady", "")
	create(t, tq)
	eventually(t, "tenant Ready", wantCondition(tq, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPoolReady))

	// Quiescent: the manager's cache holds the objects as the server does
	// and the writes that made them Ready have returned (the counter counts
	// a write once its Patch returned without error; a reconcile that read
	// a stale cache gets 409 and writes nothing).
	eventually(t, "cache caught up", func() error {
		for _, o := range []client.Object{&v1alpha1.ProviderPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "steady"}},
			&v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "steady-tenant"}}} {
			cached := o.DeepCopyObject().(client.Object)
			if err := counter.Get(ctx, client.ObjectKeyFromObject(o), cached); err != nil {
				return err
			}
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				return err
			}
			if cached.GetResourceVersion() != o.GetResourceVersion() {
				return fmt.Errorf("%s: cache at %s, server at %s", o.GetName(), cached.GetResourceVersion(), o.GetResourceVersion())
			}
		}
		if counter.StatusApplies("ProviderPool", ns, "steady") < 2 || counter.StatusApplies("TenantQuota", ns, "steady-tenant") < 1 {
			return fmt.Errorf("status writes not returned yet")
		}
		return nil
	})
	// Converging took a handful of status writes, not one per reconcile.
	poolWrites := counter.StatusApplies("ProviderPool", ns, "steady")
	tenantWrites := counter.StatusApplies("TenantQuota", ns, "steady-tenant")
	t.Logf("status writes while converging: pool %d, tenant %d", poolWrites, tenantWrites)
	// Pool: Progressing then Ready; tenant: Ready at once. One more write
	// each is tolerated: a reconcile may read the object from the cache
	// before the cache has seen the previous status write.
	if poolWrites < 2 || poolWrites > 3 {
		t.Errorf("pool status writes while converging = %d, want 2..3", poolWrites)
	}
	if tenantWrites < 1 || tenantWrites > 2 {
		t.Errorf("tenant status writes while converging = %d, want 1..2", tenantWrites)
	}
	get(t, ns, "steady", pool)
	get(t, ns, "steady-tenant", tq)
	poolRV, tenantRV := pool.ResourceVersion, tq.ResourceVersion
	poolLTT := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady).LastTransitionTime
	tenantLTT := apimeta.FindStatusCondition(tq.Status.Conditions, v1alpha1.ConditionReady).LastTransitionTime

	testClock.SetTime(testClock.Now().Add(time.Hour))

	// Reconciles through the manager: each foreign label on the Deployment is
	// an owned-object event; wait for its reconcile (one more Deployment
	// apply) before the next. (A label, not an annotation: annotations bump
	// a Deployment's generation, which is a real change of readiness.)
	for i := range 3 {
		applies := counter.Applies("Deployment", ns, "steady-scheduler")
		patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{"test.fairshare.dev/poke":"p%d"}}}`, i))
		if err := k8sClient.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "steady-scheduler"}}, patch); err != nil {
			t.Fatal(err)
		}
		eventually(t, "reconcile after poke", func() error {
			if got := counter.Applies("Deployment", ns, "steady-scheduler"); got <= applies {
				return fmt.Errorf("Deployment applies = %d, want > %d", got, applies)
			}
			return nil
		})
	}
	// Direct reconciles, as a periodic resync would run them.
	for range 5 {
		if _, err := poolReconciler.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pool)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tenantReconciler.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(tq)}); err != nil {
			t.Fatal(err)
		}
	}

	if got := counter.StatusApplies("ProviderPool", ns, "steady"); got != poolWrites {
		t.Errorf("pool status writes after convergence = %d, want 0", got-poolWrites)
	}
	if got := counter.StatusApplies("TenantQuota", ns, "steady-tenant"); got != tenantWrites {
		t.Errorf("tenant status writes after convergence = %d, want 0", got-tenantWrites)
	}
	get(t, ns, "steady", pool)
	get(t, ns, "steady-tenant", tq)
	if pool.ResourceVersion != poolRV || tq.ResourceVersion != tenantRV {
		t.Errorf("resourceVersion changed: pool %s -> %s, tenant %s -> %s", poolRV, pool.ResourceVersion, tenantRV, tq.ResourceVersion)
	}
	if got := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady).LastTransitionTime; !got.Equal(&poolLTT) {
		t.Errorf("pool Ready lastTransitionTime %v -> %v without a status flip", poolLTT, got)
	}
	if got := apimeta.FindStatusCondition(tq.Status.Conditions, v1alpha1.ConditionReady).LastTransitionTime; !got.Equal(&tenantLTT) {
		t.Errorf("tenant Ready lastTransitionTime %v -> %v without a status flip", tenantLTT, got)
	}

	// A real flip does get a new lastTransitionTime: the clock's.
	setDeploymentAvailable(t, ns, "steady-scheduler", 0)
	eventually(t, "pool not Ready", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSchedulerProgressing))
	if got, want := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady).LastTransitionTime.Time, testClock.Now().Truncate(time.Second); !got.Equal(want) {
		t.Errorf("lastTransitionTime after a flip = %v, want %v", got, want)
	}
}

// schedulerApply applies status fields under the scheduler's field manager,
// as the scheduler's status writer does.
func schedulerApply(t *testing.T, kind, namespace, name string, status map[string]any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"status": status}}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind(kind))
	u.SetNamespace(namespace)
	u.SetName(name)
	if err := k8sClient.Status().Patch(context.Background(), u, client.Apply,
		client.FieldOwner(v1alpha1.FieldManagerScheduler), client.ForceOwnership); err != nil {
		t.Fatalf("scheduler status apply: %v", err)
	}
}

func schedulerCondition(condType, reason string) map[string]any {
	return map[string]any{
		"type": condType, "status": "True", "reason": reason, "message": "from the scheduler",
		"lastTransitionTime": "2026-01-01T00:00:00Z",
	}
}

// TestBC42_TwoWritersDoNotClobber: the operator's status apply keeps the
// scheduler's Serving condition and backlog figure, and the scheduler's apply
// keeps the operator's Accepted and Ready conditions.
func TestBC42_TwoWritersDoNotClobber(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := readyPool(t, ns, "shared")

	// Scheduler -> operator's conditions survive.
	schedulerApply(t, "ProviderPool", ns, "shared", map[string]any{
		"conditions": []any{schedulerCondition(v1alpha1.ConditionServing, v1alpha1.ReasonLoaded)},
		"backlog":    int64(42),
	})
	get(t, ns, "shared", pool)
	for _, c := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionReady, v1alpha1.ConditionServing} {
		if !apimeta.IsStatusConditionTrue(pool.Status.Conditions, c) {
			t.Errorf("after the scheduler's apply, %s is not True: %v", c, pool.Status.Conditions)
		}
	}

	// Operator -> scheduler's fields survive. A spec change makes the operator
	// write observedGeneration and both conditions (a model is read live: the
	// Deployment does not roll and the pool stays Ready).
	updateWithRetry(t, pool, func() { pool.Spec.Models = append(pool.Spec.Models, v1alpha1.ModelSpec{Name: "sim-mini"}) })
	eventually(t, "operator status write for the new generation", func() error {
		get(t, ns, "shared", pool)
		if pool.Status.ObservedGeneration != pool.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", pool.Status.ObservedGeneration, pool.Generation)
		}
		if c := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.ObservedGeneration != pool.Generation {
			return fmt.Errorf("Ready condition not yet at generation %d: %+v", pool.Generation, c)
		}
		return nil
	})
	if !apimeta.IsStatusConditionTrue(pool.Status.Conditions, v1alpha1.ConditionServing) {
		t.Errorf("the operator's apply removed the scheduler's Serving condition: %v", pool.Status.Conditions)
	}
	if pool.Status.Backlog == nil || *pool.Status.Backlog != 42 {
		t.Errorf("the operator's apply changed the scheduler's backlog: %v", pool.Status.Backlog)
	}
	owners := statusConditionManagers(pool.ManagedFields)
	for cond, want := range map[string]string{
		v1alpha1.ConditionAccepted: v1alpha1.FieldManagerController,
		v1alpha1.ConditionReady:    v1alpha1.FieldManagerController,
		v1alpha1.ConditionServing:  v1alpha1.FieldManagerScheduler,
	} {
		if owners[cond] != want {
			t.Errorf("condition %s is managed by %q, want %q (managers %v)", cond, owners[cond], want, owners)
		}
	}

	// The same for a TenantQuota.
	tq := makeTenant(ns, "shared-tenant", "shared", "")
	create(t, tq)
	eventually(t, "tenant Ready", wantCondition(tq, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPoolReady))
	schedulerApply(t, "TenantQuota", ns, "shared-tenant", map[string]any{
		"conditions": []any{schedulerCondition(v1alpha1.ConditionThrottled, v1alpha1.ReasonTenantLimited)},
		"backlog":    int64(7),
	})
	updateWithRetry(t, tq, func() { tq.Spec.Weight = 3 })
	eventually(t, "tenant observedGeneration", func() error {
		get(t, ns, "shared-tenant", tq)
		if tq.Status.ObservedGeneration != tq.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", tq.Status.ObservedGeneration, tq.Generation)
		}
		return nil
	})
	if !apimeta.IsStatusConditionTrue(tq.Status.Conditions, v1alpha1.ConditionThrottled) || tq.Status.Backlog == nil || *tq.Status.Backlog != 7 {
		t.Errorf("the operator's apply changed the scheduler's tenant status: %v backlog %v", tq.Status.Conditions, tq.Status.Backlog)
	}
	if !apimeta.IsStatusConditionTrue(tq.Status.Conditions, v1alpha1.ConditionReady) {
		t.Errorf("tenant Ready lost: %v", tq.Status.Conditions)
	}
}

// statusConditionManagers maps each status condition type to the field
// manager that owns it on the status subresource.
func statusConditionManagers(entries []metav1.ManagedFieldsEntry) map[string]string {
	owners := map[string]string{}
	for _, e := range entries {
		if e.Subresource != "status" || e.FieldsV1 == nil {
			continue
		}
		for _, cond := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionReady, v1alpha1.ConditionServing, v1alpha1.ConditionThrottled} {
			if strings.Contains(string(e.FieldsV1.Raw), fmt.Sprintf(`k:{\"type\":\"%s\"}`, cond)) {
				owners[cond] = e.Manager
			}
		}
	}
	return owners
}

// TestReplicasChangeKeepsPoolReady: a change of spec.scheduler.replicas
// bumps the scheduler Deployment's generation, and its controller has not
// observed it yet (here never: no controller runs), while its replica still
// serves. The pool stays Ready (its message says the generation is not
// observed yet) and its tenant's status is not written: the pool and every
// tenant of it used to flip to not Ready and back on each such change.
func TestReplicasChangeKeepsPoolReady(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	pool := makePool(ns, "scale")
	pool.Spec.Scheduler.JobStore.Type = v1alpha1.JobStoreMemory
	create(t, pool)
	setDeploymentAvailable(t, ns, "scale-scheduler", 1)
	eventually(t, "pool Ready", wantCondition(pool, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSchedulerAvailable))
	tq := makeTenant(ns, "scale-tenant", "scale", "")
	create(t, tq)
	eventually(t, "tenant Ready", wantCondition(tq, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonPoolReady))
	poolLTT := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady).LastTransitionTime
	eventually(t, "tenant status written", func() error {
		if counter.StatusApplies("TenantQuota", ns, "scale-tenant") < 1 {
			return fmt.Errorf("no tenant status write returned yet")
		}
		return nil
	})
	tenantWrites := counter.StatusApplies("TenantQuota", ns, "scale-tenant")

	updateWithRetry(t, pool, func() { pool.Spec.Scheduler.Replicas = ptr.To(int32(2)) })
	waitObserved(t, pool)
	d := &appsv1.Deployment{}
	get(t, ns, "scale-scheduler", d)
	if *d.Spec.Replicas != 2 || d.Status.ObservedGeneration >= d.Generation {
		t.Fatalf("Deployment replicas %d, generation %d observed %d: want 2 replicas and a generation not observed yet",
			*d.Spec.Replicas, d.Generation, d.Status.ObservedGeneration)
	}
	c := apimeta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ConditionReady)
	want := fmt.Sprintf("Deployment scale-scheduler has not yet observed generation %d; 1 of 1 required replicas available", d.Generation)
	if c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonSchedulerAvailable || c.Message != want || !c.LastTransitionTime.Equal(&poolLTT) {
		t.Errorf("pool Ready %+v, want True SchedulerAvailable %q since %v", c, want, poolLTT)
	}
	// The tenant reconciles its pool's changes; its status stays as it was.
	if _, err := tenantReconciler.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(tq)}); err != nil {
		t.Fatal(err)
	}
	if got := counter.StatusApplies("TenantQuota", ns, "scale-tenant"); got != tenantWrites {
		t.Errorf("tenant status writes after the replicas change = %d, want 0", got-tenantWrites)
	}
}
