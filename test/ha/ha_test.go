// Package ha runs two scheduler processes of one pool (spec.scheduler.replicas 2,
// hence settings leaderElection true) on the real local control plane with the operator
// and the provider simulator (package test/framework), both on the same durable job
// store file, and checks the high-availability contract of issue "Scheduler HA":
// exactly one process holds the pool's Lease, only that one is ready, serves the
// gateway and writes status; when the leader is killed with SIGKILL in the middle of a
// batch backlog the standby acquires the Lease within LeaseDuration + RetryPeriod (the
// controller-runtime defaults 15 s and 2 s, plus a margin), opens the store once the
// dead process's file lock is gone, recovers the queued and running jobs, and every
// submitted job ends exactly once in the record (at-least-once toward the provider); the
// tenants' status.completedJobs never goes backwards across the failover (the new leader
// carries on from what the old one wrote, losing only what it finished after its last
// write); a restarted former leader stays standby.
package ha

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/api/v1alpha1"
	"github.com/fairshare-dev/fairshare/test/framework"
)

const (
	namespace = "fairshare-ha"
	pool      = "ha"
	// leaseName is the Lease the replicas elect a leader with: the rendered objects'
	// name (render.Name, settings leaseName).
	leaseName = pool + "-scheduler"
	// jobsPerTenant jobs are submitted by each tenant, in one bulk upload each.
	jobsPerTenant = 100
	// upstreamConcurrency bounds the calls in flight, hence the jobs running at the kill.
	upstreamConcurrency = 8
	// simLatency paces the backlog: upstreamConcurrency calls per simLatency, so the
	// 200 jobs take about 200/8 x 1 s = 25 s of leader time.
	simLatency = time.Second
	// killAfterSucceeded is how many jobs the simulator must have answered before the kill.
	killAfterSucceeded = 40
	// leaseDuration and retryPeriod are the scheduler's election durations
	// (scheduler.LeaseDuration 15 s, RetryPeriod 2 s; controller-runtime's defaults).
	leaseDuration = 15 * time.Second
	retryPeriod   = 2 * time.Second
	// jitterFactor is client-go's leader election JitterFactor: a candidate retries
	// every RetryPeriod to RetryPeriod x (1 + 1.2), so at most maxRetry apart.
	jitterFactor = 1.2
	maxRetry     = retryPeriod * (10 + 10*jitterFactor) / 10
	// failoverMargin is added to the worst case of client-go's algorithm for the bound
	// on the time from the kill to the standby holding the Lease (process scheduling,
	// API latency on a loaded 2-core machine).
	failoverMargin = 2 * time.Second
	// failoverBound: the standby counts LeaseDuration from when it last saw the Lease
	// record change (observedTime), which is at most one retry after the dead leader's
	// last renewal, hence at most maxRetry after the kill; it acquires at its first
	// retry after expiry, at most maxRetry later: 15 + 4.4 + 4.4 = 23.8 s, plus the margin.
	failoverBound = leaseDuration + 2*maxRetry + failoverMargin
	// failoverFloor: the standby's observedTime is at least its last retry before the
	// kill, at most maxRetry before it, so it cannot take over earlier than
	// LeaseDuration - maxRetry = 10.6 s after the kill (it waits for expiry).
	failoverFloor = leaseDuration - maxRetry
	// standbyObservation is how long the test watches a standby stay standby: more
	// than three retry periods, so the standby has tried to acquire the Lease several
	// times.
	standbyObservation = 3*retryPeriod + time.Second
)

var tenants = []string{"alpha", "beta"}

// haScheduler is added to the pool's spec.scheduler: two replicas (hence settings
// leaderElection true) and a Volume job store that a standby can mount.
const haScheduler = `    replicas: 2
    jobStore:
      type: Volume
      accessMode: ReadWriteMany
`

