// Package restart kills a pool's scheduler process with SIGKILL in the middle of a batch
// import and starts it again on the same durable job store (--job-store), on the real
// local control plane with the operator and the provider simulator (package
// test/framework), then checks the job record: every submitted job is there exactly
// once, finished, and the provider saw each job at least once and at most once more per
// job that was running at the kill (issue "Durable job store": jobs that were running
// are requeued and marked as retried, at-least-once toward the provider).
package restart

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fairshare-dev/fairshare/test/framework"
)

const (
	namespace = "fairshare-restart"
	pool      = "restart"
	// jobsPerTenant jobs are submitted by each of tenants, in one bulk upload each.
	jobsPerTenant = 100
	// upstreamConcurrency bounds the calls in flight, hence the jobs running at the kill.
	upstreamConcurrency = 8
	// simLatency paces the import: upstreamConcurrency calls per simLatency, so the
	// 200 jobs take about 200/8 x 1 s = 25 s.
	simLatency = time.Second
	// killAfterSucceeded is how many jobs the simulator must have answered before the kill.
	killAfterSucceeded = 60
)

var tenants = []string{"alpha", "beta"}

func TestKillSchedulerMidImport(t *testing.T) {
	framework.RequireAssets(t, "test-restart")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	work := t.TempDir()
	logf := framework.StepLogf(t)

	st := framework.StartStack(ctx, t, work, namespace, framework.PacedSimArgs(simLatency), logf)
	bin, cp, simURL, operator := st.Bin, st.CP, st.SimURL, st.Operator

	// The manifests are the pool (pointed at the simulator) and the two tenants. The pool's
	// model quota hint and the simulator's quota are far above what the import uses, so the
	// pace is set by upstreamConcurrency and the simulator's latency only (no 429s).
	logf("applying the pool and tenants %v", tenants)
	st.Apply(ctx, t, work, namespace, framework.SimPoolManifest(pool, simURL, 2, upstreamConcurrency, "")+
		framework.TenantQuotaManifests(pool, tenants, 1000))

	spec := framework.RenderedScheduler(ctx, t, cp, operator, namespace, pool+"-scheduler", work)
	if spec.Settings.UpstreamConcurrency != upstreamConcurrency {
		t.Fatalf("rendered upstreamConcurrency %d, want %d", spec.Settings.UpstreamConcurrency, upstreamConcurrency)
	}
	// One process, run twice on the same ports and job store.
	sched := framework.NewSchedulerProcess(t, spec, bin, work, "", filepath.Join(work, "jobs.db"))
	logf("scheduler as rendered by the operator, run locally: %s", strings.Join(sched.Args(), " "))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("first scheduler log (tail):\n%s\nsecond scheduler log (tail):\n%s",
				framework.TailFile(sched.RunLogPath(1), 20), framework.TailFile(sched.RunLogPath(2), 40))
		}
	})

	sched.Start(t, 1)
	sched.WaitReady(ctx, t, 60*time.Second)
	if err := cp.MarkDeploymentAvailable(ctx, namespace, pool+"-scheduler"); err != nil {
		t.Fatal(err)
	}

	// Submit the import: one bulk NDJSON upload per tenant.
	submitted := map[string]map[string]bool{} // tenant -> job id -> true
	for _, tenant := range tenants {
		submitted[tenant] = framework.BulkSubmit(ctx, t, sched.GatewayURL, tenant, jobsPerTenant)
	}
	total := len(tenants) * jobsPerTenant
	logf("submitted %d jobs (%d per tenant)", total, jobsPerTenant)

	// Kill -9 once some jobs have succeeded.
	framework.WaitSimSucceeded(ctx, t, simURL, killAfterSucceeded, sched, nil)
	runningBefore := 0
	for _, tenant := range tenants {
		runningBefore += len(framework.ListJobs(ctx, t, sched.GatewayURL, tenant, "running", 1000))
	}
	sched.Kill(t)
	atKill := framework.GetSimStats(ctx, t, simURL)
	logf("killed the scheduler (SIGKILL): simulator had %d requests, %d succeeded; %d jobs were listed running just before",
		atKill.Requests, atKill.Succeeded, runningBefore)
	if atKill.Succeeded >= int64(total) {
		t.Fatalf("the import was over before the kill (%d of %d answered): slow the simulator down", atKill.Succeeded, total)
	}

	sched.Start(t, 2)
	sched.WaitReady(ctx, t, 60*time.Second)
	logf("restarted the scheduler on the same job store")

	// Wait until no job is queued or running.
	framework.WaitJobsFinished(ctx, t, sched.GatewayURL, tenants, 90*time.Second, sched)
	logf("every job is finished")

	// The record: every submitted id exactly once, in the unfiltered list and in exactly
	// one status list, and nothing else.
	rec := framework.CheckRecord(ctx, t, sched.GatewayURL, tenants, submitted)
	final := framework.GetSimStats(ctx, t, simURL)
	logRecovered := framework.RecoveredFromLog(t, sched.LogPath())
	logf("record: %v; recovered=true: %d (scheduler log: wereRunning=%d); attempts: %d; simulator: %d requests, %d succeeded, %d throttled",
		rec.ByStatus, rec.Recovered, logRecovered, rec.Attempts, final.Requests, final.Succeeded, final.Throttled)

	// Only the jobs running at the kill are recovered: at most the pool's upstream
	// concurrency, and at least one (the kill came while the import was in flight, with
	// upstreamConcurrency calls of simLatency each outstanding). At-least-once toward
	// the provider: every succeeded job reached it; only a recovered job may have
	// reached it twice.
	framework.CheckAtLeastOnce(t, rec, final, total, upstreamConcurrency, logRecovered)
	sched.Stop()
	logf("done")
}
