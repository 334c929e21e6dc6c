package kube

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
)

// TestRecreatedTenantGetsStatus: a TenantQuota deleted and created
// again under the same name between two passes (kubectl replace --force, a
// GitOps re-create) has an empty status. The writer must write the
// scheduler's status on the new object; with no tenant heartbeat, an idle
// tenant otherwise never gets one.
func TestRecreatedTenantGetsStatus(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	ns, reg, tqs := manyTenants(t, c, fc, 1)
	w := &StatusWriter{Client: c, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	runPasses(t, w, fc, t0.Add(10*time.Second), nil)

	// Delete and re-create with the same spec; the sync reconciler sees one
	// request for the key (the informer coalesces) and upserts the same
	// policy: the registry does not change.
	old := tqs[0]
	if err := c.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	fresh := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: old.Name, Namespace: ns}, Spec: old.Spec}
	if err := c.Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if err := reg.UpsertTenant(TenantPolicy(fresh)); err != nil {
		t.Fatal(err)
	}
	runPasses(t, w, fc, fc.Now().Add(30*time.Minute), nil)

	var got v1alpha1.TenantQuota
	if err := c.Get(ctx, client.ObjectKeyFromObject(fresh), &got); err != nil {
		t.Fatal(err)
	}
	if meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionServing) == nil || got.Status.LastReportTime == nil {
		t.Errorf("re-created TenantQuota after 30 simulated minutes: status %+v; want the scheduler's Serving condition and figures", got.Status)
	}
}
