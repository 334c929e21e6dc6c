package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

var nsSeq int

// fixture creates a namespace with a ProviderPool "pool" and a TenantQuota
// "tq-a" referencing it.
func fixture(t *testing.T, c client.Client) (ns string, pool *v1alpha1.ProviderPool, tq *v1alpha1.TenantQuota) {
	t.Helper()
	ctx := context.Background()
	nsSeq++
	ns = fmt.Sprintf("status-%d-%d", time.Now().UnixNano()%100000, nsSeq)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	pool = &v1alpha1.ProviderPool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: v1alpha1.ProviderPoolSpec{Upstream: v1alpha1.UpstreamSpec{BaseURL: "http://127.0.0.1:9"},
			Models: []v1alpha1.ModelSpec{{Name: "gpt-test"}}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	wpm := int64(60000)
	tq = &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "tq-a", Namespace: ns},
		Spec: v1alpha1.TenantQuotaSpec{PoolRef: v1alpha1.PoolRef{Name: "pool"}, Tokens: &v1alpha1.TokenLimits{WeightedPerMinute: &wpm}}}
	if err := c.Create(ctx, tq); err != nil {
		t.Fatal(err)
	}
	return ns, pool, tq
}

// applyControllerConditions applies Accepted and Ready as the operator does
// (field manager fairshare-controller), sending only its own fields.
func applyControllerConditions(t *testing.T, c client.Client, kind, ns, name string, gen int64) {
	t.Helper()
	now := metav1.Now().Rfc3339Copy()
	u := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{
		"observedGeneration": gen,
		"conditions": []any{
			map[string]any{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "ok", "observedGeneration": gen, "lastTransitionTime": now.Format(time.RFC3339)},
			map[string]any{"type": "Ready", "status": "True", "reason": "PoolReady", "message": "ok", "observedGeneration": gen, "lastTransitionTime": now.Format(time.RFC3339)},
		},
	}}}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	u.SetNamespace(ns)
	u.SetName(name)
	if err := c.Status().Patch(context.Background(), u, client.Apply, client.FieldOwner(v1alpha1.FieldManagerController), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
}

func condTypes(conds []metav1.Condition) []string {
	out := []string{}
	for _, c := range conds {
		out = append(out, c.Type)
	}
	return out
}

