package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// budgetTenants is manyTenants with a monthly budget of 1,000,000 weighted
// tokens on every tenant, its status written once.
func budgetTenants(t *testing.T, c client.Client, fc *clocktesting.FakeClock, n int, w func(ns string, reg *registry.Registry) *StatusWriter) (string, *registry.Registry, []*v1alpha1.TenantQuota, *StatusWriter) {
	t.Helper()
	ns, reg, tqs := manyTenants(t, c, fc, n)
	for _, tq := range tqs {
		tq.Spec.Budget = &v1alpha1.Budget{WeightedTokens: 1_000_000, Period: v1alpha1.BudgetMonth}
		if err := reg.UpsertTenant(TenantPolicy(tq)); err != nil {
			t.Fatal(err)
		}
	}
	sw := w(ns, reg)
	if _, dirty := runPasses(t, sw, fc, fc.Now().Add(time.Duration(n/50+2)*10*time.Second), nil); dirty != 0 {
		t.Fatalf("initial: %d dirty", dirty)
	}
	return ns, reg, tqs, sw
}

// TestBudgetChangeWrittenBeforeFlipsAndRest: a tenant whose
// status.budget.used changed is written right after the pool and the
// overdue objects, ahead of condition flips and of objects dirty for longer
// (the next scheduler seeds its budgets from it; issue 6).
func TestBudgetChangeWrittenBeforeFlipsAndRest(t *testing.T) {
	c := newClient(t)
	fc := clocktesting.NewFakeClock(time.Now().UTC().Truncate(time.Second))
	log := &writeLog{clk: fc}
	_, reg, tqs, w := budgetTenants(t, c, fc, 80, func(ns string, reg *registry.Registry) *StatusWriter {
		return &StatusWriter{Client: countingClient{Client: c, log: log}, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	})

	// 70 tenants are refused a request: one pass writes the pool and 49 of
	// them; tq-00049..tq-00069 stay dirty.
	for _, tq := range tqs[:70] {
		reg.Tenant(tq.Name).AddRejection()
	}
	runPasses(t, w, fc, fc.Now().Add(time.Second), nil)

	// Then tq-00079's Throttled condition flips and tq-00075 spends.
	flipped := tqs[79].DeepCopy()
	zero := int64(0)
	flipped.Spec.Tokens.WeightedPerMinute = &zero
	if err := reg.UpsertTenant(TenantPolicy(flipped)); err != nil {
		t.Fatal(err)
	}
	reg.Tenant("tq-00075").AddUsed(fc.Now(), 5000)
	mark := log.len()
	runPasses(t, w, fc, fc.Now().Add(time.Second), nil)
	var names []string
	for _, wr := range log.since(mark)[:3] {
		names = append(names, wr.name)
	}
	if want := []string{"tq-00075", "tq-00079", "tq-00049"}; fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("first writes of the pass: %v, want %v (budget, flip, then the oldest dirty)", names, want)
	}
}

// TestInvalidTenantKeepsBudget: a TenantQuota in an error state (its spec
// cannot be served) is written with Serving False and its last
// status.budget, so that server-side apply does not remove the budget the
// next scheduler seeds from: both while the previous policy is still served
// and for a new scheduler that never served it.
func TestInvalidTenantKeepsBudget(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	fc := clocktesting.NewFakeClock(time.Now().UTC().Truncate(time.Second))
	ns, reg, tqs, w := budgetTenants(t, c, fc, 2, func(ns string, reg *registry.Registry) *StatusWriter {
		return &StatusWriter{Client: c, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	})
	reg.Tenant("tq-00000").AddUsed(fc.Now(), 5000)
	runPasses(t, w, fc, fc.Now().Add(10*time.Second), nil)

	invalid := func(reg *registry.Registry) {
		p := TenantPolicy(tqs[0])
		p.MaxQueued = -1
		if err := reg.UpsertTenant(p); err == nil {
			t.Fatal("invalid policy accepted")
		}
	}
	check := func(when string, used int64) {
		t.Helper()
		var got v1alpha1.TenantQuota
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tq-00000"}, &got); err != nil {
			t.Fatal(err)
		}
		s := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionServing)
		if s == nil || s.Status != metav1.ConditionFalse || s.Reason != v1alpha1.ReasonInvalidSpec {
			t.Errorf("%s: Serving = %+v, want False InvalidSpec", when, s)
		}
		if b := got.Status.Budget; b == nil || b.Used == nil || *b.Used != used || b.ResetTime == nil {
			t.Errorf("%s: status.budget = %+v, want used %d and the reset time", when, b, used)
		}
	}
	// The previous policy is still served: its live figures are kept.
	invalid(reg)
	reg.Tenant("tq-00000").AddUsed(fc.Now(), 1000)
	runPasses(t, w, fc, fc.Now().Add(10*time.Second), nil)
	check("previous policy served", 6000)

	// A new scheduler (empty registry) that cannot serve the object keeps
	// the figures it read from the API server.
	reg2 := registry.New(fc)
	var pool v1alpha1.ProviderPool
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, &pool); err != nil {
		t.Fatal(err)
	}
	if err := reg2.SetPool(PoolPolicy(&pool)); err != nil {
		t.Fatal(err)
	}
	invalid(reg2)
	w2 := &StatusWriter{Client: c, Registry: reg2, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	fc.Step(time.Minute)
	runPasses(t, w2, fc, fc.Now().Add(10*time.Second), nil)
	check("new scheduler", 6000)
}
