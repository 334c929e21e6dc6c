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

// TestGracefulShutdownWritesEveryBudget: the next scheduler seeds its
// budgets from status.budget.used, so the final write at shutdown writes
// every tenant whose spend changed since its last write, without the
// per-second pacing: 40 tenants (more than finalWriteTimeout x
// MaxWritesPerSecond = 25) all carry their spend afterwards.
func TestGracefulShutdownWritesEveryBudget(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	ns := fmt.Sprintf("final-budget-%d", time.Now().UnixNano()%1000000)
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
	const n = 40
	for i := range n {
		tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("tq-%02d", i), Namespace: ns},
			Spec: v1alpha1.TenantQuotaSpec{PoolRef: v1alpha1.PoolRef{Name: "pool"},
				Budget: &v1alpha1.Budget{WeightedTokens: 1_000_000, Period: v1alpha1.BudgetMonth}}}
		if err := c.Create(ctx, tq); err != nil {
			t.Fatal(err)
		}
		if err := reg.UpsertTenant(TenantPolicy(tq)); err != nil {
			t.Fatal(err)
		}
	}
	w := &StatusWriter{Client: c, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	if _, dirty := runPasses(t, w, fc, t0.Add(20*time.Second), nil); dirty != 0 {
		t.Fatalf("initial: %d dirty", dirty)
	}
	// Every tenant spends 5,000 weighted tokens; then the scheduler is
	// stopped (SIGTERM): the final write.
	for i := range n {
		reg.Tenant(fmt.Sprintf("tq-%02d", i)).AddUsed(fc.Now(), 5000)
	}
	w.final(ctx)

	var list v1alpha1.TenantQuotaList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var lost []string
	for _, tq := range list.Items {
		if b := tq.Status.Budget; b == nil || b.Used == nil || *b.Used != 5000 {
			lost = append(lost, tq.Name)
		}
	}
	if len(lost) > 0 {
		t.Errorf("after the final write at shutdown, %d of %d tenants' status.budget.used lacks the spend (a restarted scheduler seeds 0): %v",
			len(lost), n, lost)
	}
}

// TestGracefulShutdownWritesEveryCounter: the next scheduler carries the
// counters on from status, so the final write at shutdown also writes,
// without the per-second pacing, every tenant whose counters changed since
// its last write, budget or not: 40 tenants without a budget, each with
// one more rejection, all carry it afterwards (paced, 24 would: 5 writes a
// second for 5 s, the pool's included).
func TestGracefulShutdownWritesEveryCounter(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	const n = 40
	ns, reg, _ := manyTenants(t, c, fc, n)
	w := &StatusWriter{Client: c, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	if _, dirty := runPasses(t, w, fc, t0.Add(20*time.Second), nil); dirty != 0 {
		t.Fatalf("initial: %d dirty", dirty)
	}
	for i := range n {
		reg.Tenant(fmt.Sprintf("tq-%05d", i)).AddRejection()
	}
	w.final(ctx)

	var list v1alpha1.TenantQuotaList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var lost []string
	for _, tq := range list.Items {
		if r := tq.Status.Rejections; r == nil || *r != 1 {
			lost = append(lost, tq.Name)
		}
	}
	if len(list.Items) != n || len(lost) > 0 {
		t.Errorf("after the final write at shutdown, %d of %d tenants' status.rejections lacks the rejection (lost for good: the next scheduler carries on from status): %v",
			len(lost), len(list.Items), lost)
	}
}
