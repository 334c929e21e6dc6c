// Package restart kills a pool's scheduler process with SIGKILL in the middle of a batch
// import and starts it again on the same durable job store (--job-store), on the real
// local control plane with the operator and the provider simulator (package
// test/framework), then checks the job record: every submitted job is there exactly
// once, finished, and the provider saw each job at least once and at most once more per
// job that was running at the kill (issue "Durable job store": jobs that were running
// are requeued and marked as retried, at-least-once toward the provider).
package restart

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fairshare-dev/fairshare/internal/schedconfig"
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

// manifests are the pool (pointed at the simulator) and the two tenants. The pool's
// model quota hint and the simulator's quota are far above what the import uses, so the
// pace is set by upstreamConcurrency and the simulator's latency only (no 429s).
const manifests = `apiVersion: quota.fairshare.dev/v1alpha1
kind: ProviderPool
metadata:
  name: restart
spec:
  upstream:
    baseURL: SIMULATOR_URL
  models:
  - name: sim-gpt
    tokensPerMinute: 6000000
    requestsPerMinute: 600000
  tenantIdentification:
    mode: TrustedHeader
    header: X-Fairshare-Tenant
  scheduler:
    quantumTokens: 512
    statusIntervalSeconds: 2
    upstreamConcurrency: UPSTREAM_CONCURRENCY
---
apiVersion: quota.fairshare.dev/v1alpha1
kind: TenantQuota
metadata:
  name: alpha
spec:
  poolRef:
    name: restart
  weight: 1
  batch:
    maxQueuedJobs: 1000
---
apiVersion: quota.fairshare.dev/v1alpha1
kind: TenantQuota
metadata:
  name: beta
spec:
  poolRef:
    name: restart
  weight: 1
  batch:
    maxQueuedJobs: 1000
`

