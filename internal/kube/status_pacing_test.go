package kube

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// writeLog records every status write a client sends: the writer's clock
// time and the object's name.
type writeLog struct {
	mu     sync.Mutex
	clk    *clocktesting.FakeClock
	writes []loggedWrite
}

type loggedWrite struct {
	at   time.Time
	name string
}

// countingClient passes everything to the API server and logs status
// patches.
type countingClient struct {
	client.Client
	log *writeLog
}

func (c countingClient) Status() client.SubResourceWriter {
	return countingStatus{SubResourceWriter: c.Client.Status(), log: c.log}
}

type countingStatus struct {
	client.SubResourceWriter
	log *writeLog
}

func (s countingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	err := s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	if err == nil {
		s.log.mu.Lock()
		s.log.writes = append(s.log.writes, loggedWrite{at: s.log.clk.Now(), name: obj.GetName()})
		s.log.mu.Unlock()
	}
	return err
}

// since returns the writes logged from index i on.
func (l *writeLog) since(i int) []loggedWrite {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]loggedWrite(nil), l.writes[i:]...)
}

func (l *writeLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.writes)
}

// maxPerSecond is the largest number of writes in any half-open window
// [t, t+1s).
func maxPerSecond(ws []loggedWrite) int {
	ts := make([]time.Time, len(ws))
	for i, w := range ws {
		ts[i] = w.at
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= time.Second {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// manyTenants creates a namespace with pool "pool" and n TenantQuotas
// "tq-00000".. (16 at a time), and a registry serving them.
func manyTenants(tb testing.TB, c client.Client, fc *clocktesting.FakeClock, n int) (string, *registry.Registry, []*v1alpha1.TenantQuota) {
	tb.Helper()
	ctx := context.Background()
	nsSeq++
	ns := fmt.Sprintf("status-many-%d-%d", time.Now().UnixNano()%100000, nsSeq)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		tb.Fatal(err)
	}
	pool := &v1alpha1.ProviderPool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: v1alpha1.ProviderPoolSpec{Upstream: v1alpha1.UpstreamSpec{BaseURL: "http://127.0.0.1:9"},
			Models: []v1alpha1.ModelSpec{{Name: "gpt-test"}}}}
	if err := c.Create(ctx, pool); err != nil {
		tb.Fatal(err)
	}
	reg := registry.New(fc)
	if err := reg.SetPool(PoolPolicy(pool)); err != nil {
		tb.Fatal(err)
	}
	tqs := make([]*v1alpha1.TenantQuota, n)
	jobs := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				wpm := int64(60000)
				tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("tq-%05d", i), Namespace: ns},
					Spec: v1alpha1.TenantQuotaSpec{PoolRef: v1alpha1.PoolRef{Name: "pool"}, Tokens: &v1alpha1.TokenLimits{WeightedPerMinute: &wpm}}}
				if err := c.Create(ctx, tq); err != nil {
					select {
					case errs <- err:
					default:
					}
					continue
				}
				tqs[i] = tq
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		tb.Fatal(err)
	default:
	}
	for _, tq := range tqs {
		if err := reg.UpsertTenant(TenantPolicy(tq)); err != nil {
			tb.Fatal(err)
		}
	}
	return ns, reg, tqs
}

// runPasses runs a pass at every Interval on the fake clock from its
// current time until end (exclusive), calling before(k) ahead of pass k.
// It returns the writes and the dirty count after the last pass.
func runPasses(tb testing.TB, w *StatusWriter, fc *clocktesting.FakeClock, end time.Time, before func(k int)) (writes, dirty int) {
	tb.Helper()
	ctx := context.Background()
	for k := 0; fc.Now().Before(end); k++ {
		start := fc.Now()
		if before != nil {
			before(k)
		}
		r, err := w.Pass(ctx, w.interval())
		if err != nil {
			tb.Fatal(err)
		}
		writes, dirty = writes+r.Writes, r.Dirty
		if next := start.Add(w.interval()); fc.Now().After(next) {
			tb.Fatalf("pass %d ran past the next pass: %v > %v", k, fc.Now(), next)
		} else {
			fc.SetTime(next)
		}
	}
	return writes, dirty
}

