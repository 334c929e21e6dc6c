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
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// counts are the cumulative counters of a TenantQuota status, absent read
// as -1.
type counts struct{ completed, expired, rejections, tokensUsed, dryRun int64 }

func countsIn(st *v1alpha1.TenantQuotaStatus) counts {
	v := func(p *int64) int64 {
		if p == nil {
			return -1
		}
		return *p
	}
	return counts{v(st.CompletedJobs), v(st.ExpiredJobs), v(st.Rejections), v(st.TokensUsed), v(st.DryRunRejections)}
}

func getTenant(t *testing.T, c client.Client, ns, name string) *v1alpha1.TenantQuota {
	t.Helper()
	var got v1alpha1.TenantQuota
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

func poolThrottled(t *testing.T, c client.Client, ns string) int64 {
	t.Helper()
	var p v1alpha1.ProviderPool
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "pool"}, &p); err != nil {
		t.Fatal(err)
	}
	if p.Status.UpstreamThrottled == nil {
		return -1
	}
	return *p.Status.UpstreamThrottled
}

// schedulerRegistry is the registry of a scheduler that has just loaded
// the pool and tq from the API server (a restart, or a standby).
func schedulerRegistry(t *testing.T, c client.Client, fc *clocktesting.FakeClock, pool *v1alpha1.ProviderPool, tq *v1alpha1.TenantQuota) *registry.Registry {
	t.Helper()
	reg := registry.New(fc)
	if err := reg.SetPool(PoolPolicy(pool)); err != nil {
		t.Fatal(err)
	}
	if err := reg.UpsertTenant(TenantPolicy(tq)); err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestCountersCarryOverToNextWriter: the status counters go on across
// writers against the real API server. Scheduler 1 counts and writes, then
// counts one more job it never writes (it crashes). Scheduler 2, a fresh
// registry (a restarted scheduler, or the standby that takes the Lease),
// counts before its first write; that write shows scheduler 1's written
// figures plus its own, exactly: nothing counted twice, nothing of its own
// lost, only scheduler 1's unwritten job missing. Its later passes, a
// check of the status after ForceRefresh included, add only new counts. A
// third scheduler that counts nothing leaves the tenant's status untouched.
func TestCountersCarryOverToNextWriter(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, tq := fixture(t, c)
	tq.Spec.Mode = v1alpha1.ModeDryRun
	if err := c.Update(ctx, tq); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)

	reg1 := schedulerRegistry(t, c, fc, pool, tq)
	a := reg1.Tenant("tq-a")
	for range 3 {
		a.AddCompleted()
	}
	a.AddExpired()
	for range 4 {
		a.AddRejection()
	}
	a.AddUsed(t0, 700)
	a.AddDryRunRejection()
	reg1.AddUpstreamThrottled()
	reg1.AddUpstreamThrottled()
	w1 := &StatusWriter{Client: c, Registry: reg1, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	if _, err := w1.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := countsIn(&getTenant(t, c, ns, "tq-a").Status), (counts{3, 1, 4, 700, 1}); got != want {
		t.Fatalf("scheduler 1's write: %+v, want %+v", got, want)
	}
	if got := poolThrottled(t, c, ns); got != 2 {
		t.Fatalf("scheduler 1's pool upstreamThrottled %d, want 2", got)
	}
	a.AddCompleted() // counted after its last write: lost with it

	fc.Step(10 * time.Second)
	reg2 := schedulerRegistry(t, c, fc, pool, getTenant(t, c, ns, "tq-a"))
	b := reg2.Tenant("tq-a")
	b.AddCompleted()
	b.AddCompleted()
	for range 5 {
		b.AddRejection()
	}
	b.AddUsed(fc.Now(), 300)
	reg2.AddUpstreamThrottled()
	w2 := &StatusWriter{Client: c, Registry: reg2, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	if _, err := w2.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := countsIn(&getTenant(t, c, ns, "tq-a").Status), (counts{5, 1, 9, 1000, 1}); got != want {
		t.Fatalf("scheduler 2's first write: %+v, want %+v (scheduler 1's written figures plus its own)", got, want)
	}
	if got := poolThrottled(t, c, ns); got != 3 {
		t.Fatalf("scheduler 2's pool upstreamThrottled %d, want 3", got)
	}

	b.AddExpired()
	fc.Step(10 * time.Second)
	if _, err := w2.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := countsIn(&getTenant(t, c, ns, "tq-a").Status), (counts{5, 2, 9, 1000, 1}); got != want {
		t.Fatalf("scheduler 2's second write: %+v, want %+v", got, want)
	}
	// Clean for ForceRefresh: the status is read again, and not added again.
	fc.Step(DefaultForceRefresh + time.Second)
	if _, err := w2.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	b.AddDryRunRejection()
	fc.Step(10 * time.Second)
	if _, err := w2.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	final := getTenant(t, c, ns, "tq-a")
	if got, want := countsIn(&final.Status), (counts{5, 2, 9, 1000, 2}); got != want {
		t.Fatalf("after a check and one more DryRun rejection: %+v, want %+v", got, want)
	}
	if got := poolThrottled(t, c, ns); got != 3 {
		t.Fatalf("pool upstreamThrottled after the check %d, want 3", got)
	}

	// A scheduler that restarts and counts nothing writes the same
	// counters (its other figures, the usage window's, start afresh).
	fc.Step(10 * time.Second)
	reg3 := schedulerRegistry(t, c, fc, pool, final)
	w3 := &StatusWriter{Client: c, Registry: reg3, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	if _, err := w3.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := countsIn(&getTenant(t, c, ns, "tq-a").Status), (counts{5, 2, 9, 1000, 2}); got != want {
		t.Errorf("scheduler 3, nothing counted: %+v, want %+v", got, want)
	}
	if got := poolThrottled(t, c, ns); got != 3 {
		t.Errorf("scheduler 3's pool upstreamThrottled %d, want 3", got)
	}
}

// TestRecreatedTenantQuotaCountersStartFromZero: a TenantQuota deleted and
// created again under its name while the scheduler runs, applied to the
// registry as an update (the informer coalesced the two), counts from 0:
// the counts of the deleted object are not carried into the new one.
func TestRecreatedTenantQuotaCountersStartFromZero(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, tq := fixture(t, c)
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	reg := schedulerRegistry(t, c, fc, pool, tq)
	for range 3 {
		reg.Tenant("tq-a").AddCompleted()
	}
	w := &StatusWriter{Client: c, Registry: reg, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	if _, err := w.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := countsIn(&getTenant(t, c, ns, "tq-a").Status); got.completed != 3 {
		t.Fatalf("completedJobs %d, want 3", got.completed)
	}

	if err := c.Delete(ctx, tq); err != nil {
		t.Fatal(err)
	}
	fresh := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: tq.Name, Namespace: ns}, Spec: tq.Spec}
	if err := c.Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if err := reg.UpsertTenant(TenantPolicy(fresh)); err != nil {
		t.Fatal(err)
	}
	reg.Tenant("tq-a").AddCompleted()
	reg.Tenant("tq-a").AddRejection()
	fc.Step(10 * time.Second)
	if _, err := w.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := countsIn(&getTenant(t, c, ns, "tq-a").Status), (counts{1, 0, 1, 0, -1}); got != want {
		t.Errorf("re-created TenantQuota: %+v, want %+v (its own counts only)", got, want)
	}
}

// TestUnservedTenantKeepsCounters: a TenantQuota whose spec the next
// scheduler refuses (Serving False) keeps the counters the previous one
// wrote, rather than losing them with an apply that leaves them out; once
// its spec is fixed, its counts go on from them.
func TestUnservedTenantKeepsCounters(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	ns, pool, tq := fixture(t, c)
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	reg1 := schedulerRegistry(t, c, fc, pool, tq)
	for range 6 {
		reg1.Tenant("tq-a").AddRejection()
	}
	w1 := &StatusWriter{Client: c, Registry: reg1, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	if _, err := w1.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}

	reg2 := registry.New(fc)
	if err := reg2.SetPool(PoolPolicy(pool)); err != nil {
		t.Fatal(err)
	}
	bad := TenantPolicy(getTenant(t, c, ns, "tq-a"))
	bad.MaxQueued = -1
	if err := reg2.UpsertTenant(bad); err == nil {
		t.Fatal("an invalid policy was accepted")
	}
	w2 := &StatusWriter{Client: c, Registry: reg2, State: &State{}, Namespace: ns, PoolName: "pool", Clock: fc}
	fc.Step(10 * time.Second)
	if _, err := w2.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got := getTenant(t, c, ns, "tq-a")
	if s := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionServing); s == nil || s.Status != metav1.ConditionFalse {
		t.Fatalf("Serving = %+v, want False", s)
	}
	if n, want := countsIn(&got.Status), (counts{0, 0, 6, 0, -1}); n != want {
		t.Fatalf("unserved tenant's counters %+v, want %+v (kept)", n, want)
	}

	if err := reg2.UpsertTenant(TenantPolicy(got)); err != nil {
		t.Fatal(err)
	}
	reg2.Tenant("tq-a").AddRejection()
	fc.Step(10 * time.Second)
	if _, err := w2.WriteOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n, want := countsIn(&getTenant(t, c, ns, "tq-a").Status), (counts{0, 0, 7, 0, -1}); n != want {
		t.Errorf("fixed tenant's counters %+v, want %+v", n, want)
	}
}
