package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/internal/registry"
)

// statusBench is the 10k-tenant scenario, set up and measured once per
// process (the benchmark function runs several times with growing b.N).
var statusBench struct {
	once    sync.Once
	err     error
	w       *StatusWriter
	fc      *clocktesting.FakeClock
	reg     *registry.Registry
	metrics map[string]float64
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStatusWriter10k: 10,000 TenantQuotas on the envtest API server,
// a registry serving them and the status writer on a fake clock (issue 6).
// Setup writes every status once (10,001 writes paced at 5/s: 2,000
// simulated seconds). Then, reported as metrics:
//   - idle-writes/s: writes per simulated second over 30 idle minutes
//     (expected: the pool's heartbeat only, 6 / 1,800 s);
//   - churn-writes/s: over 300 simulated seconds with 1,000 tenants
//     changing before every 10 s pass;
//   - max-writes/s: the most writes in any simulated [t, t+1 s) of the run;
//   - status-B, object-B: the largest status and the largest object (as
//     the API server returns it, managedFields included) among the pool and
//     the tenants after the churn;
//   - idle-ms/pass, idle-cpu-ms/pass, churn-ms/pass, churn-cpu-ms/pass: wall
//     time and this process's CPU time (user+system; the API server is
//     another process) per pass.
//
// The timed loop runs idle passes: ns/op is the wall time of one.
func BenchmarkStatusWriter10k(b *testing.B) {
	if cfg == nil {
		b.Skip("KUBEBUILDER_ASSETS is not set: no API server for envtest")
	}
	sb := &statusBench
	sb.once.Do(func() { sb.err = setupStatusBench(b) })
	if sb.err != nil {
		b.Fatal(sb.err)
	}
	b.ResetTimer()
	for range b.N {
		start := sb.fc.Now()
		if _, err := sb.w.Pass(context.Background(), sb.w.interval()); err != nil {
			b.Fatal(err)
		}
		sb.fc.SetTime(start.Add(sb.w.interval()))
	}
	b.StopTimer()
	for k, v := range sb.metrics {
		b.ReportMetric(v, k)
	}
}

func setupStatusBench(b *testing.B) error {
	const n, churnPerPass = 10000, 1000
	sb := &statusBench
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	t0 := time.Now().UTC().Truncate(time.Second)
	fc := clocktesting.NewFakeClock(t0)
	setup := time.Now()
	ns, reg, tqs := manyTenants(b, c, fc, n)
	created := time.Since(setup)
	log := &writeLog{clk: fc}
	w := &StatusWriter{Client: countingClient{Client: c, log: log}, Registry: reg, State: &State{}, Namespace: ns,
		PoolName: "pool", Clock: fc}
	sb.w, sb.fc, sb.reg = w, fc, reg

	initial := time.Now()
	passes := 0
	for dirty := 1; dirty > 0; passes++ {
		start := fc.Now()
		r, err := w.Pass(context.Background(), w.interval())
		if err != nil {
			return err
		}
		dirty = r.Dirty
		fc.SetTime(start.Add(w.interval()))
	}
	// Every object once, plus the pool's heartbeat every 5 minutes.
	if want := n + 1 + int(fc.Now().Sub(t0)/DefaultForceRefresh) - 1; log.len() < n+1 || log.len() > want+1 {
		return fmt.Errorf("initial writes = %d, want %d..%d", log.len(), n+1, want+1)
	}
	b.Logf("setup: %d creates in %v; initial %d writes in %d passes (%v simulated) in %v",
		n, created.Round(time.Millisecond), log.len(), passes, fc.Now().Sub(t0), time.Since(initial).Round(time.Millisecond))

	// Idle: 30 simulated minutes.
	mark := log.len()
	idleStart := fc.Now()
	wall, cpu := time.Now(), cpuTime()
	idlePasses := 0
	for fc.Now().Before(idleStart.Add(30 * time.Minute)) {
		start := fc.Now()
		if _, err := w.Pass(context.Background(), w.interval()); err != nil {
			return err
		}
		fc.SetTime(start.Add(w.interval()))
		idlePasses++
	}
	idleWall, idleCPU := time.Since(wall), cpuTime()-cpu
	idleWrites := log.len() - mark

	// Churn: 1,000 tenants change before every pass, for 300 s.
	mark = log.len()
	churnStart := fc.Now()
	wall, cpu = time.Now(), cpuTime()
	churnPasses := 0
	for fc.Now().Before(churnStart.Add(300 * time.Second)) {
		for i := range churnPerPass {
			reg.Tenant(tqs[(churnPasses*churnPerPass+i)%n].Name).AddRejection()
		}
		start := fc.Now()
		if _, err := w.Pass(context.Background(), w.interval()); err != nil {
			return err
		}
		fc.SetTime(start.Add(w.interval()))
		churnPasses++
	}
	churnWall, churnCPU := time.Since(wall), cpuTime()-cpu
	churnWrites := log.len() - mark

	// Sizes on the API server.
	maxStatus, maxObject := 0, 0
	for _, kind := range []string{"TenantQuotaList", "ProviderPoolList"} {
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion(v1alpha1.GroupVersion.String())
		l.SetKind(kind)
		if err := c.List(context.Background(), l, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, it := range l.Items {
			sj, _ := json.Marshal(it.Object["status"])
			oj, _ := json.Marshal(it.Object)
			maxStatus, maxObject = max(maxStatus, len(sj)), max(maxObject, len(oj))
		}
	}
	sb.metrics = map[string]float64{
		"idle-writes/s":     float64(idleWrites) / (30 * time.Minute).Seconds(),
		"churn-writes/s":    float64(churnWrites) / 300,
		"max-writes/s":      float64(maxPerSecond(log.since(0))),
		"status-B":          float64(maxStatus),
		"object-B":          float64(maxObject),
		"idle-ms/pass":      float64(idleWall.Microseconds()) / 1000 / float64(idlePasses),
		"idle-cpu-ms/pass":  float64(idleCPU.Microseconds()) / 1000 / float64(idlePasses),
		"churn-ms/pass":     float64(churnWall.Microseconds()) / 1000 / float64(churnPasses),
		"churn-cpu-ms/pass": float64(churnCPU.Microseconds()) / 1000 / float64(churnPasses),
	}
	b.Logf("idle: %d writes in %d passes; churn: %d writes in %d passes", idleWrites, idlePasses, churnWrites, churnPasses)
	return nil
}