// TestStatusWriterIdleWritesOnlyHeartbeat: with N tenants and nothing
// changing, 30 simulated minutes cost exactly the pool's heartbeats (one per
// 5 minutes), whatever N; tenant statuses are not rewritten (issue 6).
func TestStatusWriterIdleWritesOnlyHeartbeat(t *testing.T) {
	c := newClient(t)
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	const n = 40
	ns, reg, _ := manyTenants(t, c, fc, n)
	log := &writeLog{clk: fc}
	w := &StatusWriter{Client: countingClient{Client: c, log: log}, Registry: reg, State: &State{}, Namespace: ns,
		PoolName: "pool", Clock: fc}

	// First pass: the pool and every tenant, 41 writes 200 ms apart (8.2 s,
	// within one 10 s Interval).
	if writes, dirty := runPasses(t, w, fc, t0.Add(10*time.Second), nil); writes != n+1 || dirty != 0 {
		t.Fatalf("first pass: %d writes, %d dirty; want %d, 0", writes, dirty, n+1)
	}
	first := log.since(0)
	if first[0].name != "pool" || !first[0].at.Equal(t0) || !first[n].at.Equal(t0.Add(time.Duration(n)*200*time.Millisecond)) {
		t.Errorf("first pass writes: pool first at t0, then 200 ms apart; got first %+v, last %+v", first[0], first[n])
	}

	mark := log.len()
	writes, dirty := runPasses(t, w, fc, t0.Add(30*time.Minute+10*time.Second), nil)
	got := log.since(mark)
	var want []loggedWrite
	for m := 5; m <= 30; m += 5 {
		want = append(want, loggedWrite{at: t0.Add(time.Duration(m) * time.Minute), name: "pool"})
	}
	if writes != 6 || dirty != 0 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("idle 30 min: %d writes, %d dirty: %v; want exactly %v", writes, dirty, got, want)
	}
	var pool v1alpha1.ProviderPool
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "pool"}, &pool); err != nil {
		t.Fatal(err)
	}
	if lr := pool.Status.LastReportTime; lr == nil || !lr.Time.Equal(t0.Add(30*time.Minute)) {
		t.Errorf("pool lastReportTime = %v, want %v", lr, t0.Add(30*time.Minute))
	}
	var tq v1alpha1.TenantQuota
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "tq-00039"}, &tq); err != nil {
		t.Fatal(err)
	}
	if lr := tq.Status.LastReportTime; lr == nil || !lr.Time.Equal(t0.Add(8*time.Second)) {
		t.Errorf("tenant lastReportTime = %v, want its only write at %v", lr, t0.Add(8*time.Second))
	}

	// A restarted scheduler (a fresh writer) finds every status already on
	// the API server and writes nothing but the pool's heartbeat when due.
	w2 := &StatusWriter{Client: countingClient{Client: c, log: log}, Registry: reg, State: &State{}, Namespace: ns,
		PoolName: "pool", Clock: fc}
	mark = log.len()
	if writes, dirty := runPasses(t, w2, fc, fc.Now().Add(5*time.Minute), nil); writes != 1 || dirty != 0 {
		t.Errorf("fresh writer over 5 min: %d writes (%v), %d dirty; want 1 (the pool's heartbeat)", writes, log.since(mark), dirty)
	}
}

// TestStatusWriterChurnIsPacedAndCoalesced: with a third of 300 tenants
// changing before every pass, no simulated second holds more than 5
// writes, a saturated pass writes exactly 50 (10 s x 5/s), and once the
// churn stops every tenant's status on the API server carries its latest
// figures, within dirty/rate (issue 6).
func TestStatusWriterChurnIsPacedAndCoalesced(t *testing.T) {
	c := newClient(t)
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	const n = 300
	ns, reg, tqs := manyTenants(t, c, fc, n)
	log := &writeLog{clk: fc}
	w := &StatusWriter{Client: countingClient{Client: c, log: log}, Registry: reg, State: &State{}, Namespace: ns,
		PoolName: "pool", Clock: fc}

	// Initial: 301 writes at 50 per pass take 7 passes.
	writes, dirty := runPasses(t, w, fc, t0.Add(70*time.Second), nil)
	if writes != n+1 || dirty != 0 {
		t.Fatalf("initial: %d writes, %d dirty; want %d, 0", writes, dirty, n+1)
	}

	changes := 0
	perPass := []int{}
	mark := log.len()
	end := fc.Now().Add(200 * time.Second)
	for fc.Now().Before(end) {
		k := len(perPass)
		for i := range n / 3 {
			reg.Tenant(tqs[(k*(n/3)+i)%n].Name).AddRejection()
			changes++
		}
		wr, _ := runPasses(t, w, fc, fc.Now().Add(time.Second), nil)
		perPass = append(perPass, wr)
	}
	for k, wr := range perPass {
		if wr != 50 {
			t.Errorf("churn pass %d: %d writes, want 50 (10 s x 5/s)", k, wr)
		}
	}
	churn := log.since(mark)
	if m := maxPerSecond(log.since(0)); m != 5 {
		t.Errorf("max writes in one simulated second = %d, want 5", m)
	}
	tenantWrites := 0
	for _, wr := range churn {
		if wr.name != "pool" {
			tenantWrites++
		}
	}
	if tenantWrites >= changes {
		t.Errorf("tenant writes %d >= changes %d: nothing coalesced", tenantWrites, changes)
	}

	// Drain: the remaining dirty tenants are written within dirty/rate.
	_, dirty = runPasses(t, w, fc, fc.Now().Add(10*time.Second), nil)
	drainStart := fc.Now()
	for passes := 0; dirty > 0; passes++ {
		if passes > n/50+1 {
			t.Fatalf("still %d dirty after %d passes", dirty, passes)
		}
		_, dirty = runPasses(t, w, fc, fc.Now().Add(time.Second), nil)
	}
	t.Logf("drained in %v", fc.Now().Sub(drainStart))
	var list v1alpha1.TenantQuotaList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, tq := range list.Items {
		got := tq.Status.Rejections
		snap := rejectionsOf(reg, tq.Name)
		if got == nil || *got != snap {
			t.Errorf("%s: rejections on the API server %v, registry %d", tq.Name, got, snap)
		}
	}
}

