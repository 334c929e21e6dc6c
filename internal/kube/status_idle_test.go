package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// TestIdleTenantNotRewrittenByPeers: 40 tenants of tier "pro" that have
// no traffic at all, and 5 active peers whose usage changes before every
// pass. Nothing of the idle tenants changes, so none of them is written in
// 5 minutes: a tenant's status depends on its own figures only (the tier's
// median is in the pool's status.usageTiers, the WithinTier message is
// constant), and writes are independent of the tenant count when nothing
// of the object changes (issue 6).
func TestIdleTenantNotRewrittenByPeers(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Minute)
	fc := clocktesting.NewFakeClock(t0)
	ns := fmt.Sprintf("idle-%d", time.Now().UnixNano()%1000000)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	pool := &v1alpha1.ProviderPool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: v1alpha1.ProviderPoolSpec{Upstream: v1alpha1.UpstreamSpec{BaseURL: "http://127.0.0.1:9"},
			Models: []v1alpha1.ModelSpec{{Name: "gpt-test"}}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	reg := registry.New(fc)
	if err := reg.SetPool(PoolPolicy(pool)); err != nil {
		t.Fatal(err)
	}
	var idle, active []string
	for i := range 45 {
		name := fmt.Sprintf("idle-%02d", i)
		if i < 5 {
			name = fmt.Sprintf("active-%02d", i)
			active = append(active, name)
		} else {
			idle = append(idle, name)
		}
		tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.TenantQuotaSpec{PoolRef: v1alpha1.PoolRef{Name: "pool"}, Tier: "pro"}}
		if err := c.Create(ctx, tq); err != nil {
			t.Fatal(err)
		}
		if err := reg.UpsertTenant(TenantPolicy(tq)); err != nil {
			t.Fatal(err)
		}
	}
	log := &writeLog{clk: fc}
	w := &StatusWriter{Client: countingClient{Client: c, log: log}, Registry: reg, State: &State{}, Namespace: ns,
		PoolName: "pool", Clock: fc}
	traffic := func(k int) {
		for i, name := range active {
			reg.Tenant(name).RecordCall(fc.Now(), int64(1000*(i+1)+k*100), 10, 10)
		}
	}
	traffic(0)
	runPasses(t, w, fc, t0.Add(30*time.Second), nil) // 46 writes: initial
	mark := log.len()
	runPasses(t, w, fc, fc.Now().Add(5*time.Minute), traffic)
	idleWrites := 0
	for _, wr := range log.since(mark) {
		if wr.name[:4] == "idle" {
			idleWrites++
		}
	}
	var tq v1alpha1.TenantQuota
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "idle-05"}, &tq); err != nil {
		t.Fatal(err)
	}
	if idleWrites != 0 {
		t.Errorf("40 tenants without traffic written %d times in 5 minutes (peers' traffic only); want 0. idle-05 status.usage: %+v",
			idleWrites, tq.Status.Usage)
	}
}
