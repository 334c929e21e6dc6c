package chaos

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/fairshare-dev/fairshare/test/framework"
)

// statusWrites returns the API server's count of writes (apiserver_request_total, verbs
// APPLY, PATCH, PUT, POST) to the status subresource of providerpools and tenantquotas,
// read with the admin client (not through the scheduler's proxy).
func statusWrites(ctx context.Context, t testing.TB, cs *kubernetes.Clientset) float64 {
	t.Helper()
	body, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("scraping the API server's metrics: %v", err)
	}
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `subresource="status"`) {
			continue
		}
		if !strings.Contains(line, `resource="providerpools"`) && !strings.Contains(line, `resource="tenantquotas"`) {
			continue
		}
		write := false
		for _, v := range []string{"APPLY", "PATCH", "PUT", "POST"} {
			if strings.Contains(line, `verb="`+v+`"`) {
				write = true
			}
		}
		if !write {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("parsing %q: %v", line, err)
		}
		total += v
	}
	return total
}

// TestAPIServerOutage cuts the scheduler off the API server for outage while traffic
// flows, with a TCP proxy on 127.0.0.1 between the scheduler and the API server (the
// scheduler's kubeconfig points at the proxy; etcd, the API server and the operator
// stay up; envtest's API server cannot be stopped and started again in place on the
// same port and certificates). The pool has one replica, so the scheduler runs without
// leader election (rendered leaderElection: false). It checks:
//
//   - during the outage the process keeps running and serving on the last known
//     policy: the unlimited tenant's calls all answer 200; the limited tenant (2
//     requests a minute, burst 3) gets exactly 3 of 10 back-to-back calls admitted and
//     7 refused 429 request_rate_limit; a bulk of jobs submitted during the outage
//     (after the calls) drains (every job succeeded) before it ends;
//   - after the proxy is restored, status writes resume (the tenants' status shows the
//     outage's figures: completedJobs, rejections) and no sampled window of d seconds
//     holds more than floor(5 d) + 1 status writes (the writer's bound,
//     DefaultMaxWritesPerSecond 5 with burst 1).
func TestAPIServerOutage(t *testing.T) {
	framework.RequireAssets(t, "test-chaos")
	const (
		namespace, pool = "fairshare-chaos-apiserver", "chaos-apiserver"
		outage          = 60 * time.Second
		jobsInOutage    = 30
		limitedCalls    = 10
		limitedBurst    = 3
	)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	work := t.TempDir()
	logf := framework.StepLogf(t)
	st := framework.StartStack(ctx, t, work, namespace, framework.PacedSimArgs(50*time.Millisecond), logf)
	st.Apply(ctx, t, work, namespace, framework.SimPoolManifest(pool, st.SimURL, 2, 8, "")+
		tenantQuota("open", pool, "  batch:\n    maxQueuedJobs: 1000\n")+
		tenantQuota("limited", pool, fmt.Sprintf("  requests:\n    perMinute: 2\n    burst: %d\n", limitedBurst)))
	spec := framework.RenderedScheduler(ctx, t, st.CP, st.Operator, namespace, pool+"-scheduler", work)
	for _, a := range spec.Args {
		if strings.Contains(a, "leader-elect") {
			t.Logf("scheduler argument %s", a)
		}
	}
	if spec.Settings.LeaderElection {
		t.Fatalf("rendered leaderElection true for %d replicas; this test covers the single replica", spec.Replicas)
	}

	// The scheduler reaches the API server only through the proxy.
	apiURL, err := url.Parse(st.CP.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := framework.StartCutProxy(t, apiURL.Host)
	viaProxy := filepath.Join(work, "kubeconfig-proxy")
	if err := framework.KubeconfigVia(st.CP.Kubeconfig, viaProxy, proxy.Addr); err != nil {
		t.Fatal(err)
	}
	spec.Env = append(spec.Env, "KUBECONFIG="+viaProxy) // the last KUBECONFIG wins
	sched := framework.NewSchedulerProcess(t, spec, st.Bin, work, "", filepath.Join(work, "jobs.db"))
	sched.Start(t, 1)
	sched.WaitReady(ctx, t, 60*time.Second)
	if err := st.CP.MarkDeploymentAvailable(ctx, namespace, pool+"-scheduler"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("scheduler log (tail):\n%s", sched.Tail(40))
		}
	})
	cs, err := kubernetes.NewForConfig(st.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	// Converged before the cut: the tenants' status is written.
	waitFor(t, 60*time.Second, "tenants' status written", func() string {
		for _, n := range []string{"open", "limited"} {
			if tq := getTQ(ctx, t, st.CP.Client, namespace, n); tq.Status.LastReportTime == nil {
				return n + " has no status yet"
			}
		}
		return ""
	})
	before := getTQ(ctx, t, st.CP.Client, namespace, "open")
	beforeLimited := getTQ(ctx, t, st.CP.Client, namespace, "limited")

	logf("cutting the scheduler off the API server for %s", outage)
	proxy.Cut()
	cutAt := time.Now()
	writesAtCut := statusWrites(ctx, t, cs)

	// The open tenant: one call a second for the first 20 s.
	openOK := 0
	for i := range 20 {
		if code, reason := post(ctx, t, sched.GatewayURL, "open", chat(8, false)); code == http.StatusOK {
			openOK++
		} else {
			t.Errorf("outage call %d of tenant open: %d %s, want 200", i, code, reason)
		}
		time.Sleep(time.Second)
	}
	// The limited tenant: back-to-back calls, 30 s into the outage.
	time.Sleep(time.Until(cutAt.Add(30 * time.Second)))
	admitted, refused := 0, 0
	for i := range limitedCalls {
		switch code, reason := post(ctx, t, sched.GatewayURL, "limited", chat(8, false)); {
		case code == http.StatusOK:
			admitted++
		case code == http.StatusTooManyRequests && reason == "request_rate_limit":
			refused++
		default:
			t.Errorf("outage call %d of tenant limited: %d %s", i, code, reason)
		}
	}
	if admitted != limitedBurst || refused != limitedCalls-limitedBurst {
		t.Errorf("limited tenant during the outage: %d admitted, %d refused; want %d and %d", admitted, refused, limitedBurst, limitedCalls-limitedBurst)
	}
	// Jobs submitted during the outage (after the calls: a backlog of jobs may hold all
	// of the pool's upstream slots, and an interactive call then gets 503
	// pool_concurrency_limit, which is not what this test measures); they drain before
	// the outage ends.
	submitted := framework.BulkSubmit(ctx, t, sched.GatewayURL, "open", jobsInOutage)
	succeeded := 0
	waitFor(t, time.Until(cutAt.Add(outage-2*time.Second)), "jobs drained during the outage", func() string {
		succeeded = len(framework.ListJobs(ctx, t, sched.GatewayURL, "open", "succeeded", 1000))
		if succeeded != jobsInOutage {
			return fmt.Sprintf("%d of %d succeeded", succeeded, len(submitted))
		}
		return ""
	})
	if exited, err := sched.Exited(); exited {
		t.Fatalf("the scheduler exited during the outage: %v", err)
	}
	if code, err := framework.GetStatus(ctx, sched.ReadyzURL, ""); err != nil || code != http.StatusOK {
		t.Errorf("readyz during the outage: %d %v, want 200", code, err)
	}
	writesInOutage := statusWrites(ctx, t, cs) - writesAtCut
	time.Sleep(time.Until(cutAt.Add(outage)))
	logf("outage: open %d/20 calls 200; limited %d admitted, %d refused; %d jobs succeeded; %v status writes reached the API server (the operator's)",
		openOK, admitted, refused, succeeded, writesInOutage)

	proxy.Restore()
	restoredAt := time.Now()
	logf("restored the scheduler's connection to the API server")
	// Sample the status writes every second for 30 s; check each window and that the
	// tenants' status catches up.
	type sample struct {
		at     time.Time
		writes float64
	}
	samples := []sample{{restoredAt, statusWrites(ctx, t, cs)}}
	caughtUp := time.Duration(0)
	for time.Since(restoredAt) < 30*time.Second {
		time.Sleep(time.Second)
		samples = append(samples, sample{time.Now(), statusWrites(ctx, t, cs)})
		if caughtUp == 0 {
			o := getTQ(ctx, t, st.CP.Client, namespace, "open")
			l := getTQ(ctx, t, st.CP.Client, namespace, "limited")
			if deref(o.Status.CompletedJobs) == max(deref(before.Status.CompletedJobs), 0)+jobsInOutage &&
				deref(l.Status.Rejections) == max(deref(beforeLimited.Status.Rejections), 0)+int64(refused) {
				caughtUp = time.Since(restoredAt)
			}
		}
	}
	maxRate, total := 0.0, samples[len(samples)-1].writes-samples[0].writes
	var perSecond []string
	for i := 1; i < len(samples); i++ {
		d := samples[i].at.Sub(samples[i-1].at).Seconds()
		n := samples[i].writes - samples[i-1].writes
		perSecond = append(perSecond, strconv.FormatFloat(n, 'f', 0, 64))
		maxRate = math.Max(maxRate, n/d)
		if bound := math.Floor(5*d) + 1; n > bound {
			t.Errorf("%v status writes in %.2f s after the restore (sample %d), more than the writer's bound %v", n, d, i, bound)
		}
	}
	logf("after restore: %v status writes in 30 s, per second [%s], max %.1f/s; status caught up after %s",
		total, strings.Join(perSecond, " "), maxRate, caughtUp.Round(100*time.Millisecond))
	if caughtUp == 0 {
		o := getTQ(ctx, t, st.CP.Client, namespace, "open")
		l := getTQ(ctx, t, st.CP.Client, namespace, "limited")
		t.Errorf("status did not catch up in 30 s: open completedJobs %d (before %d, +%d expected), limited rejections %d (before %d, +%d expected)",
			deref(o.Status.CompletedJobs), deref(before.Status.CompletedJobs), jobsInOutage,
			deref(l.Status.Rejections), deref(beforeLimited.Status.Rejections), refused)
	}
	if total == 0 {
		t.Errorf("no status write in the 30 s after the restore")
	}
}