func rejectionsOf(reg *registry.Registry, name string) int64 {
	for _, ts := range reg.Snapshot(time.Now()).Tenants {
		if ts.Name == name {
			return ts.Rejections
		}
	}
	return -1
}

// TestStatusWriterFlipJumpsAhead: with 200 tenants dirty, a tenant whose
// Throttled condition flips is written right after the pool, ahead of
// tenants dirty for longer; the flip keeps the time the scheduler first saw
// it.
func TestStatusWriterFlipJumpsAhead(t *testing.T) {
	c := newClient(t)
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	const n = 200
	ns, reg, tqs := manyTenants(t, c, fc, n)
	log := &writeLog{clk: fc}
	w := &StatusWriter{Client: countingClient{Client: c, log: log}, Registry: reg, State: &State{}, Namespace: ns,
		PoolName: "pool", Clock: fc}
	if writes, _ := runPasses(t, w, fc, t0.Add(50*time.Second), nil); writes != n+1 {
		t.Fatalf("initial: %d writes, want %d", writes, n+1)
	}

	// Every tenant changes; one pass writes the pool (its status.usageTiers
	// now counts 200 active tenants of the tier) and 49 of them.
	for _, tq := range tqs {
		reg.Tenant(tq.Name).AddRejection()
	}
	mark := log.len()
	runPasses(t, w, fc, fc.Now().Add(time.Second), nil)
	if got := log.since(mark); len(got) != 50 || got[0].name != "pool" || got[1].name != "tq-00000" || got[49].name != "tq-00048" {
		t.Fatalf("first churn pass wrote %d (%v..); want pool, tq-00000..tq-00048", len(got), got[0])
	}

	// tq-00199 (dirty for one pass, last in line) is suspended: Throttled
	// flips to True.
	flipSeen := fc.Now()
	last := tqs[n-1].DeepCopy()
	zero := int64(0)
	last.Spec.Tokens.WeightedPerMinute = &zero
	if err := reg.UpsertTenant(TenantPolicy(last)); err != nil {
		t.Fatal(err)
	}
	mark = log.len()
	runPasses(t, w, fc, fc.Now().Add(time.Second), nil)
	got := log.since(mark)
	if len(got) != 50 || got[0].name != "pool" && got[0].name != last.Name {
		t.Fatalf("pass after the flip: %v", got)
	}
	idx := -1
	for i, wr := range got {
		if wr.name == last.Name {
			idx = i
		}
	}
	wantIdx := 0
	if got[0].name == "pool" {
		wantIdx = 1
	}
	if idx != wantIdx {
		t.Errorf("flipped tenant written at position %d of the pass, want %d (right after the pool): %v", idx, wantIdx, got[:3])
	}
	var tq v1alpha1.TenantQuota
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(last), &tq); err != nil {
		t.Fatal(err)
	}
	th := meta.FindStatusCondition(tq.Status.Conditions, v1alpha1.ConditionThrottled)
	if th == nil || th.Status != metav1.ConditionTrue || !th.LastTransitionTime.Time.Equal(flipSeen) {
		t.Errorf("Throttled = %+v, want True since %v", th, flipSeen)
	}
}