// TestStatusWriterCoexistsWithOperator: the status writer applies figures,
// Serving and Throttled; the operator then applies Accepted and Ready under
// its own field manager; neither removes the other's conditions, and an
// unchanged status is not written again (BC-42).
func TestStatusWriterCoexistsWithOperator(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, tq := fixture(t, c)
	fc := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	reg := registry.New(fc)
	if err := reg.SetPool(PoolPolicy(pool)); err != nil {
		t.Fatal(err)
	}
	if err := reg.UpsertTenant(TenantPolicy(tq)); err != nil {
		t.Fatal(err)
	}
	w := &StatusWriter{Client: c, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}

	n, err := w.WriteOnce(ctx)
	if err != nil || n != 2 {
		t.Fatalf("first pass: %d writes, %v; want 2", n, err)
	}
	var got v1alpha1.TenantQuota
	if err := c.Get(ctx, client.ObjectKeyFromObject(tq), &got); err != nil {
		t.Fatal(err)
	}
	st := got.Status
	if d := cmp.Diff([]string{"Serving", "Throttled", "UsageOutlier"}, condTypes(st.Conditions)); d != "" {
		t.Errorf("conditions (-want +got):\n%s", d)
	}
	serving := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionServing)
	if serving.Status != metav1.ConditionTrue || serving.Reason != v1alpha1.ReasonLoaded || serving.ObservedGeneration != tq.Generation {
		t.Errorf("Serving = %+v", serving)
	}
	if st.Backlog == nil || *st.Backlog != 0 || st.TokensRemaining == nil || *st.TokensRemaining != 10000 || st.LastReportTime == nil {
		t.Errorf("figures = %+v", st)
	}
	servingLTT := serving.LastTransitionTime

	applyControllerConditions(t, c, "TenantQuota", ns, "tq-a", tq.Generation)
	applyControllerConditions(t, c, "ProviderPool", ns, "pool", pool.Generation)

	fc.Step(10 * time.Second)
	if n, err := w.WriteOnce(ctx); err != nil || n != 0 {
		t.Fatalf("unchanged pass: %d writes, %v; want 0", n, err)
	}
	reg.Tenant("tq-a").AddRejection()
	fc.Step(10 * time.Second)
	if n, err := w.WriteOnce(ctx); err != nil || n != 2 {
		t.Fatalf("pass after a rejection: %d writes, %v; want 2 (the tenant, and the pool whose status.usageTiers counts its tier's first active tenant)", n, err)
	}
	applyControllerConditions(t, c, "TenantQuota", ns, "tq-a", tq.Generation)

	for _, obj := range []client.Object{&v1alpha1.TenantQuota{}, &v1alpha1.ProviderPool{}} {
		name := map[bool]string{true: "tq-a", false: "pool"}[fmt.Sprintf("%T", obj) == "*v1alpha1.TenantQuota"]
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj); err != nil {
			t.Fatal(err)
		}
		var conds []metav1.Condition
		switch o := obj.(type) {
		case *v1alpha1.TenantQuota:
			conds = o.Status.Conditions
			if o.Status.Rejections == nil || *o.Status.Rejections != 1 {
				t.Errorf("tenant rejections = %v, want 1", o.Status.Rejections)
			}
			if s := meta.FindStatusCondition(conds, v1alpha1.ConditionServing); s == nil || !s.LastTransitionTime.Equal(&servingLTT) {
				t.Errorf("Serving lastTransitionTime changed without a flip: %+v (was %v)", s, servingLTT)
			}
		case *v1alpha1.ProviderPool:
			conds = o.Status.Conditions
			if o.Status.Tenants == nil || *o.Status.Tenants != 1 || o.Status.Backlog == nil || len(o.Status.Models) != 1 {
				t.Errorf("pool figures = %+v", o.Status)
			}
		}
		want := []string{"Serving", "Throttled", "Accepted", "Ready"}
		if name == "tq-a" {
			want = []string{"Serving", "Throttled", "UsageOutlier", "Accepted", "Ready"}
		}
		if d := cmp.Diff(want, condTypes(conds)); d != "" {
			t.Errorf("%s conditions (-want +got):\n%s", name, d)
		}
	}

	// After 5 minutes the pool's unchanged status is rewritten (the
	// heartbeat); the tenant's is not (issue 6).
	fc.Step(DefaultForceRefresh)
	if n, err := w.WriteOnce(ctx); err != nil || n != 1 {
		t.Fatalf("heartbeat: %d writes, %v; want 1 (the pool)", n, err)
	}
}

// TestSyncReconcilers: a TenantQuota with a key Secret is loaded with the
// key's hash (the key authenticates, another does not); a duplicate tenant
// id is refused and reported; a deleted TenantQuota is removed.
func TestSyncReconcilers(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, _, tq := fixture(t, c)
	reg := registry.New(clocktesting.NewFakeClock(time.Now()))
	state := &State{}
	pr := &PoolReconciler{Reader: c, Registry: reg, Namespace: ns, PoolName: "pool", State: state}
	tr := &TenantReconciler{Reader: c, Registry: reg, Namespace: ns, PoolName: "pool"}
	if _, err := pr.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "pool"}}); err != nil {
		t.Fatal(err)
	}
	if p := reg.Pool(); p == nil || p.Models[0].Name != "gpt-test" || p.ReservePercent != 20 {
		t.Fatalf("pool policy = %+v", p)
	}
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "a-key", Namespace: ns},
		Data: map[string][]byte{"api-key": []byte("sk-tenant-a\n")}}); err != nil {
		t.Fatal(err)
	}
	tq.Spec.Credentials = &v1alpha1.TenantCredentials{SecretRef: v1alpha1.SecretKeyRef{Name: "a-key"}}
	if err := c.Update(ctx, tq); err != nil {
		t.Fatal(err)
	}
	req := func(name string) reconcile.Request {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
	}
	if _, err := tr.Reconcile(ctx, req("tq-a")); err != nil {
		t.Fatal(err)
	}
	if got := reg.TenantByKey("sk-tenant-a"); got == nil || got.ID != "tq-a" {
		t.Errorf("TenantByKey(right key) = %v", got)
	}
	if got := reg.TenantByKey("sk-tenant-b"); got != nil {
		t.Errorf("TenantByKey(wrong key) = %v, want nil", got)
	}

	dup := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "tq-dup", Namespace: ns},
		Spec: v1alpha1.TenantQuotaSpec{PoolRef: v1alpha1.PoolRef{Name: "pool"}, TenantID: "tq-a"}}
	if err := c.Create(ctx, dup); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Reconcile(ctx, req("tq-dup")); err != nil {
		t.Fatal(err)
	}
	snap := reg.Snapshot(time.Now())
	var dupErr error
	for _, o := range snap.Objects {
		if o.Name == "tq-dup" {
			dupErr = o.Err
		}
	}
	if dupErr == nil || len(snap.Tenants) != 1 {
		t.Errorf("duplicate: err %v, tenants %d; want an error and 1 tenant", dupErr, len(snap.Tenants))
	}

	if err := c.Delete(ctx, tq); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Reconcile(ctx, req("tq-a")); err != nil {
		t.Fatal(err)
	}
	if reg.Tenant("tq-a") != nil || reg.TenantByKey("sk-tenant-a") != nil {
		t.Errorf("tenant still served after its TenantQuota was deleted")
	}
}