func TestLeaderFailover(t *testing.T) {
	framework.RequireAssets(t, "test-ha")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	work := t.TempDir()
	logf := framework.StepLogf(t)

	st := framework.StartStack(ctx, t, work, namespace, framework.PacedSimArgs(simLatency), logf)
	bin, cp, simURL, operator := st.Bin, st.CP, st.SimURL, st.Operator

	// The manifests are the pool (two replicas, a Volume job store that a standby can mount,
	// pointed at the simulator) and two tenants. Quotas are far above what the backlog
	// uses, so its pace is set by upstreamConcurrency and the simulator's latency only.
	logf("applying the pool (replicas 2) and tenants %v", tenants)
	st.Apply(ctx, t, work, namespace, framework.SimPoolManifest(pool, simURL, 1, upstreamConcurrency, haScheduler)+
		framework.TenantQuotaManifests(pool, tenants, 1000))

	store := filepath.Join(work, "jobs.db")
	spec := framework.RenderedScheduler(ctx, t, cp, operator, namespace, leaseName, work)
	if s := spec.Settings; !s.LeaderElection || s.LeaseName != leaseName || s.Namespace != namespace {
		t.Fatalf("rendered settings leaderElection=%v leaseName=%q namespace=%q, want true %q %q",
			s.LeaderElection, s.LeaseName, s.Namespace, leaseName, namespace)
	}
	if spec.Replicas != 2 {
		t.Fatalf("rendered Deployment replicas %d, want 2", spec.Replicas)
	}
	// Two replicas with distinct ports on one job store file.
	a := framework.NewSchedulerProcess(t, spec, bin, work, "A", store)
	b := framework.NewSchedulerProcess(t, spec, bin, work, "B", store)
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range []*framework.SchedulerProcess{a, b} {
				t.Logf("scheduler %s log (tail):\n%s", p.Name, p.Tail(25))
			}
		}
	})

	// A starts first and becomes the leader; B starts once A is ready.
	a.Start(t, 1)
	a.WaitReady(ctx, t, 60*time.Second)
	if err := cp.MarkDeploymentAvailable(ctx, namespace, leaseName); err != nil {
		t.Fatal(err)
	}
	b.Start(t, 1)
	b.WaitHealthy(ctx, t, 60*time.Second)
	leader := readLease(ctx, t, cp)
	logf("A is ready and holds the Lease (holder %q, leaseDurationSeconds %d); B is up (/healthz 200)",
		leader.holder, leader.durationSeconds)
	if leader.holder == "" {
		t.Fatalf("Lease %s/%s has no holder while A is ready", namespace, leaseName)
	}
	if leader.durationSeconds != int32(leaseDuration/time.Second) {
		t.Errorf("Lease leaseDurationSeconds = %d, want %d (controller-runtime default)", leader.durationSeconds, leaseDuration/time.Second)
	}

	// Watch the standby for several retry periods: it never becomes ready, never serves
	// the gateway, and the Lease keeps A's identity.
	until := time.Now().Add(standbyObservation)
	for time.Now().Before(until) {
		assertLeaderStandby(ctx, t, cp, a, b, leader.holder)
		time.Sleep(250 * time.Millisecond)
	}
	logf("standby B for %s: /readyz non-200, gateway connection refused, Lease held by A", standbyObservation)

	// Submit the backlog through the leader.
	submitted := map[string]map[string]bool{}
	for _, tenant := range tenants {
		submitted[tenant] = framework.BulkSubmit(ctx, t, a.GatewayURL, tenant, jobsPerTenant)
	}
	total := len(tenants) * jobsPerTenant
	reportBefore := poolReportTime(ctx, t, cp)
	logf("submitted %d jobs (%d per tenant) through A", total, jobsPerTenant)
	// From now to the end, every 200 ms: the tenants' status.completedJobs never
	// decreases, whoever writes it.
	watch := watchCompleted(ctx, cp)
	defer watch.stop()

	// While the backlog drains (its figures change, so the leader writes status every
	// statusIntervalSeconds), the roles hold; kill -9 the leader once the simulator has
	// answered killAfterSucceeded jobs.
	framework.WaitSimSucceeded(ctx, t, simURL, killAfterSucceeded, a, func() {
		assertLeaderStandby(ctx, t, cp, a, b, leader.holder)
	})
	reportAfter := poolReportTime(ctx, t, cp)
	if !reportAfter.After(reportBefore) {
		t.Errorf("pool status.lastReportTime did not advance while A led the backlog (%s -> %s)", reportBefore, reportAfter)
	}
	if fm := poolStatusManagers(ctx, t, cp); len(fm) != 1 || fm[0] != v1alpha1.FieldManagerScheduler {
		t.Errorf("pool status.lastReportTime field managers %v, want only %q", fm, v1alpha1.FieldManagerScheduler)
	}
	killedAt := a.Kill(t)
	atKill := framework.GetSimStats(ctx, t, simURL)
	logf("killed A (SIGKILL): simulator had %d requests, %d succeeded; status.lastReportTime %s -> %s while A led",
		atKill.Requests, atKill.Succeeded, reportBefore.Format(time.TimeOnly), reportAfter.Format(time.TimeOnly))
	if atKill.Succeeded >= int64(total) {
		t.Fatalf("the backlog was over before the kill (%d of %d answered): slow the simulator down", atKill.Succeeded, total)
	}

	// Until B holds the Lease nobody writes status: any request A had in flight at the
	// kill has landed after a second, and B, a standby, must not write.
	time.Sleep(time.Second)
	frozen := poolReportTime(ctx, t, cp)
	written := completedJobs(ctx, t, cp) // what A wrote before it died
	var newLeader lease
	bound := failoverBound
	for {
		report := poolReportTime(ctx, t, cp) // read before the Lease: B was not leader yet if the Lease says A
		newLeader = readLease(ctx, t, cp)
		if newLeader.holder != leader.holder {
			break
		}
		if !report.Equal(frozen) {
			t.Errorf("pool status.lastReportTime moved %s -> %s while A was dead and the Lease still A's: the standby wrote status",
				frozen, report)
		}
		if time.Since(killedAt) > bound+10*time.Second {
			t.Fatalf("the Lease is still held by the dead A %s after the kill", time.Since(killedAt).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	acquiredSeen := time.Since(killedAt)
	b.WaitReady(ctx, t, storeWait)
	readyAfter := time.Since(killedAt)
	if newLeader.holder == "" {
		t.Fatal("the Lease has no holder after the failover")
	}
	// The Lease's own acquireTime (microseconds, written by B) gives the failover time
	// without the polling period; clocks are the same machine's.
	acquiredLease := newLeader.acquired.Sub(killedAt)
	logf("failover: B holds the Lease (holder %q, leaseTransitions %d) %s after the kill by its acquireTime (%s when polled), ready %s after the kill",
		newLeader.holder, newLeader.transitions, acquiredLease.Round(time.Millisecond), acquiredSeen.Round(time.Millisecond), readyAfter.Round(time.Millisecond))
	if acquiredSeen > bound {
		t.Errorf("B acquired the Lease %s after the kill, want at most LeaseDuration + 2 x RetryPeriod x (1 + JitterFactor) + margin = %s", acquiredSeen.Round(time.Millisecond), bound)
	}
	if acquiredLease < failoverFloor {
		t.Errorf("B acquired the Lease %s after the kill (acquireTime), before the dead leader's Lease could have expired (%s)", acquiredLease.Round(time.Millisecond), failoverFloor)
	}
	if newLeader.transitions != leader.transitions+1 {
		t.Errorf("leaseTransitions %d -> %d, want one transition", leader.transitions, newLeader.transitions)
	}
	if got := framework.LogMatch(t, b.LogPath(), logOpenedRE); got == "" {
		t.Errorf("B's log has no \"opened the job store\" line")
	} else {
		logf("B opened the job store (waited %s for the file lock)", got)
	}

	// B recovers and finishes the backlog.
	framework.WaitJobsFinished(ctx, t, b.GatewayURL, tenants, 90*time.Second, b)
	logf("every job is finished (%s after the kill)", time.Since(killedAt).Round(time.Millisecond))

	rec := framework.CheckRecord(ctx, t, b.GatewayURL, tenants, submitted)
	final := framework.GetSimStats(ctx, t, simURL)
	logRecovered := framework.RecoveredFromLog(t, b.LogPath())
	logf("record: %v; recovered=true: %d (B's log: wereRunning=%d); attempts: %d; simulator: %d requests, %d succeeded, %d throttled",
		rec.ByStatus, rec.Recovered, logRecovered, rec.Attempts, final.Requests, final.Succeeded, final.Throttled)
	framework.CheckAtLeastOnce(t, rec, final, total, upstreamConcurrency, logRecovered)
	if r := poolReportTime(ctx, t, cp); !r.After(frozen) {
		t.Errorf("pool status.lastReportTime %s did not advance after B became leader (frozen at %s)", r, frozen)
	}
	checkCompletedAfterFailover(ctx, t, cp, watch, written, atKill, total, logf)

	// A comes back on the same ports and store: it stays standby.
	a.Start(t, 2)
	a.WaitHealthy(ctx, t, 60*time.Second)
	until = time.Now().Add(standbyObservation)
	for time.Now().Before(until) {
		assertLeaderStandby(ctx, t, cp, b, a, newLeader.holder)
		time.Sleep(250 * time.Millisecond)
	}
	logf("restarted A stays standby for %s: /readyz non-200, gateway refused, Lease held by B", standbyObservation)

	a.Stop()
	b.Stop()
	logf("done")
}

// storeWait bounds how long the elected standby may take to become ready after the
// test saw it acquire the Lease: the store's file lock is free at once (the dead
// process's descriptors closed with it), so this is store open, recovery and the
// informers' sync, with a margin.
const storeWait = 30 * time.Second

// assertLeaderStandby checks once that leader is ready and serves the gateway, standby
// answers /readyz non-200 and refuses gateway connections, and the Lease is holder's.
func assertLeaderStandby(ctx context.Context, t *testing.T, cp *framework.ControlPlane, leader, standby *framework.SchedulerProcess, holder string) {
	t.Helper()
	if code, err := framework.GetStatus(ctx, leader.ReadyzURL, tenants[0]); err != nil || code != http.StatusOK {
		t.Fatalf("leader %s /readyz: %d %v", leader.Name, code, err)
	}
	if code, err := framework.GetStatus(ctx, leader.GatewayURL+"/v1/jobs", tenants[0]); err != nil || code == http.StatusNotFound {
		t.Fatalf("leader %s gateway: %d %v", leader.Name, code, err)
	}
	if code, err := framework.GetStatus(ctx, standby.ReadyzURL, tenants[0]); err != nil || code == http.StatusOK {
		t.Fatalf("standby %s /readyz: %d %v, want a non-200 answer", standby.Name, code, err)
	}
	if code, err := framework.GetStatus(ctx, standby.GatewayURL+"/v1/jobs", tenants[0]); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("standby %s gateway: %d %v, want connection refused", standby.Name, code, err)
	}
	if l := readLease(ctx, t, cp); l.holder != holder {
		t.Fatalf("Lease holder %q, want %q (%s)", l.holder, holder, leader.Name)
	}
}

// lease is the part of the coordination.k8s.io Lease the test reads.
type lease struct {
	holder          string
	durationSeconds int32
	transitions     int32
	acquired        time.Time
}

func readLease(ctx context.Context, t *testing.T, cp *framework.ControlPlane) lease {
	t.Helper()
	var l coordinationv1.Lease
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: leaseName}, &l); err != nil {
		t.Fatalf("Lease %s/%s: %v", namespace, leaseName, err)
	}
	var out lease
	if l.Spec.HolderIdentity != nil {
		out.holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseDurationSeconds != nil {
		out.durationSeconds = *l.Spec.LeaseDurationSeconds
	}
	if l.Spec.LeaseTransitions != nil {
		out.transitions = *l.Spec.LeaseTransitions
	}
	if l.Spec.AcquireTime != nil {
		out.acquired = l.Spec.AcquireTime.Time
	}
	return out
}