func TestKillSchedulerMidImport(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test-restart` (it builds bin/kube-apiserver and bin/etcd)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	work := t.TempDir()
	begin := time.Now()
	logf := func(format string, args ...any) {
		t.Logf("[%5.1fs] "+format, append([]any{time.Since(begin).Seconds()}, args...)...)
	}

	logf("building the binaries")
	bin, err := framework.BuildBinaries(ctx, filepath.Join(work, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	logf("starting kube-apiserver and etcd")
	cp, err := framework.StartControlPlane(work)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	if err := cp.EnsureNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}

	simPort := freePort(t)
	simURL := fmt.Sprintf("http://127.0.0.1:%d", simPort)
	sim, err := framework.Start("providersim", work, filepath.Join(bin, "providersim"), []string{
		fmt.Sprintf("--addr=127.0.0.1:%d", simPort),
		"--tokens-per-minute=6000000", "--requests-per-minute=600000",
		"--latency=" + simLatency.String(), "--output-tokens=16",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Stop)
	if err := framework.WaitHTTP(ctx, sim, simURL+"/healthz"); err != nil {
		t.Fatal(err)
	}

	healthPort := freePort(t)
	operator, err := framework.Start("manager", work, filepath.Join(bin, "manager"), []string{
		"--leader-elect=false", "--metrics-bind-address=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", healthPort),
	}, "KUBECONFIG="+cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(operator.Stop)
	if err := framework.WaitHTTP(ctx, operator, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)); err != nil {
		t.Fatal(err)
	}

	logf("applying the pool and tenants %v", tenants)
	m := strings.NewReplacer("SIMULATOR_URL", simURL, "UPSTREAM_CONCURRENCY", strconv.Itoa(upstreamConcurrency)).Replace(manifests)
	mPath := filepath.Join(work, "manifests.yaml")
	if err := os.WriteFile(mPath, []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := framework.Kubectl(ctx, cp.Kubeconfig, "apply", "-n", namespace, "-f", mPath); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}

	spec := renderedScheduler(ctx, t, cp, operator, work, filepath.Join(work, "jobs.db"))
	logf("scheduler as rendered by the operator, run locally: %s", strings.Join(spec.args, " "))

	first := startScheduler(ctx, t, spec, bin, work, 1)
	if err := cp.MarkDeploymentAvailable(ctx, namespace, pool+"-scheduler"); err != nil {
		t.Fatal(err)
	}

	// Submit the import: one bulk NDJSON upload per tenant.
	submitted := map[string]map[string]bool{} // tenant -> job id -> true
	for _, tenant := range tenants {
		submitted[tenant] = bulkSubmit(ctx, t, spec.url, tenant, jobsPerTenant)
	}
	total := len(tenants) * jobsPerTenant
	logf("submitted %d jobs (%d per tenant)", total, jobsPerTenant)

	// Kill -9 once some jobs have succeeded.
	waitSimSucceeded(ctx, t, simURL, first, killAfterSucceeded)
	runningBefore := 0
	for _, tenant := range tenants {
		runningBefore += len(listJobs(ctx, t, spec.url, tenant, "running", 1000))
	}
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.done
	atKill := simStats(ctx, t, simURL)
	logf("killed the scheduler (SIGKILL): simulator had %d requests, %d succeeded; %d jobs were listed running just before",
		atKill.Requests, atKill.Succeeded, runningBefore)
	if atKill.Succeeded >= int64(total) {
		t.Fatalf("the import was over before the kill (%d of %d answered): slow the simulator down", atKill.Succeeded, total)
	}

	second := startScheduler(ctx, t, spec, bin, work, 2)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("first scheduler log (tail):\n%s\nsecond scheduler log (tail):\n%s", first.tail(20), second.tail(40))
		}
	})
	logf("restarted the scheduler on the same job store")

	// Wait until no job is queued or running.
	deadline := time.Now().Add(90 * time.Second)
	for {
		open := 0
		for _, tenant := range tenants {
			for _, st := range []string{"queued", "running"} {
				open += len(listJobs(ctx, t, spec.url, tenant, st, 1000))
			}
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d jobs still queued or running 90 s after the restart\nscheduler log:\n%s", open, second.tail(30))
		}
		time.Sleep(250 * time.Millisecond)
	}
	logf("every job is finished")

	// The record: every submitted id exactly once, in the unfiltered list and in exactly
	// one status list, and nothing else.
	// report records a per-job error, printing the first ten of them only.
	bad := 0
	report := func(msg string) {
		if bad++; bad <= 10 {
			t.Error(msg)
		}
	}
	statuses := []string{"queued", "running", "succeeded", "failed", "expired", "cancelled"}
	byStatus := map[string]int{}
	recovered, attempts := 0, 0
	for _, tenant := range tenants {
		all := listJobs(ctx, t, spec.url, tenant, "", 37) // a page size that does not divide 100
		seen := map[string]int{}
		for _, j := range all {
			seen[j.ID]++
			if j.Tenant != tenant {
				t.Errorf("tenant %s lists job %s of tenant %s", tenant, j.ID, j.Tenant)
			}
			if !submitted[tenant][j.ID] {
				t.Errorf("tenant %s lists job %s that was not submitted", tenant, j.ID)
			}
			switch {
			case j.Recovered && j.Attempts != 2:
				t.Errorf("job %s: recovered with %d attempts, want 2", j.ID, j.Attempts)
			case !j.Recovered && j.Attempts != 1 && j.Status == "succeeded":
				t.Errorf("job %s: %d attempts, not recovered, want 1", j.ID, j.Attempts)
			}
			if j.Recovered {
				recovered++
			}
			attempts += j.Attempts
		}
		for id := range submitted[tenant] {
			if seen[id] != 1 {
				report(fmt.Sprintf("tenant %s: job %s listed %d times, want 1", tenant, id, seen[id]))
			}
		}
		if len(all) != jobsPerTenant {
			t.Errorf("tenant %s: %d jobs listed, want %d", tenant, len(all), jobsPerTenant)
		}
		inStatus := map[string]string{}
		for _, st := range statuses {
			for _, j := range listJobs(ctx, t, spec.url, tenant, st, 50) {
				if j.Status != st {
					t.Errorf("job %s listed under status=%s has status %s", j.ID, st, j.Status)
				}
				if prev, ok := inStatus[j.ID]; ok {
					t.Errorf("job %s listed under both %s and %s", j.ID, prev, st)
				}
				inStatus[j.ID] = st
				byStatus[st]++
			}
		}
		for id := range submitted[tenant] {
			switch st := inStatus[id]; st {
			case "succeeded", "expired":
			case "":
				report(fmt.Sprintf("tenant %s: job %s is in no status list (lost)", tenant, id))
			default:
				report(fmt.Sprintf("tenant %s: job %s is %s, want succeeded or expired", tenant, id, st))
			}
		}
	}
	if bad > 10 {
		t.Errorf("... %d per-job errors in all", bad)
	}
	final := simStats(ctx, t, simURL)
	logRecovered := recoveredFromLog(t, second.logPath)
	logf("record: %v; recovered=true: %d (scheduler log: wereRunning=%d); attempts: %d; simulator: %d requests, %d succeeded, %d throttled",
		byStatus, recovered, logRecovered, attempts, final.Requests, final.Succeeded, final.Throttled)

	if got := byStatus["succeeded"] + byStatus["expired"]; got != total {
		t.Errorf("succeeded + expired = %d, want %d", got, total)
	}
	// Only the jobs running at the kill are recovered: at most the pool's upstream
	// concurrency, and at least one (the kill came while the import was in flight, with
	// upstreamConcurrency calls of simLatency each outstanding).
	if recovered < 1 || recovered > upstreamConcurrency {
		t.Errorf("%d jobs recovered, want 1 to the upstream concurrency %d", recovered, upstreamConcurrency)
	}
	if logRecovered >= 0 && logRecovered != recovered {
		t.Errorf("the scheduler logged %d jobs running at restart, the job API shows %d recovered", logRecovered, recovered)
	}
	// At-least-once toward the provider: every succeeded job reached it; only a recovered
	// job may have reached it twice.
	if lo, hi := int64(byStatus["succeeded"]), int64(total+recovered); final.Requests < lo || final.Requests > hi {
		t.Errorf("simulator received %d requests, want between %d and %d", final.Requests, lo, hi)
	}
	if final.Requests > int64(attempts) {
		t.Errorf("simulator received %d requests, more than the %d attempts recorded", final.Requests, attempts)
	}
	if final.Throttled != 0 {
		t.Errorf("simulator sent %d 429s, want 0 (the pace is set by latency and concurrency only)", final.Throttled)
	}
	second.stop()
	logf("done")
}

// schedSpec is how to run the pool's scheduler locally, as the rendered Deployment would.
type schedSpec struct {
	args, env  []string
	url        string // gateway base URL
	readyzURL  string
	settingsAt string
}

// renderedScheduler waits for the operator to render the pool's Deployment and ConfigMap
// and returns the command line of the scheduler the way test/framework runs it (settings
// file written locally, listen addresses on 127.0.0.1), with --job-store=store.
func renderedScheduler(ctx context.Context, t *testing.T, cp *framework.ControlPlane, operator *framework.Process, work, store string) schedSpec {
	t.Helper()
	name := pool + "-scheduler"
	var dep appsv1.Deployment
	var cm corev1.ConfigMap
	deadline := time.Now().Add(60 * time.Second)
	for {
		errD := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &dep)
		errC := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cm)
		if errD == nil && errC == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the operator did not render %s: %v %v\n%s", name, errD, errC, operator.Tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	settings, err := schedconfig.Parse([]byte(cm.Data[schedconfig.SettingsKey]))
	if err != nil {
		t.Fatalf("ConfigMap %s: %v", name, err)
	}
	if settings.UpstreamConcurrency != upstreamConcurrency {
		t.Fatalf("rendered upstreamConcurrency %d, want %d", settings.UpstreamConcurrency, upstreamConcurrency)
	}
	sp := schedSpec{settingsAt: filepath.Join(work, schedconfig.SettingsKey)}
	if err := os.WriteFile(sp.settingsAt, settings.Marshal(), 0o644); err != nil {
		t.Fatal(err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	for _, a := range c.Args {
		switch {
		case strings.HasPrefix(a, "--config="):
			a = "--config=" + sp.settingsAt
		case strings.HasPrefix(a, "--job-store="):
			continue // replaced by the local store below
		}
		sp.args = append(sp.args, a)
	}
	ports := []int{freePort(t), freePort(t), freePort(t)}
	sp.args = append(sp.args,
		fmt.Sprintf("--http-addr=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[2]),
		"--job-store="+store)
	sp.url = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	sp.readyzURL = fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[2])
	sp.env = []string{"KUBECONFIG=" + cp.Kubeconfig}
	for _, v := range c.Env {
		switch {
		case v.ValueFrom == nil:
			sp.env = append(sp.env, v.Name+"="+v.Value)
		case v.ValueFrom.FieldRef != nil && v.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			sp.env = append(sp.env, v.Name+"="+namespace)
		case v.ValueFrom.FieldRef != nil && v.ValueFrom.FieldRef.FieldPath == "metadata.name":
			sp.env = append(sp.env, v.Name+"="+name+"-local")
		default:
			t.Fatalf("env %s: unexpected source (the pool has no credentials Secret)", v.Name)
		}
	}
	return sp
}

// schedProc is a scheduler process this test can kill with SIGKILL (framework.Process
// only stops gracefully).
type schedProc struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// startScheduler runs the scheduler (run n, log sched-n.log) and waits for /readyz.
func startScheduler(ctx context.Context, t *testing.T, sp schedSpec, bin, work string, n int) *schedProc {
	t.Helper()
	p := &schedProc{logPath: filepath.Join(work, fmt.Sprintf("scheduler-%d.log", n)), done: make(chan struct{})}
	f, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(filepath.Join(bin, "scheduler"), sp.args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.Env = append(os.Environ(), sp.env...)
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(p.stop)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("scheduler %d exited (%v) before it was ready:\n%s", n, p.err, p.tail(30))
		default:
		}
		resp, err := http.Get(sp.readyzURL) //nolint:noctx // bounded by the deadline
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("scheduler %d not ready after 60 s:\n%s", n, p.tail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends the process gracefully (SIGTERM, then SIGKILL after 10 s); safe to repeat.
func (p *schedProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *schedProc) tail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var logRecoveredRE = regexp.MustCompile(`"recovered stored jobs".*"wereRunning":\s*(\d+)`)

// recoveredFromLog returns wereRunning of the scheduler's "recovered stored jobs" log
// line, or -1 when there is no such line.
func recoveredFromLog(t *testing.T, path string) int {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := logRecoveredRE.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return -1
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

func do(ctx context.Context, t *testing.T, method, u, tenant, contentType string, body []byte) []byte {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("X-Fairshare-Tenant", tenant)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		t.Fatalf("%s %s as %s: %d %s", method, u, tenant, resp.StatusCode, b)
	}
	return b
}

// bulkSubmit uploads n chat completion jobs for tenant as one NDJSON upload and returns
// their ids.
func bulkSubmit(ctx context.Context, t *testing.T, base, tenant string, n int) map[string]bool {
	t.Helper()
	var nd bytes.Buffer
	enc := json.NewEncoder(&nd)
	for i := range n {
		line := map[string]any{
			"endpoint": "/v1/chat/completions",
			"body": map[string]any{
				"model":      "sim-gpt",
				"messages":   []map[string]string{{"role": "user", "content": fmt.Sprintf("Summarise record %d of %s.", i, tenant)}},
				"max_tokens": 32,
			},
			"metadata": map[string]any{"n": i},
		}
		if err := enc.Encode(line); err != nil {
			t.Fatal(err)
		}
	}
	var out struct {
		Queued, Refused int
		Data            []struct {
			Line int
			Job  *job
		}
	}
	if err := json.Unmarshal(do(ctx, t, http.MethodPost, base+"/v1/jobs/bulk", tenant, "application/x-ndjson", nd.Bytes()), &out); err != nil {
		t.Fatal(err)
	}
	if out.Queued != n || out.Refused != 0 || len(out.Data) != n {
		t.Fatalf("bulk upload of %s: queued %d refused %d entries %d, want %d queued", tenant, out.Queued, out.Refused, len(out.Data), n)
	}
	ids := map[string]bool{}
	for _, d := range out.Data {
		if d.Job == nil || d.Job.ID == "" || ids[d.Job.ID] {
			t.Fatalf("bulk upload of %s: line %d has no job or a repeated id", tenant, d.Line)
		}
		ids[d.Job.ID] = true
	}
	return ids
}

// job is the part of the job API's job object the test reads.
type job struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	Status    string `json:"status"`
	Attempts  int    `json:"attempts"`
	Recovered bool   `json:"recovered"`
}

// listJobs pages through GET /v1/jobs?status=... for tenant (status "" is every job).
func listJobs(ctx context.Context, t *testing.T, base, tenant, status string, limit int) []job {
	t.Helper()
	var all []job
	after := ""
	for page := 0; ; page++ {
		if page > 1000 {
			t.Fatalf("listing %s's %q jobs did not end after 1000 pages", tenant, status)
		}
		q := url.Values{"limit": {strconv.Itoa(limit)}}
		if status != "" {
			q.Set("status", status)
		}
		if after != "" {
			q.Set("after", after)
		}
		var l struct {
			Data    []job   `json:"data"`
			HasMore bool    `json:"has_more"`
			LastID  *string `json:"last_id"`
		}
		if err := json.Unmarshal(do(ctx, t, http.MethodGet, base+"/v1/jobs?"+q.Encode(), tenant, "", nil), &l); err != nil {
			t.Fatal(err)
		}
		all = append(all, l.Data...)
		if !l.HasMore {
			return all
		}
		if l.LastID == nil || *l.LastID == after {
			t.Fatalf("listing %s's %q jobs: has_more without a new last_id", tenant, status)
		}
		after = *l.LastID
	}
}

// stats is the simulator's GET /stats.
type stats struct {
	Requests  int64 `json:"requests"`
	Succeeded int64 `json:"succeeded"`
	Throttled int64 `json:"throttled"`
}

func simStats(ctx context.Context, t *testing.T, simURL string) stats {
	t.Helper()
	var s stats
	if err := json.Unmarshal(do(ctx, t, http.MethodGet, simURL+"/stats", "", "", nil), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitSimSucceeded waits (at most 60 s) until the simulator has answered n requests.
func waitSimSucceeded(ctx context.Context, t *testing.T, simURL string, p *schedProc, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for simStats(ctx, t, simURL).Succeeded < n {
		if time.Now().After(deadline) {
			t.Fatalf("the simulator answered fewer than %d requests in 60 s\nscheduler log:\n%s", n, p.tail(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