// TestBudgetSurvivesSchedulerRestart: the budget's spend is carried across a
// scheduler restart through status.budget. Scheduler 1 writes its figures,
// spends more, and is stopped: its last write at shutdown reports the
// total. Scheduler 2, a fresh registry loading the TenantQuota from the API
// server, starts the period from that figure and refuses what no longer
// fits.
func TestBudgetSurvivesSchedulerRestart(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, tq := fixture(t, c)
	tq.Spec.Budget = &v1alpha1.Budget{WeightedTokens: 10000, Period: v1alpha1.BudgetMonth}
	tq.Spec.Mode = v1alpha1.ModeDryRun
	if err := c.Update(ctx, tq); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(now)
	reg1 := registry.New(fc)
	if err := reg1.SetPool(PoolPolicy(pool)); err != nil {
		t.Fatal(err)
	}
	if err := reg1.UpsertTenant(TenantPolicy(tq)); err != nil {
		t.Fatal(err)
	}
	w1 := &StatusWriter{Client: c, Registry: reg1, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc, Interval: time.Hour}
	reg1.Tenant("tq-a").AddUsed(now, 4000)
	reg1.Tenant("tq-a").AddDryRunRejection()
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w1.Start(sctx) }()
	waitStatus := func(what string, ok func(*v1alpha1.TenantQuotaStatus) bool) *v1alpha1.TenantQuota {
		t.Helper()
		var got v1alpha1.TenantQuota
		deadline := time.Now().Add(10 * time.Second)
		for {
			if err := c.Get(ctx, client.ObjectKeyFromObject(tq), &got); err == nil && ok(&got.Status) {
				return &got
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, got.Status)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitStatus("the first report", func(s *v1alpha1.TenantQuotaStatus) bool {
		return s.Budget != nil && s.Budget.Used != nil && *s.Budget.Used == 4000
	})
	reg1.Tenant("tq-a").AddUsed(now, 2500) // spent after the last periodic report
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := waitStatus("the report at shutdown", func(s *v1alpha1.TenantQuotaStatus) bool {
		return s.Budget != nil && s.Budget.Used != nil && *s.Budget.Used == 6500
	})
	if r := got.Status.Budget.Remaining; r == nil || *r != 3500 {
		t.Errorf("budget.remaining = %v, want 3500", r)
	}
	if d := got.Status.DryRunRejections; d == nil || *d != 1 {
		t.Errorf("dryRunRejections = %v, want 1", d)
	}

	reg2 := registry.New(fc)
	tr := &TenantReconciler{Reader: c, Registry: reg2, Namespace: ns, PoolName: "pool"}
	if _, err := tr.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tq)}); err != nil {
		t.Fatal(err)
	}
	st, ok := reg2.Tenant("tq-a").Budget(now)
	if !ok || st.Used != 6500 || st.Remaining != 3500 {
		t.Errorf("after the restart: %+v, want used 6500, remaining 3500", st)
	}
	if _, fits, _, _ := reg2.Tenant("tq-a").ReserveBudget(now, 3501); fits {
		t.Error("3501 reserved with 3500 left after the restart")
	}
}