// poolReportTime returns the pool's status.lastReportTime (zero when unset).
func poolReportTime(ctx context.Context, t *testing.T, cp *framework.ControlPlane) time.Time {
	t.Helper()
	var p v1alpha1.ProviderPool
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: pool}, &p); err != nil {
		t.Fatal(err)
	}
	if p.Status.LastReportTime == nil {
		return time.Time{}
	}
	return p.Status.LastReportTime.Time
}

// poolStatusManagers returns the field managers that own status.lastReportTime of the pool.
func poolStatusManagers(ctx context.Context, t *testing.T, cp *framework.ControlPlane) []string {
	t.Helper()
	var p v1alpha1.ProviderPool
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: pool}, &p); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range p.ManagedFields {
		if mf.FieldsV1 != nil && bytes.Contains(mf.FieldsV1.Raw, []byte(`"f:lastReportTime"`)) {
			out = append(out, mf.Manager)
		}
	}
	return out
}

// logOpenedRE matches the scheduler's "opened the job store" log line; the submatch
// is how long it waited for the store's file lock.
var logOpenedRE = regexp.MustCompile(`"opened the job store".*"waited":\s*"([^"]*)"`)

// completedJobs returns each tenant's status.completedJobs (0 when unset).
func completedJobs(ctx context.Context, t *testing.T, cp *framework.ControlPlane) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, tenant := range tenants {
		var tq v1alpha1.TenantQuota
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: tenant}, &tq); err != nil {
			t.Fatal(err)
		}
		if c := tq.Status.CompletedJobs; c != nil {
			out[tenant] = *c
		}
	}
	return out
}

// completedWatch samples the tenants' status.completedJobs every 200 ms and records
// every decrease between two samples.
type completedWatch struct {
	mu        sync.Mutex
	decreases []string
	samples   int
	done      chan struct{}
	wg        sync.WaitGroup
}

func watchCompleted(ctx context.Context, cp *framework.ControlPlane) *completedWatch {
	w := &completedWatch{done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		last := map[string]int64{}
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, tenant := range tenants {
				var tq v1alpha1.TenantQuota
				if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: tenant}, &tq); err != nil || tq.Status.CompletedJobs == nil {
					continue
				}
				v := *tq.Status.CompletedJobs
				w.mu.Lock()
				w.samples++
				if prev, ok := last[tenant]; ok && v < prev {
					w.decreases = append(w.decreases, fmt.Sprintf("%s %d -> %d at %s", tenant, prev, v, time.Now().Format(time.TimeOnly)))
				}
				w.mu.Unlock()
				last[tenant] = v
			}
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// stop ends the sampling (idempotent) and waits for it.
func (w *completedWatch) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.wg.Wait()
}

// checkCompletedAfterFailover checks the tenants' status.completedJobs once every job is
// finished: it never decreased (watch); it reaches what A wrote before the kill (written)
// plus what B finished, that is total minus what A finished and never wrote (at most
// the jobs the simulator had answered at the kill, atKill.Succeeded, minus written), and
// at most total; each tenant's at least what A wrote for it plus one and at most
// jobsPerTenant.
func checkCompletedAfterFailover(ctx context.Context, t *testing.T, cp *framework.ControlPlane, watch *completedWatch,
	written map[string]int64, atKill framework.SimStats, total int, logf func(string, ...any)) {
	t.Helper()
	var sumWritten int64
	for _, v := range written {
		sumWritten += v
	}
	floor := int64(total) - (atKill.Succeeded - sumWritten)
	var got map[string]int64
	var sum int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, sum = completedJobs(ctx, t, cp), 0
		for _, v := range got {
			sum += v
		}
		if sum >= floor || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	watch.stop()
	logf("status.completedJobs: %v written by A before the kill, %v once every job finished (sum %d of %d jobs: %d finished by A after its last write, lost); %d samples",
		written, got, sum, total, int64(total)-sum, watch.samples)
	if sumWritten == 0 {
		t.Errorf("A wrote no status.completedJobs before the kill (%v): the failover check proves nothing", written)
	}
	if len(watch.decreases) > 0 {
		t.Errorf("status.completedJobs went backwards: %v", watch.decreases)
	}
	if sum < floor || sum > int64(total) {
		t.Errorf("status.completedJobs sum %d, want between %d (%d jobs minus the %d the simulator had answered at the kill beyond the %d A wrote) and %d",
			sum, floor, total, atKill.Succeeded-sumWritten, sumWritten, total)
	}
	for _, tenant := range tenants {
		if got[tenant] <= written[tenant] || got[tenant] > jobsPerTenant {
			t.Errorf("tenant %s status.completedJobs %d, want more than the %d A wrote and at most %d", tenant, got[tenant], written[tenant], jobsPerTenant)
		}
	}
}
